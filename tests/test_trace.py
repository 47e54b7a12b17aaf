"""Trace loading/validation and node weights: every bad input is a one-line PlannerError naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from planner.errors import PlannerError
from planner.plan import plan_from_trace
from planner.trace.load import (
    TRACE_FORMAT,
    Trace,
    TraceMeta,
    load_trace,
    node_weights,
    rank_file_name,
    trace_from_records,
    validate_meta,
)
from planner.trace.synthetic import synthetic_meta


def good_meta() -> dict:
    return {
        "format": TRACE_FORMAT,
        "schedule": "GPipe",
        "pp_degree": 2,
        "num_stages": 2,
        "num_microbatches": 2,
        "stage_to_rank": [0, 1],
        "rank_orders": {"0": ["0F0", "0F1", "0B0", "0B1"], "1": ["1F0", "1F1", "1B0", "1B1"]},
    }


def records(order: list[str]) -> list[dict]:
    out = []
    for step, phase in ((1, "warmup"), (2, "upper"), (3, "upper"), (4, "upper"), (5, "lower"), (6, "lower")):
        for a in order:
            base = 1.0 if "F" in a else 4.0
            ms = base * (0.5 if phase == "lower" and "B" in a else 1.0) + 0.01 * step
            out.append({"step": step, "action": a, "ms": ms, "phase": phase, "freeze_ratio": 0.0})
    return out


def write_trace(root: Path, meta: dict, recs: dict[int, list[dict]] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps(meta))
    if recs is None:
        recs = {int(r): records(o) for r, o in meta["rank_orders"].items()}
    for r, rs in recs.items():
        (root / f"actions_rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rs) + "\n")
    return root


def test_valid_trace_loads_and_gives_weights(tmp_path) -> None:
    meta = good_meta() | {"writer": "future-version", "torch": "2.13.0"}
    root = write_trace(tmp_path / "t", meta)
    tr = load_trace(root)
    assert tr.meta.extra == {"writer": "future-version", "torch": "2.13.0"}
    assert tr.meta.to_json()["rank_orders"]["1"] == meta["rank_orders"]["1"]
    assert tr.meta.to_json()["format"] == TRACE_FORMAT
    assert len(tr.records) == 6 * 8 and {r.rank for r in tr.records} == {0, 1}
    w = node_weights(tr)
    assert w.w_max["0F0"] == pytest.approx(1.03)  # median of the upper steps 2, 3, 4
    assert w.w_min["0F0"] == w.w_max["0F0"]
    assert w.w_max["1B1"] == pytest.approx(4.03)
    assert w.w_min["1B1"] == pytest.approx(2.055)  # median of lower steps 5, 6
    assert w.freezable == {"0B0", "0B1", "1B0", "1B1"}
    plan = plan_from_trace(tr, 0.5)
    assert plan.batch_time_ms["all_frozen"] <= plan.batch_time_ms["planned"] <= plan.batch_time_ms["no_freeze"]


def test_w_min_clamped_to_w_max(tmp_path) -> None:
    recs = {int(r): records(o) for r, o in good_meta()["rank_orders"].items()}
    for x in recs[1]:
        if x["action"] == "1B0" and x["phase"] == "lower":
            x["ms"] = 99.0
    w = node_weights(load_trace(write_trace(tmp_path / "t", good_meta(), recs)))
    assert w.w_min["1B0"] == w.w_max["1B0"] and "1B0" not in w.freezable


def test_synthetic_split_meta_round_trips() -> None:
    m = synthetic_meta(4, 2, 4, True)
    again = validate_meta(m.to_json(), "mem")
    assert again.rank_orders == m.rank_orders and again.stage_to_rank == [0, 1, 2, 3, 3, 2, 1, 0]


def _meta_cases() -> list[tuple[str, dict, str]]:
    cases = []

    def case(name: str, msg: str, **changes) -> None:
        d = good_meta()
        for k, v in changes.items():
            if v is None:
                d.pop(k)
            else:
                d[k] = v
        cases.append((name, d, msg))

    case("no-format", "format", format=None)
    case("bad-format", "format", format="timelyfreeze-trace/2")
    case("missing", "pp_degree", pp_degree=None)
    case("type", "num_stages", num_stages="2")
    case("s2r-len", "stage_to_rank", stage_to_rank=[0])
    case("s2r-range", "stage_to_rank", stage_to_rank=[0, 2])
    ro = good_meta()["rank_orders"]
    case("bad-name", "0X0", rank_orders={"0": ["0F0", "0F1", "0X0", "0B1"], "1": ro["1"]})
    case("stage-range", "stage 2", rank_orders={"0": ro["0"] + ["2F0"], "1": ro["1"]})
    case("mb-range", "microbatch 5", rank_orders={"0": ro["0"] + ["0F5"], "1": ro["1"]})
    case("wrong-rank", "stage_to_rank", rank_orders={"0": ro["0"] + ["1F0"], "1": ro["1"][1:]})
    case("duplicate", "more than once", rank_orders={"0": ro["0"] + ["0F0"], "1": ro["1"]})
    case("missing-action", "stage 1 microbatch 1", rank_orders={"0": ro["0"], "1": ro["1"][:-1]})
    case("B-and-I", "stage 0 microbatch 1", rank_orders={"0": ["0F0", "0F1", "0B0", "0B1", "0I1"], "1": ro["1"]})
    case("I-without-W", "stage 0 microbatch 1", rank_orders={"0": ["0F0", "0F1", "0B0", "0I1"], "1": ro["1"]})
    case("bad-rank-key", "rank", rank_orders={"0": ro["0"], "x": ro["1"]})
    return cases


@pytest.mark.parametrize("name,meta,msg", _meta_cases(), ids=[c[0] for c in _meta_cases()])
def test_bad_meta(tmp_path, name: str, meta: dict, msg: str) -> None:
    root = write_trace(tmp_path / name, meta, recs={0: [], 1: []})
    with pytest.raises(PlannerError) as e:
        load_trace(root)
    text = str(e.value)
    assert "meta.json" in text and msg in text and "\n" not in text


def test_split_backward_meta_accepted() -> None:
    d = good_meta() | {
        "rank_orders": {"0": ["0F0", "0F1", "0I0", "0W0", "0B1"], "1": ["1F0", "1F1", "1I0", "1I1", "1W1", "1W0"]}
    }
    m = validate_meta(d, "x/meta.json")
    assert m.rank_orders[1][-1] == "1W0"


def test_missing_meta_and_bad_json(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(PlannerError, match=r"meta\.json: missing"):
        load_trace(tmp_path / "a")
    (tmp_path / "a" / "meta.json").write_text("{\n\n ,")
    with pytest.raises(PlannerError, match=r"meta\.json:3: invalid JSON"):
        load_trace(tmp_path / "a")


def test_missing_rank_file(tmp_path) -> None:
    root = write_trace(tmp_path / "t", good_meta())
    (root / "actions_rank1.jsonl").unlink()
    with pytest.raises(PlannerError, match=r"actions_rank1\.jsonl: missing"):
        load_trace(root)


def _line_cases() -> list[tuple[str, object, str]]:
    ok = {"step": 9, "action": "1F0", "ms": 1.0, "phase": "upper", "freeze_ratio": 0.0}
    return [
        ("bad-json", '{"step": 9,', "invalid JSON"),
        ("not-object", [1, 2], "JSON object"),
        ("missing-field", {k: v for k, v in ok.items() if k != "phase"}, "phase"),
        ("step-type", ok | {"step": "9"}, "step"),
        ("unknown-action", ok | {"action": "1Q0"}, "1Q0"),
        ("other-rank-action", ok | {"action": "0F0"}, "not in rank_orders"),
        ("nan-ms", ok | {"ms": float("nan")}, "ms"),
        ("inf-ms", ok | {"ms": float("inf")}, "ms"),
        ("negative-ms", ok | {"ms": -1.0}, "ms"),
        ("ms-type", ok | {"ms": "1.0"}, "ms"),
        ("ratio-range", ok | {"freeze_ratio": 1.5}, "freeze_ratio"),
        ("ratio-neg", ok | {"freeze_ratio": -0.1}, "freeze_ratio"),
        ("start-nan", ok | {"start_ms": float("nan")}, "field 'start_ms' must be a finite number"),
        ("start-type", ok | {"start_ms": "1.0"}, "start_ms"),
        ("start-null", ok | {"start_ms": None}, "start_ms"),
        ("start-bool", ok | {"start_ms": True}, "start_ms"),
    ]


@pytest.mark.parametrize("name,line,msg", _line_cases(), ids=[c[0] for c in _line_cases()])
def test_bad_record_names_file_and_line(tmp_path, name: str, line: object, msg: str) -> None:
    root = write_trace(tmp_path / name, good_meta())
    path = root / "actions_rank1.jsonl"
    lines = path.read_text().splitlines()
    text = line if isinstance(line, str) else json.dumps(line)
    lines.insert(4, text)  # becomes line 5
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PlannerError) as e:
        load_trace(root)
    assert "actions_rank1.jsonl:5:" in str(e.value) and msg in str(e.value) and "\n" not in str(e.value)


def test_weights_need_upper_and_lower_records(tmp_path) -> None:
    recs = {int(r): records(o) for r, o in good_meta()["rank_orders"].items()}
    recs[0] = [x for x in recs[0] if not (x["action"] == "0F1" and x["phase"] == "upper")]
    with pytest.raises(PlannerError, match=r"actions_rank0\.jsonl: action '0F1' has no record with phase 'upper'"):
        node_weights(load_trace(write_trace(tmp_path / "u", good_meta(), recs)))
    recs = {int(r): records(o) for r, o in good_meta()["rank_orders"].items()}
    recs[1] = [x for x in recs[1] if not (x["action"] == "1B1" and x["phase"] == "lower")]
    with pytest.raises(PlannerError, match=r"'1B1' has no record with phase 'lower'"):
        node_weights(load_trace(write_trace(tmp_path / "l", good_meta(), recs)))


def test_trace_from_records_in_memory() -> None:
    meta = good_meta()
    recs = {int(r): records(o) for r, o in meta["rank_orders"].items()}
    tr = trace_from_records(meta, recs, source="gathered")
    assert node_weights(tr).w_max["1F1"] == pytest.approx(1.03)
    bad = dict(recs)
    bad[0] = recs[0][:3] + [recs[0][3] | {"ms": -2.0}]
    with pytest.raises(PlannerError, match=r"gathered/actions_rank0\.jsonl:4: field 'ms'"):
        trace_from_records(meta, bad, source="gathered")
    with pytest.raises(PlannerError, match="rank 1"):
        trace_from_records(meta, {0: recs[0]}, source="gathered")


# ----------------------------------------------------------------------------- data-parallel replicas


def replica_records(order: list[str], scale: dict[str, float]) -> list[dict]:
    """``records(order)`` with each action's ms multiplied by ``scale.get(action, 1)``."""
    return [x | {"ms": x["ms"] * scale.get(x["action"], 1.0)} for x in records(order)]


# Replica 1 is slower on some actions, faster on others, and its 1B1 'lower' median exceeds its 'upper' one.
_SCALE1 = {"0F0": 1.5, "0B0": 0.5, "1B0": 1.3, "1F1": 0.8}


def two_replica_recs() -> dict[tuple[int, int], list[dict]]:
    ro = {int(r): o for r, o in good_meta()["rank_orders"].items()}
    recs = {(0, r): records(o) for r, o in ro.items()} | {(1, r): replica_records(o, _SCALE1) for r, o in ro.items()}
    for x in recs[1, 1]:
        if x["action"] == "1B1" and x["phase"] == "lower":
            x["ms"] = 50.0
    return recs


def write_replica_trace(root: Path, meta: dict, recs: dict[tuple[int, int], list[dict]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "meta.json").write_text(json.dumps(meta))
    for (d, r), rs in recs.items():
        (root / rank_file_name(r, d)).write_text("".join(json.dumps(x) + "\n" for x in rs))
    return root


def test_rank_file_name() -> None:
    assert rank_file_name(3) == rank_file_name(3, 0) == "actions_rank3.jsonl"
    assert rank_file_name(0, 1) == "actions_rank0_replica1.jsonl"
    assert rank_file_name(2, 7) == "actions_rank2_replica7.jsonl"


def test_two_replicas_round_trip(tmp_path) -> None:
    meta = good_meta() | {"replicas": 2, "writer": "x"}
    recs = two_replica_recs()
    root = write_replica_trace(tmp_path / "t", meta, recs)
    assert (root / "actions_rank1_replica1.jsonl").is_file()
    tr = load_trace(root)
    assert tr.meta.replicas == 2 and tr.meta.extra == {"writer": "x"}
    assert tr.meta.to_json() == meta
    assert {(x.replica, x.rank) for x in tr.records} == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert len(tr.records) == 4 * 6 * 4
    mem = trace_from_records(meta, recs, source=str(root))
    assert mem.records == tr.records  # same records, same order (replica, rank, line)
    # Int keys are replica 0.
    mixed = {0: recs[0, 0], 1: recs[0, 1], (1, 0): recs[1, 0], (1, 1): recs[1, 1]}
    assert trace_from_records(meta, mixed).records == tr.records
    assert node_weights(mem) == node_weights(tr)


def test_node_weights_are_per_action_max_over_replicas(tmp_path) -> None:
    recs = two_replica_recs()
    both = node_weights(trace_from_records(good_meta() | {"replicas": 2}, recs))
    single = [node_weights(trace_from_records(good_meta(), {r: recs[d, r] for r in (0, 1)})) for d in (0, 1)]
    for a in both.w_max:
        assert both.w_max[a] == max(w.w_max[a] for w in single)
        assert both.w_min[a] == max(w.w_min[a] for w in single)
        assert both.w_min[a] <= both.w_max[a]
    assert both.w_max["0F0"] == single[1].w_max["0F0"] > single[0].w_max["0F0"]  # replica 1 slower
    assert both.w_max["1F1"] == single[0].w_max["1F1"] > single[1].w_max["1F1"]  # replica 0 slower
    assert both.w_min["0B0"] == single[0].w_min["0B0"] > single[1].w_min["0B0"]
    assert single[1].w_min["1B1"] == single[1].w_max["1B1"]  # clamped within its replica
    trace = load_trace(write_replica_trace(tmp_path / "t", good_meta() | {"replicas": 2}, recs))
    plan = plan_from_trace(trace, 0.5, estimator="median")
    assert plan.actions["0F0"].w_max == both.w_max["0F0"]


def test_one_replica_with_or_without_field(tmp_path) -> None:
    plain = load_trace(write_trace(tmp_path / "a", good_meta()))
    with_field = load_trace(write_trace(tmp_path / "b", good_meta() | {"replicas": 1}))
    assert plain.meta.replicas == with_field.meta.replicas == 1
    assert "replicas" not in with_field.meta.extra and "replicas" not in with_field.meta.to_json()
    assert with_field.meta.to_json() == plain.meta.to_json() == good_meta()
    assert node_weights(with_field) == node_weights(plain)
    assert {x.replica for x in plain.records} == {0}


def test_trace_meta_replicas_attribute() -> None:
    m = TraceMeta("GPipe", 1, 1, 1, [0], {0: ["0F0", "0B0"]}, {"a": 1})  # positional, as before
    assert m.replicas == 1 and "replicas" not in m.to_json()
    m2 = TraceMeta("GPipe", 1, 1, 1, [0], {0: ["0F0", "0B0"]}, {"a": 1}, 3)
    assert m2.to_json()["replicas"] == 3 and validate_meta(m2.to_json(), "m").replicas == 3
    moved = TraceMeta("GPipe", 1, 1, 1, [0], {0: ["0F0", "0B0"]}, extra={"a": 1, "replicas": 2})
    assert moved.replicas == 2 and moved.extra == {"a": 1}
    with pytest.raises(ValueError):
        TraceMeta("GPipe", 1, 1, 1, [0], {0: ["0F0", "0B0"]}, replicas=0)


def test_missing_replica_file(tmp_path) -> None:
    root = write_replica_trace(tmp_path / "t", good_meta() | {"replicas": 2}, two_replica_recs())
    (root / "actions_rank1_replica1.jsonl").unlink()
    with pytest.raises(
        PlannerError,
        match=r"actions_rank1_replica1\.jsonl: missing \(pp_degree=2, replicas=2 "
        r"need one file per rank and replica\)",
    ):
        load_trace(root)


@pytest.mark.parametrize("value", [0, -1, "2", 2.0, True, None, [2]])
def test_bad_replicas_value(tmp_path, value) -> None:
    root = write_trace(tmp_path / "t", good_meta() | {"replicas": value})
    with pytest.raises(PlannerError) as e:
        load_trace(root)
    assert str(e.value) == f"{root / 'meta.json'}: field 'replicas' must be a positive integer, got {value!r}"
    with pytest.raises(PlannerError, match="field 'replicas' must be a positive integer"):
        trace_from_records(good_meta() | {"replicas": value}, {0: [], 1: []})


def test_bad_replica_record_names_replica_file(tmp_path) -> None:
    recs = two_replica_recs()
    recs[1, 0][2] = recs[1, 0][2] | {"ms": -1.0}
    with pytest.raises(PlannerError, match=r"actions_rank0_replica1\.jsonl:3: field 'ms'"):
        load_trace(write_replica_trace(tmp_path / "t", good_meta() | {"replicas": 2}, recs))
    with pytest.raises(PlannerError, match=r"^g/actions_rank0_replica1\.jsonl:3: field 'ms'"):
        trace_from_records(good_meta() | {"replicas": 2}, recs, source="g")


@pytest.mark.parametrize(
    "key, needle",
    [
        ((2, 0), "replica 2 rank 0"),
        ((0, 2), "replica 0 rank 2"),
        ((-1, 0), "replica -1 rank 0"),
        (2, "rank 2"),
        ("0", "'0'"),
        ((0,), "(0,)"),
        ((0, 1, 0), "(0, 1, 0)"),
        ((True, 3), "(True, 3)"),
    ],
)
def test_replica_key_out_of_range(key, needle) -> None:
    recs: dict = dict(two_replica_recs())
    recs[key] = []
    with pytest.raises(PlannerError) as e:
        trace_from_records(good_meta() | {"replicas": 2}, recs, source="g")
    assert str(e.value).startswith("g: records given for") and needle in str(e.value)


def test_replica_keys_missing_or_twice() -> None:
    recs = two_replica_recs()
    meta = good_meta() | {"replicas": 2}
    with pytest.raises(PlannerError, match=r"^g/actions_rank1_replica1\.jsonl: no records for rank 1 of replica 1$"):
        trace_from_records(meta, {k: v for k, v in recs.items() if k != (1, 1)}, source="g")
    with pytest.raises(PlannerError, match=r"^g: records for replica 0 rank 1 given twice"):
        trace_from_records(meta, {1: recs[0, 1], **recs}, source="g")
    # A single-replica trace rejects replica 1's records.
    with pytest.raises(PlannerError, match="replica 1 rank 0"):
        trace_from_records(good_meta(), recs, source="g")


def test_replica_weights_need_records_in_every_replica() -> None:
    recs = two_replica_recs()
    recs[1, 0] = [x for x in recs[1, 0] if not (x["action"] == "0B1" and x["phase"] == "lower")]
    with pytest.raises(
        PlannerError,
        match=r"actions_rank0_replica1\.jsonl: action '0B1' has no record with "
        r"phase 'lower'",
    ):
        node_weights(trace_from_records(good_meta() | {"replicas": 2}, recs, source="g"))
    recs = two_replica_recs()
    recs[1, 1] = [x for x in recs[1, 1] if not (x["action"] == "1F0" and x["phase"] == "upper")]
    with pytest.raises(
        PlannerError,
        match=r"actions_rank1_replica1\.jsonl: action '1F0' has no record with "
        r"phase 'upper'",
    ):
        node_weights(trace_from_records(good_meta() | {"replicas": 2}, recs, source="g"))


# ----------------------------------------------------------------------- start times and hosts (planner.timing.comm)


def test_start_ms_and_hosts_are_optional_and_kept(tmp_path) -> None:
    meta = good_meta() | {"hosts": ["node-a", "node-a"]}
    recs = {
        int(r): [x | {"start_ms": 100.0 * x["step"] + i} for i, x in enumerate(records(o))]
        for r, o in meta["rank_orders"].items()
    }
    recs[1][0]["start_ms"] = -5  # any finite number (an int too) on the monotonic clock
    tr = load_trace(write_trace(tmp_path / "t", meta, recs))
    assert tr.meta.hosts == ["node-a", "node-a"] and tr.meta.to_json() == meta
    assert tr.records[0].start_ms == 100.0 and isinstance(tr.records[0].start_ms, float)
    assert [r for r in tr.records if r.rank == 1][0].start_ms == -5.0
    plain = load_trace(write_trace(tmp_path / "p", good_meta()))
    assert plain.meta.hosts is None and {r.start_ms for r in plain.records} == {None}
    assert node_weights(tr) == node_weights(plain)  # start times do not change the node weights


@pytest.mark.parametrize("value", [["a"], ["a", "b", "c"], "ab", ["a", 1], None, {"0": "a", "1": "b"}])
def test_bad_hosts_value(tmp_path, value) -> None:
    root = write_trace(tmp_path / "t", good_meta() | {"hosts": value})
    with pytest.raises(PlannerError) as e:
        load_trace(root)
    assert str(e.value) == (
        f"{root / 'meta.json'}: field 'hosts' must be a list of pp_degree=2 clock-id strings, got {value!r}"
    )


def test_fast_and_line_by_line_loading_agree(tmp_path, monkeypatch) -> None:
    """load_trace parses a well-formed file in one pass (``_fast_block``); the line-by-line path gives the
    same records, and odd but valid lines (blank, indented, trailing spaces, ints for floats) load either way."""
    import planner.trace.load as trace_mod

    recs = {int(r): records(o) for r, o in good_meta()["rank_orders"].items()}
    recs[0][1] = recs[0][1] | {"ms": 3, "start_ms": 12}
    root = write_trace(tmp_path / "t", good_meta(), recs)
    path = root / "actions_rank1.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = "   " + lines[2] + "  "
    lines.insert(3, "")
    path.write_text("\n".join(lines) + "\n")
    loaded = load_trace(root)
    fast = loaded.records
    monkeypatch.setattr(trace_mod, "_fast_block", lambda *a: None)
    slow_trace = load_trace(root)
    slow = slow_trace.records
    assert fast == slow and len(fast) == sum(len(v) for v in recs.values())
    assert fast[1].ms == 3.0 and fast[1].start_ms == 12.0
    # a well-formed trace is read into columns (planner.trace.columns), odd but valid lines included, and its
    # records are built from them when asked; both are those built from the records afterwards (a file read line
    # by line gives the records, and the columns follow from them)
    from planner.trace.columns import columns

    monkeypatch.undo()
    assert getattr(loaded, "_columns", None) is not None and getattr(slow_trace, "_columns", None) is None
    clean = load_trace(write_trace(tmp_path / "clean", good_meta(), recs))
    assert getattr(clean, "_columns", None) is not None
    assert clean._records is None  # no Record until one is asked for
    a, b = columns(clean), columns(Trace(clean.meta, clean.records, clean.source))
    assert a.names == b.names and a.phases == b.phases and a.kinds == b.kinds
    for field in ("action", "phase", "step", "ms", "replica", "rank", "freeze_ratio", "stage", "kind"):
        assert getattr(a, field).tolist() == getattr(b, field).tolist(), field
    assert np.array_equal(a.start_ms, b.start_ms, equal_nan=True)
    monkeypatch.setattr(trace_mod, "_fast_block", lambda *a: None)
    assert clean.records == load_trace(clean.source).records  # built from the columns = checked line by line
    assert all(type(x.ms) is float and type(x.step) is int for x in clean.records)


_GOOD_LINE = '{"step": 9, "action": "1F0", "ms": 1.5, "phase": "upper", "freeze_ratio": 0.25}'


@pytest.mark.parametrize(
    "line",
    [
        _GOOD_LINE.replace("}", ', "start_ms": null}'),
        _GOOD_LINE.replace("}", ', "start_ms": NaN}'),
        _GOOD_LINE.replace("}", ', "start_ms": Infinity}'),
        _GOOD_LINE.replace("9", "true"),
        _GOOD_LINE.replace("9", "9.0"),
        _GOOD_LINE.replace("9", str(2**70)),
        _GOOD_LINE.replace("1.5", '"1.5"'),
        _GOOD_LINE.replace("1.5", "-1.5"),
        _GOOD_LINE.replace("1.5", "NaN"),
        _GOOD_LINE.replace("1.5", "false"),
        _GOOD_LINE.replace("0.25", "1.25"),
        _GOOD_LINE.replace("0.25", "NaN"),
        _GOOD_LINE.replace('"upper"', '""'),
        _GOOD_LINE.replace('"upper"', "1"),
        _GOOD_LINE.replace('"1F0"', '"0F0"'),
        _GOOD_LINE.replace('"step": 9, ', ""),
        _GOOD_LINE + ", " + _GOOD_LINE,
        "[" + _GOOD_LINE + "]",
        "7",
        _GOOD_LINE[:-1],
    ],
)
def test_the_fast_reader_leaves_every_odd_line_to_the_line_by_line_check(line) -> None:
    """``_fast_block`` reads a file only when every line is what the runtime writes; at any doubt it returns None
    and grows no phase, so the line-by-line check names the problem or reads the odd but valid line."""
    from planner.trace.load import _fast_block

    phases = {"warmup": 0}
    assert _fast_block([_GOOD_LINE, line], 1, {"1F0": 4, "1F1": 5}, 0, phases) is None
    assert phases == {"warmup": 0}


def test_the_fast_reader_gives_each_field_as_written() -> None:
    from planner.trace.load import _fast_block

    phases = {"warmup": 0}
    lines = ["", _GOOD_LINE, "  ", _GOOD_LINE.replace("}", ', "start_ms": 12}').replace('"1F0"', '"1F1"')]
    got = _fast_block(lines, 1, {"1F0": 4, "1F1": 5}, 2, phases)
    assert phases == {"warmup": 0, "upper": 1}
    action, phase, step, ms, replica, rank, fr, start = (x.tolist() for x in got)
    assert (action, phase, step, ms, replica, rank, fr) == (
        [4, 5],
        [1, 1],
        [9, 9],
        [1.5, 1.5],
        [2, 2],
        [1, 1],
        [0.25] * 2,
    )
    assert np.isnan(start[0]) and start[1] == 12.0
    assert [x.dtype.kind for x in got] == ["i", "i", "i", "f", "i", "i", "f", "f"]


@pytest.mark.parametrize(
    "text,msg",
    [
        ('{"step": 9, "action": "1F0", "ms": 1.0, "phase": "upper", "freeze_ratio": 0.0} {"step": 9}', "invalid JSON"),
        # two values joined by a comma: read as one JSON array, the file would have one record too many
        ('{"step": 9, "action": "1F0", "ms": 1.0, "phase": "upper", "freeze_ratio": 0.0}, {"step": 9}', "invalid JSON"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_two_values_on_a_line_or_bad_bytes(tmp_path, text, msg) -> None:
    root = write_trace(tmp_path / "t", good_meta())
    path = root / "actions_rank1.jsonl"
    if isinstance(text, bytes):
        path.write_bytes(path.read_bytes() + text)
    else:
        path.write_text(path.read_text() + text + "\n")
    with pytest.raises(PlannerError, match=msg) as e:
        load_trace(root)
    assert "actions_rank1.jsonl" in str(e.value)


def test_a_trace_line_is_the_json_of_its_record():
    """``ActionRecord.to_line`` (the trace writer's line) is ``json.dumps`` of ``to_json``, character for character."""
    import json
    import math
    import random

    from timelyfreeze.hooks.profiler import ActionRecord

    rng = random.Random(5)
    odd = [0.0, -0.0, 1e-7, 123456789.123456789, 1e300, math.inf, -math.inf, math.nan, 2, 5e-324]
    for _ in range(3000):
        rec = ActionRecord(
            step=rng.choice((1, 7, 10**9)),
            action=rng.choice(("0F1", "12W511", "(1F2;3B4)", 'a"b\\c', "é")),
            ms=rng.choice(odd + [rng.random() * 1e3]),
            phase=rng.choice(("stable", "lower", "ramp")),
            freeze_ratio=rng.choice(odd + [rng.random()]),
            frozen_tensors=rng.choice((None, 0, 23)),
            start_ms=rng.choice((None, rng.random() * 1e9) + tuple(odd)),
        )
        assert rec.to_line() == json.dumps(rec.to_json())


def test_a_trace_line_is_the_json_of_its_record_at_the_fast_forms_bounds():
    """The direct line's numbers at and beside the bounds of their fixed-format form (1e-4, the 15-digit limits, the
    rounding to zero), and at random magnitudes, against ``json.dumps``."""
    import json
    import math
    import random

    from timelyfreeze.hooks.profiler import ActionRecord

    rng = random.Random(6)
    edges = [1e-4, 9.99999e-5, 1.00001e-4, 5e-7, 4.9e-7, 5.1e-7, 9.5e-7, 0.0000005, 1e9, 999999999.9999995, 1e12]
    edges += [999999999999.9995, 0.1 + 0.2, 2.675, 1.0000005, 0.5e-6, 123.4565, 1e16, 1 / 3, 2 / 3]
    for _ in range(20000):
        x = rng.choice(edges) if rng.random() < 0.3 else 10 ** rng.uniform(-8, 13) * rng.choice((1, 1, 1.0 / 3))
        x = math.nextafter(x, rng.choice((0.0, math.inf))) if rng.random() < 0.3 else x
        x = -x if rng.random() < 0.2 else x
        rec = ActionRecord(7, "0F1", x, "stable", x if rng.random() < 0.5 else 0.0, None, x)
        assert rec.to_line() == json.dumps(rec.to_json()), x
