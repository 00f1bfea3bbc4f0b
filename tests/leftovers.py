"""What a run leaves running: the processes that carry a test's mark in their environment.

A test starts a command with :func:`marked_env`; every process the command starts (workers, a
reader, multiprocessing's resource tracker) inherits the mark, also once re-parented to init, so
:func:`marked_processes` finds them all by reading ``/proc`` (psutil is no dependency).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

MARK = "RESCORER_TEST_MARK"


def marked_env(**extra: str) -> tuple[dict[str, str], str]:
    """The environment for a command under test, with a fresh mark, and the mark."""
    mark = uuid.uuid4().hex
    return {**os.environ, **extra, MARK: mark}, mark


def marked_processes(mark: str) -> dict[int, str]:
    """Live processes (not zombies) whose environment holds ``mark``: pid -> command line."""
    found = {}
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != b"Z":
            found[int(entry.name)] = command.strip()
    return found


#: Seconds a killed run's processes get to end: the kernel's SIGKILL of the workers (``die_with_parent``)
#: and the janitor's removal of the spool take far less, even on a loaded machine; past this, one is
#: left running for good.
GONE_SECONDS = 60.0


def wait_until_gone(mark: str, seconds: float = GONE_SECONDS) -> dict[int, str]:
    """The marked processes still running after up to ``seconds`` (empty once all are gone)."""
    deadline = time.monotonic() + seconds
    while (left := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
