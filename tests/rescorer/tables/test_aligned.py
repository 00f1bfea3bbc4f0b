"""Chunks cut by content: every run that starts at a sync point cuts the rest of the table alike."""

from __future__ import annotations

import bisect
import io

import numpy as np
import pytest

from rescorer.tables.aligned import aligned_chunks, grid_points, shard_points, source_keys
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


def brute_force_grid_points(lines: list[bytes]) -> list[int]:
    """The first block start at or past each grid line, from the definition, line by line: every
    line up to line 512, then every 2**(e-9)-th line of those whose 0-based index has bit length
    e, at most every 512th (1-based line numbers)."""
    sources = [line.split(b" ||| ")[0] for line in lines]
    starts = [i for i in range(len(lines)) if i == 0 or sources[i] != sources[i - 1]]
    grid = [i for i in range(len(lines)) if i % min(max(2 ** (i.bit_length() - 9), 1), 512) == 0]
    return sorted({starts[bisect.bisect_left(starts, g)] + 1 for g in grid if g <= starts[-1]})


@pytest.mark.parametrize("targets", [1, 3, 40, 700])
def test_grid_points_follow_their_definition_whatever_the_reads(targets):
    lines = [f"src {s} ||| t{t} ||| 0.5".encode() for s in range(300_000 // targets // 20) for t in range(targets)]
    expected = brute_force_grid_points(lines)
    assert len(expected) > 20
    data = b"".join(x + b"\n" for x in lines)
    for read_lines in (97, 333, 10**6):
        points, counted = grid_points(iter_line_chunks(io.BytesIO(data), "t", read_lines))
        assert points.tolist() == expected and counted == len(lines)


def test_grid_points_are_shard_points_of_any_chunks():
    """So a gzip member starts at each in every run, whatever --chunk-lines."""
    lines = table(3000)
    data = b"".join(x + b"\n" for x in lines)
    grid = set(grid_points(iter_line_chunks(io.BytesIO(data), "t", 1000))[0].tolist())
    for chunk_lines in (97, 1000, 100_000):
        chunk_points, previous = set(), None
        for chunk in chunks_of(lines, 500, chunk_lines):
            points, previous = shard_points(chunk, previous)
            chunk_points |= set((chunk.first_line_no + np.flatnonzero(points)).tolist())
        assert grid <= chunk_points and len(grid) > 100
