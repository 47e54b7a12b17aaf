"""Experiments: grids of training jobs run one at a time, the report that compares them, the benchmarks.

Tooling, not runtime: these modules import the runtime (``timelyfreeze.*``, ``planner``), and nothing in the
runtime imports them (``tests/test_boundaries.py``). Jobs start through ``timelyfreeze.titan.launch``.

Three rooms and two modules, one idea each:

- ``sweep/``: grids of jobs and their report (``scripts/sweep.py`` and ``scripts/sweep_report.py`` are its doors):
  ``grid`` (a grid file or flags -> jobs), ``command`` (a job -> its ``torchrun`` command), ``runner`` (a
  resumable sweep: ``job.json`` records, progress, timeouts, Ctrl-C), ``results`` (a sweep folder -> one row per
  job), ``pareto``, ``tta`` (time to accuracy), ``predictions`` (the planner's), ``plots``, ``report``, ``cli``;
- ``runtime/``: the runtime benchmark (``scripts/bench_runtime.py``): ``bench``, ``analysis`` (what a finished
  job's dump says), ``overhead_trainer``, ``report``, ``first_plan``, ``span_figures``;
- ``studies/``: one study a module (compile, Egeria's cache, estimators, the gap model, placement, the GPU check,
  the SmolLM2 tables), each with its thin script;
- ``stats``: the intervals and verdicts every report states;
- ``pretrain``: the pre-trained checkpoint of the fine-tuning setting (``scripts/pretrain.py``).

Method names and knobs come from ``timelyfreeze.config.freeze`` (``METHODS``, ``METHOD_KNOBS``,
``PLANNED_METHODS``); nothing here keeps its own list.
"""
