"""Ctrl-C and SIGTERM held back while child processes start."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys

import pytest

from infrastructure.interrupts import held_while_starting_children, stopped_runs_say_so


def blocked_signals(pid: int) -> int:
    """The signal mask of process ``pid`` (``SigBlk`` of /proc), as a bit set."""
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("SigBlk:")).split()[1], 16)


def test_a_sigterm_while_children_start_comes_once_they_have_started() -> None:
    """The signal waits for the end of the block, then ends the run as it would have (one line,
    143); the child started in the block, and a multiprocessing semaphore made in it (which starts
    multiprocessing's resource tracker, and that unblocks both signals), start with both blocked."""
    stops = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    with pytest.raises(SystemExit) as stopped, stopped_runs_say_so("test"), held_while_starting_children():
        multiprocessing.get_context("spawn").Lock()
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        os.kill(os.getpid(), signal.SIGTERM)
        child_blocks = blocked_signals(child.pid)
        child.stdin.close()
        child.wait()
    assert stopped.value.code == 128 + signal.SIGTERM
    assert child_blocks & stops == stops, hex(child_blocks)
    assert blocked_signals(os.getpid()) & stops == 0  # this process takes them again
