"""``metrics.jsonl``: the file stays open through the run, and every row is on disk once appended."""

import json

from timelyfreeze.outputs.metrics_log import MetricsLog


def test_each_row_is_on_disk_when_appended_and_a_resume_keeps_earlier_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, write=True)
    for step in (1, 2, 3):
        log.append({"step": step, "loss": 1.0 / step})
        assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == list(range(1, step + 1))
    log.close()
    resumed = MetricsLog(path, write=True)  # a run resumed after step 2 re-does step 3
    resumed.append({"step": 3, "loss": 0.5})
    assert [json.loads(x) for x in path.read_text().splitlines()][-2:] == [
        {"step": 2, "loss": 0.5},
        {"step": 3, "loss": 0.5},
    ]
    resumed.close()
    resumed.append({"step": 4})  # a row after close opens the file again
    assert json.loads(path.read_text().splitlines()[-1]) == {"step": 4}
    resumed.close()


def test_a_rank_that_does_not_write_leaves_no_file(tmp_path):
    log = MetricsLog(tmp_path / "m.jsonl", write=False)
    log.append({"step": 1})
    log.close()
    assert not (tmp_path / "m.jsonl").exists()
