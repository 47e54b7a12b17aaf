# Two entry points for a fresh machine: `make run` and `make test`.
# Both bootstrap .venv first. torch==2.13.0 is installed on its own before anything else, so that pip
# keeps that one build when it resolves the rest. Which build it is depends on where pip looks: this
# project's machines offer a local CPU wheel and pip takes it; from PyPI alone, on Linux x86_64, it is the
# CUDA 13.0 build (a few GB more; it runs on a CPU too, and on a GPU needs NVIDIA driver 580 or newer).
# TORCH_PIP_ARGS passes pip options for that one install, e.g. another index of torch builds.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH_PIP_ARGS ?=
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench clean-venv

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 $(TORCH_PIP_ARGS)
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['timelyfreeze']['no-deps']))")
	@touch $(STAMP)

# Train the embedded default (llama3 debug model, PP=2, 1F1B, CPU) through a full
# TimelyFreeze cycle and print the summary (phases, predicted vs measured batch time, ...).
run: $(STAMP)
	$(PY) scripts/run_default.py

# --durations: the slowest tests in CI's log, to keep the suite under its 20 minutes
test: $(STAMP)
	$(PY) -m pytest -q --durations=15

# ruff: lint and format check (configured in pyproject.toml); `ruff format .` fixes the formatting.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) scripts/bench_planner.py
	$(PY) scripts/bench_runtime.py

clean-venv:
	rm -rf $(VENV)
