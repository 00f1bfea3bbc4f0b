"""Columnar chunk parsing must agree with the per-line parser and name bad lines exactly."""

from __future__ import annotations

import gzip
import io

import numpy as np
import pyarrow as pa
import pytest

from moses_integration.phrase_table import PhraseTableError, parse_line
from rescorer.tables.chunks import iter_line_chunks, parse_chunk, phrases_to_ids
from shared_paths import shared_file

GOOD = [
    b"a b ||| x y ||| 0.5 0.25 1 1 ||| 0-0 1-1 ||| 2 2 1 ||| ",
    b"a b ||| z ||| 0.5 0.5 1 1 ||| 0-0 ||| 1 2 1 ||| ",
    b"c ||| w ||| 1 1 1 1",
]


def chunks_of(data: bytes, n: int):
    return list(iter_line_chunks(io.BytesIO(data), "t.txt", n))


def test_chunks_cover_every_line_with_offsets():
    data = b"\n".join(GOOD) + b"\n"
    chunks = chunks_of(data, 2)
    assert [c.first_line_no for c in chunks] == [1, 3]
    assert [line for c in chunks for line in c.lines] == GOOD
    assert chunks[0].end_offset == len(GOOD[0]) + len(GOOD[1]) + 2
    assert chunks[-1].end_offset == len(data)


def test_last_line_without_newline_is_kept():
    chunks = chunks_of(b"\n".join(GOOD), 10)
    assert chunks[0].lines == GOOD


def test_truncated_gzip_names_the_line_reached():
    data = gzip.compress(b"\n".join(GOOD * 2000) + b"\n")
    with pytest.raises(PhraseTableError) as err:
        list(iter_line_chunks(gzip.GzipFile(fileobj=io.BytesIO(data[: len(data) // 2])), "t.gz", 100))
    assert "t.gz:" in str(err.value) and "truncated" in str(err.value)
    assert err.value.line_no > 1


def test_fast_parse_agrees_with_line_parser_on_real_table():
    path = shared_file("fixtures/hansard-enfr/phrase-table.sample.gz")
    with gzip.open(path) as fh:
        chunk = next(iter_line_chunks(fh, str(path), 3000))
    parsed = parse_chunk(chunk, str(path), want_scores=True)
    assert len(parsed.source) == 3000 and parsed.bad_rows == []
    for i in (0, 1, 1234, 2999):
        entry = parse_line(chunk.lines[i], path=str(path), line_no=chunk.first_line_no + i)
        assert parsed.source[i].as_py() == entry.source
        assert parsed.target[i].as_py() == entry.target
        assert parsed.scores[i].tolist() == entry.scores


@pytest.mark.parametrize(
    "bad, reason",
    [
        (b"a ||| b", "field"),
        (b"a ||| b ||| 0.5 x 1 1", "x"),
        (b"a ||| b ||| 0.5 -1 1 1", "-1"),
        (b" ||| b ||| 0.5 1 1 1", "empty"),
        (b"a ||| b ||| 0.5 1 1", "3"),
        (b"a ||| \xff ||| 0.5 1 1 1", "UTF-8"),
    ],
)
def test_bad_line_is_named_with_line_number(bad, reason):
    chunk = chunks_of(b"\n".join([*GOOD, bad, GOOD[0]]) + b"\n", 100)[0]
    with pytest.raises(PhraseTableError) as err:
        parse_chunk(chunk, "t.txt", num_scores=4)
    assert str(err.value).startswith("t.txt:4:")
    assert reason.lower() in str(err.value).lower()


def test_skip_bad_lines_keeps_the_good_rows():
    chunk = chunks_of(b"\n".join([GOOD[0], b"broken", GOOD[1]]) + b"\n", 100)[0]
    parsed = parse_chunk(chunk, "t.txt", skip_bad_lines=True)
    assert parsed.good_rows.tolist() == [0, 2]
    assert [line for line, _ in parsed.bad_rows] == [2]
    assert parsed.target.to_pylist() == ["x y", "z"]


def test_phrases_to_ids_maps_unknown_and_reserved_words():
    vocab = pa.array(["</s>", "[UNK]", "the", "house"])
    ids = phrases_to_ids(pa.array(["the house", "the mouse </s>", "house"]), vocab)
    assert ids.offsets.tolist() == [0, 2, 5, 6]
    assert ids.ids.tolist() == [2, 3, 2, 1, 1, 3]
    assert ids.n_unk.tolist() == [0, 2, 0]
    assert np.array_equal(ids.lengths, [2, 3, 1])


NBSP = "\u00a0"
TOKEN_LINES = [
    f"la{NBSP}maison ||| the house ||| 0.5 0.25 1 1".encode(),  # one source token for Moses
    b"a\tb ||| x  y ||| 0.5\t0.5 1  1",  # tabs and repeated spaces separate tokens and scores
    f"c ||| {NBSP} ||| 1 1 1 1".encode(),  # a target made of one no-break space is one token
]


@pytest.mark.parametrize("slow", [False, True])
def test_fast_and_slow_parsers_tokenise_like_moses(slow: bool) -> None:
    lines = TOKEN_LINES + ([b"broken line"] if slow else [])  # a bad line forces the per-line path
    chunk = chunks_of(b"\n".join(lines) + b"\n", 10)[0]
    parsed = parse_chunk(chunk, "t.txt", skip_bad_lines=True, want_scores=True)
    assert parsed.good_rows.tolist() == [0, 1, 2]
    assert [line_no for line_no, _ in parsed.bad_rows] == ([4] if slow else [])
    assert parsed.scores.tolist() == [[0.5, 0.25, 1, 1], [0.5, 0.5, 1, 1], [1, 1, 1, 1]]
    vocab = pa.array(["</s>", "[UNK]", "la", "maison", "a", "b", "x", "y", "the", "house"], pa.string())
    src = phrases_to_ids(parsed.source, vocab)
    tgt = phrases_to_ids(parsed.target, vocab)
    assert src.lengths.tolist() == [1, 2, 1]  # "la maison" with a no-break space is ONE unknown word
    assert src.n_unk.tolist() == [1, 0, 1]
    assert tgt.lengths.tolist() == [2, 2, 1] and tgt.n_unk.tolist() == [0, 0, 1]
    for i, raw in enumerate(TOKEN_LINES):  # the per-line parser agrees
        entry = parse_line(raw, path="t.txt", line_no=i + 1)
        assert entry.scores == parsed.scores[i].tolist()


def test_score_with_a_no_break_space_is_rejected_by_both_parsers() -> None:
    line = f"a ||| b ||| 0.5{NBSP} 1 1 1".encode()
    with pytest.raises(PhraseTableError, match="not a number"):
        parse_line(line, path="t.txt", line_no=1)
    chunk = chunks_of(line + b"\n", 10)[0]
    with pytest.raises(PhraseTableError, match="t.txt:1: score"):
        parse_chunk(chunk, "t.txt")
