"""The freezing methods: one table, the only place their names are written.

``[freeze] method`` name -> where its class lives, its main hyperparameter (the ``[freeze]`` field the run
summary reports and the sweep varies), and whether it plans from measurements (the TimelyFreeze
family, which needs the monitoring phases). ``timelyfreeze.config.freeze`` and the experiments read it from here.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from timelyfreeze.methods.base import FreezeMethod


@dataclass(frozen=True)
class MethodSpec:
    module: str
    knob: str | None
    """Field path of the main hyperparameter under ``[freeze]`` (``None`` for ``none``)."""
    planned: bool = False
    """True for methods that profile, plan and ramp (TimelyFreeze and its hybrids)."""
    data_parallel: bool = False
    """True if every data-parallel replica of a stage makes the same choices by construction (they
    depend only on the plan, the seed and the step), so the method runs under FSDP/HSDP/TP. Methods
    that decide from per-rank gradient statistics would need those statistics reduced over the
    replicas first (not done yet)."""
    block_units: bool = True
    """True if the method can freeze whole blocks (``[freeze] unit = "block"``, required under
    ``torch.compile``): it samples units, or freezes whole layers by construction. APF decides per tensor."""


METHODS: dict[str, MethodSpec] = {
    "none": MethodSpec("timelyfreeze.methods.base", None, data_parallel=True),
    "timelyfreeze": MethodSpec("timelyfreeze.methods.timely", "r_max", planned=True, data_parallel=True),
    "timelyfreeze_apf": MethodSpec("timelyfreeze.methods.hybrid", "r_max", planned=True),
    "timelyfreeze_autofreeze": MethodSpec("timelyfreeze.methods.hybrid", "r_max", planned=True),
    "apf": MethodSpec("timelyfreeze.methods.apf", "apf.threshold", block_units=False),
    "autofreeze": MethodSpec("timelyfreeze.methods.autofreeze", "autofreeze.percentile"),
    "egeria": MethodSpec("timelyfreeze.methods.egeria.method", "egeria.tolerance_coef"),
    "smartpipe": MethodSpec("timelyfreeze.methods.smartpipe", "smartpipe.lam"),
    "random": MethodSpec("timelyfreeze.methods.random_fixed", "random.ratio", data_parallel=True),
}


def method_class(name: str) -> type[FreezeMethod]:
    if name not in METHODS:
        raise ValueError(f"unknown freezing method {name!r}; choose one of {', '.join(METHODS)}")
    module = importlib.import_module(METHODS[name].module)
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if issubclass(obj, FreezeMethod) and obj.__dict__.get("name") == name:
            return obj
    raise ValueError(f"freezing method {name!r}: no class with name = {name!r} in {METHODS[name].module}")
