"""Bad settings through the training entry point (``timelyfreeze.train.main``, what torchrun runs on every rank):
TorchTitan's ConfigManager reads the TOML file and the flags, the trainer checks them before building anything,
and ``main`` ends with one ``error:`` line naming the field and exit status 2, never a traceback.

In-process, one rank's view (the checks run before any process group exists, and every rank runs the same
ones); ``test_runtime_torchrun.test_bad_freeze_setting_fails_with_one_line`` is the same path under torchrun."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "torchtitan_configs"


def _with_setting(tmp_path: Path, config: str, key: str, value: str, table: str = "freeze") -> Path:
    """A copy of ``config`` whose ``[table]`` sets ``key = value`` (TOML text), replacing its own line."""
    text = (CONFIGS / config).read_text()
    head, rest = text.split(f"[{table}]\n", 1)
    section, sep, tail = rest.partition("\n[")
    lines = [line for line in section.splitlines() if not re.match(rf"{re.escape(key)}\s*=", line)]
    path = tmp_path / config
    path.write_text(head + f"[{table}]\n" + f"{key} = {value}\n" + "\n".join(lines) + sep + tail)
    return path


def _main_error(monkeypatch, capsys, config: Path, *flags: str, rank: int = 0) -> str:
    """Run ``timelyfreeze.train.main`` as ``rank`` with these arguments; assert exit status 2, no traceback and
    exactly one ``error:`` line on stderr, and return that line."""
    import faulthandler

    from torchtitan.config import ConfigManager

    from timelyfreeze.train import main

    monkeypatch.setattr(faulthandler, "enable", lambda **kwargs: None)  # needs a real stderr file; pytest has its own
    monkeypatch.setenv("WORLD_SIZE", "2")  # the layout torchrun would give (PP=2)
    monkeypatch.setenv("RANK", str(rank))
    argv = ["--job.config_file", str(config), "--metrics.no-enable-tensorboard", *flags]
    # TorchTitan's ``parse_args(args=sys.argv[1:])`` binds sys.argv once, when it is imported: hand it ours
    monkeypatch.setattr(ConfigManager.parse_args, "__defaults__", (argv,))
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "key,value,line",
    [
        ("resample_every", '"2"', "error: [freeze] resample_every = '2': must be an integer"),
        ("warmup_steps", '"three"', "error: [freeze] warmup_steps = 'three': must be an integer"),
        ("monitor_steps", "2.5", "error: [freeze] monitor_steps = 2.5: must be an integer"),
        ("r_max", '"0.5"', "error: [freeze] r_max = '0.5': must be a number"),
    ],
)
def test_wrong_type_in_the_toml_file(monkeypatch, capsys, tmp_path, key, value, line):
    config = _with_setting(tmp_path, "llama3_debug_1f1b_cpu.toml", key, value)
    assert _main_error(monkeypatch, capsys, config) == line


def test_wrong_type_in_a_torchtitan_section(monkeypatch, capsys, tmp_path):
    """TorchTitan's own sections are typed by the same check: the batch is read before TorchTitan builds anything."""
    config = _with_setting(tmp_path, "llama3_debug_1f1b_cpu.toml", "local_batch_size", '"8"', table="training")
    assert _main_error(monkeypatch, capsys, config) == "error: [training] local_batch_size = '8': must be an integer"


@pytest.mark.parametrize(
    "flags,line",
    [
        (("--freeze.smartpipe.lam", "1.0"), "error: [freeze.smartpipe] lam = 1.0: must lie in (0, 1)"),
        (("--freeze.apf.ema_alpha", "0.0"), "error: [freeze.apf] ema_alpha = 0.0: must lie in (0, 1)"),
    ],
)
def test_method_knob_out_of_range_on_the_command_line(monkeypatch, capsys, flags, line):
    """The rule the method's own config section holds, not a ValueError from its constructor on every rank."""
    config = CONFIGS / "llama3_debug_1f1b_cpu.toml"
    assert _main_error(monkeypatch, capsys, config, *flags) == line


def test_interleaved_1f1b_with_microbatches_torch_would_refuse(monkeypatch, capsys):
    """5 microbatches on PP=2: 2 rounds, and 5 is not a multiple of 2 (torch's ScheduleInterleaved1F1B raises)."""
    config = CONFIGS / "llama3_debug_interleaved1f1b_cpu.toml"
    line = _main_error(monkeypatch, capsys, config, "--training.local_batch_size", "5")
    assert line.startswith(
        "error: [training] local_batch_size = 5 / [parallelism] pipeline_parallel_microbatch_size "
        "= 1 gives 5 microbatches; Interleaved1F1B needs the number of microbatches to be a "
        "multiple of the number of rounds"
    ), line
    assert "4 or 6" in line


def test_the_command_line_itself(tmp_path):
    """``python -m timelyfreeze.train`` (what torchrun starts on each rank) in a process of its own."""
    config = _with_setting(tmp_path, "llama3_debug_1f1b_cpu.toml", "monitor_steps", "2.5")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "timelyfreeze.train",
            "--job.config_file",
            str(config),
            "--metrics.no-enable-tensorboard",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        "error: [freeze] monitor_steps = 2.5: must be an integer"
    ]


def test_another_rank_waits_for_rank_0_before_it_reports(monkeypatch, capsys):
    """Rank 0 prints a bad setting's line at once. Another rank waits first (torchrun stops it once rank 0 has
    exited; exiting at once could get rank 0 stopped before it printed) and prints its own line, naming its rank,
    only if nothing stopped it: then the failure was its own."""
    from timelyfreeze import train

    waits: list[float] = []
    monkeypatch.setattr(train, "_wait", waits.append)
    config = CONFIGS / "llama3_debug_1f1b_cpu.toml"
    line = _main_error(monkeypatch, capsys, config, "--freeze.r_max", "1.5", rank=1)
    assert waits == [train.OTHER_RANK_GRACE_S]
    assert line == "error: [freeze] r_max = 1.5: must lie in [0, 1] (rank 1)"
    waits.clear()
    line = _main_error(monkeypatch, capsys, config, "--freeze.r_max", "1.5", rank=0)
    assert waits == []
    assert line == "error: [freeze] r_max = 1.5: must lie in [0, 1]"


def test_bad_instruction_data_fails_before_training(monkeypatch, capsys, tmp_path):
    """A data file with a record that lacks its response, and a bad ``[instruct]`` setting: one line each."""
    bad = tmp_path / "alpaca.jsonl"
    bad.write_text('{"instruction": "Add", "input": "1 2", "output": "3"}\n{"instruction": "Greet"}\n')
    config = CONFIGS / "llama3_debug_finetune_cpu.toml"
    line = _main_error(monkeypatch, capsys, config, "--training.dataset", "instruct", "--instruct.data_path", str(bad))
    assert line == f"error: [instruct] data_path = {str(bad)!r}: line 2: field 'output' is missing"
    line = _main_error(monkeypatch, capsys, config, "--instruct.choices", "1")
    assert line == "error: [instruct] choices = 1: must be an integer >= 2"
