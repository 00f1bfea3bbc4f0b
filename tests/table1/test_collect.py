"""The report step on hand-made runs: the table, its statistics and the evidence beside it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from table1 import collect, workspace
from table1.settings import CONFIGURATIONS_BY_KEY, RunPlan, select_configurations
from table1_folders import six_column_ini, small_experiment, write_lines, write_rnn_system


@pytest.mark.slow
def test_report_from_finished_runs(tmp_path):
    """Two Baseline runs and two +RNN runs, +RNN copying the reference: hand-checkable numbers."""
    exp = small_experiment(tmp_path)
    write_rnn_system(exp)
    refs = [f"la phrase numéro {k} est ici ." for k in range(30)]
    write_lines(exp.prepared("dev", "fr"), refs)
    write_lines(exp.prepared("test", "fr"), refs)
    write_lines(exp.prepared("test", "en"), [f"the sentence number {k} is here ." for k in range(30)])
    write_lines(exp.work / "raw" / "test.fr", [f"La phrase numéro {k} est ici." for k in range(30)])
    worse = [f"la phrase {k} ici ." for k in range(30)]
    for key, hyps in (("baseline", worse), ("rnn", refs)):
        for run in (1, 2):
            plan = RunPlan(CONFIGURATIONS_BY_KEY[key], run)
            for split in ("dev", "test"):
                write_lines(exp.eval_output(plan, split), hyps)
                exp.step(f"eval/{plan.name}/{split}", lambda: None)
            tuned = exp.tune_dir(plan) / "moses.ini"
            tuned.parent.mkdir(parents=True, exist_ok=True)
            tuned.write_text(six_column_ini(exp, "0.05" if key == "rnn" else "0", "0"))
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
    write_lines(exp.tune_dir(rnn_run1) / "run1.nbest.gz", pool_lines, gz=True)
    write_lines(Path(f"{exp.eval_output(rnn_run1, 'test')}.nbest.gz"), pool_lines, gz=True)
    # The 6-column table: p_RNN equals p(e|f) on every line, one line has an unknown word.
    p_ef = [0.5, 0.25, 0.125, 0.1, 0.01]
    write_lines(exp.rnn_ini.parent / "phrase-table.rnn.gz", [
        f"s{i} ||| t{i} ||| 0.5 {0.1 * (i + 1):g} {p:g} 0.3 {p:g} {0.367879 if i == 2 else 1:g} ||| 0-0 |||"
        for i, p in enumerate(p_ef)
    ], gz=True)
    paths = collect.step_report(exp, select_configurations("baseline rnn"), 2, tmp_path / "results", "make table1")
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
    assert by_column["p(f|e)"] == {"column": "p(f|e)", "pearson": None, "spearman": None,
                                 "pearson_same_length": None, "pearson_same_source": None,
                                 "pearson_same_source_length": None}  # constant column
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
    # + RNN's test 1-best differs from Baseline's on every sentence of both runs; these runs were
    # decoded without translation details, so the report says so and shows no sentences.
    changes = doc["rnn_changes"]
    assert changes["label"] == "+ RNN" and changes["against"] == "Baseline"
    assert [(r["run"], r["seeds"], r["changed_1best"]) for r in changes["runs"]] == [(1, [1000, 1000], 30),
                                                                                    (2, [1001, 1001], 30)]
    assert changes["missing_details"][:2] == ["WORK/eval/baseline/run1.test.tok.details",
                                              "WORK/eval/rnn/run1.test.tok.details"]
    assert "## Where + RNN's test 1-best differs from Baseline's" in md
    assert "| all | | 60 | 60 (100.0%) | – |" in md and "No translation details for 4 decode(s)" in md
    assert doc["tuning"]["+ RNN"][1] == {"run": 2, "dev_bleu_1best": [16.12, 18.0]}
    assert "| configuration | run | 1 (start weights) | 2 | 3 |" in md
    assert "| Baseline | 1 | 16.12 | 2.50 | 17.99 |" in md and "| + RNN | 2 | 16.12 | 18.00 |  |" in md


def test_report_states_what_the_trainings_reached(tmp_path):
    exp = small_experiment(tmp_path)
    exp.log_file("rnn").write_text(
        "$ rescorer train ...\nstep 0: valid log-likelihood -49.9, perplexity 15501.32, source gain 0.021 nats/pair\n"
        "step 500: valid log-likelihood -28.2, perplexity 233.18, source gain 1.441 nats/pair\n"
        "trained 500 steps in 60 s (stopped by max_time); best validation perplexity 233.18 at step 500; model: m.pt\n"
    )
    exp.log_file("cslm").write_text(
        "epoch 0: valid perplexity 15005.54\nepoch 1:   0%|  | 768/6.34M [00:01<2:24:02, 734 ngram/s]\repoch 1: "
        " 50%| 3.1M/6.34M\repoch 1: valid perplexity 210.50 (partial epoch)\nepoch 2:   1%|  | 1k/6.34M\r"
    )
    notes = collect.training_notes(exp)
    assert notes[1] == "CSLM training: epoch 1: valid perplexity 210.50 (partial epoch)."
    assert notes[:1] == [
        "RNN training: trained 500 steps in 60 s (stopped by max_time); best validation perplexity 233.18 at step "
        "500; model: m.pt; last validation: step 500: valid log-likelihood -28.2, perplexity 233.18, source gain "
        "1.441 nats/pair."
    ]


def test_report_needs_an_evaluated_run(tmp_path):
    exp = small_experiment(tmp_path)
    with pytest.raises(workspace.ExperimentError, match="no evaluated run"):
        collect.step_report(exp, select_configurations(""), 3, tmp_path / "results")


def test_the_report_names_the_work_folder_WORK(tmp_path):
    """A committed report holds no machine's paths: the work folder's is written WORK."""
    work = tmp_path / "table1-work"
    doc = {"notes": [f"model: {work}/rnn/model.pt", f"old: {work}-old/x"], "analysis": {"table": f"{work}/rnn/t.gz"},
           "n": 3}
    assert collect.portable(doc, work) == {"notes": ["model: WORK/rnn/model.pt", f"old: {work}-old/x"],
                                           "analysis": {"table": "WORK/rnn/t.gz"}, "n": 3}


def test_each_rows_leverage_columns_are_named_as_its_own_table_holds_them() -> None:
    """A 7th column is p_RNN(f|e) in the both-directions row and the indicator in the proposals row;
    the both-ways proposals row has both, the indicator 8th. WP shows only where the row tunes it."""
    names = {key: collect.leverage_columns(select_configurations(key)[0], "TM0", 4, "LM0")
             for key in ("rnn", "rnn-wp", "rnn-proposals", "rnn-both", "rnn-both-prop", "cslm-nbest-rnn")}
    scale = {"TM0_2": "p(e|f)", "LM0_0": "n-gram LM"}
    assert names["rnn"] == {"TM0_4": "p_RNN", **scale}
    assert names["rnn-wp"] == {"TM0_4": "p_RNN", "TM0_5": "WP", **scale}
    assert names["rnn-proposals"] == {"TM0_4": "p_RNN", "TM0_6": "proposed (indicator)", **scale}
    assert names["rnn-both"] == {"TM0_4": "p_RNN", "TM0_6": "p_RNN(f|e)", **scale}
    assert names["rnn-both-prop"] == {"TM0_4": "p_RNN", "TM0_6": "p_RNN(f|e)", "TM0_7": "proposed (indicator)",
                                      **scale}
    assert names["cslm-nbest-rnn"] == {"TM0_4": "p_RNN", "CSLM0_0": "CSLM", **scale}
    assert all(list(found)[-2:] == list(scale) for found in names.values())  # p(e|f) and the LM last, for scale


def test_the_tuning_decodes_are_the_iterations_that_left_their_ini_and_list(tmp_path):
    """Iteration k decoded dev with runk.moses.ini (the weights MERT chose after k - 1): those are the weights read."""
    exp = small_experiment(tmp_path)
    work = tmp_path / "tune"
    work.mkdir()
    (work / "tuning-state.json").write_text(json.dumps({
        "format": "mert-tune-state/1", "fingerprint": {"seed": 1000},
        "iterations": [{"iteration": i, "dev_bleu_1best": b} for i, b in ((1, 17.1), (2, 20.5), (3, 21.0))]}))
    for i, rnn in ((1, "0"), (2, "-0.25")):
        (work / f"run{i}.moses.ini").write_text(six_column_ini(exp, rnn, "0"))
        write_lines(work / f"run{i}.nbest.gz", ["0 ||| x ||| PhrasePenalty0= 1 ||| 0"], gz=True)
    (work / "run3.moses.ini").write_text(six_column_ini(exp, "-0.5", "0"))  # killed before its list was kept
    decodes = collect.tuning_decodes(work, 2)
    assert [(d.run, d.iteration, d.dev_bleu, d.weights["TranslationModel0"][4]) for d in decodes] == \
        [(2, 1, 17.1, 0.0), (2, 2, 20.5, -0.25)]
    assert decodes[1].nbest == work / "run2.nbest.gz"
