"""The figure commands: score scatter / histogram, word and phrase maps (paper Figs. 3–5)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import rescorer.analysis.plots as plots
from analysis_checkpoint import EXAMPLE_TABLE, png_size, write_random_checkpoint
from infrastructure.errors import UserError
from rescorer.cli import main
from rescorer.model.checkpoint import load_checkpoint
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.train_or_load import Models


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory) -> Path:
    return write_random_checkpoint(EXAMPLE_TABLE, tmp_path_factory.mktemp("plots") / "model.pt")


@pytest.fixture(scope="module")
def scores_parquet(checkpoint_path, tmp_path_factory) -> Path:
    """The file rescore-phrase-table --scores-parquet writes, for the built-in table."""
    out = tmp_path_factory.mktemp("scores")
    options = RescoreOptions(scores_parquet=str(out / "scores.parquet"), progress=False, workers=1, device="cpu")
    rescore(str(EXAMPLE_TABLE), str(out / "table.gz"), Models(load_checkpoint(checkpoint_path)), options)
    return out / "scores.parquet"


def test_scores_parquet_gives_the_table_and_rnn_log_probabilities(scores_parquet):
    pairs = plots.read_scores_parquet(scores_parquet)
    table = pq.read_table(scores_parquet).to_pydict()
    assert len(pairs.rnn_log_p) == len(table["log_p"]) == 366
    np.testing.assert_allclose(pairs.rnn_log_p, table["log_p"], rtol=1e-6)
    np.testing.assert_allclose(pairs.table_log_p, [math.log(s[2]) for s in table["table_scores"]], rtol=1e-6)
    with pytest.raises(UserError, match="no column 7"):
        plots.read_scores_parquet(scores_parquet, column=6)


def test_plot_scores_scatter_and_histogram_have_the_expected_size(scores_parquet, tmp_path, monkeypatch):
    runner = CliRunner()
    out = tmp_path / "scatter.png"
    result = runner.invoke(main, ["plot-scores", str(scores_parquet), str(out)])
    assert result.exit_code == 0, result.output
    assert "scatter of 366 phrase pairs, Pearson r = " in result.output
    assert png_size(out) == plots.PIXELS
    monkeypatch.setattr(plots, "SCATTER_LIMIT", 100)
    description = plots.plot_scores(plots.read_scores_parquet(scores_parquet), tmp_path / "hist.png")
    assert description.startswith("2-D histogram of 366")
    assert png_size(tmp_path / "hist.png") == plots.PIXELS


def _scores_with(table_scores: pa.Array, log_p: pa.Array | None = None) -> pa.Table:
    """A two-row table shaped like --scores-parquet's, with the given columns in place of the real ones."""
    return pa.table({"source": ["a", "b"], "target": ["x", "y"],
                     "log_p": log_p if log_p is not None else pa.array([-1.0, -2.0]), "table_scores": table_scores})


@pytest.mark.parametrize("kind, reason", [
    ("text", "Parquet file size is 6 bytes"),
    ("empty", "Parquet file size is 0 bytes"),
    ("truncated", "Parquet magic bytes not found"),
    ("gzip table", "Parquet magic bytes not found"),
    ("string log_p", "log_p is string, not numbers"),
    ("list table_scores", "table_scores is list<element: double>, not a fixed-size list of numbers"),
])
def test_plot_scores_refuses_what_is_not_a_scores_parquet_in_one_line(scores_parquet, tmp_path, kind, reason):
    """Each of these was an Arrow traceback (ArrowInvalid, or AttributeError on ``list_size``)."""
    bad = tmp_path / "bad.parquet"
    fixed = pa.FixedSizeListArray.from_arrays(pa.array([0.1] * 8), 4)
    if kind == "text":
        bad.write_text("hello\n")
    elif kind == "empty":
        bad.write_bytes(b"")
    elif kind == "truncated":
        data = scores_parquet.read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    elif kind == "gzip table":
        bad.write_bytes(EXAMPLE_TABLE.read_bytes())
    elif kind == "string log_p":
        pq.write_table(_scores_with(fixed, pa.array(["a", "b"])), bad)
    else:
        pq.write_table(_scores_with(pa.array([[0.1] * 4, [0.2] * 4])), bad)
    res = CliRunner().invoke(main, ["plot-scores", str(bad), str(tmp_path / "out.png")])
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    error = res.output.splitlines()[-1]
    assert error.startswith(f"Error: {bad}: not a Parquet file of rescore --scores-parquet (") and reason in error
    assert res.output.splitlines() == [f"reading {bad}", error]
    assert not (tmp_path / "out.png").exists()


def test_plot_scores_leaves_out_and_counts_pairs_whose_scores_are_not_finite(tmp_path):
    """A NaN or infinite score has no place on the axes: the figure is drawn of the rest, Pearson's r is
    theirs (not NaN), and the line says how many were left out; all of them so is one line, no PNG."""
    table = np.array([-1.0, -2.0, -3.0, -4.0, np.nan], dtype=np.float32)
    rnn = np.array([-1.5, np.inf, -2.5, -4.5, -1.0], dtype=np.float32)
    description = plots.plot_scores(plots.ScorePairs(table, rnn), tmp_path / "some.png")
    r = np.corrcoef([-1.0, -3.0, -4.0], [-1.5, -2.5, -4.5])[0, 1]
    assert description == (f"scatter of 3 phrase pairs, Pearson r = {r:.3f}; "
                           "2 with a score that is not finite (NaN or infinite) left out")
    assert png_size(tmp_path / "some.png") == plots.PIXELS
    with pytest.raises(UserError, match="^none of the 2 phrase pairs has finite scores: nothing to plot$"):
        plots.plot_scores(plots.ScorePairs(table[4:].repeat(2), rnn[4:].repeat(2)), tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_table_log_p_is_what_moses_reads():
    assert plots.table_log_p(np.array([1.0, math.exp(-3), 0.0])).tolist() == pytest.approx([0.0, -3.0, -100.0])


def test_map_words_and_map_phrases_write_pngs(checkpoint_path, tmp_path):
    runner = CliRunner()
    words = tmp_path / "words.png"
    result = runner.invoke(main, ["map-words", str(checkpoint_path), str(words), "--words", "60"])
    assert result.exit_code == 0, result.output
    assert "60 words" in result.output and png_size(words) == plots.PIXELS
    phrases_png = tmp_path / "phrases.png"
    result = runner.invoke(main, ["map-phrases", str(checkpoint_path), str(EXAMPLE_TABLE), str(phrases_png),
                                  "--max-phrases", "40"])
    assert result.exit_code == 0, result.output
    assert "40 phrases" in result.output and png_size(phrases_png) == plots.PIXELS


def test_too_few_phrases_for_a_map_names_the_file_and_what_kept_them_out(checkpoint_path, tmp_path):
    """It said "a map needs at least 5 points, got 0", naming neither the file nor --min-words."""
    text = tmp_path / "phrases.txt"
    text.write_text("the house\nall canadians\nthe government of canada\n", encoding="utf-8")
    for extra, message in (([], f"{text}: 3 distinct phrases of at least 1 word(s); a map needs at least 5"),
                           (["--min-words", "4"], f"{text}: 1 distinct phrases of at least 4 word(s); a map needs at "
                                                  "least 5 (a lower --min-words keeps more)")):
        result = CliRunner().invoke(main, ["map-phrases", str(checkpoint_path), str(text), str(tmp_path / "p.png"),
                                           *extra])
        assert (result.exit_code, result.output) == (1, f"Error: {message}\n")
    assert not (tmp_path / "p.png").exists()


def test_labels_0_labels_no_point(checkpoint_path, tmp_path):
    """``--labels 0`` labelled one point ("1 labelled"): the first was taken before the limit was checked."""
    runner = CliRunner()
    result = runner.invoke(main, ["map-words", str(checkpoint_path), str(tmp_path / "w.png"), "--words", "5",
                                  "--labels", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == f"wrote {tmp_path / 'w.png'}: 5 words, 0 labelled"
    result = runner.invoke(main, ["map-phrases", str(checkpoint_path), str(EXAMPLE_TABLE), str(tmp_path / "p.png"),
                                  "--max-phrases", "20", "--labels", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == f"wrote {tmp_path / 'p.png'}: 20 phrases, 0 labelled"


def test_read_phrases_from_text_or_table(tmp_path):
    text = tmp_path / "phrases.txt"
    text.write_text("the house\n\nthe  house\na\u00a0b c\none\n", encoding="utf-8")
    # Moses tokens: the no-break space stays inside a token; blank and repeated phrases are skipped.
    assert plots.read_phrases(text) == ["the house", "a\u00a0b c", "one"]
    assert plots.read_phrases(text, min_words=2) == ["the house", "a\u00a0b c"]
    from_table = plots.read_phrases(EXAMPLE_TABLE)
    assert len(from_table) == len(set(from_table)) and "all canadians" in from_table
    sampled = plots.read_phrases(EXAMPLE_TABLE, max_phrases=10, seed=3)
    assert len(sampled) == 10 and set(sampled) <= set(from_table)
    assert sampled == plots.read_phrases(EXAMPLE_TABLE, max_phrases=10, seed=3)


def test_phrase_summaries_are_the_models_encoding(checkpoint_path):
    import torch

    checkpoint = load_checkpoint(checkpoint_path)
    phrases = ["all canadians", "the government", "xyzzy unknown words"]
    c = plots.phrase_summaries(checkpoint, phrases)
    for phrase, row in zip(phrases, c, strict=True):
        ids = checkpoint.src_vocab.encode(phrase, add_eos=True)
        with torch.no_grad():
            direct = checkpoint.model.encode(torch.tensor([ids]), torch.tensor([len(ids)]))[0]
        np.testing.assert_allclose(row, direct.numpy(), atol=1e-5)
