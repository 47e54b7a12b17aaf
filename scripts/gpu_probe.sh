#!/usr/bin/env bash
# The GPU check on a lent machine, in one command from the repository root:
#
#   OUT=/some/folder BUDGET=540 bash scripts/gpu_probe.sh
#
# 1. a venv ($VENV, default .venv-gpu; reused when it is there) with PyPI's torch 2.13.0 for Linux x86_64, which is
#    its CUDA 13.0 build ('===' refuses a local version such as 2.13.0+cpu that a configured index may offer);
# 2. the package and its dev dependencies into it (torch stays as installed);
# 3. python scripts/gpu_check.py --out $OUT/gpu_check (which parts run depends on the GPUs at hand: see
#    docs/results/gpu/README.md), within what is left of $BUDGET seconds.
#
# Everything lands under $OUT: nvidia-smi, the pip logs and freeze, torch's view of CUDA, the check's log and its
# results folder (results.json, each part's log and dump). Files over 20 MB are deleted (a transfer limit).
# Exit code: the check's (0 all parts passed, 1 a part failed, 2 no CUDA device), or the failing install step's.
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_probe_out}
BUDGET=${BUDGET:-540}
VENV=${VENV:-.venv-gpu}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
mkdir -p "$OUT"
T0=$SECONDS
left() { local t=$((BUDGET - (SECONDS - T0) - ${1:-0})); ((t < 30)) && t=30; echo $t; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

{ timeout 20 nvidia-smi; timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } \
  > "$OUT/nvidia-smi.txt" 2>&1
test -x "$VENV/bin/python" || timeout 120 "$PYTHON" -m venv "$VENV" > "$OUT/venv.log" 2>&1 \
  || { echo "error: could not make the venv $VENV with $PYTHON (see $OUT/venv.log)" >&2; exit 3; }
PY=$VENV/bin/python

timeout "$(left 300)" "$PY" -m pip install 'torch===2.13.0' > "$OUT/pip_torch.log" 2>&1 \
  || { echo "error: torch 2.13.0 did not install (see $OUT/pip_torch.log)" >&2; exit 3; }
timeout "$(left 240)" "$PY" -m pip install -e '.[dev]' > "$OUT/pip_package.log" 2>&1 \
  || { echo "error: the package did not install (see $OUT/pip_package.log)" >&2; exit 3; }
timeout 60 "$PY" -m pip freeze > "$OUT/pip_freeze.txt" 2>&1
timeout 120 "$PY" -c 'import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      "devices", torch.cuda.device_count())' > "$OUT/torch.txt" 2>&1
cat "$OUT/torch.txt"

timeout "$(left 10)" "$PY" scripts/gpu_check.py --out "$OUT/gpu_check" > "$OUT/gpu_check.log" 2>&1
rc=$?
echo "gpu_check exit code $rc (124: stopped at the budget; results.json holds the parts that ended)" \
  | tee -a "$OUT/gpu_check.log"
find "$OUT" -type f -size +20M -print -delete
tail -n 20 "$OUT/gpu_check.log"
exit $rc
