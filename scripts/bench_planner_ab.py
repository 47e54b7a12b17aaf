"""Two planner trees side by side: the whole ``python -m planner plan`` process on the 98k-action ZBV trace of the
planner benchmark (``scripts/bench_planner.py --process``: pp 32 x 2 stages x 512 microbatches, stage scales
U(0.6, 1.4) seed 7, jitter 0.05), the trees alternated run by run, each run's wall and CPU seconds and the
machine's load appended to a JSON-lines file as it goes; at the end, whether the two trees wrote the same plan
(all but ``solver.seconds``).

    python scripts/bench_planner_ab.py --before TREE --after TREE --runs 10 --out FILE.jsonl
"""

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _bad(message: str) -> None:
    """Bad input: one ``error:`` line naming the flag, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _plan(path: Path) -> dict:
    plan = json.loads(path.read_text())
    plan.get("solver", {}).pop("seconds", None)
    return plan


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, type=Path, help="the tree of the code before (its planner/ is used)")
    p.add_argument("--after", required=True, type=Path, help="the tree of the code after")
    p.add_argument("--runs", type=int, default=10, help="runs per tree (alternated)")
    p.add_argument("--r-max", type=float, default=0.5)
    p.add_argument("--out", required=True, type=Path, help="JSON-lines file, one line per run, then the plan check")
    a = p.parse_args()
    for flag, tree in (("--before", a.before), ("--after", a.after)):
        if not (tree / "planner" / "__main__.py").is_file():
            _bad(f"{flag}: {tree} holds no planner/")
    if a.runs < 1:
        _bad(f"--runs: must be at least 1, got {a.runs}")
    if not 0.0 <= a.r_max <= 1.0:
        _bad(f"--r-max: must lie in [0, 1], got {a.r_max:g}")
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        sys.path.insert(0, str(a.before.resolve()))
        from planner.trace.simulate import synthetic_trace, write_trace

        rng = random.Random(7)
        scale = [round(rng.uniform(0.6, 1.4), 4) for _ in range(64)]
        write_trace(synthetic_trace("ZBVZeroBubble", 32, 512, stage_scale=scale, jitter=0.05, seed=7, steps=1), trace)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "w", encoding="utf-8") as out:
            for run in range(1, a.runs + 1):
                for name, tree in (("before", a.before), ("after", a.after)):
                    plan = Path(tmp) / f"plan_{name}.json"
                    cmd = [sys.executable, "-m", "planner", "plan", str(trace), "--r-max", f"{a.r_max:g}"]
                    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
                    t0, c0 = time.perf_counter(), _cpu()
                    done = subprocess.run([*cmd, "--out", str(plan)], cwd=tree, env=env, capture_output=True, text=True)
                    wall, cpu = time.perf_counter() - t0, _cpu() - c0
                    if done.returncode != 0:
                        sys.exit(f"error: {name} tree failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
                    row = {"run": run, "code": name, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
                    row["loadavg_1m"] = round(os.getloadavg()[0], 2)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(row, flush=True)
            same = _plan(Path(tmp) / "plan_before.json") == _plan(Path(tmp) / "plan_after.json")
            out.write(json.dumps({"same_plan_but_solver_seconds": same}) + "\n")
        print("same plan (all but solver.seconds):", same)


if __name__ == "__main__":
    main()
