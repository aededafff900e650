#!/usr/bin/env bash
# The row-reduction table of the reductions issue, on the lent H200, in one call:
# each example at 2^26 elements in f32 and bf16, at each row length, fusec fused
# and unfused beside the copy of the same minimum traffic, torch eager and
# torch.compile (results checked against the reference first). Rows as JSON under $OUT.
#   bash benchmarks/rows_device.sh [ROW_LENGTHS...]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
mkdir -p "$out"
lengths=${*:-1024 4096 16384 65536 262144}
for example in softmax log_softmax rmsnorm layernorm add_rmsnorm cross_entropy; do
    for length in $lengths; do
        timeout 300 python3 -m fusec.cli bench "examples/$example.fz" --sizes 2^26 --row-length "$length" \
            --json "$out/${example}_$length.json" 2>&1 | tail -12
    done
done
