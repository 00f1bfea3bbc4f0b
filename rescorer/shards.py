"""``--shard K/N``: cut a table into N contiguous slices at source-phrase boundaries.

Each SLURM array task scores one slice; the slices concatenate to the whole output. A slice is
defined by position in the file (compressed bytes for gzip), so no task has to read the table
once more just to count its lines: with S the file size, shard k nominally starts at byte
floor((k-1)·S/N) and really starts at the first line from there whose source differs from the
previous line's. Every shard applies the same rule to both of its ends, so the shards partition
the table. Line positions come from :func:`rescorer.table_chunks.iter_line_chunks`, which derives
them from the file alone, so every task computes the same ones.
"""

from __future__ import annotations

import numpy as np

from rescorer.table_chunks import LineChunk


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


def _sources_of(lines: list[bytes]) -> list[bytes]:
    return [line.split(b" ||| ", 1)[0] for line in lines]


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
        """Indices of the chunk's lines that belong to this shard (``chunk.positions`` needed)."""
        if chunk.positions is None:
            raise ValueError("sharding needs the lines' file positions (iter_line_chunks(positions=...))")
        keep = np.zeros(len(chunk.lines), dtype=bool)
        prev = self.prev_source.encode() if isinstance(self.prev_source, str) else self.prev_source
        for i, src in enumerate(_sources_of(chunk.lines)):
            start = float(chunk.positions[i])
            boundary = prev is None or src != prev
            if not self.started and start >= self.start_byte and boundary:
                self.started = True
            if self.started and not self.last_shard and start >= self.end_byte and boundary:
                self.finished = True
            keep[i] = self.started and not self.finished
            prev = src
        self.prev_source = prev.decode("utf-8", "replace") if prev is not None else None
        return np.flatnonzero(keep)
