"""The ``[freeze]`` TOML section (TorchTitan ``[job] custom_config_module = "timelyfreeze.config"``).

Every field is also a command-line flag: ``--freeze.r_max 0.5``, ``--freeze.apf.threshold 0.01``.
No ``from __future__ import annotations`` here: TorchTitan's ConfigManager merges sections by
inspecting real dataclass types.
"""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from planner.defaults import ANCHOR, DEFAULT_ESTIMATOR, GAPS, JITTER
from planner.lp.solve import SOLVERS
from planner.timing.estimate import ESTIMATORS
from timelyfreeze.config.deprecated import check_moved, names_base
from timelyfreeze.config.instruct import Instruct
from timelyfreeze.hooks.stage_layout import UNITS
from timelyfreeze.job.errors import FreezeConfigError
from timelyfreeze.job.fields import check_section, check_types, fail
from timelyfreeze.job.phases import Phases, derive_phases
from timelyfreeze.methods.apf import APFConfig
from timelyfreeze.methods.autofreeze import AutoFreezeConfig
from timelyfreeze.methods.egeria.method import EgeriaConfig
from timelyfreeze.methods.random_fixed import RandomConfig
from timelyfreeze.methods.registry import METHODS as _REGISTRY
from timelyfreeze.methods.smartpipe import SmartPipeConfig

METHODS: tuple[str, ...] = tuple(_REGISTRY)
"""Every ``[freeze] method`` name (the table is ``timelyfreeze.methods.registry.METHODS``)."""
PLANNED_METHODS: tuple[str, ...] = tuple(n for n, spec in _REGISTRY.items() if spec.planned)
METHOD_KNOBS: dict[str, str] = {n: spec.knob for n, spec in _REGISTRY.items() if spec.knob}
"""Each method's main hyperparameter (its ``[freeze]`` field path); ``none`` has none. The run summary
reports it and the sweep runner varies it."""


Solver = Literal[SOLVERS]
Estimator = Literal[ESTIMATORS]


@dataclass
class FreezeAdvanced:
    """``[freeze.advanced]``: how the planner and the re-planner work. Tuning knobs: each default was chosen by
    a measurement (linked), and a user rarely needs to change one."""

    solver: Solver = "auto"
    """LP solver of the plan, all exact (the lexicographic optimum): ``auto`` (the whole LP, or from 20,000
    actions a growing near-critical region), ``whole`` or ``region``.
    Default: [planner benchmark](results/planner/README.md)."""

    estimator: Estimator = DEFAULT_ESTIMATOR
    """How the plan's per-action times come from the monitoring records: ``pooled`` (per stage and kind, the
    median of every microbatch's records, except microbatches whose own median differs by more than noise) or
    ``median`` (each action's own medians); rules in ``docs/formats.md``.
    Default: [estimators](results/runtime/estimators.md)."""

    gap_model: bool = GAPS
    """Plan with the runtime's own time between consecutive actions of a rank (``planner.timing.gaps``), put on
    the DAG's rank-order edges next to the cross-rank delays; needs ``start_ms`` in the trace. ``false``: plan on
    action times and cross-rank delays alone. Default: [gap model](results/runtime/gap_model.md)."""

    jitter_model: bool = JITTER
    """Predict the batch as steps measure it: the longest of many nearly critical paths over jittering action
    times is longer than the longest path of the medians (``planner.timing.jitter``). The plan records the
    factor from the monitoring windows' steps and every runtime prediction carries it. ``false``: predictions
    are the plan's longest paths. Default: [monitoring runs](results/runtime/monitoring-3/span_figures.md)."""

    anchor_monitoring: bool = ANCHOR
    """Bring the lower-bound window to the upper-bound window's machine speed before planning (its records
    divided by its F factor: freezing never changes F); the plan records the factors (``monitoring``)."""

    monitor_tolerance: float = 0.1
    """A monitoring window whose F factor departs from 1 by more than this is flagged in the summary and the
    log (the machine changed speed between the two windows)."""

    replan_threshold: float = 0.05
    """The smallest change that re-plans: a re-plan is due when some (stage, kind) group's measured / planned
    time, its own pipeline rank's factor (from that rank's F and I actions) taken out, departs from 1 by more
    than ``max(replan_noise_k * its noise floor, replan_threshold)``, or a rank's factor against the other
    ranks' beyond ``max(replan_noise_k * its rank noise, replan_threshold)``, on the same side in every one of
    the last ``replan_patience`` stable steps. A change of every group of a rank alike that stays
    within its swings keeps the plan and only rescales its prediction."""

    replan_patience: int = 3
    """Stable steps a change must hold in to re-plan; their median scales decide a rescaled prediction and
    scale the re-plan."""

    replan_noise_k: float = 3.0
    """Noise floors a change must exceed to re-plan: a group's floor is the robust dispersion (1.4826 MAD) of
    its per-step scale against its rank's factor in the monitoring windows, a rank's the root mean square swing
    of its factor against the other ranks' there (``planner.timing.monitor``). 0: only ``replan_threshold``
    counts."""

    replan_min_gain: float = 0.01
    """What a due re-plan must buy to take effect: at least this fraction of a batch, or this much less
    freezing, against keeping the plan in force under the same rescaled weights; otherwise the plan stays and
    takes the measurements as its reference (a kept re-plan, candidate in ``replans/kept_step<N>.json``). 0:
    every due re-plan takes effect. Default: [monitoring runs](results/runtime/README.md)."""

    resample_every: int = 1
    """Steps between fresh random masks (1: every step draws a new subset per action)."""

    trace: bool = True
    """Write the per-action timing trace (``<dump_folder>/timelyfreeze/trace``) for every step."""

    def validate(self, section: str = "freeze.advanced") -> None:
        """The ranges of the knobs (their types and choices are checked with the whole section)."""
        check_section(
            self,
            section,
            (
                ("monitor_tolerance", lambda v: 0.0 <= v < math.inf, "must be a number >= 0"),
                ("replan_threshold", lambda v: 0.0 < v < math.inf, "must be a number > 0"),
                ("replan_patience", lambda v: v >= 1, "must be an integer >= 1"),
                ("replan_noise_k", lambda v: 0.0 <= v < math.inf, "must be a number >= 0"),
                ("replan_min_gain", lambda v: 0.0 <= v < 1.0, "must be a number in [0, 1)"),
                ("resample_every", lambda v: v >= 1, "must be >= 1"),
            ),
        )


@dataclass
class Experiment:
    """``[experiment]``: settings of experiment runs that are not about freezing."""

    stop_at_val_loss: float = 0.0
    """Time-to-accuracy runs: when > 0, the run stops after the first validation at or below this loss, once
    it has trained the length its LR schedule is made for (``lr_scheduler.total_steps``, else
    ``training.steps``); ``training.steps`` is then the most it may train, and past ``total_steps`` the LR holds
    the schedule's end value. Needs ``[validation] enable``. 0 (the default): train ``training.steps``. The sweep
    sets it from the no-freezing run (``extend_to_target`` in a grid)."""

    cpu_pinning: bool = False
    """On a host without CUDA, pin each local rank to its own equal share of the cores (when there are at least
    as many cores as local ranks). Ignored on CUDA hosts. Off by default: pinned runs were not faster on the
    2-core test machine ([runtime benchmark](results/runtime/README.md))."""

    def validate(self, section: str = "experiment") -> None:
        check_section(self, section, (("stop_at_val_loss", lambda v: 0.0 <= v < math.inf, "must be a number >= 0"),))


DeprecatedFreezeNames = names_base({"freeze.advanced": FreezeAdvanced, "experiment": Experiment})
"""The old names of the settings that moved (``timelyfreeze.config.deprecated``): accepted for one release."""
UNIT_CHOICES = ("auto",) + UNITS
Method = Literal[METHODS]
Unit = Literal[UNIT_CHOICES]


@dataclass
class Freeze(DeprecatedFreezeNames):
    enable: bool = False
    """Turn the freezing runtime on (per-action profiler, freezing hook, the chosen method).
    Requires pipeline parallelism (``pipeline_parallel_degree >= 2``)."""

    method: Method = "timelyfreeze"
    """Freezing method: ``timelyfreeze``, ``timelyfreeze_apf``, ``timelyfreeze_autofreeze``,
    ``apf``, ``autofreeze``, ``egeria``, ``smartpipe``, ``random`` or ``none`` (profile only)."""

    r_max: float = 0.8
    """Per-stage budget: the mean freeze ratio over a stage's freezable backward actions (B or W)
    may not exceed this (0..1). The paper uses 0.8 for LLMs."""

    r_max_per_stage: list[float] = field(default_factory=list)
    """Per-stage budgets instead of one: one value in [0, 1] per pipeline stage (global stage order; the
    count is checked once the pipeline is built). Empty (the default): ``r_max`` for every stage. The
    plan's ``budget_sensitivity`` says which stage's budget is worth raising (``docs/formats.md``)."""

    warmup_steps: int = -1
    """Steps with nothing measured and nothing frozen. -1: derived from the LR warm-up as in the
    paper (monitoring ends when the LR warm-up ends: ``lr_warmup - 2 * monitor_steps``)."""

    monitor_steps: int = -1
    """Length of EACH monitoring window: first the upper bound (nothing frozen), then the lower
    bound (everything freezable frozen). -1: 10 % of the LR warm-up (at least 2)."""

    ramp_steps: int = -1
    """Progressive phase: every action's ratio rises linearly from 0 to its planned value over
    this many steps, then holds (stable phase). -1: 25 % of the LR warm-up (at least 1)."""

    seed: int = 0
    """Seed of the per-(step, stage, microbatch) mask generators: runs are reproducible."""

    plan: str = ""
    """Path to an existing plan (``timelyfreeze-plan/1``): skip both monitoring windows and use it
    (it must match the schedule, stage count and microbatch count in use)."""

    unit: Unit = "auto"
    """What a backward action freezes a share of: ``tensor`` (parameter tensors, drawn one by one), ``block``
    (whole transformer blocks, with the final norm and the output head as units of their own and the first
    stage's embedding in its first block's unit), or ``auto`` (the default: ``block`` when ``[compile]``
    compiles the model, whose compiled blocks guard on their tensors' ``requires_grad``, else ``tensor``).
    Planned ratios are met in expectation either way; the trace records the realised share of elements.
    Under ``torch.compile`` it must be ``block``."""

    replan: bool = True
    """Online re-planning (TimelyFreeze methods): in the stable phase, watch each step's measured action times
    against the plan in force and solve the LP again when the stages or kinds change relative to one another
    beyond their noise; a change of every group alike (the machine) only rescales the predicted batch time.
    Each re-plan is logged in the metrics, TensorBoard and the summary and written to
    ``replans/plan_step<N>.json``; ``plan.json`` stays the plan made from the monitoring windows. How a
    re-plan is decided: ``[freeze.advanced] replan_*``. Why it is on: [re-plan A/B](results/runtime/README.md)."""

    advanced: FreezeAdvanced = field(default_factory=FreezeAdvanced)
    """How the planner and the re-planner work: tuning knobs with measured defaults (``[freeze.advanced]``)."""

    apf: APFConfig = field(default_factory=APFConfig)
    """APF (Chen et al.): freeze tensors whose effective perturbation stays below a threshold."""

    autofreeze: AutoFreezeConfig = field(default_factory=AutoFreezeConfig)
    """AutoFreeze (Liu et al.): freeze a prefix of blocks with a low gradient-norm change."""

    egeria: EgeriaConfig = field(default_factory=EgeriaConfig)
    """Egeria (Wang et al.): freeze the frontmost module once its plasticity vs an int8 reference settles."""

    smartpipe: SmartPipeConfig = field(default_factory=SmartPipeConfig)
    """SmartPipe (Niknami et al.): freeze a prefix of layers with a small gradient difference, at rate lambda."""

    random: RandomConfig = field(default_factory=RandomConfig)
    """Pipeline-unaware control: every backward action freezes a fixed random ratio."""


@dataclass
class JobConfig:
    freeze: Freeze = field(default_factory=Freeze)
    experiment: Experiment = field(default_factory=Experiment)
    instruct: Instruct = field(default_factory=Instruct)


def knob_of(cfg: "Freeze") -> dict | None:
    """``{"name", "value"}`` of the method's main hyperparameter in this config, or None. The random method
    with per-stage shares reports ``"matched"`` (shares read from another run) or ``"per_stage"``."""
    path = METHOD_KNOBS.get(cfg.method)
    if path is None:
        return None
    value = cfg
    for part in path.split("."):
        value = getattr(value, part)
    if cfg.method == "random" and (cfg.random.matched or cfg.random.ratio_per_stage):
        value = "matched" if cfg.random.matched else "per_stage"  # the shares are in method_summary
    return {"name": path.split(".")[-1], "value": value}


def validate(cfg: Freeze, *, total_steps: int, lr_warmup_steps: int) -> Phases:
    """Check the section on its own (the plan/schedule match is checked once the pipeline exists): the type
    of every field, nested method sections included (``timelyfreeze.job.fields``), then the ranges of
    ``[freeze]``'s own fields, then each method section's ``validate()`` (its rules live with its method)."""
    check_types(cfg, "freeze")
    check_moved(cfg)
    _check_ranges(cfg)
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if dataclasses.is_dataclass(section) and hasattr(section, "validate"):
            section.validate(f"freeze.{f.name}")
    phases = derive_phases(cfg, total_steps, lr_warmup_steps)
    if cfg.method in PLANNED_METHODS and phases.lower_end >= total_steps:
        raise FreezeConfigError(
            f"[freeze] phases end at step {phases.ramp_end} (warm-up {phases.warmup_end}, monitoring to "
            f"{phases.lower_end}) but [training] steps = {total_steps}: the plan step must come before the last step"
        )
    if cfg.method in PLANNED_METHODS and phases.ramp_end > total_steps:
        raise FreezeConfigError(
            f"[freeze] ramp ends at step {phases.ramp_end}, after [training] steps = {total_steps}: "
            "shorten ramp_steps or train longer"
        )
    return phases


def _check_ranges(cfg: Freeze) -> None:
    """The rules of ``[freeze]``'s own fields, whose types (and choices) ``check_types`` has checked."""
    if not 0.0 <= cfg.r_max <= 1.0:
        fail("freeze", "r_max", cfg.r_max, "must lie in [0, 1]")
    for i, v in enumerate(cfg.r_max_per_stage):
        if not 0.0 <= v <= 1.0:
            fail("freeze", f"r_max_per_stage[{i}]", v, "must lie in [0, 1]")
    for name in ("warmup_steps", "monitor_steps", "ramp_steps"):
        if getattr(cfg, name) < -1:
            fail("freeze", name, getattr(cfg, name), "must be >= 0 (or -1 to derive it)")
    if cfg.monitor_steps == 0 and cfg.method in PLANNED_METHODS and not cfg.plan:
        raise FreezeConfigError(
            "[freeze] monitor_steps = 0: the plan needs at least one upper- and one lower-bound step "
            "(or give [freeze] plan)"
        )
    if cfg.plan and cfg.method not in PLANNED_METHODS:
        raise FreezeConfigError(
            f"[freeze] plan = {cfg.plan!r}: only the TimelyFreeze methods ({', '.join(PLANNED_METHODS)}) use a plan, "
            f"method = {cfg.method!r} would ignore it"
        )


def compiles_model(compile_cfg) -> bool:
    """TorchTitan compiles every transformer block: ``[compile] enable`` with ``model`` in its components."""
    return bool(getattr(compile_cfg, "enable", False)) and "model" in getattr(compile_cfg, "components", ["model"])


def resolve_unit(cfg: "Freeze", compile_cfg, *, warmup_end: int) -> str:
    """``[freeze] unit`` (its value checked by ``validate``) as the run uses it (``tensor`` or ``block``), checked
    against ``[compile]`` and the method. Compiled blocks guard on ``requires_grad``: freezing a random subset of
    a block's tensors would compile a graph per subset, freezing whole blocks compiles two per block."""
    compiled = compiles_model(compile_cfg)
    unit = cfg.unit if cfg.unit != "auto" else ("block" if compiled else "tensor")
    if compiled and unit == "tensor":
        raise FreezeConfigError(
            "[freeze] unit = 'tensor' with [compile] enable = true: compiled blocks guard on requires_grad, so "
            "per-tensor freezing would compile a graph per frozen subset; set [freeze] unit = 'block' (or 'auto')"
        )
    if unit == "block" and not _REGISTRY[cfg.method].block_units:
        why = " (required under [compile] enable = true)" if compiled else ""
        raise FreezeConfigError(
            f"[freeze] method = {cfg.method!r} decides per tensor and cannot freeze whole blocks: [freeze] unit = "
            f"'block'{why}; use one of: {', '.join(n for n, s in _REGISTRY.items() if s.block_units)}"
        )
    if compiled and cfg.method in PLANNED_METHODS and not cfg.plan and warmup_end < 2:
        raise FreezeConfigError(
            f"[freeze] warmup_steps = {warmup_end} with [compile] enable = true: the warm-up must compile both "
            "variants of every block (step 1 trainable, the last warm-up step all frozen) before the monitoring "
            "windows measure anything; set warmup_steps >= 2"
        )
    return unit
