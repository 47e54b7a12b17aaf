#!/usr/bin/env bash
# The development check of docs/results/smollm2-table1/dev-zbv-weight-grad/README.md: why ZBV's weight-gradient
# actions run faster in some SmolLM2 jobs than in others that do the same work. Run alone on the machine from the
# repository root: bash scripts/smollm2_zbv_w_check.sh. Four short jobs in a fixed order (10 steps, no validation,
# no scoring); each job's dump goes to <dir>/<n>_<name>/ (its run.log beside it), checkpoints deleted; a finished job
# (summary.json present) is skipped, so the script resumes. Start and end lines go to <dir>/check.log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CONFIG=torchtitan_configs/smollm2_135m_instruct_cpu.toml
OUT=docs/results/smollm2-table1/dev-zbv-weight-grad
job() {  # name, env assignment (or -), then the job's own flags
  local name=$1 env=$2; shift 2
  local dump=$OUT/$name
  if [ -f "$dump/timelyfreeze/summary.json" ]; then echo "check: $name done before, skipped"; return; fi
  rm -rf "$dump"
  mkdir -p "$dump"
  echo "check: $name started $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), env $env" | tee -a "$OUT/check.log"
  local pre=(env PYTHONPATH=.)
  if [ "$env" != - ]; then pre+=("$env"); fi
  "${pre[@]}" "$PY" scripts/run_default.py --config "$CONFIG" --job.dump_folder "$dump" \
    --parallelism.pipeline_parallel_schedule ZBVZeroBubble --training.steps 10 --validation.no-enable --instruct.questions 0 \
    --optimizer.lr 3e-4 --lr_scheduler.warmup_steps 4 --freeze.warmup_steps 4 --freeze.monitor_steps 2 \
    --freeze.ramp_steps 2 --freeze.seed 0 "$@" >"$dump/run.log" 2>&1
  echo "check: $name ended $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/check.log"
  rm -rf "$dump/checkpoint"
}
job 1_none - --freeze.method none
job 2_none_mmap32m GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456 --freeze.method none
job 3_autofreeze - --freeze.method autofreeze --freeze.autofreeze.percentile 80
job 4_none - --freeze.method none
