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

import contextlib
import ctypes
import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from infrastructure.interrupts import Terminated, held_while_starting_children

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


_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _killed_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def ends_with_this_process() -> dict[str, object]:
    """``subprocess`` arguments for a program (Moses, a Moses script, KenLM's ``query``) that ends with the
    thread that starts it: a ``mert evaluate`` killed by SIGKILL left its ``moses`` decoding for half an
    hour into a temp file nobody would read. The kernel kills the program (``PR_SET_PDEATHSIG``, kept
    across ``exec``); the call that starts it must wait in the thread that started it, as
    ``subprocess.run`` does. Only the program itself: a program that starts programs of its own (a Perl
    script) runs with :func:`run_as_group`. Elsewhere than Linux, nothing."""
    return {"preexec_fn": _killed_with_parent} if _prctl is not None else {}


# Leads a process group of its own, in which run_as_group starts its program; waits for its standard
# input to close (its owner ended, or is done with the program), then ends whatever of the group is
# left, itself last. Ctrl-C and SIGTERM are the owner's to pass on.
_GROUP_REAPER = """
import os, signal, sys
for number in (signal.SIGINT, signal.SIGTERM):
    signal.signal(number, signal.SIG_IGN)
sys.stdin.buffer.read()
os.killpg(0, signal.SIGKILL)
"""


def _lead_a_group() -> None:
    os.setpgid(0, 0)


def _join_group(group: int) -> None:
    """In :func:`run_as_group`'s program before it starts: in the reaper's group, killed with the thread
    that started it (as :func:`ends_with_this_process`), with the Ctrl-C and SIGTERM its starter held
    back taken again."""
    _killed_with_parent()
    os.setpgid(0, group)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run_as_group(args: Sequence[str], **popen_args: Any) -> int:
    """Run a program that starts programs of its own (a Moses Perl script: ``mert-moses.pl`` runs
    ``moses``, ``train-model.perl`` its aligners) to its end, and its exit status; nothing it started
    outlives the call, however the call ends.

    :func:`ends_with_this_process` ends only the program itself: a ``mert tune --mert-moses`` killed by
    SIGKILL left ``moses`` decoding the dev set for an hour. Here a small process leads a process group
    and holds a pipe whose only writer is this process (as :func:`remove_when_gone`); the program starts
    in that group, known before it can start anything, and once the program has returned, or this
    process has ended, the small process ends the whole group (SIGKILL). A terminal's Ctrl-C, or a
    SIGTERM, reaches this process only (the group is not the terminal's): it passes the same signal on
    to the group and waits for the program, so that a training saves its state as it would have from
    the terminal; a second Ctrl-C while it waits ends the group at once.
    """
    reaper = program = None
    try:
        with held_while_starting_children():  # a Ctrl-C comes once the program is in the group
            reaper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GROUP_REAPER], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, preexec_fn=_lead_a_group)
            program = subprocess.Popen(list(args), preexec_fn=functools.partial(_join_group, reaper.pid),
                                       **popen_args)
        return program.wait()
    except KeyboardInterrupt as exc:
        if program is not None and reaper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(reaper.pid, signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
            program.wait()
        raise
    except BaseException:
        if program is not None:
            program.kill()
        raise
    finally:
        if reaper is not None:
            reaper.stdin.close()  # type: ignore[union-attr]  # the reaper ends what is left of the group
            reaper.wait()
        if program is not None:
            program.wait()


def leave_interrupts_to_parent() -> None:
    """Ignore Ctrl-C and SIGTERM in a child: they reach the whole process group (a terminal's Ctrl-C,
    a scheduler's SIGTERM), and the parent, which stops its children itself, says the one line
    about it (:mod:`infrastructure.interrupts`), not a traceback per child."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Started with them blocked (infrastructure.interrupts.held_while_starting_children): ignored now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


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
    It starts with Ctrl-C and SIGTERM held back, which it then ignores: a Ctrl-C while it starts
    would print its traceback.
    """
    with held_while_starting_children():
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _JANITOR, os.fspath(folder)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)


def removed_now(janitor: subprocess.Popen) -> None:
    """Have the janitor of :func:`remove_when_gone` remove its folder now, and wait until it has."""
    if janitor.stdin is not None:
        janitor.stdin.close()
    janitor.wait()


#: Where Linux keeps a named semaphore ``/NAME``: as the file ``sem.NAME`` here.
SEMAPHORE_FOLDER = Path("/dev/shm")


@contextlib.contextmanager
def semaphores_named(name: str) -> Iterator[None]:
    """Name the semaphores :mod:`multiprocessing` makes in the block ``/mp-NAME-…``, so that
    :func:`remove_semaphores` can find them once their owner is gone.

    A pool, a queue or an event shared with processes that are spawned opens its semaphores by
    name, and their names live in ``/dev/shm`` until the creator, or multiprocessing's resource
    tracker, removes them: SIGKILL of a whole process group kills both, and leaves them there
    for good, each name random. ``multiprocessing`` has no public way to name them; its
    process-wide prefix is the one place (Python 3.8 to 3.13).
    """
    config = multiprocessing.current_process()._config  # private: see above
    before = config.get("semprefix")
    config["semprefix"] = f"/mp-{name}"
    try:
        yield
    finally:
        if before is None:
            config.pop("semprefix", None)
        else:
            config["semprefix"] = before


def remove_semaphores(name: str) -> None:
    """Remove the semaphores made under :func:`semaphores_named` ``(name)`` (their owner has ended)."""
    for path in SEMAPHORE_FOLDER.glob(f"sem.mp-{name}-*"):
        with contextlib.suppress(OSError):
            path.unlink()

