#!/usr/bin/env bash
# One call on the lent two-H200 machine: the gpu tier's two-device tests, the
# data-parallel example under torchrun against one GPU, and the launch floor.
# Each result under $OUT as it is made, so a call cut short keeps what it
# finished. (The rest of the gpu tier and the comparison with an older tree:
# benchmarks/device_check.sh, on one H200.)
#   bash benchmarks/two_gpus.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi -L
timeout 120 python3 -m pytest -v -p no:cacheprovider --tb=short -rf tests/test_device_gpu.py \
    -k "device_k or two_devices or per_device" > "$out/gpu.txt" 2>&1
grep -E "PASSED|FAILED|SKIPPED|passed|failed" "$out/gpu.txt" | tail -12
timeout 150 torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --steps 50 > "$out/ddp.txt" 2>&1
echo "torchrun exit $?"; tail -30 "$out/ddp.txt"
timeout 60 python3 benchmarks/launch_floor.py > "$out/floor.txt" 2>&1; grep "^|" "$out/floor.txt"
