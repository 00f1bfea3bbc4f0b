"""Chunks whose boundaries are fixed by the table's content, so that every run cuts it alike.

The scorer groups a chunk's pairs into batches from the chunk's first line, and a batch's shape
decides how its matmuls round. When chunks were cut every N lines from where a run started, a
shard (``--shard K/N``) started its chunks elsewhere than a whole run did, and the concatenated
shards differed from one run in the last printed digit of ~0.5% of the lines. Here the table is
cut at *sync points* that depend on the content alone: a line whose source phrase differs from the
previous line's (a *block start*, :func:`block_starts`) and whose hash falls in a 1-in-``chunk_lines``
class. Between two sync points, chunks are cut every ``chunk_lines`` lines from the first. Every
run reads the table from its first line and so cuts every stretch of it at the same lines and
scores it in the same batches: whole, sharded, resumed or not. A shard starts at a block start,
wherever that falls in a chunk (:mod:`rescorer.pipeline.shards`), and scores the chunks that hold
its ends whole.

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

# A block start whose key's top SHARD_POINT_BITS bits are 0 (one in 256) is a shard point: with ~2
# lines per source in a Moses table, one every ~500 lines. The top bits of the key depend on every
# byte of the source's tail (lower ones do not see its last bytes, where "house1" and "house2"
# differ). Never change it: it decides where every gzip member starts.
SHARD_POINT_BITS = 8
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


def shard_points(chunk: LineChunk, previous: tuple[int, int] | None) -> tuple[np.ndarray, tuple | None]:
    """Which rows of ``chunk`` are *shard points*, and the key of its last line (for the next chunk).

    A shard point is a block start whose source key's top :data:`SHARD_POINT_BITS` bits are 0 (one
    in 256); the table's first line is one. They are dense (every ~500 lines) and fixed by the content alone, never by
    ``--chunk-lines``: a shard starts at one (:mod:`rescorer.pipeline.shards`), and every run
    starts a gzip member at each (:func:`rescorer.pipeline.output_chunks.format_lines`), so a
    shard's output is the whole run's bytes from there. ``previous`` as in :func:`block_starts`.
    """
    starts, hashes, last = block_starts(chunk, previous)
    points = starts & (hashes >> np.uint64(64 - SHARD_POINT_BITS) == 0)
    if previous is None and len(points):
        points[0] = True
    return points, last


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
    positions = (np.concatenate([p.positions for p in pieces]) if all(p.positions is not None for p in pieces)
                 else None)
    return LineChunk(pieces[0].first_line_no, data, offsets, pieces[-1].end_offset, positions, sync)
