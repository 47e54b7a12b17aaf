"""The freezing methods: one table of their classes, keyed by each class's own ``name`` (its one home).

``[freeze] method`` name -> its class, its main hyperparameter (the ``[freeze]`` field the run summary
reports and the sweep varies), and whether it plans from measurements (the TimelyFreeze family, which
needs the monitoring phases). ``timelyfreeze.config.freeze`` and the experiments read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from timelyfreeze.methods.apf import APF
from timelyfreeze.methods.autofreeze import AutoFreeze
from timelyfreeze.methods.base import FreezeMethod
from timelyfreeze.methods.egeria.method import Egeria
from timelyfreeze.methods.hybrid import TimelyAPF, TimelyAutoFreeze
from timelyfreeze.methods.random_fixed import RandomFixed
from timelyfreeze.methods.smartpipe import SmartPipe
from timelyfreeze.methods.timely import TimelyFreezeMethod


@dataclass(frozen=True)
class MethodSpec:
    cls: type[FreezeMethod]
    """The method's class; its ``name`` is the ``[freeze] method`` value."""
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
    spec.cls.name: spec
    for spec in (
        MethodSpec(FreezeMethod, None, data_parallel=True),
        MethodSpec(TimelyFreezeMethod, "r_max", planned=True, data_parallel=True),
        MethodSpec(TimelyAPF, "r_max", planned=True),
        MethodSpec(TimelyAutoFreeze, "r_max", planned=True),
        MethodSpec(APF, "apf.threshold", block_units=False),
        MethodSpec(AutoFreeze, "autofreeze.percentile"),
        MethodSpec(Egeria, "egeria.tolerance_coef"),
        MethodSpec(SmartPipe, "smartpipe.lam"),
        MethodSpec(RandomFixed, "random.ratio", data_parallel=True),
    )
}


def method_class(name: str) -> type[FreezeMethod]:
    if name not in METHODS:
        raise ValueError(f"unknown freezing method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name].cls
