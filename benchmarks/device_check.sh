#!/usr/bin/env bash
# One call on the lent H200: the gpu tier, and this tree against an older one
# side by side (the fusion decisions are a call of their own:
# benchmarks/decision_quality.py). Results under $OUT.
#   bash benchmarks/device_check.sh OLD_TREE
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
old=${1:-.old}
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# -v: each result as it ends, so a command cut short still names its failures
timeout 300 python3 -m pytest -v -n 12 -p no:cacheprovider --tb=line tests/test_device_gpu.py \
    tests/test_torch_gpu.py > "$out/gpu_tier.txt" 2>&1
grep -E "FAILED|passed|failed" "$out/gpu_tier.txt" | grep -v Benchmark | tail -20
timeout 240 python3 benchmarks/compare_versions.py "$old" . --rounds 2 > "$out/compare.txt" 2>&1
tail -17 "$out/compare.txt"
