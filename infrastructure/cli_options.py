"""The command-line conventions every command shares: ``rescorer``, ``rescore-phrase-table``, ``cslm``, ``nmt``,
``mert`` and ``table1``.

An MT engineer scripts these commands together, so one option means one thing everywhere:

- ``--threads N``: CPU threads (torch's pool, worker processes, the decoder's ``-threads``); the
  default is the CPUs this process may use. :func:`threads_option` applies it while the command line is
  read (:func:`infrastructure.threads.limit_threads`), for every command alike.
- ``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
- ``-q/--quiet``: no progress bars or progress lines on stderr.
- ``--seed``: default 1234, so that two runs of a command give the same result.
- ``--resume``: continue a killed run from what it saved.

Each command takes those of them that mean something for it (``tests/architecture/test_cli_conventions.py``
lists which, and why).

A bad value and a usage mistake (:class:`Command`, :class:`Group`) are one line and exit 1 (the
project's rule for bad input), not a usage screen, and what
the user must fix (a :class:`~infrastructure.errors.UserError`, a file the command cannot open, bad
UTF-8, a full disk) prints as one line through :func:`friendly_errors`; any other exception is a bug
and keeps its traceback. Every number is an :class:`IntRange` or
a :class:`FiniteFloat` (the one validating type, whose range ``--help`` shows) and every input file a
:class:`OneLinePath`.

Every output (a file or a folder) is an :class:`OutputPath`: a place that cannot be written is refused
while the command line is read, before any model is loaded or trained; an output that is one of the
command's inputs (any other :class:`click.Path` parameter) or another of its outputs is refused before
the command's body runs; and :func:`friendly_errors` runs the command under
:func:`infrastructure.files.outputs_of_a_run`, so a failed run leaves nothing it created. This
module imports click only: no torch.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import click

from infrastructure.errors import UserError
from infrastructure.files import (
    FOLDER_MARK,
    OutputPlaceError,
    check_output_place,
    check_outputs_are_not_inputs,
    disk_full_error,
    display_name,
    lock_path,
    outputs_of_a_run,
)
from infrastructure.interrupts import stopped_runs_say_so
from infrastructure.threads import available_cpus, before_torch_loads, limit_threads

# Every command imports this module before torch (the commands import it lazily): idle OpenMP
# threads then sleep instead of spinning against other processes (prefer_passive_waits says why),
# the output's bytes do not depend on --threads (same_sums_whatever_the_threads), and large tensors
# sit in huge pages (huge_pages_for_large_tensors).
before_torch_loads()

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


#: The largest integer any option takes, whatever its own range: what a C ``int64_t`` holds. Past it
#: torch, numpy and the OS calls the numbers go to raise ``OverflowError`` (a traceback).
INT64_MAX = 2**63 - 1


class IntRange(OneLineValue, click.IntRange):
    """:class:`click.IntRange`, failing with one line (:class:`OneLineValue`); an option without a
    ``max`` still refuses what no 64-bit integer holds (:data:`INT64_MAX`)."""

    name = "integer"  # "'x' is not a valid integer", not "... integer range"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if abs(number) > INT64_MAX:
            self.fail(f"{value} is beyond the largest number an option takes ({INT64_MAX}).", param, ctx)
        return number


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


#: The largest learning rate an optimiser takes: torch turns it into a float32 on the way (a larger one was
#: "value cannot be converted to type float without overflow" after the data was prepared).
FLOAT32_MAX = 3.4028234663852886e38


def learning_rate_type() -> FiniteFloat:
    """``--lr``: above 0, and what a float32 holds."""
    return FiniteFloat(min=0, min_open=True, max=FLOAT32_MAX)


class NumberList(OneLineValue, click.ParamType):
    """Comma-separated numbers (``--hidden 1536,1024``, ``--ranges 0,1``), each checked by ``item`` (an
    :class:`IntRange` or :class:`FiniteFloat`); ``count`` of them if given, and with ``ascending`` none
    smaller than the one before. Fails with one line, as every number does."""

    name = "list"

    def __init__(self, item: IntRange | FiniteFloat, *, count: int | None = None, ascending: bool = False) -> None:
        self.item, self.count, self.ascending = item, count, ascending

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            return list(value)
        parts = [part.strip() for part in str(value).split(",")]
        if "" in parts or (self.count is not None and len(parts) != self.count):
            how_many = f"{self.count} " if self.count is not None else ""
            self.fail(f"expected {how_many}comma-separated numbers, got {value!r}.", param, ctx)
        numbers = [self.item.convert(part, param, ctx) for part in parts]
        if self.ascending and numbers != sorted(numbers):
            self.fail(f"{value!r}: each number must be at least the one before.", param, ctx)
        if self.ascending and not all(math.isfinite(b - a) for a, b in itertools.pairwise(numbers)):
            self.fail(f"{value!r}: the numbers are further apart than a float holds.", param, ctx)
        return numbers


#: The file an input option stands for when it is not given, found from the command's other parameters
#: (``ctx.params``): ``propose`` reads ``lex.e2f`` beside INPUT_TABLE without ``--lex-e2f``. None: no file.
DefaultInput = Callable[[Mapping[str, Any]], str | os.PathLike[str] | None]


class OneLinePath(OneLineValue, click.Path):
    """:class:`click.Path`, failing with one line (:class:`OneLineValue`). An input that must exist and
    cannot be stdin (it is read twice, or beside another input that is) says why it refuses ``-``: click
    said "File '-' does not exist", as if a file named ``-`` were wanted.

    ``default_file``: the file the command reads when the option is not given (:data:`DefaultInput`), so
    that it counts as an input as much as a named one does and no output of the command replaces it
    (:func:`friendly_errors`).
    """

    def __init__(self, *args: Any, default_file: DefaultInput | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.default_file = default_file

    def convert(self, value, param, ctx):
        if os.fspath(value) == "-" and self.exists and not self.allow_dash and not os.path.lexists(value):
            self.fail("'-' means standard input, which this input cannot be read from; give a path.", param, ctx)
        return super().convert(value, param, ctx)


#: The files a command writes beside an output (``also_writes``) when they depend on its other options
#: (``rescore-phrase-table`` writes ``OUTPUT_TABLE.model.pt`` only without ``--model``): given the
#: output's path (``-`` too) and the command's parameters (``ctx.params``), each file as ``(how a
#: message names it, path)``.
SideOutputs = Callable[[str, Mapping[str, Any]], Iterable[tuple[str, str]]]


class OutputPath(OneLinePath):
    """Where a command writes: a file, or with ``folder`` a folder (made if missing).

    The place is tried while the command line is read (:func:`check_output_place` creates and
    removes a file there), so a read-only mount, an immutable folder or a path under a file is one
    line before hours of training, not a traceback after them. ``allow_dash``: ``-`` is stdout.
    ``also_writes``: the files the command writes beside or inside it, so that they too are refused
    where they are one of the command's inputs (:func:`check_outputs_are_not_inputs`): patterns of its
    path (``"{}.last"``; ``"{}/moses.ini"`` for a folder), or, for files that depend on the command's
    other options, :data:`SideOutputs` functions.
    """

    def __init__(self, *, folder: bool = False, allow_dash: bool = False, path_type: type | None = None,
                 also_writes: tuple[str | SideOutputs, ...] = ()) -> None:
        super().__init__(file_okay=not folder, dir_okay=folder, allow_dash=allow_dash, path_type=path_type)
        self.folder = folder
        self.also_writes = also_writes

    def convert(self, value, param, ctx):
        if os.fspath(value) == "-" and not self.allow_dash:  # else a file named "-" (and "-.last") is written
            self.fail(f"'-' means standard output, which this {'folder' if self.folder else 'file'} cannot go to; "
                      "give a path.", param, ctx)
        path = super().convert(value, param, ctx)
        try:
            check_output_place(path, folder=self.folder)
        except OutputPlaceError as exc:
            self.fail(str(exc), param, ctx)
        return path


@contextlib.contextmanager
def _usage_in_one_line() -> Iterator[None]:
    """A :class:`click.UsageError` raised inside as one line, exit 1; a bare group's help stays help."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as exc:
        where = f"; see '{exc.ctx.command_path} --help'" if exc.ctx is not None else ""
        message = " ".join(exc.format_message().split())  # click lists a missing choice's values a line each
        raise click.ClickException(message.rstrip(".") + where) from exc


class _OneLineUsage:
    """A usage mistake (an unknown option, a missing argument, two options that go together given one
    without the other) is one line and exit 1, as a bad value is: click's own is the usage line, a hint
    and the error, exit 2. The line names the ``--help`` that says the rest.

    Parsing (:meth:`make_context`) and the body (:meth:`invoke`, where a command checks the options that
    only make sense together, and a group parses its subcommand) both run under it.
    """

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        with _usage_in_one_line():
            return super().make_context(info_name, args, parent, **extra)  # type: ignore[misc]

    def invoke(self, ctx: click.Context) -> Any:
        with _usage_in_one_line():
            return super().invoke(ctx)  # type: ignore[misc]


class Command(_OneLineUsage, click.Command):
    """Every command of the project: ``@click.command(cls=Command)``, or a subcommand of a :class:`Group`."""


class Group(_OneLineUsage, click.Group):
    """Every command group of the project (``@click.group(cls=Group)``); each of its subcommands a :class:`Command`."""

    command_class = Command


#: The most threads or worker processes an option takes; more than the machine's CPUs are cut to those
#: anyway (:func:`at_most_the_cpus`).
MAX_THREADS = 1024


def at_most_the_cpus(value: int | None, label: str) -> int | None:
    """``value`` (threads or worker processes), cut to the CPUs this process may use, with a one-line
    warning. More of them than CPUs only share the CPUs: ``-j 1000`` started ~375 processes, 9.4 GB and a
    load of 73 on 2 cores, which then took minutes to answer SIGTERM."""
    cpus = available_cpus()
    if value is not None and value > cpus:
        click.echo(f"warning: {label} {value} is more than the {cpus} CPUs this process may use: using {cpus}",
                   err=True)
        return cpus
    return value


def use_threads(ctx: click.Context, param: click.Parameter, value: int | None) -> int:
    """``--threads`` applied while the command line is read (:func:`limit_threads`), so that no command body
    has to remember it; the command gets the number chosen, to size its worker pools and decoders from.
    More than the CPUs this process may use are cut to those (:func:`at_most_the_cpus`)."""
    return limit_threads(at_most_the_cpus(value, "--threads"))


def cap_workers(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    """The callback of a worker-process count (``-j``): cut to the CPUs, as ``--threads`` is."""
    return at_most_the_cpus(value, parameter_label(param))


def threads_option(help: str = THREADS_HELP) -> Callable[[F], F]:
    """``--threads N`` (1 <= N <= :data:`MAX_THREADS`, cut to the CPUs), absent: the CPUs this process may use.
    The option itself applies it (:func:`infrastructure.threads.limit_threads`: torch's pool, now or when
    torch loads), and the command receives the number as an ``int``."""
    return click.option("--threads", type=IntRange(min=1, max=MAX_THREADS), default=None, callback=use_threads,
                        help=help)


class DeviceName(OneLineValue, click.ParamType):
    """``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, checked while the command line is read.
    torch's own check of another name (``gpu``, ``cuda:x``, ``mps``, ``meta``) is a traceback, and for
    some of them only once the data is prepared."""

    name = "device"

    def convert(self, value, param, ctx):
        text = str(value)
        if text in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:[0-9]+", text):
            return text
        self.fail(f"{value!r} is not one of {DEVICE_HELP}.", param, ctx)


class PhraseText(OneLineValue, click.ParamType):
    """A phrase given on the command line (``rescorer sample``'s SOURCE): words, in UTF-8. Bytes that are
    not UTF-8 reach Python as lone surrogates, which the vocabulary would map to unknown words and a JSON
    output would carry on as invalid UTF-8; a blank phrase has nothing to condition on."""

    name = "phrase"

    def convert(self, value, param, ctx):
        text = str(value)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            self.fail(f"{text.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8.", param, ctx)
        if not text.split():
            self.fail("the phrase is empty.", param, ctx)
        return text


def device_option(help: str = DEVICE_HELP) -> Callable[[F], F]:
    return click.option("--device", type=DeviceName(), default="auto", show_default=True, help=help)


def quiet_option(help: str = "no progress output on stderr") -> Callable[[F], F]:
    return click.option("-q", "--quiet", is_flag=True, help=help)


#: The largest ``--seed``: what every generator the commands seed accepts (scikit-learn's t-SNE seeds numpy's
#: RandomState, which stops at 2**32 - 1).
MAX_SEED = 2**32 - 1


def seed_option(help: str = "random seed") -> Callable[[F], F]:
    return click.option("--seed", type=IntRange(min=0, max=MAX_SEED), default=DEFAULT_SEED, show_default=True,
                        help=help)


def checkpoint_every_option(default: float) -> Callable[[F], F]:
    """A training's ``--checkpoint-every SECONDS`` (``default``: its config's); ``--resume`` may change it."""
    return click.option("--checkpoint-every", type=FiniteFloat(min=0), default=default, show_default=True,
                        metavar="SECONDS", help="also save MODEL_OUT.last this often between validations, so that "
                        "a killed run loses at most this much training (0: after every update)")


def resume_option(help: str, *aliases: str) -> Callable[[F], F]:
    """``--resume`` (with older spellings in ``aliases``, e.g. ``mert tune``'s ``--continue``)."""
    return click.option("--resume", *aliases, "resume", is_flag=True, help=help)


def parameter_label(param: click.Parameter) -> str:
    """How the command line names ``param`` in a message: ``--save-model``, or ``MODEL_OUT`` for an argument."""
    return param.opts[0] if isinstance(param, click.Option) else param.human_readable_name


def is_input(param: click.Parameter) -> bool:
    """Whether ``param`` names files the command reads: a :class:`click.Path` that is not an :class:`OutputPath`."""
    return isinstance(param.type, click.Path) and not isinstance(param.type, OutputPath)


def _outputs_and_inputs(ctx: click.Context) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]],
                                                      list[tuple[str, Any]]]:
    """The ``(label, path)`` pairs of the outputs given on ``ctx``'s command line, of the other files the
    command writes (``also_writes``, and the lock file :func:`~infrastructure.files.exclusive_use` may hold
    beside each output) and of the inputs, those an option reads when it is not given (``default_file``) too."""

    def values(param: click.Parameter) -> list[tuple[str, Any]]:
        value = ctx.params.get(param.name)  # type: ignore[arg-type]
        given = value if isinstance(value, (tuple, list)) else [value]
        return [(parameter_label(param), v) for v in given if v is not None]

    outputs = [pair for p in ctx.command.params if isinstance(p.type, OutputPath) for pair in values(p)]
    side: list[tuple[str, Any]] = []
    for p in ctx.command.params:
        if not isinstance(p.type, OutputPath):
            continue
        for label, path in values(p):
            for also in p.type.also_writes:
                if callable(also):
                    side += also(os.fspath(path), ctx.params)
                elif os.fspath(path) != "-":
                    side.append((f"written with {label}", also.format(os.fspath(path))))
    locks = [(f"the lock file of {label}", str(lock_path(path))) for label, path in outputs + side
             if os.fspath(path) != "-" and not os.fspath(path).endswith(FOLDER_MARK)]
    inputs = [pair for p in ctx.command.params if is_input(p) for pair in values(p)]
    for p in ctx.command.params:
        default_file = getattr(p.type, "default_file", None)
        if is_input(p) and default_file is not None and ctx.params.get(p.name) is None:  # type: ignore[arg-type]
            path = default_file(ctx.params)
            if path is not None:
                inputs.append((f"{parameter_label(p)}'s default", path))
    return outputs, side + locks, inputs


def _check_side_output_places(side: list[tuple[str, Any]]) -> None:
    """The files a command writes beside its outputs must be writable too, found before any work: the
    model ``rescore-phrase-table IN -`` trains into the working folder (a read-only one is one line,
    not a traceback after the training). Each folder is tried once; a folder output as a folder."""
    tried: set[str] = set()
    for _, path in side:
        name = os.fspath(path)
        folder = name.endswith(FOLDER_MARK)
        where = name if folder else os.path.dirname(os.path.abspath(name))
        if where in tried:
            continue
        tried.add(where)
        check_output_place(name.rstrip(FOLDER_MARK) if folder else name, folder=folder)


def one_line(exc: BaseException) -> str:
    """The message of a known error: an :class:`OSError` as ``FILE: reason`` (``x.gz: No such file or
    directory``), not Python's ``[Errno 2] No such file or directory: 'x.gz'``; others as they say."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{display_name(exc.filename)}: {exc.strerror}"
    return str(exc)


def _show_warning_in_one_line(message, category, filename, lineno, file=None, line=None) -> None:
    """``warning: …`` on stderr: what the user should know, without Python's module path and source line."""
    print(f"warning: {message}", file=sys.stderr if file is None else file)


#: The :class:`OSError`\ s of a file the command was told to read or write (a missing or unreadable input,
#: a folder where a file should be): the user fixes them, so they are one line when they name the file.
FILE_PROBLEMS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def is_users_to_fix(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's to fix, so one line, not a traceback: a :class:`UserError`, an
    :class:`OSError` of a named file (:data:`FILE_PROBLEMS`) or bad UTF-8 in an input. Anything else,
    a plain ``ValueError`` included, is a bug in the project, and its traceback is what a report needs."""
    if isinstance(exc, FILE_PROBLEMS):
        return exc.filename is not None
    return isinstance(exc, (UserError, UnicodeDecodeError))


def friendly_errors(*, keeps_progress: bool | None = None) -> Callable[[F], F]:
    """Every command's body runs through this: one line for the user's errors, nothing left by a failed run.

    Before any work, an output that is one of the command's inputs (or another of its outputs) is
    refused (:func:`check_outputs_are_not_inputs`). What the user must fix (:func:`is_users_to_fix`)
    and a full disk (:func:`disk_full_error`) print as one line and exit 1; anything else keeps its
    traceback; a warning prints as one ``warning: …`` line. The command's outputs (its :class:`OutputPath`
    parameters) are written under :func:`outputs_of_a_run`: what a failed run created goes again, except
    the progress a rerun continues from, which a command keeps when it takes ``--resume`` (or
    ``keeps_progress``). Ctrl-C and SIGTERM end it with one line
    (:func:`~infrastructure.interrupts.stopped_runs_say_so`).
    """
    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context(silent=True)  # None: called as a function, outside click
            params = ctx.command.params if ctx is not None else []
            outputs: dict[bool, list[Any]] = {True: [], False: []}  # folder? -> paths
            for param in params:
                if isinstance(param.type, OutputPath):
                    outputs[param.type.folder].append(ctx.params.get(param.name))  # type: ignore[union-attr]
            takes_resume = any(p.name == "resume" for p in params)
            keeps = keeps_progress if keeps_progress is not None else takes_resume
            command = ctx.command_path if ctx is not None else fn.__name__
            try:
                if ctx is not None:
                    outputs_given, side, inputs = _outputs_and_inputs(ctx)
                    check_outputs_are_not_inputs(outputs_given + side, inputs)
                    _check_side_output_places(side)
                with stopped_runs_say_so(command), \
                        outputs_of_a_run(outputs[False], outputs[True], keeps_progress=keeps), \
                        warnings.catch_warnings():
                    warnings.showwarning = _show_warning_in_one_line
                    return fn(*args, **kwargs)
            except Exception as exc:
                if is_users_to_fix(exc):
                    raise click.ClickException(one_line(exc)) from exc
                if not isinstance(exc, (OSError, RuntimeError)) or disk_full_error(exc) is None:
                    raise
                rerun = ("run again with --resume to continue" if takes_resume
                         else "run again to continue" if keeps else "run again")
                raise click.ClickException(f"the disk is full: free space and {rerun}") from exc

        wrapper.one_line_errors = True  # type: ignore[attr-defined]  # what the convention test looks for
        return wrapper  # type: ignore[return-value]

    return decorate
