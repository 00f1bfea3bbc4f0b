"""Layers both networks build.
"""

from __future__ import annotations

import torch
from torch import nn


def embedding_layer(rows: int, dim: int, device: torch.device | str | None) -> nn.Embedding:
    """An embedding table; on the meta device without its init, whose ``normal_`` has only a Python meta
    kernel there, and that imports torch._dynamo (2.5 s) for a table a checkpoint then replaces."""
    if device is not None and torch.device(device).type == "meta":
        return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim, device=device))
    return nn.Embedding(rows, dim, device=device)
