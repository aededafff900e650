#!/usr/bin/env bash
# Rows held by thread-block clusters (issue 14), on the lent H200 in one call:
# the row table at 32 Ki-256 Ki elements with the default cluster shapes, then
# other threads a cluster's block (target.CLUSTER_THREADS) and elements of the
# row a thread holds (target.CLUSTER_ELEMENTS), each named in its heading.
#   bash benchmarks/cluster_shapes.sh   (carry .whl; writes under $OUT)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
mkdir -p "$out"
python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl
echo "## default shapes"
timeout 150 python3 benchmarks/rows_table.py --lengths 32768,65536,262144 2>&1 | tee "$out/clusters_default.md"
examples=softmax,rmsnorm,layernorm,cross_entropy
for shape in "256 16" "256 32" "128,256 32" "256,512 32" "128,256 16"; do
    set -- $shape
    echo "## cluster blocks of $1 threads, $2 elements a thread"
    timeout 80 python3 benchmarks/rows_table.py --lengths 32768,65536,131072,262144 --examples $examples \
        --cluster-threads $1 --cluster-elements $2 2>&1 | tee "$out/clusters_${1/,/-}_$2.md"
done
