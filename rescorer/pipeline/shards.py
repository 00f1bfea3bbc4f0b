"""``--shard K/N``: cut a table into N contiguous slices of equal shares of lines, byte-identical to one run.

Each SLURM array task scores one slice; the slices concatenate to the whole output, byte for
byte. With L the table's lines, the slices are cut at the *grid points*
(:func:`rescorer.tables.aligned.grid_points`: every line up to line 512, then lines spaced under
1/256 of the line number, at most 512 lines apart) nearest to the lines (k-1)·L/N + 1, the earlier
of two as near. The grid follows the lines, not the sources, so a cut moves from its exact share by
at most half the grid's spacing there, in any table: a filtered table (a few sources with hundreds
or thousands of targets each) is cut as evenly as any other, and a cut may fall inside a source
block, whose lines the two shards then share. Each task counts the table's lines alone, in a pass of
its own over the whole table that decompresses it (compressed bytes, which need no pass, give shares
18% off in lines where a stretch of the table compresses better), then reads from the table's
first line to the end of its slice (the chunks it cuts are the whole run's,
:mod:`rescorer.tables.aligned`). The cuts depend on the line count alone, not on ``--chunk-lines``.

A shard's ends fall anywhere within the chunks a whole run cuts, so a shard scores the chunks
that hold its ends whole, in the whole run's batches, and writes only its own lines of them:
every printed digit is the whole run's. Every run starts a gzip member at every grid point, so the
bytes match too.
"""

from __future__ import annotations

import numpy as np

from infrastructure.errors import UserError
from infrastructure.files import open_input
from rescorer.tables.aligned import grid_points
from rescorer.tables.chunks import LineChunk, iter_line_chunks

PASS_CHUNK_LINES = 65_536  # lines read at a time by the pass that counts the table's lines


class ShardError(UserError):
    """A malformed ``--shard``, or a table that changed under an interrupted shard."""


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` with 1 ≤ K ≤ N, as a SLURM array index would give it."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise ShardError(f"--shard must look like K/N (e.g. 3/8), got {text!r}") from exc
    if not 1 <= k <= n:
        raise ShardError(f"--shard {text}: K must be between 1 and N")
    return k, n


def shard_cuts(points: np.ndarray, table_lines: int, shards: int) -> list[int]:
    """The first line of each of ``shards`` shards, and the line after the table: the grid point
    (or the table's end) nearest to each equal share's first line, the earlier of two as near.

    ``points`` are the table's grid points, ascending (:func:`~rescorer.tables.aligned.grid_points`).
    Two shares may get the same point (more shards than lines): the shard between them is empty.
    """
    candidates = np.append(points, table_lines + 1).astype(np.int64)
    cuts = []
    for k in range(shards):
        share_start = k * table_lines // shards + 1
        at = int(np.searchsorted(candidates, share_start))  # candidates[at] >= share_start
        after = int(candidates[at])
        before = int(candidates[at - 1]) if at else after
        cuts.append(before if share_start - before <= after - share_start else after)
    return [*cuts, table_lines + 1]


def count_lines(path: str) -> int:
    """The table's lines, a last line without a newline included (the count the reader numbers by)."""
    lines = 0
    with open_input(path, decompress_thread=True) as fh:
        for chunk in iter_line_chunks(fh, path, PASS_CHUNK_LINES):
            lines = chunk.last_line_no if len(chunk) else lines
    return lines


class ShardFilter:
    """Keeps the lines of shard K/N: ``[first_line, next_line)``, from one grid point to another."""

    def __init__(self, first_line: int, next_line: int) -> None:
        self.first_line, self.next_line = first_line, next_line
        self.finished = False  # the chunk that holds the shard's last line (or its end) was seen

    @classmethod
    def of_table(cls, path: str, shard: tuple[int, int], state: dict | None = None) -> ShardFilter:
        """The filter of shard K/N of the table at ``path``, whose lines it counts first.

        ``state`` is what an interrupted run of the shard recorded (:meth:`state`): the table must
        still be cut at the same lines.
        """
        lines = count_lines(path)
        k, n = shard
        cuts = shard_cuts(grid_points(lines), lines, n)
        found = cls(cuts[k - 1], cuts[k])
        if state is not None and state != found.state():
            raise ShardError(f"cannot --resume shard {k}/{n}: {path} is now cut into lines "
                             f"{found.first_line}..{found.next_line - 1}, the interrupted run's were "
                             f"{state.get('lines')}; start over without --resume")
        return found

    def state(self) -> dict:
        """What a resumed run checks (stored in the progress file): the shard's lines."""
        return {"lines": [self.first_line, self.next_line]}

    def rows(self, chunk: LineChunk) -> tuple[int, int] | None:
        """The rows ``[a, b)`` of the chunk that belong to this shard (None: none), for chunks of
        :func:`rescorer.tables.aligned.aligned_chunks`, in table order."""
        n = len(chunk)
        if chunk.first_line_no + n >= self.next_line:
            self.finished = True
        a = min(max(self.first_line - chunk.first_line_no, 0), n)
        b = min(max(self.next_line - chunk.first_line_no, 0), n)
        return (a, b) if b > a else None
