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

from neural.model_files import ModelFileError, read_model_file, write_model_file
from neural.vocab import Vocab
from rescorer.model.config import ModelConfig, TrainConfig
from rescorer.model.network import RNNEncoderDecoder

FORMAT_NAME = "moses-rnn-rescorer-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(ModelFileError):
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
