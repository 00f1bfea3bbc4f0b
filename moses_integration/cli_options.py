"""The command-line conventions every command shares: ``rescorer``, ``rescore-phrase-table``, ``cslm``,
``mert`` and ``table1``.

An MT engineer scripts these commands together, so one option means one thing everywhere:

- ``--threads N``: CPU threads (torch's pool, worker processes, the decoder's ``-threads``); the
  default is the CPUs this process may use, resolved by :func:`moses_integration.threads.limit_threads`
  in every command.
- ``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
- ``-q/--quiet``: no progress bars or progress lines on stderr.
- ``--seed``: default 1234, so that two runs of a command give the same result.
- ``--resume``: continue a killed run from what it saved.

Each command takes those of them that mean something for it (``tests/architecture/test_cli_conventions.py``
lists which, and why).

A bad value is one line and exit 1 (the project's rule for bad input), not a usage screen, and the
known input errors (:class:`ValueError` and its file-and-line subclasses, a missing file, bad UTF-8)
print as one line through :func:`friendly_errors`.

Every output (a file or a folder) is an :class:`OutputPath`: a place that cannot be written is refused
while the command line is read, before any model is loaded or trained; and :func:`friendly_errors`
runs the command under :func:`moses_integration.files.outputs_of_a_run`, so a failed run leaves
nothing it created. This module imports click only: no torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from moses_integration.files import InUseError, OutputPlaceError, check_output_place, outputs_of_a_run
from moses_integration.interrupts import stopped_runs_say_so
from moses_integration.threads import prefer_passive_waits

# Every command imports this module before torch (the commands import it lazily): idle OpenMP
# threads then sleep instead of spinning against other processes (prefer_passive_waits says why).
prefer_passive_waits()

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_SEED = 1234
DEVICE_HELP = "auto, cpu, cuda or cuda:N"
THREADS_HELP = ("CPU threads [default: the CPUs this process may use (os.sched_getaffinity), "
                "e.g. a SLURM job's share]")


class OneLineValue:
    """A parameter type whose bad value is one line and exit 1, the rule for bad input, not a usage error.

    Range checks happen while the command line is parsed, so a value that cannot work (``--chunk-lines
    0`` would read the whole table into one endless chunk) is refused before any file is opened.
    """

    def fail(self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None):
        where = param.get_error_hint(ctx) if param is not None and ctx is not None else "value"
        raise click.ClickException(f"Invalid value for {where}: {message}")


class IntRange(OneLineValue, click.IntRange):
    """:class:`click.IntRange`, failing with one line (:class:`OneLineValue`)."""

    name = "integer"  # "'x' is not a valid integer", not "... integer range"


class FiniteFloat(OneLineValue, click.FloatRange):
    """:class:`click.FloatRange` that also refuses nan and ±inf, failing with one line."""

    name = "float"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number

    def _describe_range(self) -> str:
        return "finite" if self.min is None and self.max is None else super()._describe_range()


class OneLinePath(OneLineValue, click.Path):
    """:class:`click.Path`, failing with one line (:class:`OneLineValue`)."""


class OutputPath(OneLinePath):
    """Where a command writes: a file, or with ``folder`` a folder (made if missing).

    The place is tried while the command line is read (:func:`check_output_place` creates and
    removes a file there), so a read-only mount, an immutable folder or a path under a file is one
    line before hours of training, not a traceback after them. ``allow_dash``: ``-`` is stdout.
    """

    def __init__(self, *, folder: bool = False, allow_dash: bool = False, path_type: type | None = None) -> None:
        super().__init__(file_okay=not folder, dir_okay=folder, allow_dash=allow_dash, path_type=path_type)
        self.folder = folder

    def convert(self, value, param, ctx):
        path = super().convert(value, param, ctx)
        try:
            check_output_place(path, folder=self.folder)
        except OutputPlaceError as exc:
            self.fail(str(exc), param, ctx)
        return path


def threads_option(help: str = THREADS_HELP) -> Callable[[F], F]:
    """``--threads N`` (N >= 1); ``None`` when absent, which ``limit_threads`` turns into the available CPUs."""
    return click.option("--threads", type=IntRange(min=1), default=None, help=help)


def device_option(help: str = DEVICE_HELP) -> Callable[[F], F]:
    return click.option("--device", default="auto", show_default=True, help=help)


def quiet_option(help: str = "no progress output on stderr") -> Callable[[F], F]:
    return click.option("-q", "--quiet", is_flag=True, help=help)


def seed_option(help: str = "random seed") -> Callable[[F], F]:
    return click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True, help=help)


def resume_option(help: str, *aliases: str) -> Callable[[F], F]:
    """``--resume`` (with older spellings in ``aliases``, e.g. ``mert tune``'s ``--continue``)."""
    return click.option("--resume", *aliases, "resume", is_flag=True, help=help)


def friendly_errors(*known: type[BaseException], keeps_progress: bool | None = None) -> Callable[[F], F]:
    """Every command's body runs through this: one line for known errors, nothing left by a failed run.

    Known input problems, an output another run holds, and the ``known`` errors of a command print
    as one line and exit 1. The command's outputs (its :class:`OutputPath` parameters) are written
    under :func:`outputs_of_a_run`: what a failed run created goes again, except the progress a
    rerun continues from, which a command keeps when it takes ``--resume`` (or ``keeps_progress``).
    Ctrl-C and SIGTERM end it with one line (:func:`~moses_integration.interrupts.stopped_runs_say_so`).
    """
    caught = (ValueError, FileNotFoundError, IsADirectoryError, UnicodeDecodeError, InUseError, *known)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context(silent=True)  # None: called as a function, outside click
            params = ctx.command.params if ctx is not None else []
            outputs: dict[bool, list[Any]] = {True: [], False: []}  # folder? -> paths
            for param in params:
                if isinstance(param.type, OutputPath):
                    outputs[param.type.folder].append(ctx.params.get(param.name))  # type: ignore[union-attr]
            keeps = keeps_progress if keeps_progress is not None else any(p.name == "resume" for p in params)
            command = ctx.command_path if ctx is not None else fn.__name__
            try:
                with stopped_runs_say_so(command), \
                        outputs_of_a_run(outputs[False], outputs[True], keeps_progress=keeps):
                    return fn(*args, **kwargs)
            except caught as exc:
                raise click.ClickException(str(exc)) from exc

        wrapper.one_line_errors = True  # type: ignore[attr-defined]  # what the convention test looks for
        return wrapper  # type: ignore[return-value]

    return decorate
