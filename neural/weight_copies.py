"""Low-precision copies of the weights for the matmuls of an update, written by the optimiser.

Under bf16 training every matmul weight is cast from its fp32 master to bf16 once per update: a
pass that reads the whole weight (12 MB for a paper-size recurrent matrix) just after the
optimiser wrote it. Here the hand-written training Functions ask :func:`matmul_weight` for a
weight's copy; the first time it is cast and kept, and from then on the optimiser
(:mod:`neural.adadelta`) rewrites the kept copy in the same pass that updates the weight, while
the weight is still in cache. A copy is used only while the weight's version counter is the one
recorded when the copy was written: any other in-place change of the weight (a checkpoint loaded,
an optimiser that does not write copies) makes the next call cast again, so a stale copy is never
read.

CPU only: a CUDA graph's replay changes weights without bumping their version counters, so on
other devices :func:`matmul_weight` always casts.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.weak import WeakTensorKeyDictionary

_COPIES = WeakTensorKeyDictionary()  # weight -> [copy, the weight's version the copy was written at]


def matmul_weight(weight: Tensor, dtype: torch.dtype) -> Tensor:
    """``weight`` in ``dtype`` (not differentiable): the kept copy where it is current, else a new cast, kept."""
    if weight.dtype == dtype:
        return weight
    if weight.device.type != "cpu" or not weight.requires_grad:
        return weight.detach().to(dtype)
    entry = _COPIES.get(weight)
    if entry is not None and entry[0].dtype == dtype and entry[1] == weight._version:
        return entry[0]
    copy = weight.detach().to(dtype)
    _COPIES[weight] = [copy, weight._version]
    return copy


def kept_copy(weight: Tensor) -> Tensor | None:
    """The copy :func:`matmul_weight` keeps of ``weight`` (None: none), for an optimiser to rewrite
    in place after updating ``weight``, and then to call :func:`mark_current`."""
    entry = _COPIES.get(weight)
    return None if entry is None else entry[0]


def mark_current(weight: Tensor) -> None:
    """The kept copy of ``weight`` now holds its present values."""
    _COPIES[weight][1] = weight._version
