"""Chunks cut by content: every run that starts at a sync point cuts the rest of the table alike."""

from __future__ import annotations

import io

import numpy as np
import pytest

from rescorer.tables.aligned import aligned_chunks, grid_points, grid_rows, source_keys
from rescorer.tables.chunks import LineChunk, iter_line_chunks


def table(n_sources: int, seed: int = 0) -> list[bytes]:
    """A sorted-looking table: 1-4 lines per source, sources of varied lengths."""
    rng = np.random.default_rng(seed)
    lines = []
    for s in range(n_sources):
        source = " ".join(f"w{rng.integers(0, 50)}" for _ in range(rng.integers(1, 5))) + f" s{s}"
        lines += [f"{source} ||| t{k} ||| 0.5 0.5 0.5 0.5".encode() for k in range(rng.integers(1, 5))]
    return lines


def chunks_of(lines: list[bytes], read_lines: int, chunk_lines: int) -> list[LineChunk]:
    data = b"".join(x + b"\n" for x in lines)
    return list(aligned_chunks(iter_line_chunks(io.BytesIO(data), "t", read_lines), chunk_lines))


def test_source_keys_equal_exactly_for_equal_sources():
    lines = [b"a b ||| x ||| 1", b"a b ||| y ||| 1", b"a c ||| x ||| 1", b"no separator", b" ||| empty source",
             b"b a ||| x ||| 1"]
    hashes, lengths = source_keys(LineChunk.from_lines(1, lines))
    keys = list(zip(hashes.tolist(), lengths.tolist(), strict=True))
    assert keys[0] == keys[1]
    assert len(set(keys[1:])) == 5  # a b / a c / the separator-less line / the empty source / b a
    assert lengths.tolist() == [3, 3, 3, 12, 0, 3]


@pytest.mark.parametrize("read_lines", [7, 100, 10_000])
def test_chunks_hold_every_line_once_at_most_chunk_lines_and_the_same_whatever_the_reads(read_lines):
    lines = table(3000)
    chunks = chunks_of(lines, read_lines, 50)
    assert [x for c in chunks for x in c.lines] == lines
    assert all(0 < len(c) <= 50 for c in chunks)
    assert [c.first_line_no for c in chunks] == [c.first_line_no for c in chunks_of(lines, 333, 50)]
    assert sum(c.sync for c in chunks) > 10  # sync points come every ~2·chunk_lines lines
    # A sync point is where the source changes.
    for c in chunks[1:]:
        if c.sync:
            before = lines[c.first_line_no - 2].split(b" ||| ")[0]
            assert c.lines[0].split(b" ||| ")[0] != before


def test_a_run_from_any_sync_point_cuts_the_rest_exactly_as_the_whole_run():
    """What a shard sees: the table from a sync point on gives the whole run's chunks from there."""
    lines = table(3000, seed=1)
    whole = chunks_of(lines, 64, 40)
    for start in [c for c in whole if c.sync][1:6]:
        rest = chunks_of(lines[start.first_line_no - 1 :], 97, 40)
        shift = start.first_line_no - 1
        expected = [(c.first_line_no - shift, c.lines) for c in whole if c.first_line_no >= start.first_line_no]
        assert [(c.first_line_no, c.lines) for c in rest] == expected


def test_end_offsets_follow_the_lines():
    lines = table(500, seed=2)
    data = b"".join(x + b"\n" for x in lines)
    chunks = list(aligned_chunks(iter_line_chunks(io.BytesIO(data), "t", 64), 30))
    ends = np.cumsum([len(x) + 1 for x in lines])
    assert [c.end_offset for c in chunks] == [int(ends[c.last_line_no - 1]) for c in chunks]


def brute_force_grid_points(lines: int) -> list[int]:
    """From the definition, line by line: every line up to line 512, then every 2**(e-9)-th line of
    those whose 0-based index has bit length e, at most every 512th (1-based line numbers)."""
    return [i + 1 for i in range(lines) if i % min(2 ** max(i.bit_length() - 9, 0), 512) == 0]


@pytest.mark.parametrize("lines", [0, 1, 2, 511, 512, 513, 514, 1025, 131_073, 300_000])
def test_grid_points_follow_their_definition(lines):
    assert grid_points(lines).tolist() == brute_force_grid_points(lines)


@pytest.mark.parametrize("targets", [1, 40, 700])
def test_grid_points_are_the_grid_rows_of_any_chunks(targets):
    """So a gzip member starts at each in every run, whatever --chunk-lines and the sources."""
    lines = [f"src {s} ||| t{t} ||| 0.5".encode() for s in range(2800 // targets + 1) for t in range(targets)]
    grid = set(grid_points(len(lines)).tolist())
    for chunk_lines in (97, 1000, 100_000):
        found = set()
        for chunk in chunks_of(lines, 500, chunk_lines):
            found |= set((chunk.first_line_no + np.flatnonzero(grid_rows(chunk))).tolist())
        assert found == grid and len(grid) > 1000
