"""Tuning and decoding without Moses: the mert tune call of each row, seeds, start weights, stale runs."""

from __future__ import annotations

import json

import pytest

from table1 import systems, tuning, workspace
from table1.settings import CONFIGURATIONS_BY_KEY, SMALL, RunPlan, select_configurations
from table1_folders import load_experiment, small_experiment, write_lines, write_rnn_system, write_tuned_run


def test_steps_require_their_inputs(tmp_path):
    exp = small_experiment(tmp_path)
    with pytest.raises(workspace.ExperimentError, match="step\\(s\\) prepare not done"):
        systems.step_baseline(exp, "eflomal")
    with pytest.raises(workspace.ExperimentError, match="rnn not done"):
        tuning.step_tune(exp, select_configurations("baseline"), 1)


def test_tune_command_fixes_unused_columns_and_resumes(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)  # the Moses of this test is moses_home's
    (tmp_path / "moses" / "bin").mkdir(parents=True)
    (tmp_path / "moses" / "scripts").mkdir()
    exp = small_experiment(tmp_path, moses_home=tmp_path / "moses")
    write_rnn_system(exp)
    base = tuning.tune_command(exp, RunPlan(CONFIGURATIONS_BY_KEY["baseline"], 2))
    text = " ".join(base)
    assert "--fixed TranslationModel0_4 --fixed TranslationModel0_5" in text
    assert "--seed 1001" in text and "--continue" in text and "--feature" not in text
    assert f"--work-dir {exp.work / 'tune' / 'baseline' / 'run2'}" in text
    assert f"--moses-bin-dir {tmp_path / 'moses' / 'bin'}" in text
    assert f"--max-iterations {SMALL.tune_max_iterations}" in text
    nbest = " ".join(tuning.tune_command(exp, RunPlan(CONFIGURATIONS_BY_KEY["cslm-nbest-rnn-wp"], 1)))
    assert "--fixed" not in nbest and f"--feature CSLM:{exp.cslm_model}" in nbest
    assert f"--moses-ini {exp.rnn_ini}" in nbest
    decoder = " ".join(tuning.tune_command(exp, RunPlan(CONFIGURATIONS_BY_KEY["cslm-rnn-wp"], 1)))
    assert "--feature" not in decoder and f"--moses-ini {exp.cslm_ini}" in decoder


def test_an_nmt_row_tunes_the_nmt_model_as_an_nbest_feature_once_it_is_trained(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)
    (tmp_path / "moses" / "bin").mkdir(parents=True)
    (tmp_path / "moses" / "scripts").mkdir()
    exp = small_experiment(tmp_path, moses_home=tmp_path / "moses")
    write_rnn_system(exp)
    both = RunPlan(CONFIGURATIONS_BY_KEY["nmt-both-nbest"], 1)
    with pytest.raises(workspace.ExperimentError, match=r"needs NMT p\(e\|f\)\+p\(f\|e\), not trained"):
        tuning.tune_command(exp, both)
    for direction in ("forward", "reverse"):
        exp.step(f"reranking/nmt-{direction}", lambda: None)
    text = " ".join(tuning.tune_command(exp, both))
    forward, reverse = (exp.path("reranking", f"nmt-{d}.pt") for d in ("forward", "reverse"))
    assert f"--feature NMT:{forward},reverse={reverse}" in text
    assert "--fixed TranslationModel0_4 --fixed TranslationModel0_5" in text  # Baseline's table, the NMT added
    assert CONFIGURATIONS_BY_KEY["nmt-nbest"].nbest_rescored and not CONFIGURATIONS_BY_KEY["rnn"].nbest_rescored


def test_a_run_tuned_with_another_seed_is_refused_and_kept(tmp_path):
    exp = small_experiment(tmp_path)
    write_rnn_system(exp)
    exp.step("rnn", lambda: None)
    baseline = CONFIGURATIONS_BY_KEY["baseline"]
    write_tuned_run(exp, RunPlan(baseline, 1), 1000, "2026-11-22T10:00:00+00:00")  # current: skipped
    write_tuned_run(exp, RunPlan(baseline, 2), 2000, "2026-11-22T11:00:00+00:00")  # the old seed of run 2
    with pytest.raises(workspace.ExperimentError, match=r"tuned with seed 2000, but run 2 is tuned with seed 1001.*"
                                                 r"tune--baseline--run2\.json.* aside"):
        tuning.step_tune(exp, [baseline], 2)
    assert (exp.tune_dir(RunPlan(baseline, 2)) / "moses.ini").exists()
    for split in ("dev", "test"):  # run 1 is decoded, so eval reaches run 2
        exp.stamp_path(f"eval/baseline/run1/{split}").write_text(json.dumps({"finished": "2026-11-22T10:30:00+00:00"}))
    with pytest.raises(workspace.ExperimentError, match="seed 2000"):
        tuning.step_eval(exp, [baseline], 2)


def test_an_eval_older_than_its_tuning_is_refused(tmp_path):
    exp = small_experiment(tmp_path)
    plan = RunPlan(CONFIGURATIONS_BY_KEY["baseline"], 1)
    exp.stamp_path("x").parent.mkdir(parents=True, exist_ok=True)
    write_tuned_run(exp, plan, 1000, "2026-11-22T11:00:00+00:00")
    for split, finished in (("dev", "2026-11-22T11:05:00+00:00"), ("test", "2026-11-22T10:59:59+00:00")):
        exp.stamp_path(f"eval/{plan.name}/{split}").write_text(json.dumps({"finished": finished}))
    with pytest.raises(workspace.ExperimentError, match=r"run1--test\.json: decoded before tune/baseline/run1 last"):
        tuning.step_eval(exp, [plan.config], 1)
    exp.stamp_path(f"eval/{plan.name}/test").write_text(json.dumps({"finished": "2026-11-22T11:06:00+00:00"}))
    tuning.step_eval(exp, [plan.config], 1)  # both decoded after the tuning: nothing to do


def test_fixed_columns_must_start_at_zero(tmp_path):
    exp = small_experiment(tmp_path)
    write_rnn_system(exp, rnn="0.2", wp="0")
    tuning.check_start_weights(exp, CONFIGURATIONS_BY_KEY["rnn"])  # RNN is tuned: any start is fine
    with pytest.raises(workspace.ExperimentError, match="TranslationModel0_4 starts at 0.2"):
        tuning.check_start_weights(exp, CONFIGURATIONS_BY_KEY["baseline"])
    # A folder that shares finished Baseline runs may tune + RNN from another start: only a run
    # still to tune is checked.
    exp.step("rnn", lambda: None)
    write_tuned_run(exp, RunPlan(CONFIGURATIONS_BY_KEY["baseline"], 1), 1000, "2026-11-22T10:00:00+00:00")
    tuning.step_tune(exp, [CONFIGURATIONS_BY_KEY["baseline"]], 1)
    with pytest.raises(workspace.ExperimentError, match="TranslationModel0_4 starts at 0.2"):
        tuning.step_tune(exp, [CONFIGURATIONS_BY_KEY["baseline"]], 2)


def _stamp(exp, name: str, seconds: float = 0.0, **details) -> None:
    workspace.write_json(exp.stamp_path(name), {"step": name, "seconds": seconds, "finished": "2026-11-26T00:00:00",
                                                **details})


def test_the_time_plan_sums_measured_rows_and_says_which_optional_rows_fit(tmp_path, monkeypatch):
    """Before the first tuning run, hours per run at the cap and per evaluation, the total
    with what is done, and which optional rows fit in the scale's planned hours (hand-computed)."""
    import dataclasses

    from table1.settings import SCALES

    monkeypatch.setitem(SCALES, "plan", dataclasses.replace(SCALES["medium"], name="plan", plan_hours=18.0))
    exp = load_experiment(tmp_path / "work", "plan")
    write_lines(exp.prepared("dev", "en"), ["d"] * 1000)
    write_lines(exp.prepared("test", "en"), ["t"] * 3000)
    # 0.3 s per sentence on 1 thread, 36 s to load; 2 threads: an iteration is 36 + 1000 * 0.3 / 2 = 186 s,
    # 25 of them 1.2917 h; an evaluation 2 * 36 + 4000 * 0.3 / 2 = 672 s = 0.1867 h
    _stamp(exp, "speed/rnn", sentences=40, load_seconds=36.0, seconds_per_sentence=0.3)
    _stamp(exp, "baseline/lm", seconds=3600.0)  # 3 h of steps done: leaves counted, not "baseline"
    _stamp(exp, "baseline", seconds=7200.0)
    _stamp(exp, "baseline/train", seconds=7200.0)
    _stamp(exp, "tune/baseline/run1", seconds=999.0)
    _stamp(exp, "eval/baseline/run1/test", seconds=1.0)
    configs = select_configurations("baseline rnn")
    lines = tuning.time_plan(exp, configs, 3)
    row = (25 * 186 + 672) / 3600
    done = (3600 + 7200 + 999 + 1) / 3600
    assert lines[0] == f"time plan: {done:.1f} h of steps done so far"
    pace = 999 / 3600  # the one finished run's hours: the two to go at that pace, and their evaluations
    assert lines[1].endswith(f"2 of 3 runs to go: {2 * row:.1f} h; {2 * pace + 2 * 672 / 3600:.1f} h at the pace of "
                             "its 1 finished run (0.3 h each)")
    assert "1.3 h per tuning run at the 25-iteration cap (decoding as the speed step measured it; MERT's " \
        "optimisation not counted (no tuning iteration of this work folder has measured it yet)), 0.19 h per dev + " \
        "test evaluation" in lines[1]
    assert lines[2].endswith(f"3 of 3 runs to go: {3 * row:.1f} h")
    chosen = done + 5 * row
    assert lines[3] == f"time plan: chosen rows: {chosen:.1f} h in all of the 18 h planned"
    # + RNN + WP decodes with the same system: 3 more runs fit in 18 h; the CSLM row's 2 h of training on top do not
    assert lines[4] == f"time plan: optional + RNN + WP: {3 * row:.1f} h: fits, {chosen + 3 * row:.1f} h in all"
    cslm = 3 * row + 2.0
    assert lines[5].startswith(f"time plan: optional + CSLM (n-best) + RNN + WP: {cslm:.1f} h (with the CSLM's")
    assert lines[5].endswith(f": does not fit ({chosen + 3 * row + cslm:.1f} h)")


def test_the_time_plan_counts_a_tuning_run_resumed_across_sessions(tmp_path):
    """A tuning run interrupted by the session's end and resumed: the hours its attempts took are
    done (its clock in stamps/running/), and come off what is left of it at the cap; the total stays
    the stamped hours plus every run's cap (hand-computed, the first plan test's speeds)."""
    exp = load_experiment(tmp_path / "work", "medium")
    write_lines(exp.prepared("dev", "en"), ["d"] * 1000)
    write_lines(exp.prepared("test", "en"), ["t"] * 3000)
    _stamp(exp, "speed/rnn", sentences=40, load_seconds=36.0, seconds_per_sentence=0.3)
    _stamp(exp, "baseline/lm", seconds=3600.0)
    exp.clock_path("tune/baseline/run1").parent.mkdir(parents=True)
    exp.clock_path("tune/baseline/run1").write_text(json.dumps({"attempts": 2, "seconds": 1800.0}))
    lines = tuning.time_plan(exp, select_configurations("baseline"), 2)
    run, evaluation = 25 * 186 / 3600, 672 / 3600
    assert lines[0] == "time plan: 1.5 h of steps done so far (0.5 h of it in tuning runs not finished)"
    assert lines[1].endswith(f"2 of 2 runs to go: {2 * run - 0.5 + 2 * evaluation:.1f} h (0.5 h of their tuning done)")
    assert lines[2] == f"time plan: chosen rows: {1 + 2 * run + 2 * evaluation:.1f} h in all of the 15 h planned"
    _stamp(exp, "tune/baseline/run1", seconds=2000.0)  # finished: its clock no longer counts
    lines = tuning.time_plan(exp, select_configurations("baseline"), 2)
    assert lines[0] == "time plan: 1.6 h of steps done so far"
    assert lines[1].endswith(f"; {2000 / 3600 + 2 * evaluation:.1f} h at the pace of its 1 finished run (0.6 h each)")


def test_the_time_plan_counts_what_tuning_iterations_measured(tmp_path, monkeypatch):
    """Once runs have tuned, the plan takes their decoding times (under the machine's real load) and
    MERT's optimisation, which grows with the merged pool, so with cap² over a run (hand-computed)."""
    from mert.tune import STATE_FILE, STATE_FORMAT

    exp = load_experiment(tmp_path / "work", "medium")
    write_lines(exp.prepared("dev", "en"), ["d"] * 1000)
    write_lines(exp.prepared("test", "en"), ["t"] * 3000)
    _stamp(exp, "speed/rnn", sentences=40, load_seconds=36.0, seconds_per_sentence=0.3)
    folder = exp.tune_dir(RunPlan(CONFIGURATIONS_BY_KEY["baseline"], 1))
    folder.mkdir(parents=True)
    iterations = [{"iteration": 1, "new_hypotheses": 90_000, "merged_hypotheses": 100_000, "optimised_bleu": 20.0,
                   "optimise_seconds": 10.0, "decode_seconds": 300.0},
                  {"iteration": 2, "new_hypotheses": 80_000, "merged_hypotheses": 200_000, "optimised_bleu": 21.0,
                   "optimise_seconds": 20.0, "decode_seconds": 360.0},
                  {"iteration": 3, "new_hypotheses": 0, "merged_hypotheses": 200_000, "optimised_bleu": None,
                   "optimise_seconds": 0.0, "decode_seconds": 330.0}]  # nothing new: MERT did not run
    (folder / STATE_FILE).write_text(json.dumps({"format": STATE_FORMAT, "iterations": iterations}))
    # Decoding: 330 s an iteration (the three iterations' mean; the speed step said 186 s).
    # Optimisation: 30 s over 300,000 merged hypotheses, 0.1 ms each; 85 new hypotheses per sentence an
    # iteration; iteration k optimises on k × 85,000: 0.1 ms × 85,000 × (1 + … + 25) = 2,762.5 s = 0.767 h.
    # An evaluation: 2 loads of 36 s and 4,000 sentences at (330 − 36) / 1,000 s each = 1,248 s.
    line = tuning.time_plan(exp, select_configurations("baseline"), 3)[1]
    hours = 25 * 330 / 3600 + 2762.5 / 3600
    assert f"{hours:.1f} h per tuning run at the 25-iteration cap (decoding 5.5 min an iteration, as 3 tuning " \
        "iterations measured; MERT's optimisation ≤ 0.8 h of them (0.100 ms per merged hypothesis and 85 new " \
        "hypotheses per sentence an iteration, measured on 2 iterations)), 0.35 h per dev + test evaluation" in line
    assert line.endswith(f"3 of 3 runs to go: {3 * (hours + 1248 / 3600):.1f} h")
    # + RNN decodes with the same system as Baseline: Baseline's iterations measure its decoding too
    assert "as 3 tuning iterations measured" in tuning.time_plan(exp, select_configurations("rnn"), 3)[1]


def test_test_decodes_keep_the_translation_details_of_moses_own_1best(tmp_path, monkeypatch):
    """eval asks for details of the test decode only, and not for a row whose output n-best rescoring picks."""
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)
    (tmp_path / "moses" / "bin").mkdir(parents=True)
    (tmp_path / "moses" / "scripts").mkdir()
    exp = small_experiment(tmp_path, moses_home=tmp_path / "moses")
    exp.stamp_path("x").parent.mkdir(parents=True, exist_ok=True)
    configs = select_configurations("rnn cslm-nbest-rnn")
    for config in configs:
        write_tuned_run(exp, RunPlan(config, 1), 1000, "2026-11-22T10:00:00+00:00")
    asked = []

    def fake_decode(ini, source, output, **kw):
        asked.append((output.relative_to(exp.work).as_posix(), kw["details"]))
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text("x\n")
        return output

    monkeypatch.setattr(tuning, "decode_test_set", fake_decode)
    tuning.step_eval(exp, configs, 1)
    assert asked == [("eval/rnn/run1.dev.tok", None),
                     ("eval/rnn/run1.test.tok", exp.work / "eval" / "rnn" / "run1.test.tok.details"),
                     ("eval/cslm-nbest-rnn/run1.dev.tok", None), ("eval/cslm-nbest-rnn/run1.test.tok", None)]
    stamp = json.loads(exp.stamp_path("eval/rnn/run1/test").read_text())
    assert stamp["details"] == str(exp.work / "eval" / "rnn" / "run1.test.tok.details")


def test_the_seed_of_a_tuning_is_read_from_its_state_of_either_form() -> None:
    """``mert tune`` records its options (the seed among them); a state of an earlier version held a fingerprint."""
    assert tuning.state_seed({"options": {"seed": 1001, "restarts": 20}}) == 1001
    assert tuning.state_seed({"fingerprint": {"seed": 1000}}) == 1000
    assert tuning.state_seed({"options": {"seed": None}}) is None and tuning.state_seed({}) is None
