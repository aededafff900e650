#!/usr/bin/env bash
# The fusion-decision protocol in one device call: the pipelines split over the
# host's GPUs (one process each, its share of the cores compiling), each shard's
# results as JSON under $OUT as they are measured, then one table of them all.
#   bash benchmarks/decision_quality.sh [DEADLINE_SECONDS]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
for ((g = 0; g < gpus; g++)); do
  CUDA_VISIBLE_DEVICES=$g FUSEC_MAX_RANDOM=${FUSEC_MAX_RANDOM:-25} timeout $(( ${1:-450} + 120 )) python3 benchmarks/decision_quality.py \
    --shard "$g/$gpus" --deadline "${1:-450}" --json "$out/decisions_$g.json" > "$out/decisions_$g.txt" 2>&1 &
done
wait
tail -n 3 "$out"/decisions_*.txt
python3 benchmarks/decision_quality.py --summary "$out"/decisions_*.json | tee "$out/decisions.md"
