"""CSLM model files: self-describing (config, vocabulary, weights, optional training state).

They load with ``torch.load(weights_only=True)``, like the RNN's checkpoints, through the same
envelope reader (:func:`neural.model_files.read_model_file`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cslm.model import CSLM, CSLMConfig, CSLMError
from infrastructure.files import PathArg
from neural.device import select_device
from neural.model_files import read_model_file, write_model_file
from neural.vocab import Vocab

FORMAT_NAME = "moses-rnn-rescorer-cslm"
FORMAT_VERSION = 1


@dataclass
class CSLMFile:
    """A loaded CSLM: the model (eval mode), its vocabulary, and training state if saved."""

    model: CSLM
    vocab: Vocab
    train_config: dict[str, Any] | None = None
    optimizer_state: dict[str, Any] | None = None
    train_state: dict[str, Any] | None = None
    path: Path | None = None


def save_cslm(
    path: PathArg,
    model: CSLM,
    vocab: Vocab,
    *,
    train_config: Mapping[str, Any] | None = None,
    optimizer_state: Mapping[str, Any] | None = None,
    train_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write a model file atomically (temp file beside it, fsync, rename)."""
    if len(vocab) != model.config.vocab_size:
        raise CSLMError(f"vocabulary has {len(vocab)} ids but the model {model.config.vocab_size}")
    payload = {
        "config": model.config.to_dict(),
        "vocab": vocab.to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "train_config": dict(train_config) if train_config is not None else None,
        "optimizer_state": optimizer_state,
        "train_state": train_state,
    }
    return write_model_file(path, FORMAT_NAME, FORMAT_VERSION, payload)


def load_cslm(path: PathArg, device: str | torch.device = "cpu") -> CSLMFile:
    """Read a model file written by :func:`save_cslm`; anything else is a :class:`CSLMError`."""
    path = Path(path)
    payload = read_model_file(path, FORMAT_NAME, FORMAT_VERSION, CSLMError, "CSLM model file")
    try:
        config = CSLMConfig.from_dict(payload["config"])
        vocab = Vocab.from_dict(payload["vocab"])
        model = CSLM(config, device="meta")
        model.load_state_dict(payload["state_dict"], assign=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CSLMError(f"{path}: damaged CSLM model file ({exc})") from exc
    if len(vocab) != config.vocab_size:
        raise CSLMError(f"{path}: vocabulary size {len(vocab)} differs from the config's {config.vocab_size}")
    model.to(select_device(device) if isinstance(device, str) else device)
    model.eval()
    return CSLMFile(model, vocab, payload.get("train_config"), payload.get("optimizer_state"),
                    payload.get("train_state"), path)
