"""The pipeline's step order, as the CLI and the Makefile run it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from held_output import held_by_another_process
from table1 import experiment
from table1.cli import main
from table1.settings import RunPlan, select_configurations
from table1.workspace import new_experiment

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
    assert experiment.STEPS == ("data", "prepare", "baseline", "rnn", "proposals", "cslm", "speed", "tune", "eval",
                                "report")


@pytest.mark.parametrize("configs", ["baseline rnn", "baseline,rnn"])
def test_make_configs_becomes_one_config_option_each(configs: str) -> None:
    """``make table1 CONFIGS='baseline rnn'`` (what long runs are started with) keeps working: table1 takes
    one --config per configuration, as mert takes one --ref per reference."""
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL"}}
    out = subprocess.run(["make", "-n", "table1", f"CONFIGS={configs}", "WORK=/w"], cwd=REPO,
                         capture_output=True, text=True, check=True, env=env).stdout
    command = " ".join(line.strip(" \\") for line in out.splitlines() if line.strip())
    assert " --config baseline --config rnn --aligner " in command


def test_config_takes_one_name_and_is_repeated(tmp_path: Path, monkeypatch) -> None:
    _no_moses(monkeypatch)
    chosen = []
    monkeypatch.setattr(experiment, "run_steps", lambda exp, steps, options: chosen.append(options) or [])
    args = ["report", "--work", str(tmp_path / "work"), "--data", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--config", "rnn", "--config", "baseline"])
    assert result.exit_code == 0, result.output
    assert [c.key for c in chosen[0].configs] == ["baseline", "rnn"]
    assert "CONFIGS='rnn baseline'" in chosen[0].command
    result = CliRunner().invoke(main, [*args, "--config", "baseline rnn"])
    assert result.exit_code == 1 and "give one name per --config" in result.output, result.output


def test_a_second_run_on_a_held_work_folder_stops_before_any_step(tmp_path: Path) -> None:
    """The same ``make table1`` started twice: the second says who holds the folder, runs nothing."""
    work = tmp_path / "work"
    work.mkdir()
    with held_by_another_process(work) as holder:
        result = CliRunner().invoke(main, ["prepare", "--work", str(work), "--data", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and f"Error: {work} is in use by pid {holder.pid} " in result.output
    assert sorted(p.name for p in work.iterdir()) == []  # no step ran, nothing written


def _no_moses(monkeypatch) -> None:
    for name in ("MOSES_BIN_DIR", "MOSES_HOME"):
        monkeypatch.delenv(name, raising=False)


def _no_step_runs(monkeypatch) -> None:
    def ran(*_args, **_kwargs):
        raise AssertionError("a step ran before the tools were checked")

    monkeypatch.setattr(experiment, "run_step", ran)


def test_table1_without_moses_stops_before_any_step_and_says_where_to_get_it(tmp_path: Path, monkeypatch) -> None:
    """Before any step: not after a minute of data and prepare and 134 MB written."""
    _no_moses(monkeypatch)
    _no_step_runs(monkeypatch)
    result = CliRunner().invoke(main, ["all", "--work", str(tmp_path / "work"), "--data", str(tmp_path)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "Moses not found" in result.output
    assert "docs/moses-nplm.md" in result.output and "docker/README.md" in result.output
    assert list(tmp_path.iterdir()) == []  # not even the work folder


def test_table1_names_every_missing_moses_tool_before_any_step(tmp_path: Path, monkeypatch) -> None:
    _no_moses(monkeypatch)
    _no_step_runs(monkeypatch)
    home = tmp_path / "moses"
    (home / "scripts").mkdir(parents=True)
    (home / "bin").mkdir()
    for name in ("moses", "lmplz"):
        (home / "bin" / name).write_text("#!/bin/sh\n")
        (home / "bin" / name).chmod(0o755)
    result = CliRunner().invoke(main, ["all", "--work", str(tmp_path / "work"), "--data", str(tmp_path),
                                       "--moses-home", str(home), "--aligner", "eflomal"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    named = result.output.split("missing: ")[1].split(";")[0].split(", ")
    assert named == [str(home / "bin" / "build_binary"), str(home / "bin" / "symal"),
                     str(home / "scripts" / "training" / "train-model.perl"),
                     str(home / "scripts" / "training" / "filter-model-given-input.pl")]
    assert not (tmp_path / "work").exists()


def test_steps_that_need_no_moses_run_without_it(tmp_path: Path, monkeypatch) -> None:
    _no_moses(monkeypatch)
    ran = []
    monkeypatch.setattr(experiment, "run_step", lambda exp, step, options: ran.append(step) or [])
    result = CliRunner().invoke(main, ["data", "rnn", "proposals", "cslm", "report", "--work", str(tmp_path / "work"),
                                       "--data", str(tmp_path), "--config", "rnn", "--config", "rnn-proposals"])
    assert result.exit_code == 0, result.output
    assert ran == ["data", "rnn", "proposals", "cslm", "report"]


def test_the_proposals_step_is_stamped_only_for_a_proposals_row(tmp_path: Path) -> None:
    exp = new_experiment(tmp_path / "work", "small")
    plain = experiment.StepOptions(select_configurations("baseline rnn"), 3)
    with_proposals = experiment.StepOptions(select_configurations("baseline rnn rnn-proposals"), 3)
    assert experiment.step_stamps(exp, "proposals", plain) == []
    assert experiment.step_stamps(exp, "proposals", with_proposals) == ["proposals"]
    assert experiment.step_stamps(exp, "speed", with_proposals) == ["speed/rnn", "speed/proposals"]
    assert "tune/rnn-proposals/run3" in experiment.step_stamps(exp, "tune", with_proposals)


def test_the_both_directions_system_is_built_in_the_rnn_step_only_for_its_row(tmp_path: Path) -> None:
    exp = new_experiment(tmp_path / "work", "small")
    plain = experiment.StepOptions(select_configurations("baseline rnn"), 3)
    both = experiment.StepOptions(select_configurations("baseline rnn rnn-both"), 3)
    assert experiment.step_stamps(exp, "rnn", plain) == ["rnn"]
    assert experiment.step_stamps(exp, "rnn", both) == ["rnn", "rnn-both"]
    assert experiment.step_stamps(exp, "speed", both) == ["speed/rnn", "speed/rnn-both"]
    config = select_configurations("rnn-both")[0]
    assert exp.table_system(config) == exp.tuned_system(RunPlan(config, 1)) == exp.rnn_both_ini


def test_the_both_ways_proposals_row_has_its_own_system_beside_the_proposals_row(tmp_path: Path) -> None:
    """rnn-both-prop needs the reverse model (the rnn step trains it) and a completed table of its own:
    with rnn-proposals chosen too, the proposals and speed steps make and measure both systems."""
    exp = new_experiment(tmp_path / "work", "small")
    both = experiment.StepOptions(select_configurations("baseline rnn rnn-proposals rnn-both-prop"), 3)
    assert experiment.step_stamps(exp, "rnn", both) == ["rnn", "rnn-both"]
    assert experiment.step_stamps(exp, "proposals", both) == ["proposals", "proposals-both"]
    assert experiment.step_stamps(exp, "speed", both) == ["speed/rnn", "speed/proposals", "speed/proposals-both"]
    config = select_configurations("rnn-both-prop")[0]
    assert exp.table_system(config) == exp.tuned_system(RunPlan(config, 1)) == exp.system_ini("proposals-both")
    assert config.appended_labels() == ["p_RNN", "WP", "p_RNN(f|e)", "proposed (indicator)"]
    # Like + RNN it holds U at 0 and tunes p_RNN; the reverse column and the indicator are tuned too.
    assert config.fixed_columns("TranslationModel0", 8) == ["TranslationModel0_5"]


def test_make_tune_without_moses_says_where_to_get_it_before_installing_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"MOSES_BIN_DIR", "MAKEFLAGS", "MAKELEVEL"}}
    for moses in ("", str(tmp_path)):  # none given; a folder without moses
        done = subprocess.run(["make", "tune", f"VENV={tmp_path / 'venv'}", f"MOSES_BIN_DIR={moses}"], cwd=REPO,
                              capture_output=True, text=True, env=env)
        assert done.returncode != 0
        assert "docs/moses-nplm.md" in done.stderr and "docker/README.md" in done.stderr, done.stderr
        assert not (tmp_path / "venv").exists()  # checked before the 2.5 GB install


def test_make_table1_with_a_wrong_moses_path_says_so_before_installing_anything(tmp_path: Path) -> None:
    """Before the experiment extra installs (eflomal compiles for minutes), as make tune checks first."""
    env = {k: v for k, v in os.environ.items() if k not in {"MOSES_BIN_DIR", "MOSES_HOME", "MAKEFLAGS", "MAKELEVEL"}}
    bin_only = tmp_path / "build" / "bin"  # binaries, but no scripts/ beside them
    bin_only.mkdir(parents=True)
    for moses in (f"MOSES_BIN_DIR={tmp_path / 'no-such-folder'}", f"MOSES_HOME={tmp_path / 'no-such-tree'}",
                  f"MOSES_BIN_DIR={bin_only}"):
        done = subprocess.run(["make", "table1", f"VENV={tmp_path / 'venv'}", f"WORK={tmp_path / 'work'}", moses],
                              cwd=REPO, capture_output=True, text=True, env=env)
        assert done.returncode != 0
        assert "docs/moses-nplm.md" in done.stderr and "docker/README.md" in done.stderr, done.stderr
        assert not (tmp_path / "venv").exists() and not (tmp_path / "work").exists()


def test_a_report_on_a_missing_work_folder_fails_in_one_line_and_leaves_no_folder(tmp_path: Path) -> None:
    work = tmp_path / "work"
    result = CliRunner().invoke(main, ["report", "--work", str(work), "--data", str(tmp_path),
                                       "--results", str(tmp_path / "results")])
    assert result.exit_code != 0 and "no evaluated run" in result.output, result.output
    assert not work.exists() and not (tmp_path / "results").exists()


def test_a_failed_step_keeps_a_work_folder_that_holds_stamped_work(tmp_path: Path, monkeypatch) -> None:
    """Stamped steps are what a rerun resumes from: a later step's failure must not remove them."""
    _no_moses(monkeypatch)
    work = tmp_path / "work"

    def step(exp, name, options):
        if name == "data":
            exp.step("data", lambda: None)
            return []
        raise experiment.ExperimentError("prepare failed")

    monkeypatch.setattr(experiment, "run_step", step)
    result = CliRunner().invoke(main, ["data", "prepare", "--work", str(work), "--data", str(tmp_path)])
    assert result.exit_code != 0 and "prepare failed" in result.output, result.output
    assert work.is_dir() and any((work / "stamps").iterdir())


def test_all_then_the_reranking_models_runs_table1_first_and_all_alone_never_trains_them(tmp_path: Path,
                                                                                         monkeypatch) -> None:
    _no_moses(monkeypatch)
    ran = []
    monkeypatch.setattr(experiment, "run_steps", lambda exp, steps, options: ran.append(list(steps)) or [])
    args = ["--work", str(tmp_path / "work"), "--data", str(tmp_path)]
    for steps in (["all", "reranking-models"], ["all"], ["tune", "all"]):
        result = CliRunner().invoke(main, [*steps, *args])
        assert result.exit_code == 0, result.output
    assert ran == [[*experiment.STEPS, "reranking-models"], list(experiment.STEPS), list(experiment.STEPS)]
