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

import contextlib
import fcntl
import mmap
import os
import pickle
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infrastructure.files import lock_held
from infrastructure.processes import (
    owner_alive,
    process_tag,
    remove_semaphores,
    remove_when_gone,
    removed_now,
    semaphores_named,
)
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
    """A private folder of chunk files for one run, removed whole when the run ends (or fails).

    A run killed outright (SIGKILL) cannot remove its spool, so a small process of its own does it
    the moment the run ends (:func:`~infrastructure.processes.remove_when_gone`). Should that one
    be killed too (power, a whole process group killed), the folder is named with its owner's
    :func:`~infrastructure.processes.process_tag`, and every new spool first removes the spools
    whose owner is gone, and its run's end does again: RAM held by a dead run is freed by the next
    run (or ``--resume``).

    The owner also holds ``flock`` on the folder's :data:`OWNER_LOCK` for its whole life. A name's
    process tag speaks only for this PID namespace: containers that share ``/dev/shm`` (Docker's
    ``--ipc=host``, a pod's shared memory) but not their PIDs see each other's runs as dead, and
    would delete a live run's chunks under it. The kernel's lock is the same in every namespace,
    and it is dropped when the owner dies, however it dies.
    """

    def __init__(self, folder: str | None = None) -> None:
        """The spool in ``folder`` (a reader process joining its run's), or a new one for this process."""
        self.janitor: subprocess.Popen | None = None
        self._owner_fd: int | None = None
        if folder:
            self.folder = Path(folder)
            return
        base = Path(_spool_base())
        remove_abandoned(base)
        self.folder = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{process_tag()}-", dir=base))
        try:
            self._owner_fd = os.open(self.folder / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
            with contextlib.suppress(OSError):  # a file system without locks: the tag alone speaks for it
                fcntl.flock(self._owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.janitor = remove_when_gone(self.folder)
        except BaseException:
            self._release()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def put(self, index: int, chunk: LineChunk) -> SpooledChunk:
        """Write one chunk's lines and offsets; written whole before anyone is told of it."""
        path = self.folder / f"{index}.chunk"
        with open(path, "wb") as fh:
            fh.write(chunk.data)
            fh.write(np.ascontiguousarray(chunk.offsets, dtype=np.int64).tobytes())
        return SpooledChunk(str(path), chunk.first_line_no, len(chunk), chunk.end_offset)

    def semaphores(self) -> contextlib.AbstractContextManager[None]:
        """The multiprocessing semaphores made in this block are named after the spool, and go
        with it when it is found abandoned (:func:`remove_abandoned`): a whole process group
        killed leaves them in ``/dev/shm`` as it leaves the spool."""
        return semaphores_named(self.folder.name)

    def close(self) -> None:
        """Remove the spool (by its janitor, which then ends too), then the dead runs' spools that were
        too young to judge when this run began: a run resumed the moment after a kill of the whole
        process group (janitor included) would otherwise leave that spool in RAM for the next run."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self._release()
        if self.janitor is not None:  # the owner's spool, not a reader's view of it
            removed_now(self.janitor)
            remove_abandoned(self.folder.parent)

    def _release(self) -> None:
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None


_PREFIX = "rescore-spool-"
#: The file in a spool whose ``flock`` its owner holds while it lives.
OWNER_LOCK = ".owner"
#: A spool younger than this is never removed as abandoned: its owner may not hold its lock yet.
YOUNG_SPOOL_SECONDS = 10.0


def _spool_base() -> str:
    """RAM where the system offers it, else the temporary folder."""
    return str(_RAM_FOLDER) if _RAM_FOLDER.is_dir() and os.access(_RAM_FOLDER, os.W_OK) else tempfile.gettempdir()


def abandoned_spools(base: Path | None = None) -> list[Path]:
    """The spools in ``base`` (default: where spools go) whose owner process has ended: not alive
    by its tag in this PID namespace, and not holding its lock from another one."""
    found = []
    for folder in Path(base or _spool_base()).glob(f"{_PREFIX}*"):
        tag = "-".join(folder.name[len(_PREFIX) :].split("-")[:2])  # PID-START, then mkdtemp's suffix
        if folder.is_dir() and not owner_alive(tag) and lock_held(folder / OWNER_LOCK) is not True:
            found.append(folder)
    return found


def remove_abandoned(base: Path) -> None:
    """Remove the spools in ``base`` whose owner process has ended (none seconds old: see
    :data:`YOUNG_SPOOL_SECONDS`)."""
    now = time.time()
    for folder in abandoned_spools(base):
        with contextlib.suppress(OSError):
            if now - folder.stat().st_mtime >= YOUNG_SPOOL_SECONDS:
                shutil.rmtree(folder, ignore_errors=True)
                remove_semaphores(folder.name)
