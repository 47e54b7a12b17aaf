"""Real multi-process ``torchrun`` training on CPU through a full TimelyFreeze cycle.

Each run: warm-up 2, upper bound 3, lower bound 3, plan, ramp 3, stable 3 steps on the embedded
default (llama3 debug model, Python stdlib corpus) with sequences of 128 tokens (``SHORT_SEQUENCES``);
DualPipeV, InterleavedZeroBubble and LoopedBFS run a shorter cycle (``SHORTER``). Checked: the trace follows
the spec, the plan exists and matches the run, the offline planner makes the same plan from the trace, every
backward action froze exactly the number of tensors its planned ratio times the ramp asks for (floor or ceil),
the loss is finite.

What is asserted about the loss is what holds for every plan. The plan (hence which tensors freeze)
depends on measured timings, so the loss after the plan differs from run to run, and a 14-step loss
curve on changing batches does not fall reliably anyway (8.04 at step 1, 8.11 at step 8 in one seeded
run). Everything before the plan is deterministic (seeded weights and masks, nothing frozen, then
everything frozen), so the resume test checks that a resumed run recomputes those steps' losses bit
for bit.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from planner.plan import load_plan, plan_from_trace
from planner.schedule.actions import PAIR, parse_action
from planner.schedule.orders import rank_orders
from planner.timing.spans import f_factor, phase_spans, step_spans
from planner.trace.load import load_trace
from tests.torchrun_util import check_plan_from_trace, frozen_count_fits, short_cycle, torchrun

pytestmark = pytest.mark.torchrun

WARMUP, MONITOR, RAMP, STABLE = 2, 3, 3, 3
LOWER_END = WARMUP + 2 * MONITOR
RAMP_END = LOWER_END + RAMP


def ramp(step: int, lower_end: int = LOWER_END, ramp_steps: int = RAMP) -> float:
    if step <= lower_end:
        return 0.0
    return min(1.0, (step - lower_end) / ramp_steps)


def frozen_as_planned(
    frozen: int, ratio: float, step: int, n_tensors: int, lower_end: int = LOWER_END, ramp_steps: int = RAMP
) -> bool:
    """An action's frozen tensor count at ``step`` is what its planned ``ratio`` on the ramp asks for: floor or
    ceil of ``ratio * ramp * n_tensors`` (the selection draws one of the two)."""
    return frozen_count_fits(frozen, ratio * ramp(step, lower_end, ramp_steps) * n_tensors)


def check_full_cycle(
    run,
    schedule: str,
    num_stages: int,
    r_max: float = 0.8,
    cycle: tuple[int, int, int, int] = (WARMUP, MONITOR, RAMP, STABLE),
):
    """``cycle``: the run's (warm-up, monitoring, ramp, stable) steps, as given to ``short_cycle``."""
    warmup, monitor, ramp_steps, stable = cycle
    lower_end = warmup + 2 * monitor
    ramp_end = lower_end + ramp_steps
    assert run.rc == 0, run.tail()
    # trace: spec-conformant (load_trace checks it)
    trace = load_trace(run.out / "trace")
    assert trace.meta.schedule == schedule and trace.meta.num_stages == num_stages
    assert trace.meta.num_microbatches == 8
    # the runtime's plan, and the offline planner makes the same one from the trace
    plan = load_plan(run.out / "plan.json")
    assert plan.schedule == schedule and plan.num_stages == num_stages and plan.r_max == r_max
    check_plan_from_trace(plan, trace)
    # phases recorded per step
    phases = {r.step: r.phase for r in trace.records}
    steps = lower_end + ramp_steps + stable
    assert sorted(phases) == list(range(1, steps + 1))
    assert [phases[s] for s in (1, warmup + 1, warmup + monitor + 1, lower_end + 1, ramp_end + 1)] == [
        "warmup",
        "upper",
        "lower",
        "progressive",
        "stable",
    ]
    # applied ratios follow the ramp: tensor count within floor/ceil of ratio * freezable tensors
    n_tensors = {int(s): n for s, n in trace.meta.extra["freezable_tensors"].items()}
    raw = [
        json.loads(line)
        for r in range(trace.meta.pp_degree)
        for line in (run.out / "trace" / f"actions_rank{r}.jsonl").read_text().splitlines()
    ]
    checked = 0
    for rec in raw:
        a = rec["action"]
        act = parse_action(a)  # a DualPipeV pair: the stage of its backward part, which its ratio freezes
        kind, stage = act.kind, act.stage
        if kind in ("F", "I"):
            assert rec["freeze_ratio"] == 0.0
            continue
        if rec["phase"] in ("warmup", "upper"):
            assert rec["freeze_ratio"] == 0.0 and rec["frozen_tensors"] == 0
        elif rec["phase"] == "lower":
            assert rec["frozen_tensors"] == n_tensors[stage]
            assert rec["freeze_ratio"] > 0.99
        else:
            ratio = plan.actions[a].freeze_ratio
            assert frozen_as_planned(
                rec["frozen_tensors"], ratio, rec["step"], n_tensors[stage], lower_end, ramp_steps
            ), (a, rec, ratio)
            checked += 1
    assert checked == (ramp_steps + stable) * 8 * num_stages
    # the run reports its freezing (the lower-bound window froze everything: the whole run's average is above 0)
    summary = run.summary()
    assert summary["avg_freeze_ratio"] > 0
    expected = plan.batch_time_ms["planned"] * plan.extra["jitter"]["planned"]  # [freeze.advanced] jitter_model
    assert summary["predicted_batch_ms"]["planned"] == pytest.approx(expected)
    assert (run.out / "timeline.png").stat().st_size > 10_000
    # the loss is finite (see the module docstring for why nothing noisier is asserted)
    losses = [line for _, line in summary["loss_curve"]]
    assert len(losses) == steps and all(math.isfinite(line) for line in losses)
    assert not summary["failures"]
    assert summary["val_loss"] is not None and math.isfinite(summary["val_loss"])
    # spans and the F factor from the trace's timestamps (every rank on this host), as planner.timing.spans reads them
    spans = step_spans(trace)
    assert len(spans) == steps and summary["step_span_ms"] == [[k, round(ms, 3)] for k, ms in spans.items()]
    assert summary["span_ms"] == pytest.approx(phase_spans(trace, spans))
    assert summary["speedup"]["f_factor"] == pytest.approx(f_factor(trace))
    metrics = run.metrics()
    assert [m["phase"] for m in metrics if "phase" in m][lower_end] == "progressive"
    return plan, trace


def check_tensorboard(dump, steps: int) -> None:
    """TensorBoard got the runtime's per-step figures (``timelyfreeze/*``) for every step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(dump.rglob("events.out.tfevents*"))
    assert files, f"no TensorBoard event file under {dump}"
    tags: dict[str, list[int]] = {}
    for f in files:
        acc = EventAccumulator(str(f))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            tags.setdefault(tag, []).extend(e.step for e in acc.Scalars(tag))
    for tag in ("timelyfreeze/freeze_ratio", "timelyfreeze/batch_ms", "timelyfreeze/step_ms"):
        assert sorted(set(tags.get(tag, []))) == list(range(1, steps + 1)), (tag, sorted(tags))
    assert "timelyfreeze/predicted_batch_ms" in tags


INSTRUCT_ARGS = [
    "--training.dataset",
    "instruct",
    "--validation.dataset",
    "instruct_heldout",
    "--instruct.questions",
    "4",
]
"""Instruction data (loss on the responses only) and 4 held-out questions of 4 options."""


def check_accuracy(run, steps: int) -> None:
    """The held-out accuracy was scored on the pipeline's last stage at the last step only (not at TorchTitan's
    validation of step 1: ``FixedBatchValidator.scores_accuracy``), and reached ``metrics.jsonl`` and the summary
    beside the validation loss."""
    assert [m["step"] for m in run.metrics() if "val_loss" in m] == [1, steps]
    rows = [m for m in run.metrics() if "val_acc" in m]
    assert [m["step"] for m in rows] == [steps]
    for m in rows:
        assert m["val_acc_chance"] == 0.25 and m["val_questions"] == 4
        assert m["val_acc"] in (0.0, 0.25, 0.5, 0.75, 1.0) and m["val_acc_norm"] in (0.0, 0.25, 0.5, 0.75, 1.0)
    summary = run.summary()
    assert summary["val_acc"] == rows[-1]["val_acc"] and summary["acc_curve"] == [
        [m["step"], m["val_acc"]] for m in rows
    ]
    assert "accuracy" in run.log and "chance 0.250" in run.log


@pytest.mark.parametrize(
    "config,schedule,num_stages",
    [
        # GPipe also runs in test_freezing_exact (real stages); its full cycle is kept out of `make test` for
        # the 20-minute budget (`pytest -m slow`)
        pytest.param("llama3_debug_gpipe_cpu.toml", "GPipe", 2, marks=pytest.mark.slow),
        # 1F1B's plain full cycle is the first run of test_full_cycle_with_resumes
        ("llama3_debug_interleaved1f1b_cpu.toml", "Interleaved1F1B", 4),
        ("llama3_debug_zbv_cpu.toml", "ZBVZeroBubble", 4),
    ],
)
def test_full_cycle_pp2(tmp_path, config, schedule, num_stages):
    tensorboard = schedule == "Interleaved1F1B"  # one run checks the TensorBoard output
    # ZBV (its last stage on rank 0) trains on the instruction data and scores the held-out accuracy, as a
    # time-to-accuracy run of at most 16 steps whose target every validation reaches: it stops at step 14, its
    # first validation past the LR schedule's 14 steps, and scores the accuracy there (accuracy_freq 28 names
    # no step it runs: FreezeMetricsProcessor.score_at_stop)
    instruct = INSTRUCT_ARGS if schedule == "ZBVZeroBubble" else []
    cycle = short_cycle(WARMUP, MONITOR, RAMP, STABLE)
    steps = WARMUP + 2 * MONITOR + RAMP + STABLE
    if instruct:
        at = cycle.index("--training.steps")
        cycle[at + 1] = str(steps + 2)
        instruct = [
            *instruct,
            *("--lr_scheduler.total_steps", str(steps), "--experiment.stop_at_val_loss", "100"),
            *("--instruct.accuracy_freq", str(2 * steps)),
        ]
    run = torchrun(config, tmp_path / "run", *cycle, *instruct, tensorboard=tensorboard)
    plan, trace = check_full_cycle(run, schedule, num_stages)
    if instruct:
        check_accuracy(run, steps)
        assert f"step {steps} reaches stop_at_val_loss" in run.log and run.summary()["steps"] == steps
    if tensorboard:
        check_tensorboard(run.dump, WARMUP + 2 * MONITOR + RAMP + STABLE)
    if schedule == "ZBVZeroBubble":
        # split backward: only W actions carry freezing (how much the plan freezes depends on the measured
        # bounds; check_full_cycle checked every record against it)
        assert all(parse_action(a).kind != "B" for a in plan.actions)
        assert any(parse_action(a).kind == "W" for a in plan.actions)


SHORTER = (1, 2, 2, 2)
"""A 9-step cycle (warm-up, monitoring, ramp, stable) for the schedules below."""


@pytest.mark.parametrize(
    "config,schedule",
    [
        # DualPipeV: full backwards, split ones and OVERLAP_F_B pairs (a forward and a full backward as one
        # action; on CPU torch runs their parts one after the other, timelyfreeze/titan/cpu_shims.py)
        ("llama3_debug_dualpipev_cpu.toml", "DualPipeV"),
        ("llama3_debug_interleavedzb_cpu.toml", "InterleavedZeroBubble"),
        ("llama3_debug_loopedbfs_cpu.toml", "LoopedBFS"),
    ],
)
def test_full_cycle_more_schedules(tmp_path, config, schedule):
    """A full cycle for the other torch schedules; the orders the runtime records are the ones
    ``planner.schedule.orders`` generates (checked against torch's own in ``tests/test_schedules.py``)."""
    run = torchrun(config, tmp_path / "run", *short_cycle(*SHORTER))
    plan, trace = check_full_cycle(run, schedule, 4, cycle=SHORTER)
    assert trace.meta.rank_orders == rank_orders(schedule, 2, 8)
    # the plan has a ratio for each kind that the schedule has (DualPipeV's pairs included; check_full_cycle
    # checked every record against it)
    kinds = {parse_action(a).kind for a in plan.actions}
    assert (
        kinds
        == {"DualPipeV": {"F", "B", "I", "W", PAIR}, "LoopedBFS": {"F", "B"}, "InterleavedZeroBubble": {"F", "I", "W"}}[
            schedule
        ]
    )


RESUME_ARGS = [
    *short_cycle(WARMUP, MONITOR, RAMP, STABLE),
    "--checkpoint.enable",
    "--checkpoint.interval",
    "3",
    "--checkpoint.no-last-save-model-only",
]
"""A full cycle with a checkpoint after steps 3, 6 (lower-bound monitoring), 9 (after the plan) and 12, so that
one run serves both resumes below."""
LOWER_CKPT, AFTER_PLAN_CKPT = 6, 9


def copy_with_one_checkpoint(first, dest, step: int):
    """A copy of ``first``'s dump folder whose only checkpoint is the one of ``step``."""
    assert (first.dump / "checkpoint" / f"step-{step}").is_dir()
    keep = f"step-{step}"
    shutil.copytree(
        first.dump, dest, ignore=lambda d, names: [n for n in names if Path(d).name == "checkpoint" and n != keep]
    )
    return dest


def test_full_cycle_with_resumes(tmp_path):
    """One 1F1B full cycle (checked as every full cycle is: ``make test``'s plain PP=2 1F1B run), then two
    resumes of copies of its dump folder: from a checkpoint taken during lower-bound monitoring (step 7)
    and from one taken after the plan."""
    first = torchrun("llama3_debug_1f1b_cpu.toml", tmp_path / "run", *RESUME_ARGS)
    check_full_cycle(first, "1F1B", 2)
    check_resume_in_lower_bound_phase(first, copy_with_one_checkpoint(first, tmp_path / "lower", LOWER_CKPT))
    check_resume_after_plan_keeps_the_plan(first, copy_with_one_checkpoint(first, tmp_path / "after", AFTER_PLAN_CKPT))


def check_resume_in_lower_bound_phase(first, dump):
    """A run resumed from a checkpoint taken during lower-bound monitoring restores the upper-bound
    measurements, finishes monitoring, plans, and ends with a complete, duplicate-free trace."""
    first_plan = load_plan(first.out / "plan.json")
    (dump / "timelyfreeze" / "plan.json").unlink()
    second = torchrun("llama3_debug_1f1b_cpu.toml", dump, *RESUME_ARGS)
    assert second.rc == 0, second.tail()
    assert "restored freezing state at step %d" % LOWER_CKPT in second.log
    trace = load_trace(second.out / "trace")
    steps = WARMUP + 2 * MONITOR + RAMP + STABLE
    for r in range(2):
        per_step = {}
        for rec in trace.records:
            if rec.rank == r:
                per_step[(rec.step, rec.action)] = per_step.get((rec.step, rec.action), 0) + 1
        assert set(per_step.values()) == {1}
        assert {s for s, _ in per_step} == set(range(1, steps + 1))
    second_plan = load_plan(second.out / "plan.json")
    assert set(second_plan.actions) == set(first_plan.actions)
    # upper bound measured only in the first run: restored, not re-measured
    upper_steps = {r.step for r in trace.records if r.phase == "upper"}
    assert upper_steps == set(range(WARMUP + 1, WARMUP + MONITOR + 1))
    summary = second.summary()
    assert summary["phases"]["lower"] == [WARMUP + MONITOR + 1, LOWER_END]
    assert summary["steps"] == steps
    # the resumed run recomputes steps 7-8 (lower bound, before the plan: deterministic) bit for bit; steps 1-6
    # come from the restored history
    before = dict((s, line) for s, line in first.summary()["loss_curve"])
    after = dict((s, line) for s, line in summary["loss_curve"])
    assert all(math.isfinite(line) for line in after.values())
    assert [after[s] for s in range(1, LOWER_END + 1)] == [before[s] for s in range(1, LOWER_END + 1)]


def check_resume_after_plan_keeps_the_plan(first, dump):
    ratios = {a: ap.freeze_ratio for a, ap in load_plan(first.out / "plan.json").actions.items()}
    second = torchrun("llama3_debug_1f1b_cpu.toml", dump, *RESUME_ARGS)
    assert second.rc == 0, second.tail()
    assert "restored freezing state at step %d" % AFTER_PLAN_CKPT in second.log
    assert "plan written" not in second.log  # no re-planning
    raw = [json.loads(line) for line in (second.out / "trace" / "actions_rank0.jsonl").read_text().splitlines()]
    n0 = json.loads((second.out / "trace" / "meta.json").read_text())["freezable_tensors"]["0"]
    for rec in raw:
        if rec["step"] > AFTER_PLAN_CKPT and rec["action"].startswith("0B"):
            assert frozen_as_planned(rec["frozen_tensors"], ratios[rec["action"]], rec["step"], n0)
    # resuming with other [freeze] phases: the saved measurements no longer fit them -> one error line on
    # every rank together, exit 2, and the finished run's summary is left as it was
    summary_before = (second.out / "summary.json").read_bytes()
    third = torchrun("llama3_debug_1f1b_cpu.toml", dump, *RESUME_ARGS, "--freeze.monitor_steps", "2")
    assert third.rc != 0
    lines = [line for line in third.log.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "saved freezing state" in lines[0], third.tail()
    assert (second.out / "summary.json").read_bytes() == summary_before


def test_bad_freeze_setting_fails_with_one_line(tmp_path):
    run = torchrun("llama3_debug_1f1b_cpu.toml", tmp_path / "bad", "--freeze.r_max", "1.5", timeout=120)
    assert run.rc != 0
    lines = [line for line in run.log.splitlines() if line.startswith("error:")]
    assert lines == ["error: [freeze] r_max = 1.5: must lie in [0, 1]"]
    assert not any(line.startswith("[rank") and "Traceback" in line for line in run.log.splitlines())


def test_plan_for_another_schedule_is_refused(tmp_path):
    from planner.plan import write_plan
    from planner.trace.simulate import synthetic_trace

    plan = plan_from_trace(synthetic_trace("GPipe", 2, 8), 0.8)
    write_plan(plan, tmp_path / "gpipe_plan.json")
    run = torchrun(
        "llama3_debug_1f1b_cpu.toml",
        tmp_path / "run",
        "--freeze.plan",
        str(tmp_path / "gpipe_plan.json"),
        "--training.steps",
        "12",
        timeout=180,
    )
    assert run.rc != 0
    lines = [line for line in run.log.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "gpipe_plan.json" in lines[0] and "GPipe" in lines[0], lines


def test_given_plan_with_gradient_accumulation(tmp_path):
    """``[freeze] plan`` in a real run: no monitoring, no re-planning, every backward action freezes what
    the given plan (times the ramp) asks for. With gradient accumulation (2 batches per step) each batch
    draws and records its own masks, and the per-step metric covers both batches."""
    from planner.plan import write_plan
    from planner.trace.simulate import synthetic_trace

    given = plan_from_trace(synthetic_trace("1F1B", 2, 8), 0.8)
    write_plan(given, tmp_path / "plan.json")
    warmup, ramp_steps, stable = 2, 2, 2
    steps = warmup + ramp_steps + stable
    run = torchrun(
        "llama3_debug_1f1b_cpu.toml",
        tmp_path / "run",
        "--freeze.plan",
        str(tmp_path / "plan.json"),
        *short_cycle(warmup, 0, ramp_steps, stable),
        "--training.global_batch_size",
        "16",
    )
    assert run.rc == 0, run.tail()
    assert "plan written" not in run.log
    summary = run.summary()
    assert summary["predicted_batch_ms"]["planned"] == pytest.approx(given.batch_time_ms["planned"])
    assert summary["phases"] == {"warmup": [1, 2], "progressive": [3, 4], "stable": [5, 6]}
    assert not summary["failures"]
    meta = json.loads((run.out / "trace" / "meta.json").read_text())
    counts: dict[tuple[int, str], list[int]] = {}
    for r in range(2):
        for line in (run.out / "trace" / f"actions_rank{r}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            counts.setdefault((rec["step"], rec["action"]), []).append(rec.get("frozen_tensors"))
    assert {len(v) for v in counts.values()} == {2}  # one record per accumulation batch
    assert {s for s, _ in counts} == set(range(1, steps + 1))
    checked = 0
    for (step, a), frozen in counts.items():
        act = parse_action(a)
        if act.kind != "B":
            continue
        n = meta["freezable_tensors"][str(act.stage)]
        ratio = given.actions[a].freeze_ratio
        for f in frozen:
            assert frozen_as_planned(f, ratio, step, n, warmup, ramp_steps), (step, a, frozen, ratio)
            checked += 1
    assert checked == steps * 16 * 2
    rows = [m for m in run.metrics() if "phase" in m]
    assert [m["phase"] for m in rows] == ["warmup"] * 2 + ["progressive"] * 2 + ["stable"] * 2
    assert all(0 < m["freeze_ratio"] < 1 for m in rows[warmup:]) and all(m["freeze_ratio"] == 0 for m in rows[:2])
