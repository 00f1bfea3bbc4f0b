"""The whole Table 1 pipeline on a tiny slice of the shared data, with the real Moses tools.

Skipped without MOSES_BIN_DIR (and ../shared); marked slow. It checks what a user of
`make table1` relies on: every step runs, Baseline decodes exactly as the 4-column system
(the two new columns stay at weight 0), the CSLM row decodes with the CSLM inside Moses (needs a
Moses built with NPLM, else that part is skipped), and a rerun finds everything done.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from cslm.model_file import load_cslm
from mert.features import read_sidecar
from mert.tune import read_state
from moses_integration.moses_ini import MosesIni
from moses_integration.nbest import read_nbest
from neural.training import last_checkpoint_path
from shared_paths import has_neural_lm, moses_bin_dir, shared_file
from table1 import collect, reranking, systems, tuning, workspace
from table1.reranking_report import write_reranking_report
from table1.settings import (
    SCALES,
    CslmSettings,
    RerankingSettings,
    RnnSettings,
    RunPlan,
    TextSlice,
    select_configurations,
)
from table1.system_training import MosesInstall
from table1_folders import load_experiment

pytestmark = [pytest.mark.slow, pytest.mark.moses]


@pytest.fixture(params=["small", "medium"])
def tiny(request, monkeypatch, tmp_path):
    """A scale's settings (its LM order, MERT cap, model kinds) on a tiny slice of the data."""
    bins = moses_bin_dir()
    home = os.environ.get("MOSES_HOME")
    install = MosesInstall.locate(bins, home)
    for tool in ("symal", "lmplz", "build_binary", "extract", "score", "consolidate", "lexical-reordering-score"):
        if not (install.bin_dir / tool).exists():
            pytest.skip(f"Moses build lacks {tool}")
    if shutil.which("eflomal-align") is None and not (Path(sys.executable).parent / "eflomal-align").exists():
        pytest.skip("eflomal not installed (pip install '.[experiment]')")
    data = shared_file("data")
    scale = SCALES[request.param]
    # medium's news-domain recipe in small: 2,000 Hansard pairs selected by real KenLM to half their
    # words against dev + 100 news pairs, which are then added whole (and to the LM text)
    news = (TextSlice("newstest/news-test2008.{lang}", 1, 100),) if scale.train_in_domain else ()
    selection = dataclasses.replace(scale.selection, train_words=20_000) if scale.selection else None
    settings = dataclasses.replace(
        scale, name="tiny", train=[TextSlice("hansard/hansard.{lang}.gz", 1, 2000)], train_in_domain=news,
        selection=selection, lm=[TextSlice("hansard/hansard.{lang}.gz", 1, 2000), *news],
        lm_valid=TextSlice("newstest/newstest2011.{lang}", 1, 20),
        dev=[TextSlice("newstest/newstest2012.{lang}", 1, 4), TextSlice("newstest/newstest2013.{lang}", 1, 4)],
        test=TextSlice("newstest/newstest2014.{lang}", 1, 8), lm_prune=(0,) * SCALES[request.param].lm_order,
        # an update budget, not a time one: on a loaded machine 5 s held 116 updates, after which every
        # proposal was still [UNK] or unfinished
        rnn=RnnSettings(hidden=16, embedding=8, maxout_units=8, output_rank=8, shortlist=500, max_time=600,
                        max_steps=400),
        # an epoch budget, not a time one: on a loaded machine 5 s held one epoch of 256 n-grams
        cslm=CslmSettings(embedding=8, hidden=(16, 8), shortlist=500, max_time=600, epoch_size=256, max_epochs=2),
        tune_max_iterations=2, nbest_size=20, restarts=2,
        reranking=RerankingSettings(nbest_size=30, rerank_size=10, restarts=2),
    )
    monkeypatch.setitem(SCALES, "tiny", settings)
    return load_experiment(tmp_path / "work", "tiny", data=data, moses_bin_dir=install.bin_dir,
                              moses_home=install.scripts_dir.parent, jobs=2, device="cpu")


def test_tiny_table1_end_to_end(tiny, tmp_path):
    exp = tiny
    in_decoder = has_neural_lm(exp.moses().bin_dir)
    configs = select_configurations("baseline rnn rnn-proposals rnn-both-prop" + (" cslm-rnn" if in_decoder else ""))
    by_key = {c.key: c for c in configs}
    systems.step_data(exp)
    systems.step_prepare(exp)
    if exp.settings.train_in_domain:  # real KenLM kept some of the Hansard pairs, then the news pairs whole
        selected = json.loads(exp.stamp_path("prepare/select-train").read_text())
        news = json.loads(exp.stamp_path("prepare/clean.train-in").read_text())["pairs_kept"]
        assert 0 < selected["lines_kept"] < selected["lines_read"] and news > 90
        corpus = Path(f"{exp.train_corpus}.en").read_text(encoding="utf-8").splitlines()
        assert len(corpus) == selected["lines_kept"] + news
    systems.step_baseline(exp, "eflomal")
    systems.step_rnn(exp)
    for kind in workspace.TABLE2_KINDS:  # the paper's Table 2 for this RNN: rescorer compare's table, a row per source
        assert exp.table2_path(kind).read_text().startswith("| source (")
    weights = MosesIni.read(exp.rnn_ini).weights()["TranslationModel0"]
    assert len(weights) == 6 and weights[4:] == [0.0, 0.0]
    systems.step_proposals(exp)  # the RNN completes the filtered table: 7 columns, the new ones at weight 0
    assert MosesIni.read(exp.proposals_ini).weights()["TranslationModel0"][4:] == [0.0, 0.0, 0.0]
    assert exp.proposals_list().read_text().count("\n") > 0
    systems.step_rnn_both(exp)  # a reverse model, then proposals reranked by both directions
    systems.step_proposals(exp, "proposals-both")  # 8 columns: p_RNN(f|e) after U, then the indicator
    assert MosesIni.read(exp.system_ini("proposals-both")).weights()["TranslationModel0"][4:] == [0.0] * 4
    assert len(exp.proposals_list("proposals-both").read_text().splitlines()[0].split("\t")) == 6
    if in_decoder:
        systems.step_cslm(exp)
        # validated every epoch_size n-grams, not once per pass over the LM text
        history = load_cslm(last_checkpoint_path(exp.cslm_model)).train_state["history"]
        epoch_ends = [v["examples"] for v in history if v["examples"] == 256 * v["epoch"]]
        assert len(epoch_ends) >= 3 and epoch_ends[:3] == [0, 256, 512], history
    tuning.step_speed(exp, configs)
    speeds = {name: json.loads(exp.stamp_path(f"speed/{name}").read_text()) for name in ("rnn", "cslm")
              if exp.done(f"speed/{name}")}
    assert set(speeds) == ({"rnn", "cslm"} if in_decoder else {"rnn"})
    assert exp.done("speed/proposals") and exp.done("speed/proposals-both")
    assert all(s["sentences"] == 8 and s["seconds_per_sentence"] > 0 for s in speeds.values())
    tuning.step_tune(exp, configs, 1)
    tuning.step_eval(exp, configs, 1)
    if in_decoder:  # the CSLM row tuned Moses' NeuralLM feature: a weight in moses.ini, a column in the n-best lists
        plan = RunPlan(by_key["cslm-rnn"], 1)
        tuned_ini = MosesIni.read(exp.tune_dir(plan) / "moses.ini")
        assert tuned_ini.find_feature("CSLM0").type == "NeuralLM" and "CSLM0" in tuned_ini.weights()
        assert all(e.name != "CSLM0" for e in read_sidecar(exp.tune_dir(plan) / "moses.ini"))
        first = next(read_nbest(exp.tune_dir(plan) / "run1.nbest.gz"))
        assert "CSLM0" in dict(first.features)
    # Baseline is the original system: its tuned RNN and unknown-word weights stayed 0.
    tuned = collect.run_weights(exp.tune_dir(RunPlan(configs[0], 1)) / "moses.ini")
    assert tuned["TranslationModel0"][4:] == [0.0, 0.0]
    # The proposals row tuned its 7-column system with the unknown-word column held at 0.
    tuned = collect.run_weights(exp.tune_dir(RunPlan(by_key["rnn-proposals"], 1)) / "moses.ini")
    assert len(tuned["TranslationModel0"]) == 7 and tuned["TranslationModel0"][5] == 0.0
    # Moses read the 8-column table, and MERT tuned it with U held at 0 (the n-best lists had 8 columns).
    tuned = collect.run_weights(exp.tune_dir(RunPlan(by_key["rnn-both-prop"], 1)) / "moses.ini")
    assert len(tuned["TranslationModel0"]) == 8 and tuned["TranslationModel0"][5] == 0.0
    collect.step_report(exp, configs, 1, tmp_path / "results")
    doc = json.loads((tmp_path / "results" / "table1.json").read_text())
    assert [r["runs_finished"] for r in doc["rows"]] == [1] * len(configs)
    # each row's run 1 has its dev pool (every iteration's n-best list) and a leverage for each of its columns
    assert sorted(doc["leverage"]["runs"]) == sorted(c.label for c in configs)
    assert all(r["run"] == 1 and 0 <= r["pool_bleu"] <= 100 and r["columns"]
               for runs in doc["leverage"]["runs"].values() for r in runs)
    assert set(doc["table2"]) == set(workspace.TABLE2_KINDS)
    assert "## Table 2 (rare long source phrases)" in (tmp_path / "results" / "table1.md").read_text()
    # Baseline's and + RNN's run 1 against the test reference: each share a fraction, on real pairs
    [choice] = doc["reference_choice"]
    assert choice["run"] == 1 and choice["pairs"] > 0 and all(0 <= a <= 1 for a in choice["accuracy"].values())
    assert "## Which target the reference uses" in (tmp_path / "results" / "table1.md").read_text()
    evidence, evidence_both = doc["proposals"]
    assert evidence_both["label"] == "+ RNN both directions + proposals" and evidence_both["proposals"] > 0
    assert evidence["proposals"] > 0 and [r["run"] for r in evidence["runs"]] == [1]
    assert evidence["runs"][0]["usage"]["sentences"] == 8
    # each tuning iteration's dev 1-best, the first decoded with the indicator at its start weight 0
    iterations = read_state(exp.tune_dir(RunPlan(by_key["rnn-proposals"], 1)))["completed_iterations"]
    assert [r["iteration"] for r in evidence["tuning"]] == list(range(1, iterations + 1))
    assert evidence["tuning"][0]["indicator_weight"] == 0.0 and evidence["tuning"][0]["usage"]["sentences"] == 8
    rows = {r["key"]: r for r in doc["rows"]}
    assert [v["label"] for v in rows["rnn-proposals"]["versus"]] == ["+ RNN"] and not rows["rnn"]["versus"]
    budget = [n for n in doc["notes"] if n.startswith("Budget, ")]
    assert len(budget) == len(configs) and all("8 sentences with 2 threads" in n for n in budget)
    stamps = sorted(p.name for p in (exp.work / "stamps").iterdir())
    # a rerun finds every step done and changes nothing
    systems.step_baseline(exp, "eflomal")
    tuning.step_tune(exp, configs, 1)
    assert sorted(p.name for p in (exp.work / "stamps").iterdir()) == stamps
    # Run 1 reranks its own lists: Moses wrote them with the segmentation, best first (its 1-best is the
    # eval step's output), and the list's RNN column is a set of its own.
    sets = reranking.step_reranking(exp, 1)
    first = next(read_nbest(reranking.list_path(exp, 1, "test")))
    assert first.segmentation and "TranslationModel0" in dict(first.features)
    write_reranking_report(exp, 1, sets, [], tmp_path / "results")
    doc = json.loads((tmp_path / "results" / "reranking.json").read_text())
    assert doc["first_hypothesis_check"] == [{"run": 1, "same": 8, "sentences": 8}]
    rows = {r["label"]: r for r in doc["rows"]}
    assert {"Baseline reranked", "+ p_RNN"} <= set(rows) and all(len(r["runs"]) == 1 for r in rows.values())
    assert [size for size, _ in doc["oracle"]["run1"]["dev"]["oracle_bleu"]] == [1, 10, 30]
