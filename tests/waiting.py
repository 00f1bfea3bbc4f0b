"""Waiting for what a run does, not for a time: a line on its stderr, a record on disk, a state to kill it in.

A test that sleeps a fixed time before it acts, or stops waiting at a fixed deadline and goes on as if
the event had come, passes on an idle machine and fails now and then on a loaded one. :func:`wait_until`
waits for the event itself. Its one deadline, :data:`SAFETY_SECONDS`, is far beyond what any run of the
tests takes on a busy machine: it only keeps a hung run from hanging the suite, and passing it fails
the test, saying what never came.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Seconds after which a wait fails: a hang, not a slow machine.
SAFETY_SECONDS = 600.0


def wait_until(happened: Callable[[], T], what: str, *, proc: subprocess.Popen | None = None,
               seconds: float = SAFETY_SECONDS, poll: float = 0.01) -> T:
    """Poll ``happened`` until it returns something true, and return that.

    Fails (``AssertionError`` naming ``what``) when ``proc`` ends first, with its stderr where it is
    a pipe, or after ``seconds``.
    """
    deadline = time.monotonic() + seconds
    while not (result := happened()):
        if proc is not None and proc.poll() is not None:
            stderr = proc.stderr.read() if proc.stderr is not None else ""
            raise AssertionError(f"the run ended (exit status {proc.returncode}) before {what}: {stderr!s}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {seconds:.0f} s")
        time.sleep(poll)
    return result


def _stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (SIGSTOP has reached them all)."""
    states = []
    with contextlib.suppress(OSError):  # the process, or a thread of it, ended meanwhile
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                states.append((task / "stat").read_bytes().rsplit(b")", 1)[1].split()[0])
    return bool(states) and all(state in (b"T", b"t") for state in states)


def sigkill_when(proc: subprocess.Popen, happened: Callable[[], T], what: str, *,
                 seconds: float = SAFETY_SECONDS, poll: float = 0.01) -> T:
    """SIGKILL ``proc`` in a state where ``happened`` returns something true, and return that.

    Each look at the state first stops the process (SIGSTOP, waited for until every thread of it is
    stopped) and lets it go on only if the state is not the one wanted: the state seen is the state
    killed. A look and a kill a moment apart would let a fast run move past that state, or finish, on
    a machine where the test waits for a CPU. Fails as :func:`wait_until` does, the process killed.
    """
    deadline = time.monotonic() + seconds
    try:
        while True:
            if proc.poll() is not None:
                stderr = proc.stderr.read() if proc.stderr is not None else ""
                raise AssertionError(f"the run ended (exit status {proc.returncode}) before {what}: {stderr!s}")
            os.kill(proc.pid, signal.SIGSTOP)
            wait_until(lambda: proc.poll() is not None or _stopped(proc.pid), "stop after SIGSTOP",
                       seconds=seconds, poll=0.001)
            if proc.poll() is None:
                if result := happened():
                    return result
                os.kill(proc.pid, signal.SIGCONT)
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {seconds:.0f} s")
            time.sleep(poll)
    finally:
        proc.kill()
        proc.wait()
