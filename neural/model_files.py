"""The one envelope of this project's model files (RNN checkpoints, CSLMs), written atomically.

A model file is one ``torch.save`` of a plain dict with a format marker and a version, and
only builtins and tensors inside, so that it loads with ``torch.load(weights_only=True)``
(a file someone sent you cannot run code). A write goes to a temporary file moved into
place: a kill or a full disk mid-write leaves the previous model intact.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from infrastructure.errors import UserError
from infrastructure.files import atomic_path


class ModelFileError(UserError):
    """A model file that cannot be written in the envelope (its state would not load back)."""


# What torch.load(weights_only=True) can rebuild; checked before writing so that a trainer
# storing, say, a NumPy RNG state fails at save time with a clear message, not at resume time.
_SCALARS = (str, int, float, bool, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)


def _check_loadable(value: object, where: str) -> None:
    """Raise ``ModelFileError`` if ``value`` holds anything ``weights_only`` loading rejects."""
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise ModelFileError(f"{where}: key {key!r} of type {type(key).__name__} cannot be stored")
            _check_loadable(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_loadable(item, f"{where}[{i}]")
        return
    raise ModelFileError(
        f"{where} is a {type(value).__name__}, which torch.load(weights_only=True) cannot read back; "
        "store builtins, lists, dicts or tensors"
    )


def write_model_file(path: str | os.PathLike[str], format_name: str, version: int, payload: dict[str, Any]) -> Path:
    """Write a model file of this project (RNN checkpoint or CSLM) atomically, in the one envelope.

    The envelope is a dict with the ``format`` marker and ``version`` that :func:`read_model_file`
    checks; ``optimizer_state`` and ``train_state`` are checked to hold only what
    ``torch.load(weights_only=True)`` reads back, so a saved run can always be resumed.
    """
    for key in ("optimizer_state", "train_state"):
        if payload.get(key) is not None:
            _check_loadable(payload[key], key)
    with atomic_path(path) as temp, open(temp, "wb") as stream:
        torch.save({"format": format_name, "version": version, **payload}, stream)
    return Path(path)


def _why_unreadable(path: Path) -> str:
    """Why torch could not read ``path``, in a few words: a model file is a zip archive (torch.save's format)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if head == b"PK\x03\x04":
        return "a torch file, but damaged or holding objects no model file of this tool has"
    return "not a file torch.save wrote" if head else "an empty file"


def read_model_file(path: Path, format_name: str, max_version: int, error: type[Exception], what: str,
                    map_location: str | torch.device = "cpu") -> dict:
    """The payload of a model file of this project (RNN checkpoint or CSLM), its envelope checked.

    A file that torch cannot read, one without the ``format`` marker, or one from a newer version
    raises ``error`` naming the path in one line (a user mixing files up sees which, and not
    torch's own page of advice to load it unsafely); a missing file raises ``FileNotFoundError``.
    """
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # torch raises many types (UnpicklingError, RuntimeError, EOFError ...)
        raise error(f"{path}: not a {what} of this tool ({_why_unreadable(path)})") from exc
    if not isinstance(payload, dict) or payload.get("format") != format_name:
        raise error(f"{path}: not a {what} (no {format_name!r} marker)")
    version = payload.get("version")
    if not isinstance(version, int) or not 1 <= version <= max_version:
        raise error(f"{path}: {what} format version {version!r} is not supported "
                    f"(this version reads 1..{max_version}); upgrade moses-rnn-rescorer")
    return payload
