"""Child processes that end with the process that started them, however that one ended.

A process started with :mod:`multiprocessing` (a worker pool, a reader) outlives a parent killed by
SIGKILL, or by any signal the parent does not handle: it is re-parented to init and runs on,
holding its memory and the files it writes. A child calls :func:`die_with_parent` first thing, and
then ends within a moment of its parent, whatever ended the parent.

A folder a run works in (a spool in RAM) is removed when the run ends, however it ends, by a small
process of its own (:func:`remove_when_gone`); and it is named with the owner's :func:`process_tag`,
so that a later run can tell an abandoned one (:func:`owner_alive`) from one a live run is using.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_SECONDS = 0.25  # how often a child looks whether its parent is still there


def die_with_parent(parent_pid: int) -> None:
    """End this process (SIGKILL) as soon as process ``parent_pid``, which started it, has ended.

    On Linux the kernel does it (``prctl(PR_SET_PDEATHSIG)``); that signal comes when the *thread*
    that started this process ends, so the parent must start children from a thread that lives as
    long as they do (a run's own thread, not a helper thread). Everywhere, a thread of this process
    also watches for the parent to change (re-parenting to init or a subreaper), which catches a
    parent gone before the ``prctl`` and systems without it.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # libc is loaded
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="watch-parent").start()


def leave_interrupts_to_parent() -> None:
    """Ignore Ctrl-C and SIGTERM in a child: they reach the whole process group (a terminal's Ctrl-C,
    a scheduler's SIGTERM), and the parent, which stops its children itself, says the one line
    about it (:mod:`infrastructure.interrupts`), not a traceback per child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(WATCH_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)


def _start_time(pid: int) -> str:
    """When process ``pid`` started, in clock ticks since boot ("0" where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return "0"
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()  # field 22; the name before may hold spaces


def process_tag(pid: int | None = None) -> str:
    """``PID-START`` of a process (this one by default): which process, even after its pid is reused."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    """Whether the process of a :func:`process_tag` still runs (True when the tag cannot be read)."""
    try:
        pid_text, start = tag.split("-", 1)
        pid = int(pid_text)
    except ValueError:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    now = _start_time(pid)
    return "0" in (start, now) or now == start


# Waits for its standard input to close (its owner ended or is done with the folder), then removes
# the folder; again until it is gone, since a dying writer may still create a file in it. Ctrl-C and
# SIGTERM are the owner's to handle (they reach the whole process group).
_JANITOR = """
import os, shutil, signal, sys, time
for number in (signal.SIGINT, signal.SIGTERM):
    signal.signal(number, signal.SIG_IGN)
sys.stdin.buffer.read()
end = time.monotonic() + 30
while os.path.lexists(sys.argv[1]) and time.monotonic() < end:
    shutil.rmtree(sys.argv[1], ignore_errors=True)
    time.sleep(0.05)
"""


def remove_when_gone(folder: str | os.PathLike) -> subprocess.Popen:
    """A process that removes ``folder`` once this process ends, or once :func:`removed_now` is called.

    SIGKILL leaves a process no way to tidy up after itself; this one holds the read end of a pipe
    whose only writer is this process, so it sees the end of input the moment this process ends.
    """
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _JANITOR, os.fspath(folder)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)


def removed_now(janitor: subprocess.Popen) -> None:
    """Have the janitor of :func:`remove_when_gone` remove its folder now, and wait until it has."""
    if janitor.stdin is not None:
        janitor.stdin.close()
    janitor.wait()
