"""``--shard K/N``: cut a table into N contiguous slices at sync points, byte-identical to one run.

Each SLURM array task scores one slice; the slices concatenate to the whole output, byte for
byte. A slice is defined by position in the file (compressed bytes for gzip), so no task has to
read the table once more just to count its lines: with S the file size, shard k nominally starts
at byte floor((k-1)·S/N) and really starts at the first chunk from there that starts at a sync
point (:mod:`rescorer.tables.aligned`: a source change fixed by the content). A run cuts the
table into the same chunks from every sync point on, so a shard's chunks, and hence its batches
and every printed digit, are those of the whole run. Every shard applies the same rule to both
of its ends, so the shards partition the table. Line positions come from
:func:`rescorer.tables.chunks.iter_line_chunks`, which derives them from the file alone, so every
task computes the same ones.
"""

from __future__ import annotations

import numpy as np

from rescorer.tables.chunks import LineChunk


class ShardError(ValueError):
    """A malformed ``--shard``."""


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` with 1 ≤ K ≤ N, as a SLURM array index would give it."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise ShardError(f"--shard must look like K/N (e.g. 3/8), got {text!r}") from exc
    if not 1 <= k <= n:
        raise ShardError(f"--shard {text}: K must be between 1 and N")
    return k, n


class ShardFilter:
    """Keeps the chunks of shard K/N: contiguous, from one sync point to another."""

    def __init__(self, shard: tuple[int, int], file_size: int, state: dict | None = None) -> None:
        k, n = shard
        self.start_byte = (k - 1) * file_size // n
        self.end_byte = k * file_size // n  # nominal start of the next shard
        self.last_shard = k == n
        state = state or {}
        self.started = state.get("started", k == 1)
        self.finished = state.get("finished", False)

    def state(self) -> dict:
        """What a resumed run needs to continue the filter exactly (stored in the progress file)."""
        return {"started": self.started, "finished": self.finished}

    def rows(self, chunk: LineChunk) -> np.ndarray:
        """The chunk's rows that belong to this shard: all or none (chunks from
        :func:`rescorer.tables.aligned.aligned_chunks`, with ``positions``).

        A shard starts at the first chunk at or past its nominal start byte that starts at a sync
        point, and ends before the first such chunk at or past the next shard's.
        """
        if chunk.positions is None:
            raise ValueError("sharding needs the lines' file positions (iter_line_chunks(positions=...))")
        if not len(chunk) or self.finished:
            return np.zeros(0, dtype=np.int64)
        at = float(chunk.positions[0])
        if not self.started and chunk.sync and at >= self.start_byte:
            self.started = True
        elif self.started and not self.last_shard and chunk.sync and at >= self.end_byte:
            self.finished = True
        if self.started and not self.finished:
            return np.arange(len(chunk), dtype=np.int64)
        return np.zeros(0, dtype=np.int64)
