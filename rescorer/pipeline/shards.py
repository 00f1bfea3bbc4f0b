"""``--shard K/N``: cut a table into N contiguous slices of equal shares of lines, byte-identical to one run.

Each SLURM array task scores one slice; the slices concatenate to the whole output, byte for
byte. With L the table's lines, shard k starts at the first *shard point*
(:func:`rescorer.tables.aligned.shard_points`: the first source-block start at or past each line of
a grid whose spacing is under 1/256 of the line number, at most 512 lines) at or after line
floor((k-1)·L/N) + 1, and ends where shard k+1 starts. Shard points follow the lines, not the
sources, so a filtered table (a few sources with hundreds of targets each) has as many as any
other: each shard holds its share of the lines within 1/256 of the table and a source block, and
no source block is split between two shards. Each task finds its points alone: it counts the
table's lines in a pass of its own that only decompresses (:func:`~rescorer.tables.chunks.count_lines`,
~1M lines/s on a loaded 2-core machine; compressed bytes, which need no pass, give shares 18% off
in lines where a stretch of the table compresses better), then reads from the table's first line
to the end of its slice (the chunks it cuts are the whole run's, :mod:`rescorer.tables.aligned`).

A shard's ends fall anywhere within the chunks a whole run cuts, so a shard scores the chunks
that hold its ends whole, in the whole run's batches, and writes only its own lines of them:
every printed digit is the whole run's. Every run starts a gzip member at every shard point, so
the bytes match too.
"""

from __future__ import annotations

import numpy as np

from infrastructure.errors import UserError
from infrastructure.files import open_input
from rescorer.tables.aligned import shard_points
from rescorer.tables.chunks import LineChunk, count_lines


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

    def __init__(self, shard: tuple[int, int], table_lines: int, state: dict | None = None) -> None:
        k, n = shard
        self.start_line = (k - 1) * table_lines // n + 1
        self.end_line = k * table_lines // n + 1  # nominal start of the next shard
        self.last_shard = k == n
        state = state or {}
        self.started = state.get("started", k == 1)
        self.finished = state.get("finished", False)
        previous = state.get("previous")  # source key of the last line seen (shard_points)
        self.previous: tuple[int, int] | None = tuple(previous) if previous is not None else None

    @classmethod
    def of_table(cls, path: str, shard: tuple[int, int], state: dict | None = None) -> ShardFilter:
        """The filter of shard K/N of the table at ``path``, whose lines it counts first."""
        with open_input(path, decompress_thread=True) as fh:
            return cls(shard, count_lines(fh, path), state)

    def state(self) -> dict:
        """What a resumed run needs to continue the filter exactly (stored in the progress file)."""
        return {"started": self.started, "finished": self.finished,
                "previous": list(self.previous) if self.previous is not None else None}

    def rows(self, chunk: LineChunk) -> tuple[int, int] | None:
        """The rows ``[a, b)`` of the chunk that belong to this shard (None: none), for chunks of
        :func:`rescorer.tables.aligned.aligned_chunks`, in table order.

        The shard starts at the first shard point at or past its nominal first line, and ends
        before the first one at or past the next shard's.
        """
        n = len(chunk)
        if not n or self.finished:
            return None
        edge = self.start_line if not self.started else None if self.last_shard else self.end_line
        if edge is None or chunk.last_line_no < edge:  # no end of this shard in the chunk
            self.previous = shard_points(chunk.slice(n - 1, n), None)[1]
            return (0, n) if self.started else None
        points, self.previous = shard_points(chunk, self.previous)
        ends = np.flatnonzero(points)  # where a shard may start or end
        at = chunk.first_line_no + ends
        first = 0
        if not self.started:
            found = ends[at >= self.start_line]
            if not len(found):
                return None
            self.started, first = True, int(found[0])
        last = n
        if not self.last_shard:
            found = ends[(at >= self.end_line) & (ends >= first)]
            if len(found):
                self.finished, last = True, int(found[0])
        return (first, last) if last > first else None
