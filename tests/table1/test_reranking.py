"""The reranking step on hand-made lists of Baseline's three runs (the decoding stamped as done, since
its lists are what Moses would write): feature sets, tuning on the lists, the report, resuming."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from mert.evaluate import PostProcessor
from mert.features import WordCount
from moses_integration.nbest import read_nbest
from table1 import reranking, reranking_report
from table1.experiment import StepOptions, run_steps
from table1.settings import select_configurations
from table1_folders import six_column_ini, small_experiment, write_lines, write_rnn_system

DEV = ["the cat sat on the mat", "a dog ran in the park", "it rains in paris today", "we like green tea a lot"]
TEST = ["the dog sat on the mat", "a cat ran in the park", "it snows in paris today", "we like black tea a lot"]


def hypotheses(ref: str) -> list[str]:
    """Moses' 1-best (the words reversed), a near miss, the reference, and a short one: in list order."""
    words = ref.split()
    return [" ".join(reversed(words)), " ".join(words[:-2] + words[-1:] + words[-2:-1]), ref, " ".join(words[:3])]


def list_lines(refs: list[str], seed: int) -> list[str]:
    """A 4-best list per sentence where the LM prefers Moses' 1-best and only the RNN's column (TranslationModel0's
    fifth) tells the reference from the others: every other value is the same on all four lines."""
    rng = np.random.default_rng(seed)
    lines = []
    for s, ref in enumerate(refs):
        shared = " ".join(f"{x:.4f}" for x in rng.normal(size=4))
        for j, hyp in enumerate(hypotheses(ref)):
            lm = 5.0 if j == 0 else 0.0
            rnn = 1.0 if j == 2 else 0.0
            lines.append(f"{s} ||| {hyp} ||| LM0= {lm:.4f} Distortion0= -1 WordPenalty0= -6 PhrasePenalty0= 2 "
                         f"TranslationModel0= {shared} {rnn} 0 ||| 0")
    return lines


@pytest.fixture
def tuned_baseline(tmp_path: Path):
    """A work folder with Baseline's three tuned runs and their dev and test lists."""
    exp = small_experiment(tmp_path)
    write_rnn_system(exp)
    post = PostProcessor(exp.tgt)
    for split, refs in (("dev", DEV), ("test", TEST)):
        write_lines(exp.prepared(split, exp.tgt), refs)
        write_lines(exp.prepared(split, exp.src), [f"source {i}" for i in range(len(refs))])
        write_lines(exp.path("raw", f"{split}.{exp.tgt}"), [post(r) for r in refs])
        write_lines(exp.path("raw", f"{split}.{exp.src}"), [f"Source {i}" for i in range(len(refs))])
    for stamp in ("baseline", "rnn"):
        exp.step(stamp, lambda: None)
    filtered = exp.path("baseline", "filtered")  # the table the lists are decoded from (its phrase pairs)
    filtered.mkdir(parents=True)
    (filtered / "moses.ini").write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 "
                                        "path=phrase-table.0-0.1.1.gz input-factor=0 output-factor=0\n")
    for k in (1, 2, 3):
        tune_dir = exp.tune_dir(reranking.baseline_plan(k))
        tune_dir.mkdir(parents=True)
        (tune_dir / "moses.ini").write_text(six_column_ini(exp, "0", "0"))
        exp.step(f"tune/baseline/run{k}", lambda: None)
        for split, refs in (("dev", DEV), ("test", TEST)):
            write_lines(reranking.list_path(exp, k, split), list_lines(refs, 10 * k + len(split)), gz=True)
            exp.step(reranking.list_stamp(k, split), lambda: None)  # what decode_list leaves
    return exp


def run_reranking(exp, results: Path) -> list[Path]:
    options = StepOptions(configs=select_configurations("baseline"), runs=3, results=results)
    return run_steps(exp, ["reranking"], options)


def test_the_rnn_column_that_tells_the_reference_apart_wins_every_run(tuned_baseline, tmp_path):
    exp = tuned_baseline
    paths = run_reranking(exp, tmp_path / "results")
    assert [p.name for p in paths] == ["reranking.json", "reranking.md", "reranking.png"]
    doc = json.loads(paths[0].read_text())
    rows = {row["label"]: row for row in doc["rows"]}
    assert list(rows) == ["Baseline reranked", "+ p_RNN"]  # no model trained: the list's own column only
    assert doc["not_trained"] == ["RNN(f|e)", "CSLM", "NMT p(e|f)", "NMT p(e|f)+p(f|e)", "RNN d=1000 @6h",
                                  "RNN d=1000 @12h"]
    rnn = rows["+ p_RNN"]
    assert [r["test_bleu"] for r in rnn["runs"]] == [100.0] * 3
    assert all(r["weights"]["TranslationModel0_4"] > 0 and r["new_columns"] == ["TranslationModel0_4"]
               for r in rnn["runs"])
    assert all(r["test_bleu"] < 100 and r["weights"]["TranslationModel0_4"] == 0
               for r in rows["Baseline reranked"]["runs"])
    assert reranking.output_path(exp, reranking.FeatureSet("+ p_RNN", ("p_RNN",)), 2, "test").read_text() == \
        "".join(f"{r}\n" for r in TEST)
    gain = rnn["over_runs"]
    assert gain["runs"] == 3 and gain["mean_delta"] > 0 and len(gain["deltas"]) == 3
    assert doc["best_on_dev"] == "+ p_RNN"
    assert doc["tuning_loop"] == {"set": "+ p_RNN", "row": "rnn",
                                  "reason": "the best on dev of the sets that gain enough"}
    assert [ex["line"] for ex in doc["changed_examples"]] == [1, 2, 3, 4]  # all four changed, in order
    assert doc["oracle"]["run1"]["test"]["oracle_bleu"] == [[1, 4.72], [10, 100.0], [50, 100.0], [100, 100.0],
                                                            [200, 100.0], [500, 100.0], [1000, 100.0]]
    markdown = paths[1].read_text()
    assert "| + p_RNN |" in markdown and "Baseline reranked" in markdown and "Oracle BLEU" in markdown
    assert "CONFIGS='baseline rnn' STEPS='tune eval report'" in markdown
    for label, row in rows.items():  # where each reranked 1-best was in its list, counted from the outputs
        fset = reranking.FeatureSet(label, tuple(row["features"]))
        for run in row["runs"]:
            for split, refs in (("dev", DEV), ("test", TEST)):
                chosen = reranking.output_path(exp, fset, run["run"], split).read_text().splitlines()
                at = [hypotheses(ref).index(hyp) for ref, hyp in zip(refs, chosen, strict=True)]
                assert run["choice_depth"][split] == {"1": at.count(0), "2-10": len(at) - at.count(0), "11-50": 0,
                                                      "51-1000": 0}, (label, split)
    assert [r["choice_depth"]["test"] for r in rnn["runs"]] == [{"1": 0, "2-10": 4, "11-50": 0, "51-1000": 0}] * 3
    assert "| + p_RNN | 0.0% | 100.0% | 0.0% | 0.0% |" in markdown


def test_the_nmt_models_own_translation_is_scored_beside_the_sets(tuned_baseline, tmp_path):
    exp = tuned_baseline
    post = PostProcessor(exp.tgt)
    write_lines(reranking.nmt_test_output(exp), TEST[:2] + [hypotheses(r)[0] for r in TEST[2:]])
    exp.step(reranking.NMT_TRANSLATE_STAMP, lambda: None)  # what `nmt translate` leaves
    doc = json.loads(run_reranking(exp, tmp_path / "results")[0].read_text())
    expected = BLEU().corpus_score([post(h) for h in TEST[:2] + [hypotheses(r)[0] for r in TEST[2:]]],
                                   [[post(r) for r in TEST]]).score
    assert doc["nmt_standalone"]["test_bleu"] == pytest.approx(expected, abs=1e-4)
    assert "The NMT model p(e|f) alone" in (tmp_path / "results" / "reranking.md").read_text()


def test_a_rerun_finds_everything_done_and_writes_the_same_report(tuned_baseline, tmp_path, capsys):
    exp = tuned_baseline
    first = run_reranking(exp, tmp_path / "a")[0].read_text()
    capsys.readouterr()
    again = run_reranking(exp, tmp_path / "b")[0].read_text()
    assert json.loads(again) == json.loads(first)
    assert "starting" not in capsys.readouterr().err


def test_the_plan_gives_the_hours_of_the_lists_still_to_decode_at_the_measured_rate(tuned_baseline):
    exp = tuned_baseline
    for k in (2, 3):
        for split in ("dev", "test"):
            exp.stamp_path(reranking.list_stamp(k, split)).unlink()
    exp.stamp_path(reranking.list_stamp(1, "dev")).unlink()
    exp.step(reranking.list_stamp(1, "dev"), lambda: {"decode_seconds": 3600})  # 4 sentences: 900 s each
    sets, missing = reranking.available_sets(exp)
    lines = reranking.plan_lines(exp, 3, sets, missing)
    assert lines[0] == "reranking: 4 of 6 lists to decode (1000-best distinct, the first 1000 scored): 4.0 h (measured)"
    assert lines[1] == "reranking: 6 tunings on fixed lists to run (2 sets x 3 runs; minutes each)"


def test_feature_sets_each_alone_both_rnn_directions_and_all():
    labels = ["p_RNN", "RNN(f|e)", "CSLM", "NMT p(e|f)", "NMT p(e|f)+p(f|e)", "RNN d=1000 @6h", "RNN d=1000 @12h"]
    sets = {s.label: s.features for s in reranking.feature_sets(labels)}
    assert sets["Baseline reranked"] == ()
    assert all(sets[f"+ {label}"] == (label,) for label in labels)
    assert sets["+ p_RNN + RNN(f|e)"] == ("p_RNN", "RNN(f|e)")
    assert sets["+ all"] == ("p_RNN", "RNN(f|e)", "CSLM", "NMT p(e|f)+p(f|e)", "RNN d=1000 @12h")
    assert list(reranking.feature_sets(["p_RNN"])) == [reranking.FeatureSet("Baseline reranked", ()),
                                                        reranking.FeatureSet("+ p_RNN", ("p_RNN",))]


def test_scoring_a_list_resumes_from_its_saved_parts(tmp_path):
    """A killed scoring keeps its finished blocks: the rerun scores only the others (a planted part's
    values come through unchanged), and the parts go once the whole array is saved."""
    refs = [f"sentence number {i} of many" for i in range(2 * reranking.BLOCK_SENTENCES + 5)]
    nbest = tmp_path / "run1.dev.nbest.gz"
    with gzip.open(nbest, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(list_lines(refs, 1)) + "\n")
    out = tmp_path / "scores" / "run1.dev.npy"
    out.parent.mkdir()
    parts = out.with_name(out.name + ".parts")
    parts.mkdir()
    planted = np.full((2 * reranking.BLOCK_SENTENCES, 1), -7.0)  # block 1: its 100 sentences' first 2 hypotheses
    np.save(parts / "000001.npy", planted)
    sources = [f"source {i}" for i in range(len(refs))]
    record = reranking.score_list(WordCount(), nbest, sources, 2, out)
    values = np.load(out)
    kept = [e for e in read_nbest(nbest, per_sentence=2)]
    assert record == {"name": "WordCount", "values": 1, "hypotheses": len(kept), "reused": 0}
    expected = np.array([[len(e.hypothesis.split())] for e in kept], dtype=float)
    block1 = slice(2 * reranking.BLOCK_SENTENCES, 4 * reranking.BLOCK_SENTENCES)
    expected[block1] = -7.0
    assert np.array_equal(values, expected)
    assert not parts.exists()


class CountingWordCount(WordCount):
    """WordCount that counts the hypotheses it is asked to score."""

    def __init__(self) -> None:
        super().__init__()
        self.scored = 0

    def score(self, source_sentences, entries):
        self.scored += len(entries)
        return super().score(source_sentences, entries)


def test_a_hypothesis_another_runs_list_holds_is_not_scored_again(tmp_path):
    """Run 2's list shares most hypotheses with run 1's (other weights, the same system): only its new ones
    are scored, and its values are those a scoring from scratch gives."""
    refs = [f"sentence number {i} of many" for i in range(30)]
    first, second = tmp_path / "run1.nbest.gz", tmp_path / "run2.nbest.gz"
    lines = list_lines(refs, 1)
    write_lines(first, lines, gz=True)
    write_lines(second, [line.replace("sentence number 7 of many", "a new hypothesis") for line in lines], gz=True)
    sources = [f"source {i}" for i in range(len(refs))]
    feature, known = CountingWordCount(), {}
    reranking.score_list(feature, first, sources, 4, tmp_path / "run1.npy", known)
    assert feature.scored == 4 * len(refs)
    record = reranking.score_list(feature, second, sources, 4, tmp_path / "run2.npy", known)
    assert feature.scored == 4 * len(refs) + 1 and record["reused"] == 4 * len(refs) - 1
    fresh = CountingWordCount()
    reranking.score_list(fresh, second, sources, 4, tmp_path / "fresh.npy")
    assert np.array_equal(np.load(tmp_path / "run2.npy"), np.load(tmp_path / "fresh.npy"))
    assert not np.array_equal(np.load(tmp_path / "run1.npy"), np.load(tmp_path / "run2.npy"))


def test_no_set_goes_into_the_tuning_loop_without_a_gain_whose_interval_is_above_zero():
    def row(label, mean, low, dev):
        return {"label": label, "runs": [{"dev_bleu": dev}] * 3,
                "over_runs": {"mean_delta": mean, "ci95": [low, 2 * mean - low]}}

    rows = [row("+ CSLM", 0.5, -0.1, 30.0), row("+ NMT p(e|f)", 0.29, 0.1, 31.0)]
    assert reranking_report.tuning_loop_choice(rows, 3)["set"] is None
    rows.append(row("+ NMT p(e|f)+p(f|e)", 0.6, 0.2, 29.0))
    rows.append(row("+ all", 0.9, 0.3, 28.0))
    choice = reranking_report.tuning_loop_choice(rows, 3)
    assert choice == {"set": "+ NMT p(e|f)+p(f|e)", "row": "nmt-both-nbest",
                      "reason": "the best on dev of the sets that gain enough"}
    assert reranking_report.tuning_loop_choice(rows[:3] + [row("+ all", 0.9, 0.3, 35.0)], 3) == {
        "set": "+ all", "row": None, "reason": "no Table 1 row tunes this set yet"}


def test_the_paper_size_rnns_read_outs_are_shown_as_it_trains(tuned_baseline):
    exp = tuned_baseline
    corr = {"pearson": 0.2, "spearman": 0.25, "pearson_same_source": 0.31}
    exp.step("reranking/big-rnn@6h", lambda: {"hours": 6.0, "valid_perplexity": 41.5, "step": 900,
                                              "sample_pairs": 25000, "lex_e_f": corr,
                                              "rnn_step_lex_e_f": {**corr, "pearson_same_source": 0.12}})
    found = reranking_report.readout_document(exp)
    assert found == [{"hours": 6.0, "valid_perplexity": 41.5, "step": 900, "sample_pairs": 25000, "lex_e_f": corr,
                      "rnn_step_lex_e_f": {**corr, "pearson_same_source": 0.12}}]
    table = reranking_report.format_readouts({"readouts": found})
    assert "| 6 | 41.50 (900) | 25000 | +0.310 | +0.120 |" in table
