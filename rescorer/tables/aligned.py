"""Chunks whose boundaries are fixed by the table's content, so that every run cuts it alike.

The scorer groups a chunk's pairs into batches from the chunk's first line, and a batch's shape
decides how its matmuls round. When chunks were cut every N lines from where a run started, a
shard (``--shard K/N``) started its chunks elsewhere than a whole run did, and the concatenated
shards differed from one run in the last printed digit of ~0.5% of the lines. Here the table is
cut at *sync points* that depend on the content alone: a line whose source phrase differs from the
previous line's (a *block start*, :func:`block_starts`) and whose hash falls in a 1-in-``chunk_lines``
class. Between two sync points, chunks are cut every ``chunk_lines`` lines from the first. Every
run reads the table from its first line and so cuts every stretch of it at the same lines and
scores it in the same batches: whole, sharded, resumed or not. A shard starts at a grid point
(:func:`grid_rows`, a line number), wherever that falls in a chunk (:mod:`rescorer.pipeline.shards`),
and scores the chunks that hold its ends whole.

With about two lines per source in a Moses table, sync points come every ~2·``chunk_lines`` lines,
and chunks hold ~0.8·``chunk_lines`` lines on average, at most ``chunk_lines``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescorer.tables.chunks import FIELD_SEPARATOR, LineChunk

# Shard points follow a grid of lines whose spacing grows with the line number: 1 line up to line
# 2**GRID_BITS, then 2**(e - GRID_BITS) lines among the lines of bit length e (between 1/512 and
# 1/256 of the line number), and at most GRID_MAX_LINES lines. So a cut between shards falls within
# half the spacing (under 1/512 of the table's lines, and at most 256 lines) of an equal share's
# start, in a table of any length and whatever its sources (rescorer.pipeline.shards), and a table
# has about 2,600 points, plus one every 512 lines past line 131,072: each starts a gzip member.
# Never change them without rescorer.pipeline.resume.PROGRESS_VERSION: they decide where every gzip
# member starts.
GRID_BITS = 9
GRID_MAX_LINES = 512
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads the key's bits over the high ones
_EDGE = 8  # bytes taken from the end of the source phrase


def source_keys(chunk: LineChunk) -> tuple[np.ndarray, np.ndarray]:
    """Each line's source phrase as ``(key, length in bytes)``: equal sources give equal keys.

    The source is what precedes the first `` ||| `` (the whole line where there is none). The key
    mixes the source's last 8 bytes and its length, read for a whole chunk in a few vectorised
    passes (the reader's rate is the pipeline's ceiling, so no pass per line). Two different
    sources may share a key; that only hides a sync point, the same way in every run, and equal
    sources always share it. Never change the key: it decides where every table is cut, and so the
    bytes of every output.
    """
    n = len(chunk)
    if not n:
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    offsets = chunk.offsets.astype(np.int64, copy=False)
    starts, ends = offsets[:-1], offsets[1:] - 1  # each line's first byte and its newline
    lines = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets),
                                                                    pa.py_buffer(chunk.data)])
    found = pc.find_substring(lines, FIELD_SEPARATOR).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.where(found < 0, ends - starts, found)
    # The 8 bytes that end each source, as one little-endian word read at any byte offset (a strided
    # view of the data, no copy; the same on every machine), the bytes before a short source masked.
    padded = np.frombuffer(bytes(_EDGE) + chunk.data, dtype=np.uint8)
    words = np.ndarray((len(padded) - _EDGE + 1,), dtype="<u8", buffer=padded, strides=(1,))
    tail = words[starts + lengths]  # padded offset of (start + length - 8) + 8
    short = lengths < _EDGE
    keep = np.where(short, ~(np.uint64(0xFFFFFFFFFFFFFFFF) >> (8 * lengths.clip(0, _EDGE - 1)).astype(np.uint64)),
                    np.uint64(0xFFFFFFFFFFFFFFFF))
    key = ((tail & keep) ^ lengths.astype(np.uint64)) * _MIX
    return key ^ (key >> np.uint64(29)), lengths


def block_starts(chunk: LineChunk, previous: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray, tuple | None]:
    """Which rows of ``chunk`` start a source block (their source differs from the line before),
    the rows' source keys, and the key of its last line (for the next chunk).

    ``previous`` is the key of the line before the chunk (None at the start of the table, whose
    first line starts a block). A hash collision between two different adjacent sources only hides
    a block start, identically in every run.
    """
    hashes, lengths = source_keys(chunk)
    if not len(hashes):
        return np.zeros(0, dtype=bool), hashes, previous
    changed = np.empty(len(hashes), dtype=bool)
    changed[0] = previous is None or (int(hashes[0]), int(lengths[0])) != tuple(previous)
    changed[1:] = (hashes[1:] != hashes[:-1]) | (lengths[1:] != lengths[:-1])
    return changed, hashes, (int(hashes[-1]), int(lengths[-1]))


def sync_points(chunk: LineChunk, previous: tuple[int, int] | None, chunk_lines: int) -> tuple[np.ndarray, tuple]:
    """Rows of ``chunk`` that are sync points, and the key of its last line (for the next chunk).

    ``previous`` is the key of the line before the chunk (None at the start of the table, whose
    first line is a sync point).
    """
    changed, hashes, last = block_starts(chunk, previous)
    if not len(hashes):
        return np.zeros(0, dtype=np.int64), previous
    chosen = (hashes >> np.uint64(20)) % np.uint64(chunk_lines) == 0
    if previous is None:
        chosen[0] = True
    return np.flatnonzero(changed & chosen), last


def grid_cells(line_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which cell of the shard-point grid each 0-based line index falls in, as ``(bit length, index
    >> spacing bits)``: two lines lie in different cells exactly when a grid line lies in between
    (a grid line of each octave is a multiple of that octave's spacing, a power of two, and the
    octave's first line is one)."""
    lengths = np.frexp(line_index.astype(np.float64))[1].astype(np.int64)  # bit length; exact below 2**53
    shift = np.clip(lengths - GRID_BITS, 0, GRID_MAX_LINES.bit_length() - 1)
    return lengths, line_index >> shift


def grid_rows(chunk: LineChunk) -> np.ndarray:
    """Which rows of ``chunk`` are *grid points*: lines where a grid line (:func:`grid_cells`) lies,
    the table's first line included.

    A shard may start at each (:mod:`rescorer.pipeline.shards`), and so every run starts a gzip
    member at each (:func:`rescorer.pipeline.output_chunks.format_lines`): a shard's output is then
    the whole run's bytes from there. They follow the line numbers alone, not the sources, so a
    filtered table (few sources, many targets each) has as many as any other, and a shard may start
    inside a source block; a chunk finds its own from its first line number, whatever was read before.
    """
    index = chunk.first_line_no - 1 + np.arange(len(chunk), dtype=np.int64)
    lengths, cells = grid_cells(index)
    before_lengths, before_cells = grid_cells(np.maximum(index - 1, 0))
    return (index == 0) | (lengths != before_lengths) | (cells != before_cells)


def grid_points(lines: int) -> np.ndarray:
    """The 1-based line numbers of the grid points (:func:`grid_rows`) of a table of ``lines`` lines,
    ascending: every line up to line 512, then every 2**(e - GRID_BITS) lines among the line indices
    of bit length e, at most every GRID_MAX_LINES lines (about 2,600 points below line 131,072, then
    one every 512 lines)."""
    found = []
    for length in range(lines.bit_length() + 1):
        low, high = (1 << length) >> 1, 1 << length  # 0-based indices of this bit length: [low, high)
        shift = min(max(length - GRID_BITS, 0), GRID_MAX_LINES.bit_length() - 1)
        found.append(np.arange(low, min(high, lines), 1 << shift, dtype=np.int64))
    return np.concatenate(found) + 1


def aligned_chunks(chunks: Iterable[LineChunk], chunk_lines: int) -> Iterator[LineChunk]:
    """Re-cut consecutive chunks (from :func:`~rescorer.tables.chunks.iter_line_chunks`, from the
    table's first line) at content-fixed places; each chunk's ``sync`` says whether it starts at a
    sync point."""
    previous: tuple[int, int] | None = None  # key of the last line seen
    since_sync = 0  # lines from the last sync point to the end of what was seen
    held: list[LineChunk] = []  # the lines after the last cut, not yet yielded
    held_sync = False  # whether that cut is a sync point
    for chunk in chunks:
        syncs, previous = sync_points(chunk, previous, chunk_lines)
        start = 0
        for cut, is_sync in _cuts(len(chunk), syncs, since_sync, chunk_lines):
            if cut > start:
                held.append(chunk.slice(start, cut))
            if held:
                yield _concat(held, held_sync)
            held, held_sync, start = [], is_sync, cut
        if start < len(chunk):
            held.append(chunk.slice(start, len(chunk)))
        since_sync = len(chunk) - int(syncs[-1]) if len(syncs) else since_sync + len(chunk)
    if held:
        yield _concat(held, held_sync)


def _cuts(n: int, syncs: np.ndarray, since_sync: int, chunk_lines: int) -> list[tuple[int, bool]]:
    """``(row, is a sync point)`` of the rows of an ``n``-line chunk before which a new chunk starts:
    every sync point, and every ``chunk_lines`` lines after one (``since_sync`` of those lines came
    before this chunk)."""
    bounds = [*syncs.tolist(), n]
    first = (-since_sync) % chunk_lines
    if since_sync + first == 0:  # distance 0 is the sync point itself, listed in syncs
        first += chunk_lines
    cuts = [(row, False) for row in range(first, bounds[0], chunk_lines)]
    for sync, following in zip(bounds[:-1], bounds[1:], strict=True):
        cuts.append((sync, True))
        cuts += [(row, False) for row in range(sync + chunk_lines, following, chunk_lines)]
    return cuts


def _concat(pieces: list[LineChunk], sync: bool) -> LineChunk:
    """Consecutive chunks as one (line numbers from the first)."""
    if len(pieces) == 1:
        return replace(pieces[0], sync=sync)
    data = b"".join(p.data for p in pieces)
    starts = np.cumsum([0] + [len(p.data) for p in pieces[:-1]])
    offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(pieces, starts, strict=True)])
    return LineChunk(pieces[0].first_line_no, data, offsets, pieces[-1].end_offset, sync=sync)
