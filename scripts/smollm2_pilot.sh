#!/usr/bin/env bash
# The pilot of docs/results/smollm2-table1/README.md (development runs that size its studies), run alone on the
# machine from the repository root: bash scripts/smollm2_pilot.sh [1F1B|ZBVZeroBubble|pretrained|lr=<lr> ...]
# Each job's dump goes to docs/results/smollm2-table1/pilot/<name>/ (its run.log beside it); a finished job
# (summary.json present) is skipped, so the script resumes. Its own start and end lines also go to pilot/pilot.log
# (what `scripts/smollm2_report.py --pilot` reads). lr=<lr>: the 1F1B no-freezing job at that learning rate
# (amendment 2's check of the task at another learning rate).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CONFIG=torchtitan_configs/smollm2_135m_instruct_cpu.toml
OUT=docs/results/smollm2-table1/pilot
job() {  # name, then the job's own flags
  local name=$1; shift
  local dump=$OUT/$name
  if [ -f "$dump/timelyfreeze/summary.json" ]; then echo "pilot: $name done before, skipped"; return; fi
  rm -rf "$dump"
  echo "pilot: $name started $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/pilot.log"
  PYTHONPATH=. "$PY" scripts/run_default.py --config "$CONFIG" --job.dump_folder "$dump" --freeze.seed 100 "$@"
  echo "pilot: $name ended $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/pilot.log"
  rm -rf "$dump/checkpoint"  # the fine-tuned weights (~600 MB) are not kept
}
for what in "${@:-pretrained 1F1B ZBVZeroBubble}"; do
  for w in $what; do
    case $w in
      pretrained) job pretrained --freeze.method none --training.steps 1 --optimizer.lr 0 ;;
      1F1B|ZBVZeroBubble)
        job "${w}_none" --parallelism.pipeline_parallel_schedule "$w" --freeze.method none
        job "${w}_timelyfreeze" --parallelism.pipeline_parallel_schedule "$w" --freeze.method timelyfreeze --freeze.r_max 0.8 ;;
      lr=*) job "1F1B_none_lr${w#lr=}" --parallelism.pipeline_parallel_schedule 1F1B --freeze.method none --optimizer.lr "${w#lr=}" ;;
      *) echo "error: unknown pilot part $w (pretrained, 1F1B, ZBVZeroBubble, lr=<lr>)" >&2; exit 2 ;;
    esac
  done
done
