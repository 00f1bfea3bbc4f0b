"""The Table 1 pipeline's own logic, without Moses: configurations, fixed weights, restarts, report."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mert.tune import DEFAULT_MAX_ITERATIONS, SEED_STRIDE
from moses_integration.moses_ini import MosesIni
from moses_integration.nplm import NPLMConfig, NPLMModel, write_nplm
from table1 import experiment as ex
from table1.settings import (
    CONFIGURATIONS_BY_KEY,
    MAX_RUNS,
    SCALES,
    SMALL,
    RunPlan,
    TextSlice,
    select_configurations,
)

REPO = Path(__file__).resolve().parents[2]

SIX_COLUMN_INI = """[input-factors]
0
[mapping]
0 T 0
[distortion-limit]
6
[feature]
UnknownWordPenalty
WordPenalty
PhrasePenalty
PhraseDictionaryMemory name=TranslationModel0 num-features=6 path={table} input-factor=0 output-factor=0
Distortion
KENLM name=LM0 factor=0 path=/x/lm.bin order=4
[weight]
UnknownWordPenalty0= 1
WordPenalty0= -1
PhrasePenalty0= 0.2
TranslationModel0= 0.2 0.2 0.2 0.2 {rnn} {wp}
Distortion0= 0.3
LM0= 0.5
"""


@pytest.mark.parametrize(
    ("key", "fixed", "features"),
    [
        ("baseline", ["TranslationModel0_4", "TranslationModel0_5"], []),
        ("rnn", ["TranslationModel0_5"], []),
        ("cslm-rnn", ["TranslationModel0_5"], []),  # the CSLM is in the decoder: no n-best feature
        ("cslm-rnn-wp", [], []),
        ("cslm-nbest-rnn", ["TranslationModel0_5"], ["CSLM:/m.pt"]),
        ("cslm-nbest-rnn-wp", [], ["CSLM:/m.pt"]),
    ],
)
def test_each_configuration_fixes_the_columns_it_does_not_use(key, fixed, features):
    config = CONFIGURATIONS_BY_KEY[key]
    assert config.fixed_columns("TranslationModel0", 6) == fixed
    assert config.feature_specs("/m.pt") == features


def test_select_configurations_keeps_table_order_and_rejects_unknown_names():
    assert [c.key for c in select_configurations("rnn, baseline")] == ["baseline", "rnn"]
    assert [c.key for c in select_configurations("")] == ["baseline", "rnn", "cslm-rnn", "cslm-rnn-wp"]
    assert [c.key for c in select_configurations("cslm-nbest-rnn cslm-rnn")] == ["cslm-rnn", "cslm-nbest-rnn"]
    with pytest.raises(ValueError, match="unknown configuration"):
        select_configurations("baseline cslm")


def test_small_scale_meets_the_issue_sizes():
    dev_lines = sum(s.last - s.first + 1 for s in SMALL.dev)  # type: ignore[operator]
    assert dev_lines >= 400 and {Path(s.path).name for s in SMALL.dev} == {"newstest2012.{lang}", "newstest2013.{lang}"}
    assert SMALL.test.last - SMALL.test.first + 1 >= 1000 and "newstest2014" in SMALL.test.path  # type: ignore[operator]
    assert SMALL.train[0].last == 40_000


def _experiment(tmp_path: Path, **kw) -> ex.Experiment:
    return ex.load_experiment(tmp_path / "work", "small", **kw)


def test_a_stamped_step_is_skipped_on_rerun_and_timed_once(tmp_path):
    exp = _experiment(tmp_path)
    calls = []
    assert exp.step("baseline/lm", lambda: calls.append(1) or {"n": 3})
    assert not exp.step("baseline/lm", lambda: calls.append(2))
    assert calls == [1]
    stamp = json.loads(exp.stamp_path("baseline/lm").read_text())
    assert stamp["step"] == "baseline/lm" and stamp["n"] == 3 and stamp["seconds"] >= 0
    assert len((exp.work / "timings.tsv").read_text().splitlines()) == 1
    exp.step("baseline", lambda: None)
    timings = ex.step_timings(exp)
    assert timings["baseline (total)"] == pytest.approx(timings["baseline/lm"] + timings["baseline"], abs=0.11)


def test_a_failed_step_leaves_no_stamp_and_runs_again(tmp_path):
    exp = _experiment(tmp_path)

    def boom():
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        exp.step("rnn/train", boom)
    assert not exp.done("rnn/train")
    assert exp.step("rnn/train", lambda: None)


def test_a_work_folder_refuses_other_settings(tmp_path):
    _experiment(tmp_path)
    with pytest.raises(ex.ExperimentError, match="other settings"):
        ex.load_experiment(tmp_path / "work", "full")


def test_a_folder_made_before_a_setting_existed_is_kept_when_the_setting_is_off(tmp_path):
    """Work folders from before data selection existed hold no "selection" key: SCALE=small
    (selection off) must go on using them; any real change still refuses."""
    exp = _experiment(tmp_path)
    settings = json.loads((exp.work / "settings.json").read_text())
    assert settings.pop("selection") is None
    (exp.work / "settings.json").write_text(json.dumps(settings))
    _experiment(tmp_path)
    settings["lm_order"] = 3
    (exp.work / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(ex.ExperimentError, match=r"other settings \(lm_order differ"):
        _experiment(tmp_path)


def test_full_scale_selects_the_training_and_lm_text_against_the_dev_set(tmp_path, monkeypatch):
    """SCALE=full keeps the paper's 348M parallel / 418M LM words, scored against dev (newstest2012+13),
    and every later step reads the selected text; SCALE=small trains on all of it."""
    from table1 import data_selection

    small = _experiment(tmp_path / "s")
    assert small.train_corpus.name == "train.clean" and small.lm_text == small.prepared("lm", "fr")
    exp = ex.load_experiment(tmp_path / "work", "full", moses_bin_dir=tmp_path)
    calls = []

    def select(install, corpus, in_domain, out, budget_words, work, log, settings, **kw):
        calls.append(([p.name for p in corpus], [p.name for p in in_domain], list(out), budget_words))
        return data_selection.SelectionResult(1, 1, 1, 1, 0.0)

    monkeypatch.setattr(ex, "select_lines", select)
    monkeypatch.setattr(ex.Experiment, "moses", lambda self: None)
    ex.select_training_text(exp, exp.settings.selection)
    assert calls == [
        (["train.clean.en", "train.clean.fr"], ["dev.tok.tc.en", "dev.tok.tc.fr"],
         [exp.work / "prepared" / "train.sel.en", exp.work / "prepared" / "train.sel.fr"], 348_000_000),
        (["lm.tok.tc.fr"], ["dev.tok.tc.fr"], [exp.work / "prepared" / "lm.sel.fr"], 418_000_000),
    ]
    assert exp.train_corpus == exp.work / "prepared" / "train.sel" and exp.lm_text == calls[1][2][0]
    assert exp.done("prepare/select-train") and exp.done("prepare/select-lm")


def test_steps_require_their_inputs(tmp_path):
    exp = _experiment(tmp_path)
    with pytest.raises(ex.ExperimentError, match="step\\(s\\) prepare not done"):
        ex.step_baseline(exp, "eflomal")
    with pytest.raises(ex.ExperimentError, match="rnn not done"):
        ex.step_tune(exp, select_configurations("baseline"), 1)


def _write(path: Path, lines: list[str], gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(f"{line}\n" for line in lines).encode()
    if gz:
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def test_data_step_takes_the_slices_of_the_settings(tmp_path, monkeypatch):
    data = tmp_path / "data"
    for lang in ("en", "fr"):
        _write(data / f"hansard/hansard.{lang}.gz", [f"h{k} {lang}" for k in range(1, 11)], gz=True)
        for year in (2011, 2012, 2013, 2014):
            _write(data / f"newstest/newstest{year}.{lang}", [f"n{year} {k} {lang}" for k in range(1, 6)])
    settings = dataclasses.replace(
        SMALL, name="tiny", train=[TextSlice("hansard/hansard.{lang}.gz", 2, 4)],
        lm=[TextSlice("hansard/hansard.{lang}.gz", 1, 6)], lm_valid=TextSlice("newstest/newstest2011.{lang}", 1, 2),
        dev=[TextSlice("newstest/newstest2012.{lang}", 1, 2), TextSlice("newstest/newstest2013.{lang}", 4, 5)],
        test=TextSlice("newstest/newstest2014.{lang}", 1, 3),
    )
    monkeypatch.setitem(SCALES, "tiny", settings)
    exp = ex.load_experiment(tmp_path / "work", "tiny", data=data)
    ex.step_data(exp)
    raw = exp.work / "raw"
    assert (raw / "train.en").read_text().splitlines() == ["h2 en", "h3 en", "h4 en"]
    assert (raw / "dev.fr").read_text().splitlines() == ["n2012 1 fr", "n2012 2 fr", "n2013 4 fr", "n2013 5 fr"]
    assert len((raw / "lm.fr").read_text().splitlines()) == 6 and not (raw / "lm.en").exists()
    assert json.loads(exp.stamp_path("data").read_text())["lines"]["test.en"] == 3


def _six_column_ini(exp: ex.Experiment, rnn: str, wp: str) -> str:
    return SIX_COLUMN_INI.format(rnn=rnn, wp=wp, table=exp.rnn_ini.parent / "phrase-table.rnn.gz")


def _rnn_system(exp: ex.Experiment, rnn: str = "0", wp: str = "0") -> None:
    exp.rnn_ini.parent.mkdir(parents=True, exist_ok=True)
    exp.rnn_ini.write_text(_six_column_ini(exp, rnn, wp))


def test_tune_command_fixes_unused_columns_and_resumes(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)  # the Moses of this test is moses_home's
    (tmp_path / "moses" / "bin").mkdir(parents=True)
    (tmp_path / "moses" / "scripts").mkdir()
    exp = _experiment(tmp_path, moses_home=tmp_path / "moses")
    _rnn_system(exp)
    base = ex.tune_command(exp, RunPlan(CONFIGURATIONS_BY_KEY["baseline"], 2))
    text = " ".join(base)
    assert "--fixed TranslationModel0_4 --fixed TranslationModel0_5" in text
    assert "--seed 1001" in text and "--continue" in text and "--feature" not in text
    assert f"--work-dir {exp.work / 'tune' / 'baseline' / 'run2'}" in text
    assert f"--moses-bin-dir {tmp_path / 'moses' / 'bin'}" in text
    assert f"--max-iterations {SMALL.tune_max_iterations}" in text
    nbest = " ".join(ex.tune_command(exp, RunPlan(CONFIGURATIONS_BY_KEY["cslm-nbest-rnn-wp"], 1)))
    assert "--fixed" not in nbest and f"--feature CSLM:{exp.cslm_model}" in nbest
    assert f"--moses-ini {exp.rnn_ini}" in nbest
    decoder = " ".join(ex.tune_command(exp, RunPlan(CONFIGURATIONS_BY_KEY["cslm-rnn-wp"], 1)))
    assert "--feature" not in decoder and f"--moses-ini {exp.cslm_ini}" in decoder


def test_cslm_rows_tune_the_six_column_system_with_the_cslm_in_the_decoder(tmp_path):
    exp = _experiment(tmp_path)
    _rnn_system(exp)
    config = NPLMConfig(ngram_size=7, input_vocab_size=5, output_vocab_size=5, input_embedding_dimension=2,
                        num_hidden=0, output_embedding_dimension=3)
    shapes = config.shapes()
    exp.cslm_nplm.parent.mkdir(parents=True)
    write_nplm(exp.cslm_nplm, NPLMModel(config, ["</s>", "<unk>", "le", "<s>", "<null>"],
                                        {name: np.zeros(shape) for name, shape in shapes.items()}))
    ex.write_cslm_ini(exp)
    ini, base = MosesIni.read(exp.cslm_ini), MosesIni.read(exp.rnn_ini)
    neural = ini.find_feature("CSLM0")
    assert neural is not None and neural.type == "NeuralLM" and neural.path == str(exp.cslm_nplm)
    assert "order=7" in ini.text() and ini.weights()["CSLM0"] == [0.0]
    assert {k: v for k, v in ini.weights().items() if k != "CSLM0"} == base.weights()


def test_no_two_runs_share_an_iterations_restart_points():
    """mert tune seeds iteration n with seed + 1000 n: run seeds 1000 k made run 2's iteration n
    draw run 1's iteration n + 1 restarts. Every (run, iteration) must get its own seed."""
    config = CONFIGURATIONS_BY_KEY["baseline"]
    seeds = [RunPlan(config, k).seed + SEED_STRIDE * n
             for k in range(1, MAX_RUNS + 1) for n in range(1, DEFAULT_MAX_ITERATIONS + 1)]
    assert len(set(seeds)) == len(seeds)
    assert RunPlan(config, 1).seed == 1000 and RunPlan(CONFIGURATIONS_BY_KEY["rnn"], 2).seed == 1001
    with pytest.raises(ValueError, match="1..999"):
        RunPlan(config, MAX_RUNS + 1).seed  # noqa: B018


def _tuned_run(exp: ex.Experiment, plan: RunPlan, seed: int, finished: str) -> None:
    """A finished tuning run as the pipeline leaves it: state, final ini and stamp."""
    work = exp.tune_dir(plan)
    work.mkdir(parents=True, exist_ok=True)
    (work / "tuning-state.json").write_text(json.dumps({"format": "mert-tune-state/1", "fingerprint": {"seed": seed}}))
    (work / "moses.ini").write_text(_six_column_ini(exp, "0", "0"))
    exp.stamp_path(f"tune/{plan.name}").write_text(json.dumps({"step": f"tune/{plan.name}", "finished": finished}))


def test_a_run_tuned_with_another_seed_is_refused_and_kept(tmp_path):
    exp = _experiment(tmp_path)
    _rnn_system(exp)
    exp.step("rnn", lambda: None)
    baseline = CONFIGURATIONS_BY_KEY["baseline"]
    _tuned_run(exp, RunPlan(baseline, 1), 1000, "2026-11-22T10:00:00+00:00")  # current: skipped
    _tuned_run(exp, RunPlan(baseline, 2), 2000, "2026-11-22T11:00:00+00:00")  # the old seed of run 2
    with pytest.raises(ex.ExperimentError, match=r"tuned with seed 2000, but run 2 is tuned with seed 1001.*"
                                                 r"tune--baseline--run2\.json.* aside"):
        ex.step_tune(exp, [baseline], 2)
    assert (exp.tune_dir(RunPlan(baseline, 2)) / "moses.ini").exists()
    for split in ("dev", "test"):  # run 1 is decoded, so eval reaches run 2
        exp.stamp_path(f"eval/baseline/run1/{split}").write_text(json.dumps({"finished": "2026-11-22T10:30:00+00:00"}))
    with pytest.raises(ex.ExperimentError, match="seed 2000"):
        ex.step_eval(exp, [baseline], 2)


def test_an_eval_older_than_its_tuning_is_refused(tmp_path):
    exp = _experiment(tmp_path)
    plan = RunPlan(CONFIGURATIONS_BY_KEY["baseline"], 1)
    exp.stamp_path("x").parent.mkdir(parents=True, exist_ok=True)
    _tuned_run(exp, plan, 1000, "2026-11-22T11:00:00+00:00")
    for split, finished in (("dev", "2026-11-22T11:05:00+00:00"), ("test", "2026-11-22T10:59:59+00:00")):
        exp.stamp_path(f"eval/{plan.name}/{split}").write_text(json.dumps({"finished": finished}))
    with pytest.raises(ex.ExperimentError, match=r"run1--test\.json: decoded before tune/baseline/run1 last"):
        ex.step_eval(exp, [plan.config], 1)
    exp.stamp_path(f"eval/{plan.name}/test").write_text(json.dumps({"finished": "2026-11-22T11:06:00+00:00"}))
    ex.step_eval(exp, [plan.config], 1)  # both decoded after the tuning: nothing to do


def test_fixed_columns_must_start_at_zero(tmp_path):
    exp = _experiment(tmp_path)
    _rnn_system(exp, rnn="0.2", wp="0")
    ex.check_start_weights(exp, CONFIGURATIONS_BY_KEY["rnn"])  # RNN is tuned: any start is fine
    with pytest.raises(ex.ExperimentError, match="TranslationModel0_4 starts at 0.2"):
        ex.check_start_weights(exp, CONFIGURATIONS_BY_KEY["baseline"])
    # A folder that shares finished Baseline runs may tune + RNN from another start: only a run
    # still to tune is checked.
    exp.step("rnn", lambda: None)
    _tuned_run(exp, RunPlan(CONFIGURATIONS_BY_KEY["baseline"], 1), 1000, "2026-11-22T10:00:00+00:00")
    ex.step_tune(exp, [CONFIGURATIONS_BY_KEY["baseline"]], 1)
    with pytest.raises(ex.ExperimentError, match="TranslationModel0_4 starts at 0.2"):
        ex.step_tune(exp, [CONFIGURATIONS_BY_KEY["baseline"]], 2)


def test_report_from_finished_runs(tmp_path):
    """Two Baseline runs and two +RNN runs, +RNN copying the reference: hand-checkable numbers."""
    exp = _experiment(tmp_path)
    _rnn_system(exp)
    refs = [f"la phrase numéro {k} est ici ." for k in range(30)]
    _write(exp.prepared("dev", "fr"), refs)
    _write(exp.prepared("test", "fr"), refs)
    _write(exp.work / "raw" / "test.fr", [f"La phrase numéro {k} est ici." for k in range(30)])
    worse = [f"la phrase {k} ici ." for k in range(30)]
    for key, hyps in (("baseline", worse), ("rnn", refs)):
        for run in (1, 2):
            plan = RunPlan(CONFIGURATIONS_BY_KEY[key], run)
            for split in ("dev", "test"):
                _write(exp.eval_output(plan, split), hyps)
                exp.step(f"eval/{plan.name}/{split}", lambda: None)
            tuned = exp.tune_dir(plan) / "moses.ini"
            tuned.parent.mkdir(parents=True, exist_ok=True)
            tuned.write_text(_six_column_ini(exp, "0.05" if key == "rnn" else "0", "0"))
            # what `mert tune` records of each iteration; run 2 of +RNN converged after 2 iterations
            bleus = [16.123, 2.5, 17.994] if (key, run) != ("rnn", 2) else [16.123, 18.0]
            (tuned.parent / "tuning-state.json").write_text(json.dumps({
                "format": "mert-tune-state/1", "completed_iterations": len(bleus), "fingerprint": {"seed": plan.seed},
                "stop_reason": "weights converged" if len(bleus) == 2 else "maximum iterations",
                "iterations": [{"iteration": i, "dev_bleu_1best": b} for i, b in enumerate(bleus, start=1)]}))
    # +RNN run 1's n-best pool: the reference wins only through the RNN column (ln p_RNN -20 on
    # the worse hypothesis, weight 0.05, against the LM's 0.5 x 1 nat in its favour).
    # The eval step's test 100-best list of that run is the same (the test references are the same).
    rnn_run1 = RunPlan(CONFIGURATIONS_BY_KEY["rnn"], 1)
    pool_lines = [f"{k} ||| {hyp} ||| LM0= {lm} TranslationModel0= 0 0 0 0 {rnn} 0 ||| 0"
                  for k in range(30) for hyp, lm, rnn in ((refs[k], -3, 0), (worse[k], -2, -20))]
    _write(exp.tune_dir(rnn_run1) / "run1.nbest.gz", pool_lines, gz=True)
    _write(Path(f"{exp.eval_output(rnn_run1, 'test')}.nbest.gz"), pool_lines, gz=True)
    # The 6-column table: p_RNN equals p(e|f) on every line, one line has an unknown word.
    p_ef = [0.5, 0.25, 0.125, 0.1, 0.01]
    _write(exp.rnn_ini.parent / "phrase-table.rnn.gz", [
        f"s{i} ||| t{i} ||| 0.5 {0.1 * (i + 1):g} {p:g} 0.3 {p:g} {0.367879 if i == 2 else 1:g} ||| 0-0 |||"
        for i, p in enumerate(p_ef)
    ], gz=True)
    paths = ex.step_report(exp, select_configurations("baseline rnn"), 2, tmp_path / "results", "make table1")
    doc = json.loads((tmp_path / "results" / "table1.json").read_text())
    base, rnn = doc["rows"][0], doc["rows"][1]
    assert rnn["test"] == {"mean": 100.0, "std": 0.0} and rnn["dev"]["mean"] == 100.0
    assert base["test"]["mean"] < 60 and base["runs_finished"] == 2
    assert len(rnn["p_values_vs_baseline"]) == 2 and all(p < 0.05 for p in rnn["p_values_vs_baseline"])
    gain = 100.0 - base["runs"][0]["test_bleu"]  # the same Baseline output in both runs
    assert rnn["deltas_vs_baseline"] == [pytest.approx(gain, abs=1e-3)] * 2
    assert base["p_values_vs_baseline"] == []
    assert [r["seed"] for r in base["runs"]] == [1000, 1001]  # read from the tuning state
    assert [r["stop_reason"] for r in rnn["runs"]] == ["maximum iterations", "weights converged"]
    assert rnn["runs"][0]["weights"]["TranslationModel0"][4] == 0.05
    assert "UnknownWordPenalty0" not in rnn["runs"][0]["weights"]
    md = (tmp_path / "results" / "table1.md").read_text()
    assert "| + RNN | 100.00 ± 0.00 (2 runs)" in md and "| 31.20 | 33.87 |" in md
    assert f"| +{gain:.2f} (p {rnn['p_values_vs_baseline'][0]:.3f}), +{gain:.2f} (p " in md
    assert "Made by `make table1`" in md
    assert "- + RNN run 2 (seed 1001, 2 iterations, stopped: weights converged, dev 100.00" in md
    assert (tmp_path / "results" / "table1.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "results" / "timings.tsv").exists() and len(paths) == 3
    analysis = doc["analysis"]
    assert analysis["phrase_pairs"] == 5 and analysis["pairs_with_unknown_words"] == pytest.approx(0.2)
    by_column = {c["column"]: c for c in analysis["correlations"]}
    assert by_column["p(e|f)"]["pearson"] == pytest.approx(1.0)
    assert by_column["p(e|f)"]["spearman"] == pytest.approx(1.0)
    assert by_column["p(f|e)"] == {"column": "p(f|e)", "pearson": None, "spearman": None}  # constant column
    assert by_column["lex(f|e)"]["spearman"] == pytest.approx(-1.0)  # 0.1 … 0.5 against a falling p_RNN
    rnn_runs = analysis["weights"]["+ RNN"]
    # L1 of the tuned weights: |−1| + 0.2 + 4 × 0.2 + 0.05 + 0 + 0.3 + 0.5 = 2.85
    assert rnn_runs[0] == {"run": 1, "rnn": 0.05, "wp": 0.0, "rnn_l1_share": pytest.approx(0.05 / 2.85)}
    assert "| + RNN | 1 | 0.05 | 0 | 1.8% |" in md and "| p(e\\|f) | 1.000 | 1.000 |" in md
    leverage = doc["leverage"]["runs"]
    assert list(leverage) == ["+ RNN"] and [r["run"] for r in leverage["+ RNN"]] == [1]  # the runs with n-best lists
    pool = leverage["+ RNN"][0]
    assert pool["pool_bleu"] == 100.0
    by_name = {doc["leverage"]["labels"][c["column"]]: c for c in pool["columns"]}
    assert list(by_name) == ["p_RNN", "p(e|f)", "n-gram LM"]
    # without it every worse hypothesis wins: no 4-gram of the reference, so MERT's BLEU (unsmoothed) is 0
    assert by_name["p_RNN"]["bleu_without"] == 0.0
    assert by_name["p(e|f)"]["bleu_without"] == 100.0 and by_name["n-gram LM"]["bleu_without"] == 100.0
    assert pool["test"]["pool_bleu"] == 100.0 and pool["test"]["columns"][0]["bleu_without"] == 0.0
    assert "| + RNN | 1 | p_RNN | 0.05 | 100.00 | 0.00 | 100.00 (0.05) | 100.00 | 0.00 |" in md
    assert doc["tuning"]["+ RNN"][1] == {"run": 2, "dev_bleu_1best": [16.12, 18.0]}
    assert "| configuration | run | 1 (start weights) | 2 | 3 |" in md
    assert "| Baseline | 1 | 16.12 | 2.50 | 17.99 |" in md and "| + RNN | 2 | 16.12 | 18.00 |  |" in md


def test_report_states_what_the_trainings_reached(tmp_path):
    exp = _experiment(tmp_path)
    exp.log_file("rnn").write_text(
        "$ rescorer train ...\nstep 0: valid log-likelihood -49.9, perplexity 15501.32, source gain 0.021 nats/pair\n"
        "step 500: valid log-likelihood -28.2, perplexity 233.18, source gain 1.441 nats/pair\n"
        "trained 500 steps in 60 s (stopped by max_time); best validation perplexity 233.18 at step 500; model: m.pt\n"
    )
    exp.log_file("cslm").write_text(
        "epoch 0: valid perplexity 15005.54\nepoch 1:   0%|  | 768/6.34M [00:01<2:24:02, 734 ngram/s]\repoch 1: "
        " 50%| 3.1M/6.34M\repoch 1: valid perplexity 210.50 (partial epoch)\nepoch 2:   1%|  | 1k/6.34M\r"
    )
    notes = ex.training_notes(exp)
    assert notes[1] == "CSLM training: epoch 1: valid perplexity 210.50 (partial epoch)."
    assert notes[:1] == [
        "RNN training: trained 500 steps in 60 s (stopped by max_time); best validation perplexity 233.18 at step "
        "500; model: m.pt; last validation: step 500: valid log-likelihood -28.2, perplexity 233.18, source gain "
        "1.441 nats/pair."
    ]


def test_report_needs_an_evaluated_run(tmp_path):
    exp = _experiment(tmp_path)
    with pytest.raises(ex.ExperimentError, match="no evaluated run"):
        ex.step_report(exp, select_configurations(""), 3, tmp_path / "results")


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
    assert ex.STEPS == ("data", "prepare", "baseline", "rnn", "cslm", "speed", "tune", "eval", "report")
