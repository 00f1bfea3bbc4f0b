from __future__ import annotations

import pytest

from infrastructure.errors import UserError
from table1.reference_choice import format_reference_choice, reference_choice

# Columns: p(f|e) lex(f|e) p(e|f) lex(e|f) p_RNN WP. "x" is what the reference of "a b" uses, "w" not:
# p(e|f) prefers w, p_RNN prefers x; "x y" (used) and "v u" (not) tie on every column.
TABLE = """\
a ||| x ||| 0.5 0.5 0.2 0.5 0.4 1 ||| 0-0
a ||| w ||| 0.5 0.5 0.6 0.5 0.1 1 ||| 0-0
a ||| x y ||| 0.1 0.1 0.1 0.1 0.1 1 ||| 0-0
a ||| v u ||| 0.1 0.1 0.1 0.1 0.1 1 ||| 0-0
b ||| q ||| 0.5 0.5 0.5 0.5 0.5 1 ||| 0-0
"""
BASELINE = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
RNN = [0.0, 0.0, 1.0, 0.0, 2.0, 0.0]


def _files(tmp_path, sources: str, references: str):
    table, src, ref = tmp_path / "pt", tmp_path / "test.en", tmp_path / "test.fr"
    table.write_text(TABLE)
    src.write_text(sources)
    ref.write_text(references)
    return table, src, ref


def test_each_score_is_right_where_it_ranks_the_used_target_above_an_unused_one_of_its_length(tmp_path):
    """By hand: two same-length pairs, (x, w) and the tie (x y, v u); "x y" against "w" is not a
    pair (other lengths), and "b" has no target the reference uses."""
    [found] = reference_choice(*_files(tmp_path, "a b\n", "x y z\n"), {1: (BASELINE, RNN)})
    assert (found.run, found.occurrences, found.pairs) == (1, 1, 2)
    # (x, w): x has ln 0.2 + 2 ln 0.4 = −3.44 under + RNN's weights, w ln 0.6 + 2 ln 0.1 = −5.12: right;
    # Baseline's sum of the four columns prefers w (0.6 against 0.2), as does + RNN's less p_RNN.
    expected = {"p(f|e)": 0.5, "lex(f|e)": 0.5, "p(e|f)": 0.25, "lex(e|f)": 0.5, "p_RNN": 0.75,
                "Baseline's tuned score": 0.25, "+ RNN's tuned score": 0.75, "+ RNN's tuned score less p_RNN": 0.25}
    assert found.accuracy == pytest.approx(expected)


def test_only_the_targets_the_decoder_considers_and_each_sentences_own_reference(tmp_path):
    """``limit`` 1 keeps Baseline's best target of "a" (w) and + RNN's (x): only the pair (x, w). A
    second sentence whose reference uses w makes (w, x) a pair where p(e|f) is right, p_RNN not."""
    table, src, ref = _files(tmp_path, "a b\na\n", "x y z\nw\n")
    [found] = reference_choice(table, src, ref, {1: (BASELINE, RNN)}, limit=1)
    assert (found.occurrences, found.pairs) == (2, 2)
    assert found.accuracy["p(e|f)"] == 0.5 and found.accuracy["p_RNN"] == 0.5
    [found] = reference_choice(table, src, ref, {1: (BASELINE, RNN)})
    assert found.pairs == 3  # (x, w), (x y, v u), then (w, x)
    assert found.accuracy["p(e|f)"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert found.accuracy["p_RNN"] == pytest.approx((1 + 0.5 + 0) / 3)


def test_no_pair_gives_no_share_and_the_report_shows_each_run(tmp_path):
    [found] = reference_choice(*_files(tmp_path, "b\n", "q\n"), {2: (BASELINE, RNN)})
    assert found.pairs == 0 and found.accuracy["p_RNN"] is None
    assert "| p_RNN | – |" in format_reference_choice([found.__dict__])
    [one] = reference_choice(*_files(tmp_path, "a b\n", "x y z\n"), {1: (BASELINE, RNN)})
    lines = format_reference_choice([one.__dict__, {**one.__dict__, "run": 2}])
    assert "| score | run 1 | run 2 |" in lines
    assert "| p_RNN | 75.0% | 75.0% |" in lines
    assert "| (source occurrences; pairs) | 1; 2 | 1; 2 |" in lines


def test_a_reference_of_another_length_is_one_error_naming_it_and_the_line(tmp_path):
    table, src, ref = _files(tmp_path, "a b\na\n", "x y z\n")
    table.write_text("a ||| x ||| not a number\n")  # never read: the lengths are checked first
    with pytest.raises(UserError) as raised:
        reference_choice(table, src, ref, {1: (BASELINE, RNN)})
    assert str(raised.value) == f"{ref}:2: the reference has 1 lines but its source {src} has 2"
