#!/usr/bin/env bash
# The PyTorch issue's device measurement, in one call on the lent H200 (under 9 minutes):
#  (b) the gradients of every differentiable example against torch autograd on the same
#      maths, f32 and bf16, with the tolerances tests/grad_compare.py states
#      (tests/test_grad_gpu.py, 8 workers: their compiles are the CPU's work): PASS/FAIL
#      lines, one per output or gradient, then one per test;
#  (a) `fusec bench --grad` at 2^26 (forward + backward beside the copy of their minimum
#      traffic, torch eager, torch.compile and Liger; every variant's results and
#      gradients checked before it is timed) for bias-GELU and SwiGLU (examples/mlp.fz,
#      f32 and retyped to bf16), RMSNorm (examples/rmsnorm.fz: f32 and bf16), LayerNorm of y
#      alone (as torch's layer_norm and Liger's; written below, f32 and bf16), then
#      examples/layernorm.fz as written (y, mean and rstd: Liger has no backward for that).
#      torch.compile's compiles (20-40 s each) are paid in a first pass that runs the seven
#      benches at once, beside (b); its rows are kept only where the timed pass, one bench
#      at a time (Inductor's, Triton's and fusec's caches warm), did not finish.
# Rows as JSON in $OUT/grad_bench.json, everything printed in $OUT/grad_device.log, the
# gpu test's own output in $OUT/grad_gpu_tier.txt. Every command has its timeout, and
# the timed pass stops where the call's deadline would be passed.
#   bash benchmarks/grad_device.sh                 # on the device: carry [".whl"]
#   GRAD_BACKEND=sim GRAD_SIZE=4096 GRAD_ROW_LENGTH=256 GRAD_WORKERS=2 bash benchmarks/grad_device.sh   # CPU
# Trimmed: GRAD_ONLY names the benches to run (of the list below), GRAD_GPU_TESTS=0 leaves out (b):
#   GRAD_ONLY="bias_gelu_f32 bias_gelu_bf16 rmsnorm layernorm_y layernorm" GRAD_GPU_TESTS=0 bash benchmarks/grad_device.sh
# The device call must carry `.whl`: lark and interegular (fusec's parser) and
# liger_kernel 0.8.5 (pure Python over the machine's Triton), unpacked into /tmp/site;
# without liger_kernel the Liger rows read "skipped: Liger is not installed".
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
backend=${GRAD_BACKEND:-cuda}
size=${GRAD_SIZE:-2^26}
row_length=${GRAD_ROW_LENGTH:-4096}
deadline=${GRAD_DEADLINE:-480}  # seconds from the start: the timed pass starts no bench after it
work=/tmp/grad_device
mkdir -p "$out"
rm -rf "$work" && mkdir -p "$work/warm" "$work/timed"
exec > >(tee "$out/grad_device.log") 2>&1
tee_pid=$!
if compgen -G ".whl/*.whl" > /dev/null; then  # wheels are zip files: unpacked, they import
    python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
python3 -c 'import torch, importlib.metadata as m; print("torch", torch.__version__)
try:
    import liger_kernel.ops; print("Liger", m.version("liger_kernel"))
except Exception as exc: print("Liger not importable:", type(exc).__name__, exc)' 2>&1 | tail -2

cat > "$work/layernorm_y.fz" <<'EOF'
# LayerNorm of y alone: examples/layernorm.fz without the row statistics as outputs.
pipeline layernorm_y(x: f32[rows, cols], w: f32[cols], b: f32[cols], eps: f32) -> (y: f32[rows, cols]) {
    mean = row_mean(x);
    rstd = rsqrt(row_var(x) + eps);
    y = (x - mean) * rstd * w + b;
}

pipeline layernorm_y_bf16(x: bf16[rows, cols], w: bf16[cols], b: bf16[cols], eps: f32) -> (y: bf16[rows, cols]) {
    mean = row_mean(x);
    rstd = rsqrt(row_var(x) + eps);
    y = (x - mean) * rstd * w + b;
}
EOF
# name and arguments of each bench, the most wanted first (the timed pass may stop at its deadline)
benches=(
    "bias_gelu_f32 examples/mlp.fz --pipeline bias_gelu --dtype f32"
    "bias_gelu_bf16 examples/mlp.fz --pipeline bias_gelu --dtype bf16"
    "swiglu_f32 examples/mlp.fz --pipeline swiglu --dtype f32"
    "swiglu_bf16 examples/mlp.fz --pipeline swiglu --dtype bf16"
    "rmsnorm examples/rmsnorm.fz"
    "layernorm_y $work/layernorm_y.fz"
    "layernorm examples/layernorm.fz"
)
if [ -n "${GRAD_ONLY:-}" ]; then
    kept=()
    for b in "${benches[@]}"; do
        [[ " $GRAD_ONLY " == *" ${b%% *} "* ]] && kept+=("$b")
    done
    benches=("${kept[@]}")
fi
bench() {  # PASS SECONDS NAME ARGS...: one `fusec bench --grad`, its rows in $work/PASS/NAME.json
    local pass=$1 seconds=$2 name=$3
    shift 3
    timeout "$seconds" python3 -m fusec.cli bench --grad "$@" --backend "$backend" --sizes "$size" \
        --row-length "$row_length" --json "$work/$pass/$name.json" > "$work/$pass/$name.log" 2>&1
    local rc=$?
    [ "$rc" = 0 ] || echo "bench $name ($pass pass): exit $rc$([ "$rc" = 124 ] && echo ", timed out after ${seconds} s")"
}

echo "== $(date +%T) the first pass (the benches at once) beside the gradient check"
pids=()
for b in "${benches[@]}"; do
    bench warm 300 $b &  # word splitting of $b is meant: name, then its arguments
    pids+=($!)
done
if [ "${GRAD_GPU_TESTS:-1}" != 0 ]; then
timeout 300 python3 -m pytest -v -rA -n "${GRAD_WORKERS:-8}" -p no:cacheprovider --tb=short tests/test_grad_gpu.py \
    > "$out/grad_gpu_tier.txt" 2>&1
echo "pytest exit $? ($(grep -cE '^(PASS|FAIL) grad' "$out/grad_gpu_tier.txt") comparisons)"
grep -E '^(PASS|FAIL) grad' "$out/grad_gpu_tier.txt" | sort -u
# -rA's summary: a line per test (PASS, FAIL with its first line, SKIPPED with why), then the count
grep -E '^(PASSED|FAILED|ERROR|SKIPPED) ' "$out/grad_gpu_tier.txt" | sed -E 's/^PASSED/PASS/; s/^(FAILED|ERROR)/FAIL/'
grep -E '[0-9]+ (passed|failed|skipped|error)' "$out/grad_gpu_tier.txt" | tail -1
fi
wait "${pids[@]}"  # (a bare wait would wait for the log's tee too)
echo "== $(date +%T) first pass done ($SECONDS s); the timed pass, one bench at a time"
for b in "${benches[@]}"; do
    left=$((deadline - SECONDS))
    if [ "$left" -lt 30 ]; then
        echo "bench ${b%% *}: not run in the timed pass (${SECONDS} s of the call gone)"
        continue
    fi
    bench timed $((left < 150 ? left : 150)) $b
    tail -14 "$work/timed/${b%% *}.log"
done

echo "== $(date +%T) the rows ($SECONDS s)"
python3 - "$work" "$out/grad_bench.json" <<'EOF'
"""Merges the passes' rows (the timed pass's, else the first pass's, said in the note) and
prints the issue's criteria: fusec fused at >= 90 % of the copy, and no more than 2 % slower
than the best of torch.compile and Liger (faster where that peer is below 90 %)."""
import json
import sys
from pathlib import Path

work, target = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for timed in sorted({p.name for p in (work / "timed").glob("*.json")} | {p.name for p in (work / "warm").glob("*.json")}):
    path = work / "timed" / timed
    if path.exists():
        rows += json.loads(path.read_text())
        continue
    for row in json.loads((work / "warm" / timed).read_text()):
        row["note"] = (row["note"] + "; " if row["note"] else "") + "first pass: the benches at once, not isolated"
        rows.append(row)
target.write_text(json.dumps(rows, indent=1) + "\n")
print(f"{len(rows)} rows in {target}")
print(f"{'pipeline':24} {'dtype':10} {'fused µs':>10} {'% copy':>7} {'best peer':>14} {'its µs':>9} {'its %':>6}  verdict")
for key in dict.fromkeys((r["pipeline"], r["dtype"], r["size"]) for r in rows):
    group = {r["variant"]: r for r in rows if (r["pipeline"], r["dtype"], r["size"]) == key}
    fused = group.get("fusec fused", {})
    peers = [group[v] for v in ("torch.compile", "Liger") if group.get(v, {}).get("us_per_call")]
    best = min(peers, key=lambda r: r["us_per_call"]) if peers else None
    us, pct = fused.get("us_per_call"), fused.get("pct_of_copy")
    if not us:
        verdict = f"fusec fused not timed: {fused.get('note', 'no row')}"
    else:
        misses = [] if pct >= 90 else [f"{pct:.1f} % of the copy < 90 %"]
        if best:
            limit = best["us_per_call"] * (1.0 if best["pct_of_copy"] < 90 else 1.02)
            if us > limit:
                misses.append(f"{us / best['us_per_call']:.3f}x {best['variant']}")
        verdict = "meets" if not misses else "misses: " + ", ".join(misses)
    print(f"{key[0]:24} {key[1]:10} {us or 0:10.1f} {pct or 0:7.1f} {best['variant'] if best else '-':>14} "
          f"{best['us_per_call'] if best else 0:9.1f} {best['pct_of_copy'] if best else 0:6.1f}  {verdict}")
for r in rows:
    if r["note"] and r["variant"] != "copy (16-byte, the limit)":
        print(f"  {r['pipeline']} ({r['dtype']}) {r['variant']}: {r['note']}")
EOF
echo "== $(date +%T) done in $SECONDS s"
exec >&- 2>&-
wait "$tee_pid"  # the log written out before the call returns
