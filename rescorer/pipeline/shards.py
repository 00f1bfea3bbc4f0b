"""``--shard K/N``: cut a table into N contiguous slices of about equal size, byte-identical to one run.

Each SLURM array task scores one slice; the slices concatenate to the whole output, byte for
byte. A slice is defined by position in the file (compressed bytes for gzip), so no task has to
read the table once more just to count its lines: with S the file size, shard k starts at the
first *shard point* (:func:`rescorer.tables.aligned.shard_points`: a line that starts a source
block and whose source key falls in a 1-in-256 class) at or after byte floor((k-1)·S/N), and
ends where shard k+1 starts. Shard points come every ~500 lines of a Moses table and depend on
the content alone, never on ``--chunk-lines``, so the shards hold about equal shares of the
lines, and no source block is split between two shards.

A shard's ends fall anywhere within the chunks a whole run cuts (:mod:`rescorer.tables.aligned`),
so a shard scores the chunks that hold its ends whole, in the whole run's batches, and writes
only its own lines of them: every printed digit is the whole run's. Every run starts a gzip
member at every shard point, so the bytes match too. Line positions come from
:func:`rescorer.tables.chunks.iter_line_chunks`, which derives them from the file alone, so every
task computes the same ones.
"""

from __future__ import annotations

import numpy as np

from infrastructure.errors import UserError
from rescorer.tables.aligned import shard_points
from rescorer.tables.chunks import LineChunk


class ShardError(UserError):
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
    """Keeps the lines of shard K/N: contiguous, from one shard point to another."""

    def __init__(self, shard: tuple[int, int], file_size: int, state: dict | None = None) -> None:
        k, n = shard
        self.start_byte = (k - 1) * file_size // n
        self.end_byte = k * file_size // n  # nominal start of the next shard
        self.last_shard = k == n
        state = state or {}
        self.started = state.get("started", k == 1)
        self.finished = state.get("finished", False)
        previous = state.get("previous")  # source key of the last line seen (shard_points)
        self.previous: tuple[int, int] | None = tuple(previous) if previous is not None else None

    def state(self) -> dict:
        """What a resumed run needs to continue the filter exactly (stored in the progress file)."""
        return {"started": self.started, "finished": self.finished,
                "previous": list(self.previous) if self.previous is not None else None}

    def rows(self, chunk: LineChunk) -> tuple[int, int] | None:
        """The rows ``[a, b)`` of the chunk that belong to this shard (None: none), for chunks of
        :func:`rescorer.tables.aligned.aligned_chunks` with ``positions``, in table order.

        The shard starts at the first shard point at or past its nominal start byte, and ends
        before the first one at or past the next shard's.
        """
        if chunk.positions is None:
            raise ValueError("sharding needs the lines' file positions (iter_line_chunks(positions=...))")
        n = len(chunk)
        if not n or self.finished:
            return None
        edge = self.start_byte if not self.started else None if self.last_shard else self.end_byte
        if edge is None or float(chunk.positions[-1]) < edge:  # no end of this shard in the chunk
            self.previous = shard_points(chunk.slice(n - 1, n), None)[1]
            return (0, n) if self.started else None
        points, self.previous = shard_points(chunk, self.previous)
        ends = np.flatnonzero(points)  # where a shard may start or end
        at = chunk.positions[ends]
        first = 0
        if not self.started:
            found = ends[at >= self.start_byte]
            if not len(found):
                return None
            self.started, first = True, int(found[0])
        last = n
        if not self.last_shard:
            found = ends[(at >= self.end_byte) & (ends >= first)]
            if len(found):
                self.finished, last = True, int(found[0])
        return (first, last) if last > first else None
