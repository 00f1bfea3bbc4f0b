"""What a column moves on a run's n-best pool: hand-computed BLEU on two sentences."""

from __future__ import annotations

import math

import pytest

from table1.analysis import column_leverage, format_analysis, format_leverage, read_table_scores, rnn_correlations


def test_column_leverage_reranks_the_pool_without_the_column_and_along_its_axis(tmp_path):
    """Sentence 0: the reference "a b c d" wins only through the RNN column (LM -3 against -1,
    RNN 0 against -5, so it needs an RNN weight above 0.4); sentence 1's reference always wins.
    Without the RNN, sentence 0 becomes "x b c d": n-gram precisions 7/8, 5/6, 3/4, 1/2 over the
    two sentences, equal lengths, so BLEU = (7/8 * 5/6 * 3/4 * 1/2) ** (1/4)."""
    (tmp_path / "ref").write_text("a b c d\ne f g h\n")
    rows = [(0, "a b c d", -3, 0), (0, "x b c d", -1, -5), (1, "e f g h", -1, 0), (1, "e f g x", -2, 0)]
    lists = []
    for iteration, part in ((1, rows[:2] + rows[2:3]), (2, rows[1:2] + rows[3:])):  # two iterations' lists
        path = tmp_path / f"run{iteration}.nbest"
        path.write_text("".join(f"{s} ||| {h} ||| LM0= {lm} TranslationModel0= -1 {rnn} ||| 0\n"
                                for s, h, lm, rnn in sorted(part)))
        lists.append(path)
    weights = {"LM0": [1.0], "TranslationModel0": [0.5, 1.0]}
    pool, (rnn, lm) = column_leverage(lists, [tmp_path / "ref"], weights, ["TranslationModel0_1", "LM0_0"])
    assert pool == 100.0
    assert rnn.weight == 1.0 and rnn.best_bleu == 100.0 and rnn.best_weight == 1.0
    assert rnn.bleu_without == pytest.approx(100 * (7 / 8 * 5 / 6 * 3 / 4 * 1 / 2) ** 0.25, abs=1e-4)
    # Without the LM the RNN alone decides sentence 0 (right) but sentence 1 ties: the first
    # hypothesis in the pool, the reference, wins. So the LM moves nothing here.
    assert lm.bleu_without == 100.0 and lm.best_bleu == 100.0
    md = "\n".join(format_leverage({"+ RNN": [{"run": 1, "pool_bleu": pool, "columns": [rnn.__dict__]}]},
                                   {"TranslationModel0_1": "p_RNN"}))
    assert f"| + RNN | 1 | p_RNN | 1 | 100.00 | {rnn.bleu_without:.2f} | 100.00 (1) | – | – |" in md
    assert math.isclose(rnn.bleu_without, 72.31, abs_tol=0.01)
    # a row whose 7th column is the reverse RNN names it so, whatever the shared labels say
    md = "\n".join(format_leverage({"+ RNN both directions": [
        {"run": 1, "pool_bleu": pool, "columns": [rnn.__dict__], "column_labels": {"TranslationModel0_1": "p_RNN(f|e)"}}
    ]}, {"TranslationModel0_1": "proposed (indicator)"}))
    assert "| + RNN both directions | 1 | p_RNN(f\\|e) | 1 |" in md


def test_correlation_within_target_lengths_and_within_sources_takes_out_what_each_explains(tmp_path):
    """ln lex(e|f) and ln p_RNN both fall with the target's length but disagree within each length:
    r over all pairs is 146/154 (deviations from the mean -7: 6, 5, 4, -4, -5, -6 against 4, 5, 6, -6,
    -5, -4), and within lengths -1. Each source has one target of each length, and within a source
    the two agree: (-1, -11) against (-3, -13) less their means is (5, -5) on both sides, r = 1."""
    lex = [-1, -2, -3, -11, -12, -13]
    rnn = [-3, -2, -1, -13, -12, -11]
    targets = ["a", "b", "c", "a b", "b c", "c d"]
    sources = ["s0", "s1", "s2", "s0", "s1", "s2"]  # not sorted: the analysis groups by value
    table = tmp_path / "pt.txt"
    table.write_text("".join(f"{s} ||| {t} ||| 0.5 0.5 {0.1 * (i + 1)} {math.exp(x)!r} {math.exp(y)!r} 1\n"
                             for i, (s, t, x, y) in enumerate(zip(sources, targets, lex, rnn, strict=True))))
    scores = read_table_scores(table)
    assert scores.target_words.tolist() == [1, 1, 1, 2, 2, 2]
    assert scores.source_ids.tolist() == [0, 1, 2, 0, 1, 2]
    by_column = {c.column: c for c in rnn_correlations(scores)}
    assert by_column["lex(e|f)"].pearson == pytest.approx(146 / 154)
    assert by_column["lex(e|f)"].pearson_same_length == pytest.approx(-1.0)
    assert by_column["lex(e|f)"].pearson_same_source == pytest.approx(1.0)
    assert by_column["p(f|e)"].pearson is None and by_column["p(f|e)"].pearson_same_length is None  # constant
    assert by_column["p(f|e)"].pearson_same_source is None
    assert by_column["lex(e|f)"].pearson_same_source_length is None  # each source has one target of each length
    lines = format_analysis({"phrase_pairs": 6, "rnn_log_p": {"mean": -7.0, "std": 4.7},
                             "pairs_with_unknown_words": 0.0, "weights": {},
                             "correlations": [c.__dict__ for c in by_column.values()]})
    assert "| lex(e\\|f) | 0.948 | 0.543 | -1.000 | 1.000 | – |" in lines


def test_correlation_within_a_sources_targets_of_one_length(tmp_path):
    """One source, two one-word and two two-word targets: less their (source, length) means, ln lex(e|f)
    is (0.5, -0.5, 1, -1) and ln p_RNN (-0.5, 0.5, 1, -1), so r = (-0.25 - 0.25 + 1 + 1) / 2.5 = 0.6."""
    lex, rnn = [-1, -2, -11, -13], [-2, -1, -12, -14]
    table = tmp_path / "pt.txt"
    table.write_text("".join(f"s ||| {t} ||| 0.5 0.5 0.5 {math.exp(x)!r} {math.exp(y)!r} 1\n"
                             for t, x, y in zip(["a", "b", "a b", "b c"], lex, rnn, strict=True)))
    lex_ef = {c.column: c for c in rnn_correlations(read_table_scores(table))}["lex(e|f)"]
    assert lex_ef.pearson_same_source_length == pytest.approx(0.6)


def test_correlation_within_sources_is_undefined_when_every_source_has_one_target(tmp_path):
    """Taking each source's mean out of its only target leaves nothing to correlate."""
    table = tmp_path / "pt.txt"
    table.write_text("".join(f"s{i} ||| t ||| 0.5 {math.exp(-i)!r} 0.5 0.5 {math.exp(i - 3)!r} 1\n" for i in range(3)))
    lex_fe = {c.column: c for c in rnn_correlations(read_table_scores(table))}["lex(f|e)"]
    assert lex_fe.pearson == pytest.approx(-1.0) and lex_fe.pearson_same_source is None
