"""[freeze] section: defaults, phase derivation from the LR warm-up, and one-line validation errors."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from timelyfreeze.config.deprecated import RENAMED, apply_renames
from timelyfreeze.config.freeze import Experiment, Freeze, FreezeAdvanced, FreezeConfigError, knob_of, validate
from timelyfreeze.config.job_checks import check_parallelism
from timelyfreeze.job.phases import Phases, derive_phases
from timelyfreeze.methods.registry import METHODS as REGISTRY

ROOT = Path(__file__).resolve().parents[1]


def test_paper_phases_from_lr_warmup():
    # LLaMA-3-8B in the paper: LR warm-up 200 -> t_w, t_m, t_p = 160, 200, 250
    p = validate(Freeze(), total_steps=2000, lr_warmup_steps=200)
    assert p == Phases(warmup_end=160, upper_end=180, lower_end=200, ramp_end=250)


def test_explicit_phases_and_ramp():
    p = derive_phases(Freeze(warmup_steps=3, monitor_steps=4, ramp_steps=6), 30, 0)
    assert [p.phase(s) for s in (1, 3, 4, 7, 8, 11, 12, 17, 18)] == [
        "warmup",
        "warmup",
        "upper",
        "upper",
        "lower",
        "lower",
        "progressive",
        "progressive",
        "stable",
    ]
    assert p.ramp(11) == 0.0 and p.ramp(12) == pytest.approx(1 / 6) and p.ramp(17) == 1.0 and p.ramp(30) == 1.0
    assert p.ranges(30) == {
        "warmup": (1, 3),
        "upper": (4, 7),
        "lower": (8, 11),
        "progressive": (12, 17),
        "stable": (18, 30),
    }


def test_given_plan_skips_monitoring():
    p = derive_phases(Freeze(plan="x.json", warmup_steps=2, ramp_steps=3), 10, 0)
    assert p.lower_end == 2 and p.phase(3) == "progressive"


@pytest.mark.parametrize(
    "kwargs,steps,warm,needle",
    [
        ({"r_max": 1.5}, 100, 10, "r_max = 1.5"),
        ({"r_max": -0.1}, 100, 10, "r_max = -0.1"),
        ({"method": "magic"}, 100, 10, "method = 'magic'"),
        ({"warmup_steps": -3}, 100, 10, "warmup_steps = -3"),
        ({"monitor_steps": 0}, 100, 10, "monitor_steps = 0"),
        ({"resample_every": 0}, 100, 10, "resample_every = 0"),
        ({"solver": "cplex"}, 100, 10, "solver = 'cplex'"),
        ({"solver": "simplex"}, 100, 10, "solver = 'simplex'"),  # names the README once listed
        ({"solver": "ipm"}, 100, 10, "solver = 'ipm'"),
        ({"estimator": "mean"}, 100, 10, "estimator = 'mean'"),
        ({"r_max_per_stage": [0.5, 1.2]}, 100, 10, "r_max_per_stage[1] = 1.2"),
        ({"r_max_per_stage": [0.5, True]}, 100, 10, "r_max_per_stage[1] = True"),
        ({"replan_threshold": -1}, 100, 10, "replan_threshold = -1"),
        ({"warmup_steps": 5, "monitor_steps": 5, "ramp_steps": 5}, 15, 0, "plan step must come before the last step"),
        ({"warmup_steps": 5, "monitor_steps": 5, "ramp_steps": 10}, 18, 0, "ramp ends at step 25"),
        ({}, 100, 0, "derived from [lr_scheduler] warmup_steps"),
    ],
)
def test_bad_settings_name_the_field(kwargs, steps, warm, needle):
    kwargs = dict(kwargs)
    with pytest.raises(FreezeConfigError) as e:
        validate(freeze_with(**kwargs), total_steps=steps, lr_warmup_steps=warm)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and msg.startswith("[freeze")


def test_random_ratio_checked():
    f = Freeze(method="random")
    f.random.ratio = 2.0
    with pytest.raises(FreezeConfigError, match=r"\[freeze.random\] ratio = 2.0"):
        validate(f, total_steps=100, lr_warmup_steps=10)


def _par(pp=2, shard=-1, rep=1, tp=1, cp=1):
    return SimpleNamespace(
        pipeline_parallel_degree=pp,
        data_parallel_shard_degree=shard,
        data_parallel_replicate_degree=rep,
        tensor_parallel_degree=tp,
        context_parallel_degree=cp,
    )


def test_parallelism_checks():
    check_parallelism(_par(), world_size=2)
    # TorchTitan 0.2.2: no DDP with PP, with or without freezing; the message points to HSDP
    for freezing in (True, False):
        with pytest.raises(FreezeConfigError, match=r"data_parallel_replicate_degree = 2 with pipeline.*use HSDP"):
            check_parallelism(_par(rep=2, shard=1), world_size=4, freezing=freezing)
        with pytest.raises(FreezeConfigError, match=r"use HSDP"):
            check_parallelism(_par(rep=2), world_size=4, freezing=freezing)  # shard -1 resolves to 1
    check_parallelism(_par(pp=1, rep=2, shard=1), world_size=2, freezing=False)  # plain DDP is TorchTitan's
    with pytest.raises(FreezeConfigError, match="pipeline_parallel_degree = 1"):
        check_parallelism(_par(pp=1), world_size=2)
    # FSDP2 (shard given or resolved from -1), HSDP and TP compose with PP and freezing
    check_parallelism(_par(), world_size=4, method="timelyfreeze")
    check_parallelism(_par(shard=2), world_size=4, method="random")
    check_parallelism(_par(rep=2, shard=2), world_size=8, method="timelyfreeze")
    check_parallelism(_par(tp=2, shard=1), world_size=4, method="none")
    with pytest.raises(FreezeConfigError, match="context_parallel_degree = 2"):
        check_parallelism(_par(cp=2, shard=1), world_size=4)
    check_parallelism(_par(shard=2), world_size=4, method="timelyfreze")  # a typo: validate() names it, no KeyError


def test_microbatch_checks():
    from timelyfreeze.config.job_checks import check_microbatches

    def par(schedule, pp=2, mbs=1):
        return SimpleNamespace(
            pipeline_parallel_degree=pp, pipeline_parallel_schedule=schedule, pipeline_parallel_microbatch_size=mbs
        )

    check_microbatches(par("DualPipeV"), 4)  # 4 stages, 4 microbatches
    with pytest.raises(FreezeConfigError, match=r"gives 3 microbatches; DualPipeV needs.*\(4 stages\).*to 4 or more"):
        check_microbatches(par("DualPipeV"), 3)
    with pytest.raises(FreezeConfigError, match=r"gives 1 microbatches; 1F1B needs.*\(2 stages\)"):
        check_microbatches(par("1F1B", mbs=2), 2)
    with pytest.raises(FreezeConfigError, match=r"microbatch_size = 2 does not divide.*local_batch_size = 5"):
        check_microbatches(par("GPipe", mbs=2), 5)
    check_microbatches(par("GPipe"), 1)  # GPipe and the others run with fewer
    check_microbatches(par("1F1B", pp=1), 1)  # no pipeline: nothing to check


@pytest.mark.parametrize("method", [m for m, spec in REGISTRY.items() if not spec.data_parallel])
def test_methods_with_per_rank_statistics_are_refused_with_replicas(method):
    check_parallelism(_par(shard=1), world_size=2, method=method)  # one pipeline: fine
    with pytest.raises(FreezeConfigError, match=rf"method = '{method}' does not support data-parallel.*2 replicas"):
        check_parallelism(_par(shard=2), world_size=4, method=method)


def test_toml_and_cli_reach_the_section():
    """The TorchTitan ConfigManager merges [freeze] (and its method sub-sections) from TOML and CLI."""
    from timelyfreeze.titan import cpu_shims

    cpu_shims.apply_if_needed()
    from torchtitan.config import ConfigManager

    cfg = ConfigManager().parse_args(
        [
            "--job.config_file",
            "torchtitan_configs/llama3_debug_zbv_cpu.toml",
            "--freeze.r_max",
            "0.5",
            "--freeze.apf.threshold",
            "0.2",
            "--freeze.smartpipe.lam",
            "0.75",
            "--freeze.advanced.estimator",
            "pooled",
            "--experiment.cpu-pinning",
        ]
    )
    assert cfg.freeze.enable and cfg.freeze.method == "timelyfreeze"
    assert cfg.freeze.r_max == 0.5 and cfg.freeze.monitor_steps == 4
    assert cfg.freeze.apf.threshold == 0.2 and cfg.freeze.smartpipe.lam == 0.75
    assert cfg.freeze.advanced.estimator == "pooled" and cfg.experiment.cpu_pinning
    assert cfg.activation_checkpoint.mode == "none"


def test_old_names_still_parse_and_move_with_one_warning_each(tmp_path):
    """The settings that moved to [freeze.advanced] and [experiment] keep their old [freeze] names for one
    release, in a TOML file and on the command line (``timelyfreeze.config.deprecated``)."""
    from timelyfreeze.titan import cpu_shims

    cpu_shims.apply_if_needed()
    from torchtitan.config import ConfigManager

    toml = tmp_path / "old.toml"
    base = (ROOT / "torchtitan_configs" / "llama3_debug_zbv_cpu.toml").read_text()
    toml.write_text(base.replace("[freeze]\n", '[freeze]\nsolver = "whole"\nstop_at_val_loss = 4.5\n', 1))
    cfg = ConfigManager().parse_args(
        ["--job.config_file", str(toml), "--freeze.no-gap-model", "--freeze.replan_min_gain", "0.0"]
    )
    warnings = apply_renames(cfg)
    assert cfg.freeze.advanced.solver == "whole" and cfg.freeze.advanced.gap_model is False
    assert cfg.freeze.advanced.replan_min_gain == 0.0 and cfg.experiment.stop_at_val_loss == 4.5
    assert cfg.freeze.solver == "auto" and cfg.freeze.gap_model is True  # the old names hold their defaults again
    assert len(warnings) == 4 and all(w.startswith("warning: [freeze] ") for w in warnings)
    assert "warning: [freeze] solver is deprecated: it is now [freeze.advanced] solver" in warnings[0]
    assert apply_renames(cfg) == []  # nothing left to move


def test_help_lists_each_setting_once_in_its_new_home(capsys):
    """``--help`` (``timelyfreeze.titan.help``) leaves the old ``[freeze]`` names out and shows their new homes;
    a run still parses the old names (the test above)."""
    import re

    from timelyfreeze.titan import cpu_shims

    cpu_shims.apply_if_needed()
    from timelyfreeze.titan.help import print_help

    with pytest.raises(SystemExit) as exit_:
        print_help(["--job.config_file", "torchtitan_configs/llama3_debug_zbv_cpu.toml", "--help"])
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out

    def flag(section: str, name: str) -> str:
        return rf"--{re.escape(section)}\.(no[-_])?{name.replace('_', '[-_]')}(?![\w-])"

    assert re.search(flag("freeze", "r_max"), out) and re.search(flag("freeze", "method"), out)
    for old, home in RENAMED.items():
        assert not re.search(flag("freeze", old), out), old
        assert re.search(flag(home, old), out), f"{home}.{old}"


def test_an_old_and_a_new_name_that_disagree_are_an_error():
    job = SimpleNamespace(freeze=freeze_with(solver="whole"), experiment=Experiment())
    job.freeze.solver = "region"
    with pytest.raises(FreezeConfigError, match=r"^\[freeze\] solver = 'region' and \[freeze.advanced\] solver"):
        apply_renames(job)
    job = SimpleNamespace(freeze=freeze_with(solver="whole"), experiment=Experiment())
    job.freeze.solver = "whole"  # the same value twice: fine
    assert len(apply_renames(job)) == 1 and job.freeze.advanced.solver == "whole"


def freeze_with(**kw) -> Freeze:
    """A ``[freeze]`` section with ``kw``; the tuning knobs go to ``[freeze.advanced]``, where they live."""
    advanced = {k: kw.pop(k) for k in list(kw) if RENAMED.get(k) == "freeze.advanced"}
    return Freeze(**kw, advanced=FreezeAdvanced(**advanced))


def test_the_gpu_debug_config_parses_and_splits_into_8_microbatches():
    """torchtitan_configs/llama3_debug_1f1b_gpu.toml (run on a lent GPU, docs/results/gpu) stays valid."""
    from timelyfreeze.titan import cpu_shims

    cpu_shims.apply_if_needed()
    from torchtitan.config import ConfigManager

    cfg = ConfigManager().parse_args(["--job.config_file", "torchtitan_configs/llama3_debug_1f1b_gpu.toml"])
    assert cfg.freeze.enable and cfg.freeze.method == "timelyfreeze"
    assert cfg.training.local_batch_size // cfg.parallelism.pipeline_parallel_microbatch_size == 8
    assert cfg.parallelism.pipeline_parallel_schedule == "1F1B"


def test_knob_of_each_method():
    f = Freeze(method="smartpipe")
    f.smartpipe.lam = 0.75
    assert knob_of(f) == {"name": "lam", "value": 0.75}
    assert knob_of(Freeze(method="timelyfreeze_apf", r_max=0.3)) == {"name": "r_max", "value": 0.3}
    assert knob_of(Freeze(method="apf")) == {"name": "threshold", "value": 0.01}
    assert knob_of(Freeze(method="none")) is None


def test_every_planner_solver_name_is_accepted():
    from planner.lp.solve import SOLVERS

    for name in SOLVERS:
        validate(freeze_with(enable=True, solver=name), total_steps=100, lr_warmup_steps=10)


def test_estimator_names_come_from_the_planner():
    from planner.timing.estimate import ESTIMATORS

    assert Freeze().advanced.estimator == "pooled"
    for name in ESTIMATORS:
        validate(freeze_with(enable=True, estimator=name), total_steps=100, lr_warmup_steps=10)
    with pytest.raises(FreezeConfigError) as e:
        validate(freeze_with(estimator="x"), total_steps=100, lr_warmup_steps=10)
    assert str(e.value) == "[freeze.advanced] estimator = 'x': choose one of median, pooled"


def test_layer_order_of_parameter_names():
    from timelyfreeze.hooks.stage_layout import layer_index

    assert layer_index("tok_embeddings.weight", 6) == 0
    assert layer_index("layers.0.attention.wq.weight", 6) == 1
    assert layer_index("model.layers.5.mlp.w1.weight", 6) == 6
    assert layer_index("norm.weight", 6) == layer_index("output.weight", 6) == 7
    with pytest.raises(FreezeConfigError, match="parameter 'adapter.proj.weight'"):
        layer_index("adapter.proj.weight", 6)


@pytest.mark.parametrize(
    "section,name,value,needle",
    [
        ("apf", "threshold", -0.1, "[freeze.apf] threshold = -0.1"),
        ("apf", "ema_alpha", 1.0, "[freeze.apf] ema_alpha = 1.0"),
        ("autofreeze", "percentile", 120.0, "[freeze.autofreeze] percentile = 120.0"),
        ("autofreeze", "check_every", 0, "[freeze.autofreeze] check_every = 0"),
        ("egeria", "window", 1, "[freeze.egeria] window = 1"),
        ("egeria", "unfreeze_lr_drop", 0.5, "[freeze.egeria] unfreeze_lr_drop = 0.5"),
        ("apf", "ema_alpha", 0.0, "[freeze.apf] ema_alpha = 0.0: must lie in (0, 1)"),  # P = 1: nothing freezes
        ("smartpipe", "lam", 0.0, "[freeze.smartpipe] lam = 0.0"),
        ("smartpipe", "lam", 1.0, "[freeze.smartpipe] lam = 1.0: must lie in (0, 1)"),  # the paper's open interval
        ("smartpipe", "check_every", -2, "[freeze.smartpipe] check_every = -2"),
        ("random", "ratio", float("nan"), "[freeze.random] ratio = nan"),
    ],
)
def test_bad_method_knobs_name_the_field(section, name, value, needle):
    f = Freeze(enable=True)
    setattr(getattr(f, section), name, value)
    with pytest.raises(FreezeConfigError) as e:
        validate(f, total_steps=100, lr_warmup_steps=10)
    assert needle in str(e.value)


def test_a_plan_for_a_method_that_ignores_it_is_refused():
    with pytest.raises(FreezeConfigError, match="only the TimelyFreeze methods"):
        validate(Freeze(enable=True, method="random", plan="p.json"), total_steps=100, lr_warmup_steps=10)


def _sections() -> list[tuple[str, tuple[str, ...], type]]:
    """(name, path of attributes from ``Freeze``, dataclass) of ``[freeze]`` and every section nested in it."""
    found = [("freeze", (), Freeze)]
    for name, kind in typing.get_type_hints(Freeze).items():
        if dataclasses.is_dataclass(kind):
            found.append((f"freeze.{name}", (name,), kind))
    return found


_WRONG_VALUES: dict[object, list[tuple[object, str]]] = {
    bool: [("yes", "true or false"), (1, "true or false")],
    int: [("2", "an integer"), (2.5, "an integer"), (True, "an integer")],
    float: [("0.5", "a number"), (True, "a number")],
    str: [(3, "a string"), (True, "a string")],
    list[float]: [("0.5", "a list of numbers"), ([0.5, "x"], "a number"), ([False], "a number")],
}
"""Per declared type, values of another type that a TOML file can give, and what the error says it must be."""


def _wrong_type_cases():
    for section, path, cls in _sections():
        for name, kind in typing.get_type_hints(cls).items():
            if section == "freeze" and dataclasses.is_dataclass(kind):
                continue  # a nested section: its fields are cases of their own
            if typing.get_origin(kind) is typing.Literal:  # a choice: a wrong type and a wrong name
                choices = ", ".join(map(str, typing.get_args(kind)))
                for value in (3, "nope"):
                    message = f"[{section}] {name} = {value!r}: choose one of {choices}"
                    yield pytest.param(path, name, value, message, id=f"{section}.{name}={value!r}")
                continue
            assert kind in _WRONG_VALUES, f"[{section}] {name}: add wrong values of type {kind} to _WRONG_VALUES"
            for value, noun in _WRONG_VALUES[kind]:
                label, shown = name, value
                if isinstance(value, list):
                    bad = next(i for i, v in enumerate(value) if not isinstance(v, float))
                    label, shown = f"{name}[{bad}]", value[bad]
                yield pytest.param(
                    path,
                    name,
                    value,
                    f"[{section}] {label} = {shown!r}: must be {noun}",
                    id=f"{section}.{name}={value!r}",
                )


@pytest.mark.parametrize("path,name,value,message", list(_wrong_type_cases()))
def test_every_field_of_every_section_has_its_type_checked(path, name, value, message):
    """A value of the wrong type (as a TOML file can give it) is one error naming the field, never a
    TypeError from a comparison or a silently accepted 2.5 steps; the check comes from the annotations."""
    f = Freeze(enable=True)
    section = f
    for part in path:
        section = getattr(section, part)
    setattr(section, name, value)
    with pytest.raises(FreezeConfigError) as e:
        validate(f, total_steps=100, lr_warmup_steps=10)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"resample_every": "2"}, "[freeze.advanced] resample_every = '2': must be an integer"),
        ({"warmup_steps": "three"}, "[freeze] warmup_steps = 'three': must be an integer"),
        ({"monitor_steps": 2.5}, "[freeze] monitor_steps = 2.5: must be an integer"),
        ({"r_max": "0.5"}, "[freeze] r_max = '0.5': must be a number"),
        ({"r_max": 1}, None),  # an integer is a number
        ({"replan_patience": 2.0}, "[freeze.advanced] replan_patience = 2.0: must be an integer"),
    ],
)
def test_types_are_checked_before_ranges(kwargs, message):
    if message is None:
        validate(freeze_with(enable=True, **kwargs), total_steps=100, lr_warmup_steps=10)
        return
    with pytest.raises(FreezeConfigError) as e:
        validate(freeze_with(enable=True, **kwargs), total_steps=100, lr_warmup_steps=10)
    assert str(e.value) == message


def test_each_method_section_validates_itself():
    """Each method's config section holds its own rules: its defaults pass, a bad value names the field."""
    for section, path, cls in _sections()[1:]:
        cls().validate()
        cls().validate(section)
    from timelyfreeze.methods.apf import APFConfig

    with pytest.raises(FreezeConfigError, match=r"^\[freeze.apf\] threshold = 'x': must be a number$"):
        APFConfig(threshold="x").validate()


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "torchtitan_configs").glob("*.toml")))
def test_every_shipped_config_passes_the_type_check_of_every_section(config):
    """``check_job_types`` reads TorchTitan's annotations too: none of the shipped TOML files trips it."""
    from timelyfreeze.config.job_checks import check_job_types
    from timelyfreeze.titan import cpu_shims

    cpu_shims.apply_if_needed()
    from torchtitan.config import ConfigManager

    check_job_types(ConfigManager().parse_args(["--job.config_file", str(ROOT / "torchtitan_configs" / config)]))
