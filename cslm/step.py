"""One CSLM training update, eager, with static shapes, or captured as a CUDA graph (``--train-step``).

The same three ways as the RNN's (``rescorer.training.step``), for the same reason: an update of
a 128-n-gram minibatch is a few dozen kernels plus Adam's, short enough on a GPU that launching
them costs more than running them.

* ``eager``: the minibatch as drawn (the last of an epoch may be smaller).
* ``static``: every minibatch filled up to the batch size with empty n-grams (target −1, which
  the cross-entropy ignores and the (log Z)² penalty masks), gradients in persistent buffers.
* ``captured``: ``static`` with the update captured once as a CUDA graph and replayed
  (``neural.cuda_graphs``, which checks the graph against its eager update first). Adam
  only: SGD's learning rate changes at every update, and a graph would keep the first.
* ``auto``: ``captured`` on CUDA with Adam, else ``eager``.

An update returns [loss, mean cross-entropy, mean (log Z)²] as one device tensor (0 for the last
without self-normalisation), so that the caller's running sums never wait for the device.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from cslm.model import CSLM
from infrastructure.errors import UserError
from neural.config import TRAIN_STEPS
from neural.cuda_graphs import CudaGraphs, GraphedUpdates, optimizer_tensors, persistent_grads, set_capturable
from neural.device import autocast

CSLMStep = Callable[[Tensor, Tensor], Tensor]
IGNORED = -1  # the target of an empty n-gram in a static minibatch


def resolve_cslm_step(mode: str, device: torch.device, optimizer: str) -> str:
    """What ``mode`` (one of ``TRAIN_STEPS``) means for a CSLM run; a clear error where it cannot run."""
    if mode not in TRAIN_STEPS:
        raise UserError(f"--train-step must be one of {', '.join(TRAIN_STEPS)}, got {mode!r}")
    if mode == "auto":
        return "captured" if device.type == "cuda" and optimizer == "adam" else "eager"
    if mode == "captured" and device.type != "cuda":
        raise UserError(f"--train-step captured needs a CUDA device (CUDA graphs), not {device}; "
                         "--train-step static runs the same static-shape step without them")
    if mode == "captured" and optimizer != "adam":
        raise UserError("--train-step captured needs --optimizer adam: SGD's learning rate changes at every "
                         "update, and a CUDA graph would keep the first")
    return mode


def cslm_update(model: CSLM, optimizer: torch.optim.Optimizer, hist: Tensor, tgt: Tensor, self_normalize: float,
                amp_dtype: torch.dtype | None, static: bool) -> Tensor:
    """One update on histories ``hist`` [B, order−1] and targets ``tgt`` [B] (−1: an empty n-gram).

    The loss is the mean cross-entropy over the real n-grams, plus ``self_normalize`` times their
    mean (log Z)² (Devlin et al. 2014: pulling each history's log Z towards 0 makes the raw score
    the decoder adds without normalising a log-probability). ``static``: gradients are zeroed in
    place (persistent buffers, as a CUDA graph needs), else dropped.
    """
    if static:
        torch._foreach_zero_([p.grad for p in model.parameters()])
    else:
        optimizer.zero_grad(set_to_none=True)
    with autocast(hist.device, amp_dtype, cache=not static):
        logits = model(hist).float()
    cross_entropy = F.cross_entropy(logits, tgt, ignore_index=IGNORED)
    loss, log_z_squared = cross_entropy, torch.zeros((), device=hist.device)
    if self_normalize:
        real = tgt != IGNORED
        log_z = torch.logsumexp(logits, dim=-1)
        log_z_squared = torch.where(real, log_z * log_z, 0.0).sum() / real.sum()
        loss = loss + self_normalize * log_z_squared
    loss.backward()
    optimizer.step()
    return torch.stack([loss, cross_entropy, log_z_squared]).detach()


class _EagerStep:
    def __init__(self, model: CSLM, optimizer: torch.optim.Optimizer, self_normalize: float, device: torch.device,
                 amp_dtype: torch.dtype | None) -> None:
        self.model, self.optimizer, self.self_normalize = model, optimizer, self_normalize
        self.device, self.amp_dtype = device, amp_dtype
        set_capturable(optimizer, False)

    def __call__(self, hist: Tensor, tgt: Tensor) -> Tensor:
        return cslm_update(self.model, self.optimizer, hist.to(self.device), tgt.to(self.device), self.self_normalize,
                           self.amp_dtype, static=False)


class _StaticStep(_EagerStep):
    def __init__(self, model: CSLM, optimizer: torch.optim.Optimizer, self_normalize: float, device: torch.device,
                 amp_dtype: torch.dtype | None, batch_size: int, graphs: CudaGraphs | None) -> None:
        super().__init__(model, optimizer, self_normalize, device, amp_dtype)
        self.batch_size = batch_size
        persistent_grads(model.parameters())
        set_capturable(optimizer, graphs is not None and device.type == "cuda")  # (CPU: tests' stand-in graphs)
        self.graphs = None if graphs is None else GraphedUpdates(self.update, lambda: optimizer_tensors(optimizer),
                                                                 graphs)

    def __call__(self, hist: Tensor, tgt: Tensor) -> Tensor:
        rows = hist.shape[0]
        if not 0 < rows <= self.batch_size:
            raise ValueError(f"a static step takes 1 to {self.batch_size} n-grams, got {rows}")
        packed = torch.zeros(self.batch_size, hist.shape[1] + 1, dtype=torch.int64)
        packed[:rows, :-1] = hist
        packed[:rows, -1] = tgt
        packed[rows:, -1] = IGNORED
        if self.graphs is not None:
            return self.graphs("ngrams", packed)
        return self.update(packed.to(self.device), "ngrams")

    def update(self, inputs: Tensor, key: str) -> Tensor:
        """The update from the packed minibatch on the device: what the CUDA graph captures."""
        return cslm_update(self.model, self.optimizer, inputs[:, :-1], inputs[:, -1], self.self_normalize,
                           self.amp_dtype, static=True)


def make_cslm_step(mode: str, model: CSLM, optimizer: torch.optim.Optimizer, *, self_normalize: float,
                   batch_size: int, optimizer_name: str, device: torch.device, amp_dtype: torch.dtype | None,
                   graphs: CudaGraphs | None = None) -> CSLMStep:
    """The update callable ``(hist, tgt) -> [loss, cross-entropy, (log Z)²]`` for ``mode``.

    ``graphs`` stands in for a :class:`CudaGraphs` of ``device`` (tests replay without a GPU).
    """
    mode = resolve_cslm_step(mode, device, optimizer_name) if graphs is None else "captured"
    if mode == "eager":
        return _EagerStep(model, optimizer, self_normalize, device, amp_dtype)
    if mode == "captured" and graphs is None:
        graphs = CudaGraphs(device)
    return _StaticStep(model, optimizer, self_normalize, device, amp_dtype, batch_size,
                       graphs if mode == "captured" else None)
