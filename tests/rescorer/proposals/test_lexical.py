"""Lexical weights of proposed pairs (Koehn et al. 2003) from Moses' word tables, checked by hand."""

from __future__ import annotations

import re

import pytest

from rescorer.proposals.lexical import LexFileError, lexical_scores, read_word_table

# lex.f2e lines are "e f w(e|f)"; lex.e2f lines "f e w(f|e)" (LexicalTranslationModel.pm).
F2E = """la the 0.4
maison house 0.5
chambre house 0.3
bleue blue 0.8
la NULL 0.05
maison the 0.01
"""
E2F = """the la 0.6
house maison 0.7
house chambre 0.2
blue bleue 0.9
the maison 0.02
blue NULL 0.1
"""


@pytest.fixture
def tables(tmp_path):
    (tmp_path / "lex.f2e").write_text(F2E)
    (tmp_path / "lex.e2f").write_text(E2F)
    return read_word_table(tmp_path / "lex.f2e"), read_word_table(tmp_path / "lex.e2f")


def test_lexical_weights_by_hand(tables) -> None:
    f2e, e2f = tables
    scores = lexical_scores(["the", "house"], ["la", "maison"], f2e, e2f)
    # la: the (0.4·0.6) beats nothing else; maison: house 0.5·0.7 = 0.35 beats the 0.01·0.02.
    assert scores.alignment == ((0, 0), (1, 1))
    assert scores.alignment_field() == "0-0 1-1"
    assert scores.target_given_source == pytest.approx(0.4 * 0.5)  # w(la|the) w(maison|house)
    assert scores.source_given_target == pytest.approx(0.6 * 0.7)  # w(the|la) w(house|maison)


def test_unlinked_words_are_explained_by_null_or_the_files_floor(tables) -> None:
    f2e, e2f = tables
    # "rouge" is in neither table: unlinked, and w(rouge|NULL) is absent -> lex.f2e's floor 0.01.
    # "blue" is a source word nobody links to: w(blue|NULL) = 0.1.
    scores = lexical_scores(["the", "blue", "house"], ["la", "maison", "rouge"], f2e, e2f)
    assert scores.alignment == ((0, 0), (2, 1))
    assert scores.target_given_source == pytest.approx(0.4 * 0.5 * 0.01)
    assert scores.source_given_target == pytest.approx(0.6 * 0.1 * 0.7)


def test_a_source_word_linked_twice_averages_its_links(tables) -> None:
    f2e, e2f = tables
    # Both targets link to "house": lex(f|e) takes the mean of w(house|maison) and w(house|chambre).
    scores = lexical_scores(["house"], ["maison", "chambre"], f2e, e2f)
    assert scores.alignment == ((0, 0), (0, 1))
    assert scores.source_given_target == pytest.approx((0.7 + 0.2) / 2)
    assert scores.target_given_source == pytest.approx(0.5 * 0.3)


def test_no_link_at_all_gives_an_empty_alignment(tables) -> None:
    f2e, e2f = tables
    scores = lexical_scores(["blue"], ["maison"], f2e, e2f)
    assert scores.alignment == ()


@pytest.mark.parametrize(("text", "line", "reason"), [
    ("a b 0.5\nc d\n", 2, "found 2 fields"),
    ("a b 0.5\nc d x\n", 2, "not a number"),
    ("a b 0\n", 1, "not in (0, 1]"),
    ("a b 0.5\n\nc d 1.5\n", 2, "found 0 fields"),
])
def test_a_malformed_word_table_is_one_line_with_file_and_line(tmp_path, text, line, reason) -> None:
    path = tmp_path / "lex.e2f"
    path.write_text(text)
    with pytest.raises(LexFileError, match=rf"lex.e2f:{line}: .*{re.escape(reason)}"):
        read_word_table(path)


def test_a_missing_or_empty_word_table_names_the_file(tmp_path) -> None:
    with pytest.raises(LexFileError, match=r"lex.f2e: no such word translation table"):
        read_word_table(tmp_path / "lex.f2e")
    (tmp_path / "lex.f2e").write_text("")
    with pytest.raises(LexFileError, match=r"lex.f2e: the word translation table is empty"):
        read_word_table(tmp_path / "lex.f2e")


def test_words_split_on_ascii_space_and_tab_only(tmp_path) -> None:
    """A no-break space is part of a French token, as in Moses (SPEC §3)."""
    (tmp_path / "lex.f2e").write_text("20\u00a0%\tpercent 0.5\n")
    table = read_word_table(tmp_path / "lex.f2e")
    assert table.get("percent", "20\u00a0%") == 0.5
