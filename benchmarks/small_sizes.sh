#!/usr/bin/env bash
# Every example at 2^12 elements (the host-bound size) against torch.compile:
# `fusec bench --sizes 2^12` for each (its types as written, or retyped by
# DTYPE where the program has one float type), then one table of the fused
# call's µs, torch.compile's and their ratio. On a host of several GPUs the
# examples are split among them, one process each (the host has the cores).
# The tables under $OUT/small_sizes.md, the table of ratios printed.
#   bash benchmarks/small_sizes.sh [DTYPE]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
dtype=${1:-}
out=${OUT:-/tmp/out}
work=$(mktemp -d)
mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
bench() {  # bench GPU FILE...
  local gpu=$1; shift
  for f in "$@"; do
    stem=$(basename "$f" .fz)
    CUDA_VISIBLE_DEVICES=$gpu timeout 90 python3 -m fusec bench "$f" ${dtype:+--dtype $dtype} --sizes 2^12 \
      --json "$work/$stem.json" > "$work/$stem.md" 2>&1 || echo "$stem: exit $?"
  done
}
files=(examples/*.fz)
for ((g = 0; g < gpus; g++)); do
  bench "$g" $(for ((i = g; i < ${#files[@]}; i += gpus)); do echo "${files[i]}"; done) &
done
wait
cat "$work"/*.md > "$out/small_sizes.md"
python3 - "$work" <<'PY'
import glob, json, sys
print("| pipeline (2^12 elements) | dtype | fusec fused µs | torch.compile µs | torch.compile / fusec |\n|---|---|---|---|---|")
for path in sorted(glob.glob(f"{sys.argv[1]}/*.json")):
    by = {}
    for r in json.load(open(path)):
        by.setdefault((r["pipeline"], r["dtype"]), {})[r["variant"]] = r["us_per_call"]
    for (name, dtype), v in by.items():
        fused, compiled = v.get("fusec fused"), v.get("torch.compile")
        show = lambda us: "-" if us is None else f"{us:.1f}"
        ratio = f"{compiled / fused:.2f}" if fused and compiled else "-"
        print(f"| {name} | {dtype} | {show(fused)} | {show(compiled)} | {ratio} |")
PY
