"""NMT model files: config, both sides' sentencepiece models, weights and, while training, its state.

One envelope with the RNN's and the CSLM's (:mod:`neural.model_files`): ``torch.load(weights_only=True)``
reads it, and a file of another kind is one line naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infrastructure.files import PathArg
from neural.model_files import read_model_file, write_model_file
from nmt.model import AttentionNMT, NMTConfig, NMTError
from nmt.subwords import Subwords

FORMAT_NAME = "moses-rnn-rescorer-nmt"
FORMAT_VERSION = 1


@dataclass
class NMTFile:
    """A loaded model (eval mode) with its subword models, and its training state if saved."""

    model: AttentionNMT
    src_subwords: Subwords
    tgt_subwords: Subwords
    train_config: dict[str, Any] | None = None
    optimizer_state: dict[str, Any] | None = None
    train_state: dict[str, Any] | None = None
    path: Path | None = None


def save_nmt(path: PathArg, model: AttentionNMT, src_subwords: Subwords, tgt_subwords: Subwords, *,
             train_config: Mapping[str, Any] | None = None, optimizer_state: Mapping[str, Any] | None = None,
             train_state: Mapping[str, Any] | None = None) -> Path:
    """Write a model file atomically (temp file beside it, fsync, rename)."""
    if (len(src_subwords), len(tgt_subwords)) != (model.config.src_vocab, model.config.tgt_vocab):
        raise ValueError(f"subword vocabularies of {len(src_subwords)} and {len(tgt_subwords)} pieces but a "
                         f"model of {model.config.src_vocab} and {model.config.tgt_vocab}")
    payload = {
        "config": model.config.to_dict(),
        "src_subwords": src_subwords.to_tensor(),
        "tgt_subwords": tgt_subwords.to_tensor(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "train_config": dict(train_config) if train_config is not None else None,
        "optimizer_state": optimizer_state,
        "train_state": train_state,
    }
    return write_model_file(path, FORMAT_NAME, FORMAT_VERSION, payload)


def load_nmt(path: PathArg, device: torch.device | str = "cpu") -> NMTFile:
    """Read a file :func:`save_nmt` wrote; anything else is an :class:`NMTError` naming the file."""
    path = Path(path)
    payload = read_model_file(path, FORMAT_NAME, FORMAT_VERSION, NMTError, "NMT model file")
    try:
        config = NMTConfig.from_dict(payload["config"])
        src_subwords = Subwords.from_tensor(payload["src_subwords"])
        tgt_subwords = Subwords.from_tensor(payload["tgt_subwords"])
        model = AttentionNMT(config, device="meta")
        model.load_state_dict(payload["state_dict"], assign=True)
    except (KeyError, TypeError, ValueError, RuntimeError, NMTError) as exc:
        raise NMTError(f"{path}: damaged NMT model file ({exc})") from exc
    if (len(src_subwords), len(tgt_subwords)) != (config.src_vocab, config.tgt_vocab):
        raise NMTError(f"{path}: subword vocabularies differ in size from the model's")
    model.to(device)
    model.eval()
    return NMTFile(model, src_subwords, tgt_subwords, payload.get("train_config"), payload.get("optimizer_state"),
                   payload.get("train_state"), path)
