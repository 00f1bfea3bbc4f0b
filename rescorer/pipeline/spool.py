"""Chunks of lines handed between processes through files in RAM, never through the main process.

With ``-j`` workers, ``rescore-phrase-table`` reads the table in a reader process
(:mod:`rescorer.pipeline.reader`). Each chunk's lines go to a spool file (on ``/dev/shm`` where the
system has it: memory, not disk) and only a :class:`SpooledChunk` — a name and four numbers —
travels through the main process, to the worker that parses the chunk and later to the one that
formats and compresses it, which deletes the file. The main process, which runs the model, so
never copies, pickles or decompresses a line: what it handles per chunk is the scoring plan, the
scores and the compressed output.
"""

from __future__ import annotations

import mmap
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rescorer.tables.chunks import LineChunk

_RAM_FOLDER = Path("/dev/shm")


@dataclass(frozen=True)
class SpooledChunk:
    """Where a chunk's lines wait, and what the pipeline needs to know of it without them."""

    path: str
    first_line_no: int
    lines: int
    end_offset: int

    def __len__(self) -> int:
        return self.lines

    @property
    def last_line_no(self) -> int:
        return self.first_line_no + self.lines - 1

    def load(self) -> LineChunk:
        """The chunk's lines (one read of the file; their offsets are the file's tail)."""
        raw = Path(self.path).read_bytes()
        split = len(raw) - 8 * (self.lines + 1)
        offsets = np.frombuffer(raw, dtype=np.int64, offset=split)
        return LineChunk(self.first_line_no, raw[:split], offsets, self.end_offset)

    def drop(self) -> None:
        """Delete the spool file (its last reader does it); a missing one is no error."""
        Path(self.path).unlink(missing_ok=True)


@dataclass(frozen=True)
class SpooledObject:
    """An object whose arrays wait in a spool file: a worker's result for the main process.

    Pickle protocol 5 hands the NumPy arrays over out of band (:meth:`dump`); :meth:`load` maps the
    file and rebuilds the object around the mapped bytes, so a chunk's scoring plan (~26 MB of
    tree arrays per 100,000 lines) reaches the main process without being unpickled byte by byte:
    the model's first use of each array is its only copy.
    """

    path: str
    meta: bytes  # the pickle without its arrays
    sizes: tuple[int, ...]  # byte size of each array, in file order

    @classmethod
    def dump(cls, obj: object, path: str) -> SpooledObject:
        buffers: list[pickle.PickleBuffer] = []
        meta = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        with open(path, "wb") as fh:
            for buffer in buffers:
                fh.write(buffer.raw())
        return cls(path, meta, tuple(buffer.raw().nbytes for buffer in buffers))

    def load(self) -> object:
        """The object, its arrays backed by a private (copy-on-write) mapping; the file is deleted."""
        with open(self.path, "rb") as fh:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) if sum(self.sizes) else b""
        os.unlink(self.path)
        view, start, parts = memoryview(mapped), 0, []
        for size in self.sizes:
            parts.append(view[start : start + size])
            start += size
        return pickle.loads(self.meta, buffers=parts)


def lines_of(lines: LineChunk | SpooledChunk) -> LineChunk:
    """The lines themselves, from memory or from the spool."""
    return lines.load() if isinstance(lines, SpooledChunk) else lines


class Spool:
    """A private folder of chunk files for one run, removed whole when the run ends (or fails)."""

    def __init__(self, folder: str | None = None) -> None:
        base = _RAM_FOLDER if _RAM_FOLDER.is_dir() and os.access(_RAM_FOLDER, os.W_OK) else None
        self.folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="rescore-spool-", dir=base))

    def put(self, index: int, chunk: LineChunk) -> SpooledChunk:
        """Write one chunk's lines and offsets; written whole before anyone is told of it."""
        path = self.folder / f"{index}.chunk"
        with open(path, "wb") as fh:
            fh.write(chunk.data)
            fh.write(np.ascontiguousarray(chunk.offsets, dtype=np.int64).tobytes())
        return SpooledChunk(str(path), chunk.first_line_no, len(chunk), chunk.end_offset)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
