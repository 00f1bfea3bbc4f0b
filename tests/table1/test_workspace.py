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


def test_a_folder_made_before_the_proposals_step_takes_on_its_settings_until_that_step_runs(tmp_path):
    """A folder whose record lacks "proposals" (made before that step existed) goes on and records
    them; once the step has run under other values, the folder refuses them."""
    exp = small_experiment(tmp_path)
    settings = json.loads((exp.work / "settings.json").read_text())
    recorded = settings.pop("proposals")
    (exp.work / "settings.json").write_text(json.dumps(settings))
    small_experiment(tmp_path)
    assert json.loads((exp.work / "settings.json").read_text())["proposals"] == recorded
    settings["proposals"] = {**recorded, "beam": 3}
    (exp.work / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(workspace.ExperimentError, match=r"other settings \(proposals differ"):
        small_experiment(tmp_path)
    settings.pop("proposals")
    (exp.work / "settings.json").write_text(json.dumps(settings))
    exp.step("proposals", lambda: None)  # the step ran (its settings unrecorded: an impossible folder)
    with pytest.raises(workspace.ExperimentError, match=r"other settings \(proposals differ"):
        small_experiment(tmp_path)
