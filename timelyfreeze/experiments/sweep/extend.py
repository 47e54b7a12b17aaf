"""Time-to-accuracy runs: a freezing job trains on past the no-freezing run's length until it reaches that
run's final validation loss.

With ``extend_to_target = F`` in a grid, every freezing job of a (schedule, seed) gets, from the finished
no-freezing job of the same schedule and seed (which the grid runs first):

- ``--training.steps ceil(F * S)`` (S: the no-freezing run's ``training.steps``), the most it may train;
- ``--lr_scheduler.total_steps S``: the same LR schedule as the no-freezing run, then its end value (min_lr);
- ``--experiment.stop_at_val_loss L`` (L: the no-freezing run's final validation loss): it stops at the first
  validation at or below L once it has trained S steps.

Without a usable no-freezing result (it failed, or never validated) the job runs its plain length and the
sweep prints why; its time to accuracy then stays open in the report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from timelyfreeze.experiments.sweep.command import job_setting
from timelyfreeze.experiments.sweep.grid import NO_FREEZING, Job
from timelyfreeze.experiments.sweep.results import num
from timelyfreeze.experiments.sweep.runner import read_job_json, summary_path


def no_freezing_id(job: Job) -> str:
    return Job(job.schedule, NO_FREEZING, None, job.seed).job_id


def target_loss(jobs_dir: Path, job: Job, start_sha: str | None = None) -> tuple[float | None, str | None]:
    """(the no-freezing job's final validation loss, None) or (None, why there is none). With ``start_sha``
    the no-freezing job must have started from the same pre-trained checkpoint."""
    nf_dir = jobs_dir / no_freezing_id(job)
    rec = read_job_json(nf_dir)
    if rec is None or rec.get("status") != "ok":
        return None, f"no target loss: {nf_dir.name} is {'missing' if rec is None else rec.get('status')}"
    if start_sha is not None and (rec.get("spec") or {}).get("start_sha256") != start_sha:
        return None, f"no target loss: {nf_dir.name} started from another pre-trained checkpoint"
    try:
        loss = json.loads(summary_path(nf_dir).read_text()).get("val_loss")
    except (OSError, ValueError, AttributeError):
        loss = None
    if num(loss) is None or loss <= 0:
        return None, f"no target loss: {nf_dir.name} has no final validation loss"
    return float(loss), None


def extension_overrides(
    job: Job, jobs_dir: Path, base_toml: str | Path, start_sha: str | None = None
) -> tuple[tuple[tuple[str, Any], ...], str | None]:
    """The overrides that extend ``job`` (see the module docstring) and a note when it cannot be extended."""
    if job.extend is None or job.method == NO_FREEZING:
        return (), None
    loss, why = target_loss(Path(jobs_dir), job, start_sha)
    if loss is None:
        return (), why
    steps = job_setting(job, base_toml, "training.steps")
    if not isinstance(steps, int) or steps < 1:
        return (), f"no extension: training.steps = {steps!r}"
    return (
        ("training.steps", math.ceil(job.extend * steps)),
        ("lr_scheduler.total_steps", steps),
        ("experiment.stop_at_val_loss", repr(loss)),  # the full float: a rounded target would move the finish line
    ), None
