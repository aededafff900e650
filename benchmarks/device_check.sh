#!/usr/bin/env bash
# One call on the lent H200: the gpu tier, this tree against an older one side
# by side, and the fusion decisions on a subset of pipelines. Results under $OUT.
#   bash benchmarks/device_check.sh OLD_TREE
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
old=${1:-.old}
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd /tmp && timeout 120 python3 -m pytest -q -p no:cacheprovider --rootdir "$OLDPWD" \
    "$OLDPWD/tests/test_device_gpu.py" "$OLDPWD/tests/test_torch_gpu.py" 2>&1 | tail -15) | tee "$out/gpu_tier.txt"
timeout 150 python3 benchmarks/compare_versions.py "$old" . --rounds 2 2>&1 | tail -17 | tee "$out/compare.txt"
FUSEC_MAX_RANDOM=4 timeout 140 python3 benchmarks/decision_quality.py --f32 --json "$out/decisions.json" \
    --only scale_bias_relu dag transcendental_chain wide12 fusion_hurts 2>&1 | tee "$out/decisions.txt" | tail -16
