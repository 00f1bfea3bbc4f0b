"""Self-describing model checkpoints, written atomically.

A checkpoint is one ``torch.save`` of a plain dict: the model's ``state_dict``, the configs and the
vocabularies as plain dicts/lists of str, an optional optimiser state and trainer state, and a
format marker plus version. Keeping everything to builtins and tensors means the file loads
with ``torch.load(weights_only=True)`` — no pickled classes, so loading a checkpoint someone sent
you cannot execute code, and the file can be read without this package.

Writes go to a temporary file in the destination folder and are moved into place with
``os.replace``: the trainer checkpoints a long run repeatedly, and a kill or a full disk in the
middle of a write must leave the previous checkpoint intact, never a truncated one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from infrastructure.errors import UserError
from infrastructure.files import atomic_path
from rescorer.model.config import ModelConfig, TrainConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.vocab import Vocab

FORMAT_NAME = "moses-rnn-rescorer-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(UserError):
    """The file is not a (readable) checkpoint of this tool, or cannot be written as one."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model (in eval mode) and everything needed to use or resume it."""

    model: RNNEncoderDecoder
    config: ModelConfig
    src_vocab: Vocab
    tgt_vocab: Vocab
    train_config: TrainConfig | None = None
    optimizer_state: dict[str, Any] | None = None
    train_state: dict[str, Any] | None = None
    path: Path | None = None
    version: int = FORMAT_VERSION


# What torch.load(weights_only=True) can rebuild; checked before writing so that a trainer
# storing, say, a NumPy RNG state fails at save time with a clear message, not at resume time.
_SCALARS = (str, int, float, bool, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)


def _check_loadable(value: object, where: str) -> None:
    """Raise ``CheckpointError`` if ``value`` holds anything ``weights_only`` loading rejects."""
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool, type(None))):
                raise CheckpointError(f"{where}: key {key!r} of type {type(key).__name__} cannot be stored")
            _check_loadable(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_loadable(item, f"{where}[{i}]")
        return
    raise CheckpointError(
        f"{where} is a {type(value).__name__}, which torch.load(weights_only=True) cannot read back; "
        "store builtins, lists, dicts or tensors"
    )


def _unwrap(model: nn.Module) -> nn.Module:
    """The plain module behind ``torch.compile`` (``_orig_mod``) or DDP (``module``) wrappers.

    Their state_dict keys carry a prefix, which would make the checkpoint unloadable into a
    plain ``RNNEncoderDecoder``.
    """
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: nn.Module,
    config: ModelConfig,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    train_config: TrainConfig | None = None,
    optimizer_state: Mapping[str, Any] | None = None,
    train_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically to ``path`` and return it as a ``Path``.

    ``optimizer_state`` is an ``optimizer.state_dict()``; ``train_state`` is the trainer's own
    bookkeeping (step, best score, RNG tensors ...) and must hold only builtins and tensors.
    """
    path = Path(path)
    model = _unwrap(model)
    model_config = getattr(model, "config", None)
    if model_config is not None and model_config != config:
        raise CheckpointError(f"the model was built with {model_config}, not the given {config}")
    if len(src_vocab) != config.src_vocab_size or len(tgt_vocab) != config.tgt_vocab_size:
        raise CheckpointError(
            f"vocabulary sizes {len(src_vocab)}/{len(tgt_vocab)} do not match the config's "
            f"{config.src_vocab_size}/{config.tgt_vocab_size}"
        )
    payload: dict[str, Any] = {
        "model_config": config.to_dict(),
        "train_config": train_config.to_dict() if train_config is not None else None,
        "src_vocab": src_vocab.to_dict(),
        "tgt_vocab": tgt_vocab.to_dict(),
        "state_dict": model.state_dict(),
        "optimizer_state": optimizer_state,
        "train_state": train_state,
    }
    return write_model_file(path, FORMAT_NAME, FORMAT_VERSION, payload)


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


def last_checkpoint_path(model_out: str | Path) -> Path:
    """Where the latest training state lives, beside the best model ``model_out``."""
    return Path(str(model_out) + ".last")


def refuse_to_overwrite(model_out: Path, resume: bool) -> None:
    """A fresh training would overwrite a model that took hours at its first save: without
    ``resume``, an existing model or training state under ``model_out`` is an error, not a restart."""
    if resume:
        return
    for path in (model_out, last_checkpoint_path(model_out)):
        if path.exists():
            raise UserError(f"{path} already exists: pass --resume to continue that training, "
                             "or remove it to train from scratch")


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


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`; the model is on ``map_location``, in eval mode.

    Anything that is not such a checkpoint (another torch file, a truncated or garbage file)
    raises ``CheckpointError`` naming the path; a missing file raises ``FileNotFoundError``.
    """
    path = Path(path)
    payload = read_model_file(path, FORMAT_NAME, FORMAT_VERSION, CheckpointError, "rescorer checkpoint",
                              map_location)
    try:
        config = ModelConfig.from_dict(payload["model_config"])
        raw_train = payload.get("train_config")
        train_config = TrainConfig.from_dict(raw_train) if raw_train is not None else None
        src_vocab = Vocab.from_dict(payload["src_vocab"])
        tgt_vocab = Vocab.from_dict(payload["tgt_vocab"])
        # Built on the meta device and filled by assignment: no random init to throw away (six
        # 1000×1000 eigendecompositions for the paper's size) and no second copy of the weights.
        model = RNNEncoderDecoder(config, device="meta")
        model.load_state_dict(payload["state_dict"], assign=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: damaged rescorer checkpoint ({exc})") from exc
    if len(src_vocab) != config.src_vocab_size or len(tgt_vocab) != config.tgt_vocab_size:
        raise CheckpointError(f"{path}: vocabulary sizes do not match the model config")
    if isinstance(map_location, (str, torch.device)):
        model.to(map_location)
    model.eval()
    return Checkpoint(
        model=model,
        config=config,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        train_config=train_config,
        optimizer_state=payload.get("optimizer_state"),
        train_state=payload.get("train_state"),
        path=path,
        version=payload["version"],
    )
