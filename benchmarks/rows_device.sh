#!/usr/bin/env bash
# The row-reduction table of the reductions issue, on the lent H200, in one call:
# each example at 2^26 elements in f32 and bf16, at each row length, fusec fused
# and unfused beside the copy of the same minimum traffic, torch eager,
# torch.compile and Liger (each peer's results checked first; a row says why a
# peer is skipped, failed or not timed: Liger's norm and softmax kernels take
# rows of at most 64 Ki, and it has none for log_softmax). Rows as JSON under $OUT.
#   bash benchmarks/rows_device.sh [ROW_LENGTHS...]
# The device call must carry `.whl` (carry: [".whl"]): lark and interegular
# (fusec's parser) and liger_kernel 0.8.5 (pure Python over the machine's
# Triton), unpacked here into /tmp/site; without liger_kernel the Liger rows
# read "skipped: Liger is not installed".
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then  # wheels are zip files: unpacked, they import
    python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl
fi
python3 -c 'import liger_kernel.ops, importlib.metadata as m; print("Liger", m.version("liger_kernel"))' 2>&1 | tail -1
lengths=${*:-1024 4096 16384 65536 262144}
for example in softmax log_softmax rmsnorm layernorm add_rmsnorm cross_entropy; do
    for length in $lengths; do
        timeout 300 python3 -m fusec.cli bench "examples/$example.fz" --sizes 2^26 --row-length "$length" \
            --json "$out/${example}_$length.json" 2>&1 | tail -12
    done
done
