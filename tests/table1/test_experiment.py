"""The pipeline's step order, as the CLI and the Makefile run it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from click.testing import CliRunner
from held_output import held_by_another_process

from table1 import experiment
from table1.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_make_table1_full_runs_every_step_in_order():
    # The Makefile's parameters also come from the environment (the Docker image sets DATA, WORK, ...):
    # this checks its own defaults.
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATA", "WORK", "RESULTS", "ALIGNER", "MOSES_HOME", "MOSES_BIN_DIR", "MAKEFLAGS", "MAKELEVEL"}}
    out = subprocess.run(["make", "-n", "table1", "SCALE=full", "WORK=/w", "MOSES_BIN_DIR=/m/bin"], cwd=REPO,
                         capture_output=True, text=True, check=True, env=env).stdout
    command = " ".join(line.strip(" \\") for line in out.splitlines() if line.strip())
    assert "/table1 all --work /w --scale full" in command
    assert "--moses-bin-dir /m/bin" in command and "--data /w/wmt14" in command
    assert experiment.STEPS == ("data", "prepare", "baseline", "rnn", "cslm", "speed", "tune", "eval", "report")


def test_a_second_run_on_a_held_work_folder_stops_before_any_step(tmp_path: Path) -> None:
    """The same ``make table1`` started twice: the second says who holds the folder, runs nothing."""
    work = tmp_path / "work"
    work.mkdir()
    with held_by_another_process(work) as holder:
        result = CliRunner().invoke(main, ["prepare", "--work", str(work), "--data", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and f"Error: {work} is in use by pid {holder.pid} " in result.output
    assert sorted(p.name for p in work.iterdir()) == ["settings.json"]  # no step ran, nothing stamped
