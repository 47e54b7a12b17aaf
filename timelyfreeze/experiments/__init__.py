"""Experiments: grids of training jobs run one at a time, the report that compares them, the benchmarks.

Tooling, not runtime: these modules import the runtime (``timelyfreeze.*``, ``planner``), and nothing in the
runtime imports them (``tests/test_boundaries.py``). Jobs start through ``timelyfreeze.titan.launch``.

``scripts/sweep.py`` and ``scripts/sweep_report.py`` are thin entry points to ``cli``
(``python -m timelyfreeze.experiments run|report ...`` does the same). One idea per module:

- ``grid``: a grid file / grid flags -> jobs (schedule x method x knob value x seed), their ids and knobs;
- ``command``: one job -> its ``torchrun -m timelyfreeze.train`` command (``launch``) or a fake launcher's;
- ``runner``: run one job or a resumable sweep: ``job.json`` records, progress/ETA, timeouts, Ctrl-C and SIGTERM;
- ``results``: read a sweep folder's job outputs into one row per job;
- ``pareto``: means per configuration over seeds and the loss/throughput Pareto front;
- ``tta``: time-to-accuracy against the no-freezing run;
- ``predictions``: the planner's predictions (r_max sweeps, timelines), called in this process;
- ``plots``: the report's matplotlib figures;
- ``report``: the report folder: CSV and Markdown tables, plots, warnings;
- ``cli``: the command lines of ``sweep.py run`` and ``sweep.py report``;
- ``pretrain``: the pre-trained checkpoint of the fine-tuning setting (``scripts/pretrain.py``);
- ``runtime_bench`` (with ``runtime_analysis`` and the trainer ``overhead_trainer``), ``compile_bench``: the
  benchmarks of ``scripts/bench_runtime.py`` and ``scripts/bench_compile.py``.

Method names and knobs come from ``timelyfreeze.config.freeze`` (``METHODS``, ``METHOD_KNOBS``,
``PLANNED_METHODS``); nothing here keeps its own list.
"""
