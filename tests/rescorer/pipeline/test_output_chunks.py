"""The columnar formatter writes exactly what the per-line definition of the two columns gives."""

from __future__ import annotations

import gzip
import itertools

import numpy as np
import pytest

from moses_integration.phrase_table import append_score_columns_bulk, format_log_probability
from rescorer.pipeline.columns.rnn import probability_column
from rescorer.pipeline.columns.unknown import unknown_column
from rescorer.pipeline.output_chunks import format_chunk
from rescorer.tables.chunks import LineChunk
from shared_paths import shared_file

ODD = [
    b"a ||| b ||| 0.5",  # no field after the scores
    b"a ||| b ||| 0.5\r",  # a stray carriage return stays last
    b"a ||| b ||| 0.5  ||| 0-0",  # blanks before the next field
    b"a ||| b ||| 0.5 ||| 0-0 ||| 1 1 1 ||| |||",
]


def two_columns(log_p: np.ndarray, n_unk: np.ndarray) -> list:
    """The RNN's and the unknown-word column's values, with the functions that write them."""
    return [(probability_column, log_p), (unknown_column, n_unk)]


def per_line(lines: list[bytes], log_p: np.ndarray, n_unk: np.ndarray) -> bytes:
    """The definition: format each value, append the pair to the scores field of each line."""
    columns = [f"{format_log_probability(lp)} {format_log_probability(-n)}".encode()
               for lp, n in zip(log_p.tolist(), n_unk.tolist(), strict=True)]
    return b"".join(line + b"\n" for line in append_score_columns_bulk(lines, columns))


@pytest.mark.parametrize("odd", [False, True])
def test_real_lines_get_the_per_line_bytes(odd):
    with gzip.open(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz")) as fh:
        lines = [line.rstrip(b"\n") for line in itertools.islice(fh, 3000)]
    if odd:
        lines[1000:1000] = ODD
    rng = np.random.default_rng(0)
    log_p = np.concatenate([[0.0, -100.0, -150.0, -np.inf, -1e-300], rng.normal(-15, 10, len(lines) - 5)])
    n_unk = rng.integers(0, 5, len(lines))
    chunk = LineChunk.from_lines(1, lines)
    expected = per_line(lines, log_p, n_unk)
    assert format_chunk(chunk, two_columns(log_p, n_unk), None) == expected
    assert gzip.decompress(format_chunk(chunk, two_columns(log_p, n_unk), 3)) == expected


def test_an_empty_chunk_is_an_empty_gzip_member():
    empty = LineChunk.from_lines(1, [])
    assert format_chunk(empty, two_columns(np.zeros(0), np.zeros(0, dtype=np.int64)), None) == b""
    assert format_chunk(empty, two_columns(np.zeros(0), np.zeros(0, dtype=np.int64)), 3) == b""  # no member at all


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_an_impossible_score_is_refused(bad):
    with pytest.raises(ValueError, match="cannot write log-probability"):
        format_chunk(LineChunk.from_lines(1, ODD[:1]), two_columns(np.array([bad]), np.array([0])), None)
