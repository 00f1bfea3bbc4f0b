"""What a ``--resume`` must match: a record of ALL of a command's options, less those listed as free to differ.

A resumable command (rescoring, tuning, training) writes a record beside its work and, on ``--resume``,
refuses to go on when the options that decide its output are not those of the interrupted run: the
output would splice two settings. Listing by hand the options that decide the output is how one gets
forgotten (and a new option is missed by default); so the record holds every option, and a command
lists only those that may differ between the two runs (``MAY_DIFFER``, as sockeye's ``ARGS_MAY_DIFFER``:
threads, quiet, progress, stops such as a time budget), each a decision someone made.

:func:`options_record` makes the record (from a dataclass of options or click's parameters),
:func:`check_same_options` compares it with the one recorded, in one line that names each option that
differs; the record itself is written with the one JSON writer (``files.write_json``), inside the
command's own progress or state file.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import os
from collections.abc import Collection, Mapping
from pathlib import Path, PurePath

from infrastructure.errors import UserError


class ResumeRecordError(UserError):
    """A ``--resume`` with options other than the interrupted run's."""


def options_record(options: object, may_differ: Collection[str], *,
                   recorded_as: Mapping[str, object] | None = None) -> dict[str, object]:
    """Every option of ``options`` but those in ``may_differ``, as plain JSON values.

    ``options`` is a dataclass (the fields of a dataclass inside it count as options of their own, so
    their names must not clash, unless that dataclass is named in ``may_differ`` or ``recorded_as`` as a
    whole) or a mapping of option names to values (click's ``params``). Paths
    become strings, tuples lists, enums their values. ``recorded_as`` gives the recorded form of an
    option whose value is not plain data (a large array by its digest); any other such value is a
    ``TypeError``, so that a new kind of option is decided on, never silently dropped. A name in
    ``may_differ`` or ``recorded_as`` that is no option is a ``ValueError``: a renamed option must
    not leave its exemption behind.
    """
    recorded_as = dict(recorded_as or {})
    values = _flat_options(options, {*may_differ, *recorded_as})
    unknown = sorted((set(may_differ) | set(recorded_as)) - set(values))
    if unknown:
        raise ValueError(f"not options of {type(options).__name__}: {', '.join(unknown)}")
    return {name: recorded_as[name] if name in recorded_as else _plain(name, value)
            for name, value in values.items() if name not in may_differ}


def _flat_options(options: object, whole: Collection[str] = ()) -> dict[str, object]:
    """The options by name, the fields of nested dataclasses raised to the top (but those named in ``whole``)."""
    if isinstance(options, Mapping):
        items = list(options.items())
    elif dataclasses.is_dataclass(options) and not isinstance(options, type):
        items = [(f.name, getattr(options, f.name)) for f in dataclasses.fields(options)]
    else:
        raise TypeError(f"options_record takes a dataclass or a mapping, not {type(options).__name__}")
    values: dict[str, object] = {}
    for name, value in items:
        nested = dataclasses.is_dataclass(value) and not isinstance(value, type) and name not in whole
        inner = _flat_options(value, whole) if nested else {name: value}
        clash = set(inner) & set(values)
        if clash:
            raise ValueError(f"options of {type(options).__name__} named twice: {', '.join(sorted(clash))}")
        values.update(inner)
    return values


def _plain(name: str, value: object) -> object:
    """``value`` as JSON data: what the record holds and the next run compares."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return _plain(name, value.value)
    if isinstance(value, (PurePath, os.PathLike)):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(name, item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _plain(name, item) for key, item in value.items()}
    raise TypeError(f"option {name}: a {type(value).__name__} cannot be recorded as it is; give its recorded "
                    f"form (recorded_as) or list it as an option that may differ")


def differences(then: Mapping[str, object], now: Mapping[str, object],
                names: Mapping[str, str] | None = None) -> list[str]:
    """``--chunk-lines 1000, now 2000`` for each option recorded ``then`` that is not the same ``now``
    (an option missing from one side counts as absent: ``none``)."""
    names = names or {}
    return [f"{names.get(key, option_name(key))} {shown(then.get(key))}, now {shown(now.get(key))}"
            for key in sorted({*then, *now}, key=str) if then.get(key) != now.get(key)]


def check_same_options(then: Mapping[str, object], now: Mapping[str, object], where: object, *, advice: str,
                       names: Mapping[str, str] | None = None,
                       error: type[UserError] = ResumeRecordError) -> None:
    """Refuse a resume whose options are not those recorded in ``where``, in one line naming each one:
    ``cannot --resume: OUT.progress was made with --chunk-lines 1000, now 2000; ADVICE``.

    ``names`` shows a recorded key that is not spelt as its option (default: ``--chunk-lines`` for
    ``chunk_lines``); ``error`` is the command's own error class."""
    changed = differences(then, now, names)
    if changed:
        raise error(f"cannot --resume: {where} was made with {'; with '.join(changed)}; {advice}")


def option_name(key: str) -> str:
    """The command-line spelling of an option recorded as ``key``: ``chunk_lines`` is ``--chunk-lines``."""
    return "--" + key.replace("_", "-")


def shown(value: object) -> str:
    """A recorded value in a message: a file by its path, size and time, or by its size and hash; a missing
    one as ``none``."""
    if value is None:
        return "none"
    if isinstance(value, dict) and "path" in value:
        return f"{value['path']} ({value.get('size')} bytes, mtime {value.get('mtime_ns')})"
    if isinstance(value, dict) and "sha256" in value:
        return f"a file of {value.get('size')} bytes, SHA-256 {str(value['sha256'])[:12]}…"
    if isinstance(value, str):
        return value if value and not any(c.isspace() for c in value) else repr(value)
    return repr(value)


def file_identity(path: str | os.PathLike | None) -> dict | None:
    """Path, size and modification time: enough to notice a changed input or a retrained model."""
    if path is None or str(path) == "-":
        return None
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def content_identity(path: str | os.PathLike | None) -> dict | None:
    """A model file by its content: its SHA-256 and size, read once in blocks (a few hundred MB: about a
    second). Path, size and modification time do not tell two models apart: another model of the same
    size with its time copied (``cp -p``, ``touch -r``, a sync tool) would let a resumed run finish the
    table with another model than the chunks before, and the output would mix the two."""
    if path is None or str(path) == "-":
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return {"sha256": digest.hexdigest(), "size": os.stat(path).st_size}
