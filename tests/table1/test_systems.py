"""The steps that build the systems, without Moses: the data slices, selection, the CSLM rows' moses.ini."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from analysis_checkpoint import EXAMPLE_TABLE, write_random_checkpoint
from moses_integration.moses_ini import MosesIni
from moses_integration.nplm import NPLMConfig, NPLMModel, write_nplm
from proposal_system import EXAMPLE_INI, write_model, write_reverse_model, write_word_tables
from shared_paths import REPO_ROOT
from table1 import collect, report, systems, workspace
from table1.settings import SCALES, SMALL, ProposalSettings, TextSlice
from table1.workspace import RERANK_STEP, ExperimentError
from table1_folders import load_experiment, small_experiment, write_lines, write_rnn_system

SAMPLE_TABLE = REPO_ROOT / "examples" / "phrase-table.en-fr.gz"


def test_full_scale_selects_the_training_and_lm_text_against_the_dev_set(tmp_path, monkeypatch):
    """SCALE=full keeps the paper's 348M parallel / 418M LM words, scored against dev (newstest2012+13),
    and every later step reads the selected text; SCALE=small trains on all of it."""
    from table1 import data_selection

    small = small_experiment(tmp_path / "s")
    assert small.train_corpus.name == "train.clean" and small.lm_text == small.prepared("lm", "fr")
    exp = load_experiment(tmp_path / "work", "full", moses_bin_dir=tmp_path)
    calls = []

    def select(install, corpus, in_domain, out, budget_words, work, log, settings, **kw):
        calls.append(([p.name for p in corpus], [p.name for p in in_domain], list(out), budget_words))
        return data_selection.SelectionResult(1, 1, 1, 1, 0.0)

    monkeypatch.setattr(systems, "select_lines", select)
    monkeypatch.setattr(workspace.Experiment, "moses", lambda self: None)
    systems.select_training_text(exp, exp.settings.selection)
    assert calls == [
        (["train.clean.en", "train.clean.fr"], ["dev.tok.tc.en", "dev.tok.tc.fr"],
         [exp.work / "prepared" / "train.sel.en", exp.work / "prepared" / "train.sel.fr"], 348_000_000),
        (["lm.tok.tc.fr"], ["dev.tok.tc.fr"], [exp.work / "prepared" / "lm.sel.fr"], 418_000_000),
    ]
    assert exp.train_corpus == exp.work / "prepared" / "train.sel" and exp.lm_text == calls[1][2][0]
    assert exp.done("prepare/select-train") and exp.done("prepare/select-lm")


def test_data_step_takes_the_slices_of_the_settings(tmp_path, monkeypatch):
    data = tmp_path / "data"
    for lang in ("en", "fr"):
        write_lines(data / f"hansard/hansard.{lang}.gz", [f"h{k} {lang}" for k in range(1, 11)], gz=True)
        for year in (2011, 2012, 2013, 2014):
            write_lines(data / f"newstest/newstest{year}.{lang}", [f"n{year} {k} {lang}" for k in range(1, 6)])
    settings = dataclasses.replace(
        SMALL, name="tiny", train=[TextSlice("hansard/hansard.{lang}.gz", 2, 4)],
        lm=[TextSlice("hansard/hansard.{lang}.gz", 1, 6)], lm_valid=TextSlice("newstest/newstest2011.{lang}", 1, 2),
        dev=[TextSlice("newstest/newstest2012.{lang}", 1, 2), TextSlice("newstest/newstest2013.{lang}", 4, 5)],
        test=TextSlice("newstest/newstest2014.{lang}", 1, 3),
    )
    monkeypatch.setitem(SCALES, "tiny", settings)
    exp = load_experiment(tmp_path / "work", "tiny", data=data)
    systems.step_data(exp)
    raw = exp.work / "raw"
    assert (raw / "train.en").read_text().splitlines() == ["h2 en", "h3 en", "h4 en"]
    assert (raw / "dev.fr").read_text().splitlines() == ["n2012 1 fr", "n2012 2 fr", "n2013 4 fr", "n2013 5 fr"]
    assert len((raw / "lm.fr").read_text().splitlines()) == 6 and not (raw / "lm.en").exists()
    assert json.loads(exp.stamp_path("data").read_text())["lines"]["test.en"] == 3


def test_cslm_rows_tune_the_six_column_system_with_the_cslm_in_the_decoder(tmp_path):
    exp = small_experiment(tmp_path)
    write_rnn_system(exp)
    config = NPLMConfig(ngram_size=7, input_vocab_size=5, output_vocab_size=5, input_embedding_dimension=2,
                        num_hidden=0, output_embedding_dimension=3)
    shapes = config.shapes()
    exp.cslm_nplm.parent.mkdir(parents=True)
    write_nplm(exp.cslm_nplm, NPLMModel(config, ["</s>", "<unk>", "le", "<s>", "<null>"],
                                        {name: np.zeros(shape) for name, shape in shapes.items()}))
    systems.write_cslm_ini(exp)
    ini, base = MosesIni.read(exp.cslm_ini), MosesIni.read(exp.rnn_ini)
    neural = ini.find_feature("CSLM0")
    assert neural is not None and neural.type == "NeuralLM" and neural.path == str(exp.cslm_nplm)
    assert "order=7" in ini.text() and ini.weights()["CSLM0"] == [0.0]
    assert {k: v for k, v in ini.weights().items() if k != "CSLM0"} == base.weights()


def test_news_domain_scales_select_hansard_against_dev_and_news_then_add_the_news_whole(tmp_path, monkeypatch):
    """SCALE=medium and small-news: the Hansard pairs most like the in-domain text (dev +
    the earlier news sets) are selected, the news sets are added whole after them, the truecaser
    learns from both, and the LM text is not selected."""
    from table1 import data_selection

    data = tmp_path / "data"
    for lang in ("en", "fr"):
        write_lines(data / f"hansard/hansard.{lang}.gz", [f"Hansard {k} {lang}" for k in range(1, 11)], gz=True)
        write_lines(data / f"newstest/news-test2008.{lang}", [f"News {k} {lang}" for k in range(1, 4)])
        for year in (2011, 2012, 2013, 2014):
            write_lines(data / f"newstest/newstest{year}.{lang}", [f"n{year} {k} {lang}" for k in range(1, 6)])
    settings = dataclasses.replace(
        SCALES["medium"], name="tiny", train_in_domain=(TextSlice("newstest/news-test2008.{lang}"),),
        lm=[TextSlice("hansard/hansard.{lang}.gz"), TextSlice("newstest/news-test2008.{lang}")],
        lm_valid=TextSlice("newstest/newstest2011.{lang}", 1, 2),
        dev=[TextSlice("newstest/newstest2012.{lang}", 1, 2), TextSlice("newstest/newstest2013.{lang}", 4, 5)],
        test=TextSlice("newstest/newstest2014.{lang}", 1, 3))
    monkeypatch.setitem(SCALES, "tiny", settings)
    exp = load_experiment(tmp_path / "work", "tiny", data=data, moses_bin_dir=tmp_path)
    calls = []

    def select(install, corpus, in_domain, out, budget_words, work, log, settings, **kw):
        """Keeps the even-numbered lines, as a selection would keep some."""
        calls.append(([p.name for p in corpus], [p.read_text().splitlines() for p in in_domain], budget_words))
        for src, dest in zip(corpus, out, strict=True):
            dest.write_text("".join(line + "\n" for line in src.read_text().splitlines()[1::2]))
        return data_selection.SelectionResult(10, 5, 30, 15, 0.0)

    monkeypatch.setattr(systems, "select_lines", select)
    monkeypatch.setattr(workspace.Experiment, "moses", lambda self: None)
    systems.step_data(exp)
    systems.step_prepare(exp)
    assert [c[0] for c in calls] == [["train.clean.en", "train.clean.fr"]] and calls[0][2] == 6_000_000
    in_domain_fr = calls[0][1][1]
    assert in_domain_fr == ["n2012 1 fr", "n2012 2 fr", "n2013 4 fr", "n2013 5 fr", "News 1 fr", "News 2 fr",
                            "News 3 fr"]
    assert (exp.train_corpus.parent / f"{exp.train_corpus.name}.en").read_text().splitlines() == [
        f"Hansard {k} en" for k in (2, 4, 6, 8, 10)] + [f"News {k} en" for k in (1, 2, 3)]
    assert exp.lm_text == exp.prepared("lm", "fr")  # all of it: Hansard and the news' French side
    assert len(exp.lm_text.read_text().splitlines()) == 13
    # the truecaser counted "fr" in the 10 Hansard and the 3 news lines (first words do not count)
    assert (exp.work / "prepared" / "truecase-model.fr").read_text().split() == ["fr", "(13/13)"]


def test_the_both_directions_system_trains_a_reverse_model_as_the_forward_one_and_scores_with_both(
        tmp_path, monkeypatch):
    """The reverse model gets the forward one's sizes, shortlists, budget and patience, plus
    --reverse and at most as many updates as the forward training made (its last state's step, not
    its best model's); the filtered table is scored with both models into the 7-column system."""
    exp = small_experiment(tmp_path)
    filtered = exp.path("baseline", "filtered", "moses.ini")
    filtered.parent.mkdir(parents=True)
    write_rnn_system(exp)
    filtered.write_text(exp.rnn_ini.read_text())
    exp.step("baseline", lambda: None)
    forward = exp.path("rnn", "model.pt")
    write_random_checkpoint(SAMPLE_TABLE, forward, history=[{"step": 8500}])  # the best validation
    write_random_checkpoint(SAMPLE_TABLE, Path(f"{forward}.last"), history=[{"step": 8737}])  # where it stopped
    commands: list[list[str]] = []
    monkeypatch.setattr(systems, "run_tool", lambda command, *args: commands.append([str(c) for c in command]))
    systems.step_rnn(exp)
    systems.step_rnn_both(exp)
    train, reverse_train = (c for c in commands if c[1] == "train")
    forward_model, reverse_model = exp.path("rnn", "model.pt"), exp.path("rnn-both", "model.reverse.pt")
    assert reverse_train.count("--reverse") == 1
    steps = reverse_train.index("--max-steps")
    assert reverse_train[steps + 1] == "8737" and "--max-steps" not in train
    assert [part for i, part in enumerate(reverse_train) if part != "--reverse" and i not in (steps, steps + 1)] == [
        str(reverse_model) if part == str(forward_model) else part for part in train]
    both = next(c for c in commands if "--reverse-model" in c)
    assert both[both.index("--model") + 1] == str(forward_model)
    assert both[both.index("--reverse-model") + 1] == str(reverse_model)
    assert both[both.index("--moses-ini-out") + 1] == str(exp.rnn_both_ini)
    assert all(exp.done(stamp) for stamp in ("rnn-both/train", "rnn-both/rescore", "rnn-both"))
    untrained = write_random_checkpoint(SAMPLE_TABLE, tmp_path / "untrained.pt")
    with pytest.raises(ExperimentError, match="untrained.pt holds no training state"):
        systems.trained_updates(untrained)


def test_the_both_ways_proposals_rerank_with_the_reverse_model_into_a_system_of_their_own(tmp_path, monkeypatch):
    """+ RNN both directions + proposals: the same sources and targets per source as the
    proposals row, the reverse model of the rnn-both step, rescorer's reranked beam (no --beam), and
    its own folder, listing and stamp, so both proposals rows can live in one work folder."""
    exp = small_experiment(tmp_path)
    filtered = exp.path("baseline", "filtered", "moses.ini")
    filtered.parent.mkdir(parents=True)
    write_rnn_system(exp)
    filtered.write_text(exp.rnn_ini.read_text())
    for stamp in ("baseline", "rnn"):
        exp.step(stamp, lambda: None)
    commands: list[list[str]] = []
    monkeypatch.setattr(systems, "run_tool", lambda command, *args: commands.append([str(c) for c in command]))
    with pytest.raises(ExperimentError, match="rnn-both"):  # the reverse model comes first
        systems.step_proposals(exp, "proposals-both")
    exp.step("rnn-both", lambda: None)
    exp.step(RERANK_STEP, lambda: {"reverse": 0.25, "length": 1.0})  # as chosen on dev (test_rerank_choice)
    systems.step_proposals(exp, "proposals")
    systems.step_proposals(exp, "proposals-both")
    plain, both = commands
    assert both[both.index("--rerank-reverse-weight") + 1:both.index("--rerank-length-weight") + 2] == \
        ["0.25", "--rerank-length-weight", "1.0"]
    assert "--reverse-model" not in plain and both[both.index("--reverse-model") + 1] == str(exp.reverse_model)
    assert "--beam" in plain and "--beam" not in both
    for option in ("--model", "--for-text", "--thin-below", "--per-source", "--moses-ini"):
        assert both[both.index(option) + 1] == plain[plain.index(option) + 1], option
    assert both[both.index("--moses-ini-out") + 1] == str(exp.system_ini("proposals-both"))
    assert both[both.index("--list") + 1] == str(exp.proposals_list("proposals-both")) != \
        plain[plain.index("--list") + 1]
    assert exp.done("proposals") and exp.done("proposals-both")


def _dev_system(exp: workspace.Experiment) -> None:
    """What the weights step reads: the filtered table and word tables of the baseline, the two RNNs
    (the reverse one trained briefly, so that its weight matters), and dev's tokenised text (10
    sentences, each a table source and two more words)."""
    filtered = exp.path("baseline", "filtered")
    filtered.mkdir(parents=True)
    shutil.copy(EXAMPLE_TABLE, filtered / EXAMPLE_TABLE.name)
    shutil.copy(EXAMPLE_INI, filtered / "moses.ini")
    exp.path("baseline", "model").mkdir(parents=True)
    write_word_tables(EXAMPLE_TABLE, exp.path("baseline", "model"))
    exp.path("rnn").mkdir()
    write_model(EXAMPLE_TABLE, exp.path("rnn", "model.pt"))
    exp.reverse_model.parent.mkdir()
    write_reverse_model(EXAMPLE_TABLE, exp.reverse_model)
    lines = gzip.decompress(EXAMPLE_TABLE.read_bytes()).decode().splitlines()
    pairs = [line.split(" ||| ")[:2] for line in lines[::40]]
    exp.path("prepared").mkdir()
    exp.prepared("dev", "en").write_text("".join(f"{s} the budget\n" for s, _ in pairs))
    exp.prepared("dev", "fr").write_text("".join(f"{t} le budget\n" for _, t in pairs))


@pytest.mark.slow
def test_the_weights_step_runs_rerank_weights_on_dev_and_proposes_with_its_choice(tmp_path) -> None:
    """``proposals-both/weights`` runs ``rescorer rerank-weights`` on dev (the whole of it: it has fewer
    sentences than the setting asks for) with the scale's grid and the rows' own models, keeps its
    figures for the report, and stamps the choice its last line states; a rerun reads the stamp, even
    with the models gone, so the proposals keep the weights they were chosen with."""
    exp = small_experiment(tmp_path)
    exp.settings = dataclasses.replace(exp.settings, proposals=ProposalSettings(per_source=1))
    _dev_system(exp)
    reverse, length = systems.rerank_weights(exp)
    said = exp.rerank_report.read_text(encoding="utf-8").splitlines()
    assert said[0].startswith("dev.tok.tc.en: 10 sentences; ") and " sources to fill (" in said[0]
    grid = exp.settings.rerank
    points = [re.match(r"  λ (\S+), μ (\S+): ", line) for line in said]
    assert [(float(m[1]), float(m[2])) for m in points if m] == \
        [(lam, mu) for lam in grid.reverse for mu in grid.length]
    assert said[-1].startswith(f"chosen: λ {reverse:g}, μ {length:g} (")
    assert "--per-source 1" in json.loads(exp.stamp_path(RERANK_STEP).read_text())["command"]
    section = report.format_rerank_grid(collect.rerank_grid(exp))  # the report shows them all, and the choice
    assert section[0] == "## The both-ways proposals' rerank weights, chosen on dev"
    assert section[-len(said) - 1:] == [*said, "```"]
    exp.reverse_model.unlink()
    exp.path("rnn", "model.pt").unlink()
    assert systems.rerank_weights(exp) == (reverse, length)


def test_a_rerank_report_without_a_choice_is_an_error(tmp_path) -> None:
    report_path = tmp_path / "rerank-weights.txt"
    report_path.write_text("  λ 0, μ 0: 3 proposals\n")
    with pytest.raises(ExperimentError, match="chose no weights"):
        systems.chosen_weights(report_path)
    report_path.write_text("  λ 0, μ 0: 3 proposals\nchosen: λ 0.25, μ 1 (within 20% …)\n")
    assert systems.chosen_weights(report_path) == (0.25, 1.0)
