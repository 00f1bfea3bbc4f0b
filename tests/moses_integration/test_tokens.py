"""Moses' tokenisation: ASCII space and tab only, the same for Python strings and Arrow arrays."""

from __future__ import annotations

import pyarrow as pa
import pytest

from moses_integration.tokens import split_tokens, split_tokens_arrow

NBSP, NNBSP = "\u00a0", "\u202f"
CASES = [
    f"la{NBSP}maison",  # one token for Moses
    f"10{NNBSP}000 euros",
    "a\tb",  # a tab separates
    "  a   b  ",  # repeated, leading, trailing spaces
    "\t",
    "",
    f"{NBSP}",  # a no-break space alone is a token
    "x\u2003y\u3000z",  # em space and ideographic space are part of the token too
    "é ü\tß",
]


@pytest.mark.parametrize("text", CASES)
def test_split_tokens_splits_only_on_ascii_space_and_tab(text: str) -> None:
    expected = [t for t in text.replace("\t", " ").split(" ") if t]  # brute force: Tokenize(" \t")
    assert split_tokens(text) == expected


def test_split_tokens_keeps_no_break_space_inside_the_token() -> None:
    assert split_tokens(f"la{NBSP}maison") == [f"la{NBSP}maison"]
    assert split_tokens("a\tb  c") == ["a", "b", "c"]


def test_arrow_split_equals_the_python_split() -> None:
    array = pa.array(CASES, pa.string())
    assert split_tokens_arrow(array).to_pylist() == [split_tokens(t) for t in CASES]
    sliced = array.slice(2, 4)  # offsets that do not start at 0
    assert split_tokens_arrow(sliced).to_pylist() == [split_tokens(t) for t in CASES[2:6]]
    chunked = pa.chunked_array([array.slice(0, 3), array.slice(3)])
    assert split_tokens_arrow(chunked).to_pylist() == [split_tokens(t) for t in CASES]


def test_arrow_split_of_clean_phrases_takes_the_fast_path_correctly() -> None:
    clean = pa.array(["a b", f"la{NBSP}maison bleue", "c", "d e f"], pa.string())
    assert split_tokens_arrow(clean.slice(1, 2)).to_pylist() == [[f"la{NBSP}maison", "bleue"], ["c"]]
    assert split_tokens_arrow(pa.array([], pa.string())).to_pylist() == []
