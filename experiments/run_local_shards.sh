#!/bin/bash
# Stages of the depth ablation on this machine as one shard per core, each process pinned to its core
# (benchmarks/bench_sweep_processes.py measures why: small runs use one core better than two), round after round
# until a round adds no record, then once unsharded, which trains anything left and writes the stage's outputs.
# Several stages run one after the other, so the machine goes on to the next when one ends.
#
#   experiments/run_local_shards.sh rates final      # or any of: budget rates final; extra flags go to depth_ablation.py
#   OUT=/scratch/ablation experiments/run_local_shards.sh rates --out /scratch/ablation
#
# Resumable like every stage: rerun after a stop. Logs: ${LOGS:-/tmp}/ablation_<stage>_shard_<i>.log (appended).
set -euo pipefail
stages=()
while [ $# -gt 0 ] && [[ "$1" =~ ^(budget|rates|final)$ ]]; do stages+=("$1"); shift; done
[ ${#stages[@]} -gt 0 ] || { echo "usage: run_local_shards.sh budget|rates|final [...] [depth_ablation.py flags]" >&2; exit 2; }
cd "$(dirname "$0")/.."
out=${OUT:-experiments/results/depth_ablation_converged}
cores=($(python -c "import os; print(*sorted(os.sched_getaffinity(0)))"))
n=${#cores[@]}
for stage in "${stages[@]}"; do
  mkdir -p "$out/$stage/runs"
  while true; do
    before=$(ls "$out/$stage/runs" | wc -l)
    pids=()
    for i in $(seq 1 "$n"); do
      taskset -c "${cores[$((i - 1))]}" python experiments/depth_ablation.py --protocol "$stage" --shard "$i/$n" "$@" \
        >> "${LOGS:-/tmp}/ablation_${stage}_shard_$i.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    [ "$(ls "$out/$stage/runs" | wc -l)" = "$before" ] && break
  done
  python experiments/depth_ablation.py --protocol "$stage" "$@"
done
