"""docs/formats.md stays in step with the validators: every field they check is documented (as checked)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planner import plan as plan_mod
from planner.schedule import meta as meta_mod
from planner.trace import load as trace_mod
from planner.trace.simulate import synthetic_trace, write_trace

DOC = Path(__file__).resolve().parent.parent / "docs" / "formats.md"
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|.*\|\s*([^|]*?)\s*\|\s*$")


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def table(doc: str, heading: str) -> dict[str, bool]:
    """``{field: checked}`` of the first table under the heading line ``heading`` (rows whose first cell is
    one backticked name; ``checked`` is the last cell starting with ``yes``)."""
    lines = doc.splitlines()
    assert heading in lines, f"docs/formats.md has no heading {heading!r}"
    out: dict[str, bool] = {}
    for line in lines[lines.index(heading) + 1 :]:
        if line.startswith("#"):
            break
        m = _ROW.match(line)
        if m:
            out[m.group(1)] = m.group(2).startswith("yes")
        elif out and not line.startswith("|"):
            break  # end of the first table
    assert out, f"no field table under {heading!r}"
    return out


def checked(fields: tuple[str, ...], *, with_format: bool = False) -> set[str]:
    return set(fields) | ({"format"} if with_format else set())


def test_versions_and_backticked_fields(doc: str) -> None:
    assert trace_mod.TRACE_FORMAT == "timelyfreeze-trace/1" and plan_mod.PLAN_FORMAT == "timelyfreeze-plan/1"
    for version in (trace_mod.TRACE_FORMAT, plan_mod.PLAN_FORMAT):
        assert version in doc
    fields = (
        meta_mod._META_FIELDS
        + meta_mod._OPTIONAL_META_FIELDS
        + trace_mod._RECORD_FIELDS
        + trace_mod._OPTIONAL_RECORD_FIELDS
        + plan_mod._PLAN_FIELDS
        + plan_mod._ACTION_FIELDS
        + plan_mod._BATCH_TIME_FIELDS
        + plan_mod._SOLVER_FIELDS
        + ("format",)
    )
    for name in fields:
        assert f"`{name}`" in doc, f"docs/formats.md does not mention `{name}`"


@pytest.mark.parametrize(
    "heading,fields",
    [
        ("### `meta.json`", checked(meta_mod._META_FIELDS + meta_mod._OPTIONAL_META_FIELDS, with_format=True)),
        ("### `actions_rank<r>.jsonl`", checked(trace_mod._RECORD_FIELDS + trace_mod._OPTIONAL_RECORD_FIELDS)),
        ("### `plan.json`", checked(plan_mod._PLAN_FIELDS, with_format=True)),
        ("### `plan.json`: `batch_time_ms`", checked(plan_mod._BATCH_TIME_FIELDS)),
        ("### `plan.json`: `actions.<action>`", checked(plan_mod._ACTION_FIELDS)),
        ("### `plan.json`: `solver`", checked(plan_mod._SOLVER_FIELDS)),
    ],
)
def test_tables_mark_exactly_the_validated_fields(doc: str, heading: str, fields: set[str]) -> None:
    rows = table(doc, heading)
    assert {f for f, yes in rows.items() if yes} == fields


def test_runtime_extras_documented_as_unchecked(doc: str) -> None:
    meta = table(doc, "### `meta.json`")
    assert meta.get("freezable_tensors") is False and meta.get("method") is False
    assert table(doc, "### `actions_rank<r>.jsonl`").get("frozen_tensors") is False
    assert "docs/run-outputs.md" in doc and (DOC.parent / "run-outputs.md").is_file()


def test_communication_delays_documented(doc: str) -> None:
    from planner.timing.comm import summarize

    assert "### Communication delays on cross-rank edges (`planner.timing.comm`)" in doc.splitlines()
    assert table(doc, "### `plan.json`").get("comm") is False
    assert table(doc, "### `actions_rank<r>.jsonl`").get("start_ms") is True
    assert table(doc, "### `meta.json`").get("hosts") is True
    assert "--no-comm" in doc
    for key in summarize({("0F0", "1F0"): 1.0}):
        assert f'"{key}"' in doc, key


def test_budgets_documented(doc: str) -> None:
    """Per-stage ``r_max`` (checked) and the writer's ``budget_sensitivity`` (unchecked) are documented; a
    plan the writer makes uses only documented top-level fields."""
    from planner.plan import SENSITIVITY_FIELD, make_plan
    from planner.trace.load import node_weights

    rows = table(doc, "### `plan.json`")
    assert rows.get("r_max") is True and rows.get(SENSITIVITY_FIELD) is False
    assert "### Budget sensitivity (`budget_sensitivity`)" in doc.splitlines()
    assert "--r-max 0.5,0.8,0.8,0.6" in doc and "dual_s * n_s * 0.01" in doc
    tr = synthetic_trace("1F1B", 2, 4)
    plan = make_plan(tr.meta, node_weights(tr), [0.5, 0.8]).to_json()
    assert set(plan) <= set(rows) and plan["r_max"] == [0.5, 0.8] and SENSITIVITY_FIELD in plan


@pytest.mark.parametrize("schedule,pp,mb", [("1F1B", 2, 4), ("ZBVZeroBubble", 2, 4)])
def test_synthetic_trace_uses_only_documented_fields(doc: str, tmp_path, schedule: str, pp: int, mb: int) -> None:
    root = Path(write_trace(synthetic_trace(schedule, pp, mb, stable_ratio=0.5), tmp_path / "t"))
    meta = json.loads((root / trace_mod.META_FILE).read_text())
    assert set(meta) <= set(table(doc, "### `meta.json`"))
    assert meta["format"] == trace_mod.TRACE_FORMAT
    record_fields = set(table(doc, "### `actions_rank<r>.jsonl`"))
    for r in range(pp):
        for line in (root / trace_mod.rank_file_name(r)).read_text().splitlines():
            assert set(json.loads(line)) <= record_fields
    trace_mod.load_trace(root)  # and the validator accepts it
