#!/usr/bin/env bash
# Every number in BENCHMARKS.md, in one run on the H200 (through the device tool):
#   bash benchmarks/run_h200.sh   (with PYTHONPATH=. and lark installed; writes to $OUT)
set -u
OUT=${OUT:-/tmp/fusec-bench}
mkdir -p "$OUT" /tmp/fusec-json
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"
echo "## compile time"; python3 benchmarks/compile_time.py
echo "## launch configuration"; python3 benchmarks/launch_config.py
for dtype in f32 bf16; do
  for f in examples/*.fz; do
    stem=$(basename "$f" .fz)
    extra=""; [ "$stem" = scale_bias_relu ] && extra="--dispatch"
    python3 -m fusec bench "$f" --dtype "$dtype" --sizes 2^12 2^20 2^26 2^28 $extra \
      --json "/tmp/fusec-json/$stem-$dtype.json" > "/tmp/fusec-json/$stem-$dtype.md" 2>&1
    echo "## $stem $dtype (exit $?)"; sed -n '/^$/,$p' "/tmp/fusec-json/$stem-$dtype.md"
  done
done
python3 - <<'PY'
import glob, json, os
rows = [r for path in sorted(glob.glob("/tmp/fusec-json/*.json")) for r in json.load(open(path))]
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp/fusec-bench"), "bench.json"), "w"), indent=1)
from fusec.bench.harness import Row, plot
plot([Row(**r) for r in rows if r["pipeline"] == "scale_bias_relu" and r["dtype"] == "f32"],
     os.path.join(os.environ.get("OUT", "/tmp/fusec-bench"), "scale_bias_relu_f32.png"))
PY
