"""``--shard K/N``: cut a table into N contiguous slices at source-phrase boundaries.

Each SLURM array task scores one slice; the slices concatenate to the whole output. A slice is
defined by position in the file (compressed bytes for gzip), so no task has to read the table
once more just to count its lines: with S the file size, shard k nominally starts at byte
floor((k-1)·S/N) and really starts at the first line from there whose source differs from the
previous line's. Every shard applies the same rule to both of its ends, so the shards partition
the table. Line positions come from :func:`rescorer.tables.chunks.iter_line_chunks`, which derives
them from the file alone, so every task computes the same ones.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescorer.tables.chunks import FIELD_SEPARATOR, LineChunk


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


def _sources_of(chunk: LineChunk) -> pa.Array:
    """Each line's source phrase (the whole line where it has no separator), as binary."""
    return pc.list_element(pc.split_pattern(chunk.arrow(), FIELD_SEPARATOR, max_splits=1), 0)


class ShardFilter:
    """Keeps the lines of shard K/N: contiguous, cut where the source phrase changes."""

    def __init__(self, shard: tuple[int, int], file_size: int, state: dict | None = None) -> None:
        k, n = shard
        self.start_byte = (k - 1) * file_size // n
        self.end_byte = k * file_size // n  # nominal start of the next shard
        self.last_shard = k == n
        state = state or {}
        self.started = state.get("started", k == 1)
        self.finished = state.get("finished", False)
        self.prev_source = state.get("prev_source")

    def state(self) -> dict:
        """What a resumed run needs to continue the filter exactly (stored in the progress file)."""
        return {"started": self.started, "finished": self.finished, "prev_source": self.prev_source}

    def rows(self, chunk: LineChunk) -> np.ndarray:
        """Indices of the chunk's lines that belong to this shard (``chunk.positions`` needed).

        Vectorised, since it runs in the reader thread, the one stage that does not scale with
        ``-j``. A line starts the shard if it is the first at or past the nominal start byte whose
        source differs from the line before; the end is found the same way from there on.
        """
        if chunk.positions is None:
            raise ValueError("sharding needs the lines' file positions (iter_line_chunks(positions=...))")
        n = len(chunk)
        if not n:
            return np.zeros(0, dtype=np.int64)
        sources = _sources_of(chunk)
        prev = self.prev_source.encode() if isinstance(self.prev_source, str) else self.prev_source
        boundary = np.empty(n, dtype=bool)
        boundary[0] = prev is None or sources[0].as_py() != prev
        boundary[1:] = pc.not_equal(sources.slice(1), sources.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        positions = np.asarray(chunk.positions)
        first = last = 0
        if not self.finished:
            if not self.started:
                found = np.flatnonzero((positions >= self.start_byte) & boundary)
                self.started = bool(len(found))
                first = int(found[0]) if len(found) else n
            last = n
            if self.started and not self.last_shard:
                found = np.flatnonzero((positions[first:] >= self.end_byte) & boundary[first:])
                if len(found):
                    self.finished = True
                    last = first + int(found[0])
        self.prev_source = sources[n - 1].as_py().decode("utf-8", "replace")
        return np.arange(first, max(first, last), dtype=np.int64)
