"""The work folder: stamps make every step run once, and a folder belongs to one scale's settings."""

from __future__ import annotations

import json

import pytest

from table1 import collect, workspace
from table1_folders import load_experiment, small_experiment


def test_a_stamped_step_is_skipped_on_rerun_and_timed_once(tmp_path):
    exp = small_experiment(tmp_path)
    calls = []
    assert exp.step("baseline/lm", lambda: calls.append(1) or {"n": 3})
    assert not exp.step("baseline/lm", lambda: calls.append(2))
    assert calls == [1]
    stamp = json.loads(exp.stamp_path("baseline/lm").read_text())
    assert stamp["step"] == "baseline/lm" and stamp["n"] == 3 and stamp["seconds"] >= 0
    assert len((exp.work / "timings.tsv").read_text().splitlines()) == 1
    exp.step("baseline", lambda: None)
    timings = collect.step_timings(exp)
    assert timings["baseline (total)"] == pytest.approx(timings["baseline/lm"] + timings["baseline"], abs=0.11)


def test_a_failed_step_leaves_no_stamp_and_runs_again(tmp_path):
    exp = small_experiment(tmp_path)

    def boom():
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        exp.step("rnn/train", boom)
    assert not exp.done("rnn/train")
    assert exp.step("rnn/train", lambda: None)


class FakeClock:
    """``time.monotonic`` under the test's control: a body "takes" the seconds it adds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_resumed_step_is_timed_over_all_its_attempts(tmp_path, monkeypatch):
    """A training or tuning run interrupted and resumed across sessions: its stamp (and so the
    report's step times) says the sum of the attempts, not the last one's seconds (medium's RNN
    training said 6,518 s of its 4 hours); a single attempt's stamp is as before."""
    clock = FakeClock()
    monkeypatch.setattr(workspace.time, "monotonic", clock)
    exp = small_experiment(tmp_path)

    def fails_after(seconds: float):
        clock.now += seconds
        raise RuntimeError("interrupted")

    for seconds in (100.0, 30.0):
        with pytest.raises(RuntimeError):
            exp.step("rnn/train", lambda s=seconds: fails_after(s))
    assert not exp.done("rnn/train")
    assert exp.step("rnn/train", lambda: setattr(clock, "now", clock.now + 50.0))
    stamp = json.loads(exp.stamp_path("rnn/train").read_text())
    assert (stamp["seconds"], stamp["attempts"], stamp["last_attempt_seconds"]) == (180.0, 3, 50.0)
    assert (exp.work / "timings.tsv").read_text().split("\t")[:2] == ["rnn/train", "180.0"]
    assert collect.step_timings(exp)["rnn/train"] == 180.0
    assert not (exp.work / "stamps" / "running").exists()  # nothing left once stamped
    assert exp.step("rnn/rescore", lambda: setattr(clock, "now", clock.now + 7.0))
    assert json.loads(exp.stamp_path("rnn/rescore").read_text()).keys() == {"step", "seconds", "finished"}


def test_a_clock_left_beside_a_stamp_goes_on_the_rerun(tmp_path):
    """Killed in the moment between writing a step's stamp and removing its clock file, a run
    leaves that file in ``stamps/running/``; the rerun, which skips the stamped step, removes it
    (and the folder), so the folder no longer says a finished step is running."""
    exp = small_experiment(tmp_path)
    assert exp.step("rnn/train", lambda: None)
    running = exp.work / "stamps" / "running"
    running.mkdir()
    (running / "rnn--train.json").write_text('{"attempts": 1, "seconds": 5.0}')
    assert not exp.step("rnn/train", lambda: None)
    assert not running.exists()


KILLED_STEP = """
import sys, time
from table1 import workspace
from table1_folders import load_experiment
workspace.HEARTBEAT_SECONDS = 0.05
exp = load_experiment(__import__("pathlib").Path(sys.argv[1]), "small")
exp.step("tune/baseline/run1", lambda: (print("running", flush=True), time.sleep(60)))
"""


def test_an_attempt_killed_outright_counts_to_its_last_heartbeat(tmp_path):
    """SIGKILL (a session's end) gives the step no chance to write: the heartbeat it wrote while
    running is what the next attempt adds.

    The kill waits for a heartbeat that counts a second, read from the clock file itself, not for a
    second of the test's own: on a loaded machine the heartbeat thread may lag the test's clock.
    """
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    small_experiment(tmp_path)
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", KILLED_STEP, str(tmp_path / "work")], env=env,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "running\n"
        clock_file = tmp_path / "work" / "stamps" / "running" / "tune--baseline--run1.json"
        beat = 0.0
        while beat < 1.0:
            assert child.poll() is None, "the step ended before it was killed"
            beat = workspace.StepClock.read(clock_file)[1]
            time.sleep(0.01)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    killed_after = time.monotonic() - started
    exp = small_experiment(tmp_path)
    assert not exp.done("tune/baseline/run1")
    assert exp.step("tune/baseline/run1", lambda: None)
    stamp = json.loads(exp.stamp_path("tune/baseline/run1").read_text())
    both = time.monotonic() - started
    # At least the heartbeat seen before the kill; at most the child's whole life and this attempt.
    assert stamp["attempts"] == 2 and beat <= stamp["seconds"] <= both + 0.1, (stamp, beat, killed_after)


def test_a_work_folder_refuses_other_settings(tmp_path):
    small_experiment(tmp_path)
    with pytest.raises(workspace.ExperimentError, match="other settings"):
        load_experiment(tmp_path / "work", "full")


def test_a_folder_made_before_a_setting_existed_is_kept_when_the_setting_is_off(tmp_path):
    """Work folders from before data selection existed hold no "selection" key: SCALE=small
    (selection off) must go on using them; any real change still refuses."""
    exp = small_experiment(tmp_path)
    settings = json.loads((exp.work / "settings.json").read_text())
    assert settings.pop("selection") is None
    (exp.work / "settings.json").write_text(json.dumps(settings))
    small_experiment(tmp_path)
    settings["lm_order"] = 3
    (exp.work / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(workspace.ExperimentError, match=r"other settings \(lm_order differ"):
        small_experiment(tmp_path)


def test_a_folder_takes_on_the_proposals_settings_until_that_step_runs(tmp_path):
    """A folder whose record lacks "proposals" (made before that step existed), or holds other values,
    goes on and records the current ones, as long as the proposals step has not run; once it has,
    the folder refuses other values."""
    exp = small_experiment(tmp_path)
    settings = json.loads((exp.work / "settings.json").read_text())
    recorded = settings.pop("proposals")
    (exp.work / "settings.json").write_text(json.dumps(settings))
    small_experiment(tmp_path)
    assert json.loads((exp.work / "settings.json").read_text())["proposals"] == recorded
    settings["proposals"] = {**recorded, "beam": 3}
    (exp.work / "settings.json").write_text(json.dumps(settings))
    small_experiment(tmp_path)
    assert json.loads((exp.work / "settings.json").read_text())["proposals"] == recorded
    exp.step("proposals", lambda: None)
    (exp.work / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(workspace.ExperimentError, match=r"other settings \(proposals differ"):
        small_experiment(tmp_path)
    settings.pop("proposals")
    (exp.work / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(workspace.ExperimentError, match=r"other settings \(proposals differ"):
        small_experiment(tmp_path)


def test_a_folder_made_before_a_nested_setting_existed_is_kept_when_it_is_off(tmp_path):
    """The RNN's settings gained ``max_steps`` (None: off): a folder recorded without it goes on; a value refuses."""
    exp = small_experiment(tmp_path)
    settings = json.loads((exp.work / "settings.json").read_text())
    assert settings["rnn"].pop("max_steps") is None and settings["reranking"]["big_rnn"].pop("max_steps") is None
    (exp.work / "settings.json").write_text(json.dumps(settings))
    small_experiment(tmp_path)
    settings["rnn"]["max_steps"] = 5
    (exp.work / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(workspace.ExperimentError, match=r"other settings \(rnn differ"):
        small_experiment(tmp_path)


def test_the_reranking_settings_may_change_until_any_reranking_step_has_run(tmp_path):
    exp = small_experiment(tmp_path)
    settings = json.loads((exp.work / "settings.json").read_text())
    recorded = settings["reranking"]
    settings["reranking"] = {**recorded, "restarts": 3}
    (exp.work / "settings.json").write_text(json.dumps(settings))
    exp.step("rerankingx", lambda: None)  # a stamp whose name only starts like the reranking's
    small_experiment(tmp_path)
    assert json.loads((exp.work / "settings.json").read_text())["reranking"] == recorded
    exp.step("reranking/lists/run1/dev", lambda: None)
    (exp.work / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(workspace.ExperimentError, match=r"other settings \(reranking differ"):
        small_experiment(tmp_path)


def test_a_tool_whose_output_is_kept_leaves_nothing_when_it_fails(tmp_path):
    """``run_tool(stdout=...)`` (the Table 2 reports): a tool that fails, or is stopped, halfway
    leaves neither its output nor a half-written file beside it (it left ``OUT.partial``)."""
    import sys

    from table1.system_training import MosesToolError

    out = tmp_path / "out" / "table2-frequent.md"
    out.parent.mkdir()
    log = tmp_path / "logs" / "rnn.log"
    with pytest.raises(MosesToolError, match="exited with 3"):
        workspace.run_tool([sys.executable, "-c", "import sys; print('half'); sys.exit(3)"], log, stdout=out)
    assert list(out.parent.iterdir()) == []
    workspace.run_tool([sys.executable, "-c", "print('whole')"], log, stdout=out)
    assert out.read_text() == "whole\n" and list(out.parent.iterdir()) == [out]


def test_a_work_folder_inside_the_source_tree_is_refused_before_anything_is_written() -> None:
    """The help said "outside the source tree", and a run into the clone wrote its gigabytes there."""
    inside = workspace.SOURCE_TREE / "table1-work-inside"
    with pytest.raises(workspace.ExperimentError) as refused:
        workspace.new_experiment(inside, "small")
    assert str(refused.value) == (f"--work {inside} is inside the source tree {workspace.SOURCE_TREE}: give a folder "
                                  "outside it (make's default is ../table1-work)")
    assert not inside.exists()
    assert (workspace.SOURCE_TREE / "pyproject.toml").is_file()  # the tests run from the source tree
