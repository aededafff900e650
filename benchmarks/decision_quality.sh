#!/usr/bin/env bash
# Issue 12's device measurement in one call (carry .whl: lark and interegular, fusec's parser):
#   bash benchmarks/decision_quality.sh [DEADLINE_SECONDS]      (default 470: the call ends within about 530 s)
# - the fusion-decision protocol: the pipelines split over the host's GPUs (one process
#   each, its share of the cores compiling); each shard starts no pipeline whose projected
#   time would pass DEADLINE seconds, and plans its random partitions to fit; each shard's
#   full record as JSON under $OUT as it is measured (decisions_G.json, its log
#   decisions_G.txt), then one table of them all (decisions.md). The first shard times the
#   deep-chain probe (SASS bytes against time a stage) with the time left.
# - fast math (benchmarks/fast_math.py --op-costs, fast_math.md) on the last GPU first,
#   while that GPU's shard enumerates and compiles: its shard times nothing until it is done.
# - the clocks, power and temperature of every GPU twice a second (gpu_clocks.csv).
# Without a device, the same plumbing on the sim (nvidia-smi faked by a script on PATH):
#   DECISION_ARGS="--sim --only deep16,scale_bias_relu" FAST_MATH_ARGS=--count FUSEC_ELEMENTS=4096 \
#   FUSEC_MAX_RANDOM=3 bash benchmarks/decision_quality.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
out=${OUT:-/tmp/out}
deadline=${1:-470}
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then  # wheels are zip files: unpacked, they import
    python3 -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall("/tmp/site") for w in sys.argv[1:]]' .whl/*.whl
fi
gpus=$(nvidia-smi -L | wc -l)
fields=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu
for reasons in clocks_event_reasons.active clocks_throttle_reasons.active ""; do
    nvidia-smi --query-gpu="$fields${reasons:+,$reasons}" --format=csv -i 0 > /dev/null 2>&1 && break
done
nvidia-smi --query-gpu="$fields${reasons:+,$reasons}" --format=csv,nounits -lms 500 > "$out/gpu_clocks.csv" 2>&1 &
smi=$!
last=$((gpus - 1))
hold=/tmp/decision_quality_hold
touch "$hold"
(CUDA_VISIBLE_DEVICES=$last timeout 150 python3 benchmarks/fast_math.py ${FAST_MATH_ARGS---op-costs} > "$out/fast_math.md" 2>&1
 echo "(exit $?)" >> "$out/fast_math.md"; rm -f "$hold") &
fast=$!
shards=()
for ((g = 0; g < gpus; g++)); do
    extra=()
    [ "$g" = 0 ] && extra+=(--probe)
    [ "$g" = "$last" ] && extra+=(--hold "$hold")
    CUDA_VISIBLE_DEVICES=$g timeout $((deadline + 60)) python3 benchmarks/decision_quality.py \
        --shard "$g/$gpus" --deadline "$deadline" --json "$out/decisions_$g.json" ${extra[@]+"${extra[@]}"} ${DECISION_ARGS:-} \
        > "$out/decisions_$g.txt" 2>&1 &
    shards+=($!)
done
wait "${shards[@]}" "$fast"
kill "$smi" 2> /dev/null
tail -n 4 "$out"/decisions_*.txt
cat "$out/fast_math.md"
python3 benchmarks/decision_quality.py --summary "$out"/decisions_*.json | tee "$out/decisions.md"
