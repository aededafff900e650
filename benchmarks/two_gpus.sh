#!/usr/bin/env bash
# One call on the lent two-H200 machine: the gpu tier (the two-device tests
# included), the data-parallel example under torchrun against one GPU, the
# launch floor and this tree against an older one. Each result under $OUT as
# it is made, so a call cut short keeps what it finished.
#   bash benchmarks/two_gpus.sh OLD_TREE
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
old=${1:-.old}
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi -L
timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider --tb=short -rf \
    tests/test_device_gpu.py tests/test_torch_gpu.py > "$out/gpu.txt" 2>&1
grep -E "passed|failed|^FAILED" "$out/gpu.txt" | tail -30
timeout 150 torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --steps 50 > "$out/ddp.txt" 2>&1
echo "torchrun exit $?"; tail -30 "$out/ddp.txt"
timeout 60 python3 benchmarks/launch_floor.py > "$out/floor.txt" 2>&1; grep "^|" "$out/floor.txt"
timeout 200 python3 benchmarks/compare_versions.py "$old" . --rounds 2 > "$out/compare.txt" 2>&1; tail -20 "$out/compare.txt"
