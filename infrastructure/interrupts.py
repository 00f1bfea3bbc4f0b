"""Ctrl-C and SIGTERM end a command alike: one line saying what was kept, and the shell's exit status.

A scheduler (SLURM's time limit, ``kill``, systemd) stops a run with SIGTERM, which by default ends
Python at once, without a word and without the tidying a Ctrl-C gets. While a command runs
(:func:`stopped_runs_say_so`, which every command's body runs under), SIGTERM raises
:class:`Terminated`, a ``KeyboardInterrupt``, so the same code saves the same progress. A library
that keeps something a rerun continues from says so by raising :class:`Interrupted` with what it
kept; the command then prints one line, ``COMMAND: stopped by Ctrl-C; WHAT WAS KEPT``, instead of a
traceback and ``Aborted!``, and exits 130 (Ctrl-C) or 143 (SIGTERM), as a shell reports them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import signal
import sys
import threading
import types
from collections.abc import Iterator
from multiprocessing import resource_tracker


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C would be."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C or SIGTERM, with what it kept for a rerun (``kept``, one clause)."""

    def __init__(self, kept: str) -> None:
        super().__init__(kept)
        self.kept = kept


def _terminated(number: int, frame: object) -> None:
    raise Terminated


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first exception it was raised from (or during) that is a ``kind``."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def stopped_runs_say_so(command: str) -> Iterator[None]:
    """Run the block with SIGTERM as Ctrl-C; either one ends the command with one line and 128 + signal.

    Only the main thread can take a signal handler; elsewhere (a test calling a command in a thread)
    SIGTERM keeps its default and Ctrl-C still gets the one line.
    """
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    except KeyboardInterrupt as exc:
        by_term = _cause(exc, Terminated) is not None
        interrupted = _cause(exc, Interrupted)
        kept = f"; {interrupted.kept}" if isinstance(interrupted, Interrupted) else ""
        sys.stderr.write(f"{command}: stopped by {'SIGTERM' if by_term else 'Ctrl-C'}{kept}\n")
        sys.stderr.flush()
        raise SystemExit(128 + (signal.SIGTERM if by_term else signal.SIGINT)) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_STOPS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def held_while_starting_children() -> Iterator[None]:
    """Run the block with Ctrl-C and SIGTERM held back, then take the first that came, as it would have come.

    Starting a child process is no moment to stop: a child half-started when its parent ends
    finds the parent's semaphores gone and prints a traceback, and a pool interrupted while it
    starts a worker cannot be shut down (``AssertionError: can only join a started process``).
    The signals are also blocked in this thread, which every process started in the block
    inherits, so that a terminal's Ctrl-C, which reaches the whole process group, waits in a child
    too until it has started and ignores them
    (:func:`infrastructure.processes.leave_interrupts_to_parent`).
    """
    # multiprocessing's resource tracker unblocks both signals when it starts, with the first
    # semaphore: started before they are blocked here, it leaves them blocked.
    resource_tracker.ensure_running()
    with held_interrupts():
        yield


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Run the block with Ctrl-C and SIGTERM held back (blocked in this thread, and in every thread or process
    it starts), then take the first that came, as it would have come."""
    main = threading.current_thread() is threading.main_thread()
    came: list[int] = []
    previous = {number: signal.signal(number, lambda got, frame: came.append(got)) for number in _STOPS} \
        if main else {}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held by the mask comes now, to ``came``
        for number, handler in previous.items():
            signal.signal(number, handler)
        if came:
            signal.raise_signal(came[0])


#: The modules whose first import runs with Ctrl-C and SIGTERM held (:func:`hold_interrupts_while_torch_loads`).
_HELD_IMPORTS = frozenset({"torch"})


class _HeldLoader(importlib.abc.Loader):
    """A module's own loader, its code run under :func:`held_interrupts`; everything else is the loader's."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> object:
        if name == "loader":  # not set yet (a copy being made): no recursion through this method
            raise AttributeError(name)
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # as if imported the usual way
        with held_interrupts():
            self.loader.exec_module(module)


class _HeldImportFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`_HELD_IMPORTS` as the other finders do, with their loader wrapped in :class:`_HeldLoader`."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _HELD_IMPORTS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HeldLoader(spec.loader)
                return spec
        return None


def hold_interrupts_while_torch_loads() -> None:
    """Hold Ctrl-C and SIGTERM back while torch is first imported, and take them once it is.

    torch's import (a second or more, inside a command that is already running) mishandles a signal
    that comes during it: measured on 12 Ctrl-Cs at 0.15–1.25 s into ``import torch``, 2 were swallowed
    and the command ran to its end with exit 0, and 1 aborted the process from C++ (``terminate called
    after throwing … KeyboardInterrupt``), and numpy's import may raise ``RecursionError`` instead. Held, the
    signal ends the command as any Ctrl-C does, once torch is in. Installed once per process
    (:func:`infrastructure.threads.before_torch_loads`); an import that is already done is not affected.
    """
    if not any(isinstance(finder, _HeldImportFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HeldImportFinder())
