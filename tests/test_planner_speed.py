"""The planner's speed-ups (issue 48 item 4) leave every plan as it was.

``tests/data/planner_golden.json`` holds what the planner wrote before them (commit d8e8f8a): the whole plan
of the committed measured trace (``docs/results/planner/measured/Interleaved1F1B``: start times, so
communication delays, gaps, several monitoring steps, jitter residuals) and the digest of the bounded region
method's plan of a small synthetic ZBV trace.  Regenerate (only for a change that means to change plans) with
``PYTHONPATH=<a checkout's root> python tests/test_planner_speed.py --write``.

The numpy longest paths (:func:`planner.schedule.dag.farthest`, one DAG level at a time) are checked bit for
bit against the loop over the topological order they replace.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from planner.cli import main as planner_main
from planner.plan import plan_from_trace
from planner.schedule.actions import parse_action
from planner.schedule.dag import build_dag, indexed_longest_path
from planner.timing import monitor
from planner.trace.load import load_trace
from planner.trace.simulate import synthetic_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "planner_golden.json"
MEASURED = ROOT / "docs" / "results" / "planner" / "measured" / "Interleaved1F1B"
SWITCHES = {"estimator": "pooled", "comm": True, "gaps": True, "anchor": True, "jitter": True, "cliff": True}
"""Every switch named (not the defaults of the day), so the golden plans stay those of one configuration."""


def _comparable(plan_json: dict) -> dict:
    """A plan file's content without what may differ between two runs of one plan: the solver's seconds."""
    d = json.loads(json.dumps(plan_json))
    d["solver"].pop("seconds")
    return d


def _digest(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def _zbv_trace():
    rng = random.Random(7)
    scale = [round(rng.uniform(0.6, 1.4), 4) for _ in range(8)]
    return synthetic_trace("ZBVZeroBubble", 4, 16, stage_scale=scale, jitter=0.05, seed=7, steps=3)


def _zbv_region_plan(gap: float) -> dict:
    """The region method (bounded for ``gap > 0``) forced on the small ZBV trace (no fallback to the whole LP)."""
    import planner.lp.region as region

    old = region._REGION_MAX_FRACTION
    region._REGION_MAX_FRACTION = 1.0
    try:
        plan = plan_from_trace(_zbv_trace(), 0.5, solver="region", gap=gap, **SWITCHES)
    finally:
        region._REGION_MAX_FRACTION = old
    return _comparable(plan.to_json())


def _golden_now() -> dict:
    measured = plan_from_trace(load_trace(MEASURED), 0.5, **SWITCHES)
    zbv = _zbv_region_plan(1e-3)
    return {
        "measured_interleaved_r0.5": _comparable(measured.to_json()),
        "zbv_4x16_region_gap1e-3": {
            "digest": _digest(zbv),
            "batch_time_ms": zbv["batch_time_ms"],
            "method": zbv["solver"]["method"],
        },
    }


def test_plans_are_those_written_before_the_speed_ups() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = _golden_now()
    assert now["measured_interleaved_r0.5"] == golden["measured_interleaved_r0.5"]
    assert now["zbv_4x16_region_gap1e-3"] == golden["zbv_4x16_region_gap1e-3"]


def test_the_cli_writes_the_golden_plan(tmp_path, capsys) -> None:
    out = tmp_path / "plan.json"
    from planner.defaults import PLAN_DEFAULTS

    assert all(PLAN_DEFAULTS[k] for k in ("comm", "gaps", "anchor", "jitter")), "the CLI's switches changed"
    flags = ["--estimator", "pooled"] + ([] if PLAN_DEFAULTS["cliff"] else ["--cliff"])
    assert planner_main(["plan", str(MEASURED), "--r-max", "0.5", "--out", str(out), *flags]) == 0
    written = _comparable(json.loads(out.read_text()))
    assert written == json.loads(GOLDEN.read_text())["measured_interleaved_r0.5"]
    assert f"wrote {out}" in capsys.readouterr().out


def test_region_plans_against_the_whole_lp_optimum() -> None:
    """The exact region method's plan is the whole LP's; the bounded one is within its gap of it."""
    whole = plan_from_trace(_zbv_trace(), 0.5, solver="whole", **SWITCHES)
    exact = _zbv_region_plan(0.0)
    bounded = _zbv_region_plan(1e-3)
    t_star = whole.batch_time_ms["planned"]
    assert exact["batch_time_ms"]["planned"] == pytest.approx(t_star, rel=1e-9)
    assert t_star * (1 - 1e-9) <= bounded["batch_time_ms"]["planned"] <= t_star * (1 + 1e-3)
    assert bounded["solver"]["lower_bound_ms"] <= t_star * (1 + 1e-9)


def _loop_farthest(order, ptr, nbr, w, delay=None, floor=0.0):
    """The loop the numpy passes replaced: every node after its neighbours, a running maximum from ``floor``."""
    val = [0.0] * len(w)
    for x in order:
        lo, hi = ptr[x], ptr[x + 1]
        if lo == hi:
            continue
        b = floor
        for k in range(lo, hi):
            t = val[nbr[k]] + w[nbr[k]]
            if delay is not None:
                t += delay[k]
            if t > b:
                b = t
        val[x] = b
    return val


@pytest.mark.parametrize("small", [True, False], ids=["node-loop", "level-passes"])
@pytest.mark.parametrize("seed", range(6))
def test_level_passes_are_the_topological_loop_bit_for_bit(seed: int, small: bool, monkeypatch) -> None:
    """Both of ``farthest``'s forms: the numpy level passes (a DAG above ``LOOP_NODES``) and the node loop."""
    from planner.schedule import dag as dag_module
    from planner.schedule.dag import farthest, layers

    if not small:
        monkeypatch.setattr(dag_module, "LOOP_NODES", 0)

    rng = np.random.default_rng(seed)
    n = 300
    perm = rng.permutation(n)  # a random DAG: edges from lower to higher position of perm
    src, dst = [], []
    for _ in range(900):
        a, b = sorted(rng.choice(n, 2, replace=False))
        src.append(perm[a])
        dst.append(perm[b])
    src, dst = np.asarray(src), np.asarray(dst)
    by = np.argsort(dst, kind="stable")
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    nbr = src[by]
    order = perm.tolist()
    w = rng.random(n) * 10
    delay = rng.random(nbr.size) if seed % 2 else None
    lay = layers(ptr, nbr, order)
    depth = [0] * n  # the most edges on a path to each node: its level
    for x in order:
        depth[x] = max((depth[y] + 1 for y in nbr[ptr[x] : ptr[x + 1]].tolist()), default=0)
    assert [nodes.tolist() for _, _, nodes, _ in lay.levels] == [
        [x for x in range(n) if depth[x] == k] for k in range(max(depth) + 1)
    ]
    for floor in (0.0, -1.0):
        want = _loop_farthest(
            order, ptr.tolist(), nbr.tolist(), w.tolist(), None if delay is None else delay.tolist(), floor
        )
        got = farthest(lay, w, delay, floor)
        assert got.tolist() == want
        assert (lay.steps is not None) == small  # the form that ran
    w[int(rng.integers(n))] = np.inf  # not finite: the level passes, on a small DAG too
    want = _loop_farthest(order, ptr.tolist(), nbr.tolist(), w.tolist(), None if delay is None else delay.tolist())
    assert farthest(lay, w, delay).tolist() == want


def test_critical_path_is_the_first_predecessor_that_sets_each_start() -> None:
    """Ties (equal durations everywhere) are where the choice shows: the loop kept the first maximum."""
    trace = _zbv_trace()
    dag = build_dag(trace.meta)
    di = dag.index
    dur = {a: 1.0 for a in trace.meta.all_actions()}
    makespan, starts, path = indexed_longest_path(di, dur, None)
    names, ptr, preds = di.names, di.pred_ptr.tolist(), di.pred_idx.tolist()
    start = [starts[a] for a in names]
    d = [0.0 if a in ("source", "sink") else 1.0 for a in names]
    want, v = [], names.index("sink")
    while True:
        best, bu = -1.0, -1
        for u in preds[ptr[v] : ptr[v + 1]]:
            if start[u] + d[u] > best:
                best, bu = start[u] + d[u], u
        if bu < 0 or names[bu] == "source":
            break
        want.append(names[bu])
        v = bu
    assert path == want[::-1] and makespan == len(path)


def test_an_action_name_is_parsed_once() -> None:
    assert parse_action("3W7") is parse_action("3W7")


class _CountingList(list):
    iterations = 0

    def __iter__(self):
        type(self).iterations += 1
        return super().__iter__()


def test_planning_a_loaded_trace_without_start_times_builds_no_record(tmp_path) -> None:
    """A well-formed trace is read into columns, and every default planning step reads those: its records (an
    object per line, most of a 100k-action load) are built only when asked for, and are then the same."""
    tr = _zbv_trace()
    loaded = load_trace(write_trace(tr, tmp_path / "t"))
    plan_from_trace(loaded, 0.5, **SWITCHES)
    assert loaded._records is None and not loaded.has_start_times()
    assert loaded.records == tr.records


def test_the_monitoring_summary_reads_the_records_once() -> None:
    trace = _zbv_trace()
    trace.records = _CountingList(trace.records)
    _CountingList.iterations = 0
    monitor.monitoring_summary(trace, True)
    assert _CountingList.iterations == 1


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    GOLDEN.write_text(json.dumps(_golden_now(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")


def test_the_dag_is_the_graph_networkx_builds_from_its_nodes_and_edges() -> None:
    """build_dag fills the graph's dicts itself: the same graph as networkx's own add_* calls, in order."""
    import networkx as nx

    g = build_dag(_zbv_trace().meta)
    ref = nx.DiGraph()
    ref.add_nodes_from(g.nodes(data=True))
    ref.add_edges_from(g.edges)
    assert list(ref.nodes(data=True)) == list(g.nodes(data=True)) and list(ref.edges) == list(g.edges)
    assert all(set(ref.pred[x]) == set(g.pred[x]) for x in g.nodes)
    assert all(g.succ[u][v] is g.pred[v][u] for u, v in g.edges)
    assert nx.is_directed_acyclic_graph(g) and nx.is_frozen(g)


def test_the_cli_runs_a_command_without_the_cyclic_collector_and_restores_it(monkeypatch, tmp_path) -> None:
    import gc

    import planner.cli as cli

    seen = []
    monkeypatch.setitem(cli._COMMANDS, "plan", lambda args: seen.append(gc.isenabled()))
    assert gc.isenabled()
    assert cli.main(["plan", str(MEASURED), "--r-max", "0.5", "--out", str(tmp_path / "p.json")]) == 0
    assert seen == [False] and gc.isenabled()


def test_one_line_members_are_what_the_json_encoder_writes() -> None:
    """The plan file's per-action lines come from a template of float reprs: the encoder's own text, and the
    encoder itself for anything else (ints, non-finite numbers, other keys, nested values)."""
    from planner.fileio import _members

    enc = json.JSONEncoder().encode
    rng = random.Random(3)
    floats = [0.0, -0.0, 1e-310, 5e-324, 1e22, 1.5e16, -2.25, 0.1, 1 / 3, 123456.789]
    mapping = {f"{i}B{i}": {k: rng.choice(floats) for k in ("w_min", "w_max", "start")} for i in range(20)}
    mapping |= {
        "ints": {"a": 1, "b": 2.0},
        "inf": {"a": float("inf")},
        "overflowing sum": {"a": 1e308, "b": 1e308},
        "nan": {"a": float("nan")},
        "nested": {"a": {"b": 1.0}},
        "odd keys": {"1%s": 1.0, 'é"\\': 2.0},
        "empty": {},
        "list": [1.0, 2.0],
        "(0F3;3B1)OVERLAP_F_B": {"w_min": 1.0},
    }
    assert list(_members(mapping)) == [f"  {enc(k)}: {enc(v)}" for k, v in mapping.items()]


@pytest.mark.parametrize(
    "odd",
    [None, 1, float("inf"), float("nan"), True, "1.0"],
)
def test_plan_rows_are_written_as_their_dicts_would_be(odd) -> None:
    """A plan's actions go to the file as rows (``Rows``), formatted from one template when every value is a finite
    float; the text is what ``_members`` writes for the same dicts, and ``_members`` itself where a value is not."""
    from planner.fileio import Rows, _members, _row_members

    rng = random.Random(5)
    floats = [0.0, -0.0, 1e-310, 5e-324, 1e22, 1.5e16, -2.25, 0.1, 1 / 3, 123456.789, 1e308]
    fields = ("w_min", "w_max", "start", "duration", "freeze_ratio")
    keys = [f"{i}B{i}" for i in range(30)] + ["(0F3;3B1)OVERLAP_F_B", 'é"\\%s']
    rows = [tuple(rng.choice(floats) for _ in fields) for _ in keys]
    if odd is not None:
        rows[7] = (*rows[7][:2], odd, *rows[7][3:])
    got = Rows(keys, fields, rows)
    assert list(_row_members(got)) == list(_members(got.as_dict()))
    assert list(_row_members(Rows(keys, ("a%s", *fields[1:]), rows))) == list(
        _members(Rows(keys, ("a%s", *fields[1:]), rows).as_dict())
    )


def test_action_fields_are_parse_actions_fields_for_every_name() -> None:
    """The one reader of many action names: plain_fields' scan where it can vouch for every name, parse_action's
    fields otherwise (pairs, non-canonical names), and parse_action's error on a bad one."""
    from planner.schedule.actions import action_fields

    for names in (["0F0", "12B345", "3I7"], ["0F0", "(0F3;3B1)OVERLAP_F_B", "007W1"]):
        stage, kind, mb = action_fields(names)
        assert list(zip(stage, kind, mb)) == [(a.stage, a.kind, a.microbatch) for a in map(parse_action, names)]
    with pytest.raises(ValueError, match="not an action name: '0X0'"):
        action_fields(["0F0", "0X0"])


def test_plain_fields_are_parse_actions_fields_or_none() -> None:
    """The bulk reader of action names gives parse_action's fields for canonical plain names, and None for
    anything it cannot vouch for (parse_action then decides, name by name)."""
    from planner.schedule.actions import plain_fields

    names = ["0F0", "12B345", "3I7", "3W7", "10F0"]
    stage, kind, mb = plain_fields(names)
    assert [(s, k, m) for s, k, m in zip(stage, kind, mb)] == [
        (a.stage, a.kind, a.microbatch) for a in map(parse_action, names)
    ]
    for bad in ([], ["01F0"], ["1F01"], ["(0F3;3B1)OVERLAP_F_B"], ["1F0\n1B0", "x"], ["1F0", ""], ["1X0"], ["１F0"]):
        assert plain_fields(bad) is None, bad


def test_the_array_check_of_rank_orders_agrees_with_the_loop() -> None:
    """validate_meta checks plain names over arrays; wherever that check passes, the loop passes too, and wherever
    the loop finds a problem, the array check does not pass (so the loop names it)."""
    from planner.errors import PlannerError
    from planner.schedule.actions import plain_fields
    from planner.schedule.meta import _check_actions, _plain_actions_hold

    meta = _zbv_trace().meta
    ro, s2r, ns, nm = meta.rank_orders, meta.stage_to_rank, meta.num_stages, meta.num_microbatches

    def read(orders: dict) -> tuple | None:  # the names' fields, read once by validate_meta and handed to both
        return plain_fields([a for r in sorted(orders) for a in orders[r]])

    assert _plain_actions_hold(ro, s2r, ns, nm, read(ro))

    def err(msg: str) -> PlannerError:
        return PlannerError(msg)

    first = ro[0][0]
    broken = [
        {**ro, 0: ro[0][1:]},  # an action missing
        {**ro, 0: ro[0] + [first]},  # listed twice
        {**ro, 0: ro[0] + [f"{ns}F0"]},  # stage out of range
        {**ro, 0: ro[0] + [f"0F{nm}"]},  # microbatch out of range
        {**ro, 0: ro[1], 1: ro[0]},  # on the wrong ranks
        {**ro, 0: [a.replace("I", "B") for a in ro[0]]},  # a B beside a W
    ]
    for orders in broken:
        assert not _plain_actions_hold(orders, s2r, ns, nm, read(orders))
        with pytest.raises(PlannerError):
            _check_actions(orders, s2r, ns, nm, err, read(orders))


def test_the_cli_loads_only_what_planning_needs() -> None:
    """``python -m planner plan`` does not import the modules of the other commands (the Gantt chart's, the sweep's,
    the simulator's, the log importer's): each command imports them when it runs."""
    import ast
    import subprocess

    code = "import sys, planner.cli; print(sorted(m for m in sys.modules if m.startswith('planner')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    loaded = set(ast.literal_eval(out))
    for name in ("gantt", "rmax_sweep", "timing.spans", "schedule.orders", "trace.simulate", "trace.authors_log"):
        assert f"planner.{name}" not in loaded, name


def test_the_action_names_are_read_once_per_plan(tmp_path, monkeypatch) -> None:
    """What ``planner plan`` does (load, plan with the defaults, write, summarise) reads the batch's action names
    once: validate_meta's check reads them and the metadata keeps them (``TraceMeta.action_table``) for the DAG, the
    trace's columns, the monitoring groups, the freezable actions and the summary; no name is parsed one by one."""
    import planner.schedule.actions as actions
    from planner.defaults import PLAN_DEFAULTS
    from planner.plan import plan_summary, stage_mean_ratios, write_plan

    scanned: list[int] = []
    pattern = actions._PLAIN_LINES

    class Counting:
        def findall(self, text: str) -> list:
            scanned.append(text.count("\n") + 1)
            return pattern.findall(text)

    trace = _zbv_trace()
    path = write_trace(trace, tmp_path / "t")
    monkeypatch.setattr(actions, "_PLAIN_LINES", Counting())
    parsed = parse_action.cache_info()
    loaded = load_trace(path)
    plan = plan_from_trace(loaded, 0.5, **PLAN_DEFAULTS)
    write_plan(plan, tmp_path / "plan.json")
    plan_summary(plan, loaded.meta)
    now = parse_action.cache_info()
    assert scanned == [len(trace.meta.all_actions())]
    assert (now.hits + now.misses) - (parsed.hits + parsed.misses) == 0
    assert stage_mean_ratios(plan, loaded.meta) == stage_mean_ratios(plan)  # (the table's fields, or read afresh)


def test_float_reprs_are_each_values_repr() -> None:
    """The plan file's numbers are formatted once per distinct value, and are still each value's own repr: also
    where 0.0 and -0.0 (one key for a dict) are both there, or only one of them."""
    from planner.fileio import _float_reprs

    some = [0.1, 1 / 3, 1e22, 5e-324, 123456.789, 0.1, 1 / 3]
    for values in (some, some + [0.0], some + [-0.0], [0.0, -0.0] + some, some + [-0.0, 0.0], []):
        assert _float_reprs(values) == list(map(repr, values))


def test_the_array_dependencies_are_the_loops_edges(monkeypatch) -> None:
    """build_dag finds the data dependencies of plain actions over arrays: the same edges in the same order as the
    loop over (stage, microbatch), on every schedule without pairs; where it cannot vouch (an action outside the
    stages, a (stage, kind, microbatch) twice) it leaves them to the loop."""
    import planner.schedule.dag as dag_mod
    from planner.schedule.meta import TraceMeta, validate_meta
    from planner.schedule.orders import SCHEDULES, min_microbatches, schedule_meta

    metas = []
    for name in SCHEDULES:
        if name != "DualPipeV":  # (pairs: the loop)
            metas.append(validate_meta(schedule_meta(name, 4, max(8, min_microbatches(name, 4))), name))
    m = metas[0]
    for odd in ({**m.rank_orders, 0: m.rank_orders[0] + [f"{m.num_stages}F0"]}, {0: ["0F0", "0F0", "0B0"]}):
        metas.append(TraceMeta(m.schedule, m.pp_degree, m.num_stages, m.num_microbatches, m.stage_to_rank, odd))
    vouched = [dag_mod._plain_dependencies(x.action_table(), x.num_stages, x.num_microbatches, []) for x in metas]
    assert vouched == [True] * (len(metas) - 2) + [False, False]
    got = [dag_mod._actions(meta) for meta in metas]
    monkeypatch.setattr(dag_mod, "_plain_dependencies", lambda *args: False)
    assert got == [dag_mod._actions(meta) for meta in metas]


def test_the_critical_path_walk_is_the_node_by_node_walk_with_delays() -> None:
    """indexed_longest_path finds each node's first tight predecessor over all entries at once: the path is the
    one the walk node by node back from the sink finds, also with delays and many ties (whole-number times)."""
    dag = build_dag(_zbv_trace().meta)
    di = dag.index
    rng = random.Random(11)
    for delays in (False, True):
        dur = {a: float(rng.randint(1, 3)) for a in di.names if a not in ("source", "sink")}
        delay = np.array([float(rng.randint(0, 2)) for _ in range(di.pred_idx.size)]) if delays else None
        makespan, starts, path = indexed_longest_path(di, dur, delay)
        start = np.array([starts[a] for a in di.names])
        w = np.array([dur.get(a, 0.0) for a in di.names])
        ptr, preds = di.pred_ptr, di.pred_idx
        want, v = [], di.index["sink"]
        while ptr[v] < ptr[v + 1]:
            lo, hi = int(ptr[v]), int(ptr[v + 1])
            t = start[preds[lo:hi]] + w[preds[lo:hi]] + (0.0 if delay is None else delay[lo:hi])
            hit = np.flatnonzero((t == start[v]) & (t > -1.0))
            if not hit.size:
                break
            v = int(preds[lo + hit[0]])
            if di.names[v] != "source":
                want.append(di.names[v])
        assert path == want[::-1] and makespan == starts["sink"]


def test_a_missing_duration_is_named() -> None:
    """Durations by name: source and sink take 0 whatever is given; the first action without one is named."""
    from planner.errors import PlannerError
    from planner.schedule.dag import longest_path

    dag = build_dag(_zbv_trace().meta)
    names = dag.index.names
    dur = {a: 1.0 for a in names} | {"source": 5.0, "sink": 5.0}
    assert longest_path(dag, dur)[0] == longest_path(dag, {a: 1.0 for a in names[2:]})[0]
    del dur[names[7]], dur[names[9]]
    with pytest.raises(PlannerError, match=f"no duration given for action '{names[7]}'"):
        longest_path(dag, dur)


def test_the_groups_ranks_from_the_action_table_are_those_of_each_parsed_name() -> None:
    """``drift.group_ranks`` (the monitoring summary's and the re-planner's) reads each group's rank from the
    metadata's action table: the map a parse of every name of every rank gives."""
    from planner.schedule.meta import validate_meta
    from planner.schedule.orders import schedule_meta
    from planner.timing.drift import group_ranks

    for name in ("ZBVZeroBubble", "DualPipeV", "Interleaved1F1B", "1F1B"):
        meta = validate_meta(schedule_meta(name, 4, 16), name)
        want: dict[str, int] = {}
        for r, actions in meta.rank_orders.items():
            for a in actions:
                p = parse_action(a)
                want[f"{p.stage}{p.kind}"] = r
        got = group_ranks(meta)
        assert got == want and sorted(got) == sorted(want)


def test_paths_keep_the_last_tail_and_only_for_the_same_durations() -> None:
    """Paths.tail gives its last answer again for the same durations (a copy: the caller may change it) and a
    fresh pass for any other."""
    from planner.lp.arrays import Paths, dag_arrays
    from planner.schedule.dag import farthest
    from planner.timing.estimate import estimate_weights

    trace = _zbv_trace()
    arrays = dag_arrays(build_dag(trace.meta), estimate_weights(trace, "pooled"))
    paths = Paths(arrays)
    d = arrays.wmax.copy()
    first = paths.tail(d)
    first[:] = -5.0
    assert paths.tail(d.copy()).tolist() == farthest(paths.tails, d, paths.sdelay).tolist()
    d[5] += 1.0
    assert paths.tail(d).tolist() == farthest(paths.tails, d, paths.sdelay).tolist()


def test_group_ids_are_np_uniques() -> None:
    """group_ids counts where its keys are small non-negative integers: the groups np.unique numbers, each with its
    first row, also with negative, large or float keys (np.unique's own path)."""
    from planner.trace.columns import group_ids

    rng = np.random.default_rng(4)
    n = 500
    for keys in (
        (rng.integers(0, 3, n), rng.integers(0, 90, n)),
        (rng.integers(0, 2, n), rng.integers(-5, 5, n), rng.integers(0, 10**9, n)),
        (rng.integers(0, 4, n).astype(np.float64), rng.integers(0, 7, n)),
        (np.zeros(n, dtype=np.int64),),
    ):
        code = np.zeros(n, dtype=np.int64)
        for k in keys:
            _, inv = np.unique(k, return_inverse=True)
            code = code * (int(inv.max()) + 1) + inv
        _, first, gid = np.unique(code, return_index=True, return_inverse=True)
        got_gid, got_first = group_ids(*keys)
        assert got_gid.tolist() == gid.reshape(-1).tolist() and got_first.tolist() == first.tolist()


def test_the_makespan_is_the_longest_paths() -> None:
    """indexed_makespan (no starts by name, no path) is indexed_longest_path's makespan, by name or by array."""
    from planner.schedule.dag import indexed_makespan

    di = build_dag(_zbv_trace().meta).index
    rng = random.Random(2)
    dur = {a: rng.random() for a in di.names[2:]}
    delay = np.array([rng.random() for _ in range(di.pred_idx.size)])
    w = np.array([0.0, 0.0] + [dur[a] for a in di.names[2:]])
    for d in (None, delay):
        assert indexed_makespan(di, dur, d) == indexed_makespan(di, w, d) == indexed_longest_path(di, dur, d)[0]


def test_kahns_pass_finds_the_depths_the_layers_would() -> None:
    """index_graph keeps each node's depth from Kahn's pass: the depths layers finds from the predecessor lists, so
    the DAG's layers are the same either way."""
    from planner.schedule.dag import _depths, layers

    for meta in (_zbv_trace().meta, synthetic_trace("DualPipeV", 4, 16, seed=3).meta):
        di = build_dag(meta).index
        want = _depths(di.pred_ptr, di.pred_idx, di.order.tolist())
        assert di.depth.tolist() == want.tolist()
        got, ref = layers(di.pred_ptr, di.pred_idx, (), di.depth), layers(di.pred_ptr, di.pred_idx, di.order.tolist())
        assert got.nbr.tolist() == ref.nbr.tolist() and got.entry.tolist() == ref.entry.tolist()
        plain = [[None if x is None else np.asarray(x).tolist() for x in level] for level in ref.levels]
        assert [[None if x is None else np.asarray(x).tolist() for x in level] for level in got.levels] == plain
