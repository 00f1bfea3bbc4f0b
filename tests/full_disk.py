"""A disk that fills up, for the tests of what every command does then (a small tmpfs needs root and a
mount; this needs neither): :class:`FullDisk` wraps a file that accepts ``room`` more bytes, writes part
of the next write, then fails with ENOSPC, as a real full disk does; :func:`fill_up_on_write` makes every
file a module opens for writing such a file."""

from __future__ import annotations

import builtins
import errno
from types import ModuleType

import pytest


class FullDisk:
    """A file that accepts ``room`` more bytes, writes part of the next write, then fails: ENOSPC."""

    def __init__(self, stream, room: int) -> None:
        self._stream, self._room = stream, room

    def write(self, data: bytes) -> int:
        if len(data) > self._room:
            self._stream.write(data[: self._room])  # a real full disk also takes part of the write
            self._stream.flush()
            self._room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return self._stream.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._stream.close()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def fill_up_on_write(monkeypatch: pytest.MonkeyPatch, module: ModuleType, room: int = 100) -> None:
    """Every file ``module`` opens for writing with ``open()`` takes ``room`` bytes, then the disk is full."""

    def full_open(file, mode="r", *args, **kwargs):
        stream = builtins.open(file, mode, *args, **kwargs)  # noqa: SIM115 - returned to the caller
        return FullDisk(stream, room) if any(m in mode for m in "wax") else stream

    monkeypatch.setattr(module, "open", full_open, raising=False)
