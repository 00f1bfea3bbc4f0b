"""One training update on one minibatch, in the three ways ``--train-step`` names.

* ``eager``: the minibatch as drawn, through :meth:`RNNEncoderDecoder.forward`: the encoder
  steps only the rows still reading, the output layer covers only real positions. The least
  arithmetic, so the CPU's default. Where its matmuls run in bf16 or fp16 on the CPU, those row
  and position counts are rounded up to a small fixed set (``rescorer.model.block_sizes``), so that
  oneDNN, which builds a kernel for each new shape, stops meeting new ones after a few updates.
* ``static``: the same update with shapes that never change within a bucket: the minibatch is
  filled up to the fixed batch size with empty rows (length 0: no score, no gradient) and padded
  to its bucket's widths (:func:`bucket_width`), scored by
  :func:`rescorer.model.static_shape.static_log_likelihood`, which reads no value on the host; gradients
  stay in persistent buffers zeroed in place. Runs anywhere; on the CPU it does more arithmetic
  than ``eager`` (padding) for no gain, and it is what the tests compare with ``eager``.
* ``captured``: ``static`` with each bucket's whole update (zeroing, forward, hand-written
  backward, clipping, Adadelta in torch's capturable foreach form) captured once in a CUDA graph
  and replayed (:mod:`neural.cuda_graphs`, which checks each graph against the eager
  update first). CUDA only.
* ``auto``: ``captured`` on CUDA (but with fp16, which needs loss scaling: ``eager``), ``eager``
  elsewhere. On an H100 (torch 2.11, paper size, 64 pairs per update) the captured step trains 6.5×
  (bf16) and 5.5× (TF32) faster than eager, its losses within 2.5e-6 of eager's over 600 updates
  (results/gpu-h100/README.md, run 9; run 8's failed capture was the check's default-stream
  autograd history, :mod:`neural.cuda_graphs`).

All three give the same losses and models to about 1e-6 (float rounding of differently shaped
matmuls): ``tests/rescorer/training/test_step.py``. A step is a callable taking the host tensors
``(src, src_len, tgt, tgt_len)`` of :meth:`PairData.batch` and returning the loss on the device
(reading it is a host sync, which callers do rarely); ``benchmarks/train_speed.py`` times it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from infrastructure.errors import UserError
from neural.adadelta import ChunkedAdadelta
from neural.config import TRAIN_STEPS
from neural.cuda_graphs import CudaGraphs, GraphedUpdates, optimizer_tensors, persistent_grads, set_capturable
from neural.device import autocast
from rescorer.model.config import TrainConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.static_shape import static_log_likelihood

Batch = tuple[Tensor, Tensor, Tensor, Tensor]
TrainStep = Callable[[Batch], Tensor]


def resolve_train_step(mode: str, device: torch.device, amp_dtype: torch.dtype | None) -> str:
    """The step ``mode`` (one of :data:`TRAIN_STEPS`) means on ``device``; a clear error where it cannot run."""
    if mode not in TRAIN_STEPS:
        raise UserError(f"--train-step must be one of {', '.join(TRAIN_STEPS)}, got {mode!r}")
    if mode == "auto":
        return "captured" if device.type == "cuda" and amp_dtype != torch.float16 else "eager"
    if mode == "captured" and device.type != "cuda":
        raise UserError(f"--train-step captured needs a CUDA device (CUDA graphs), not {device}; "
                         "--train-step static runs the same static-shape step without them")
    if mode != "eager" and amp_dtype == torch.float16:
        raise UserError(f"--train-step {mode} does not scale losses, which fp16 needs: use --precision bf16, "
                         "or --train-step eager")
    return mode


def bucket_width(width: int) -> int:
    """The padded width of a bucket: exact up to 8 (phrase tables' phrases rarely pass 7 words,
    plus ``</s>``), then a multiple of 8, so that a table of long phrases makes a few dozen
    shapes (CUDA graphs), not hundreds."""
    return width if width <= 8 else -(-width // 8) * 8


def train_step(
    model: RNNEncoderDecoder,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    batch: Batch,
    clip_norm: float | None,
    amp_dtype: torch.dtype | None,
) -> Tensor:
    """The eager update: −mean log p(Y|X), backward, gradient clipping, Adadelta.

    ``src``/``tgt`` on the model's device, the lengths on the host (the model's checks and row
    counts then read them without a GPU sync).
    """
    src, src_len, tgt, tgt_len = batch
    with autocast(src.device, amp_dtype):
        loss = -model(src, src_len, tgt, tgt_len).float().mean()
    optimizer.zero_grad(set_to_none=True)
    if not scaler.is_enabled():
        loss.backward()
        clip_and_step(optimizer, model.parameters(), clip_norm)
        return loss.detach()
    scaler.scale(loss).backward()
    if clip_norm is not None:  # None: no clipping, as TrainConfig documents
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def clip_and_step(optimizer: torch.optim.Optimizer, params: Iterable[Tensor], clip_norm: float | None) -> None:
    """Gradient-norm clipping (None: none) and the optimiser's step: in one pass over the gradients
    for :class:`ChunkedAdadelta` (the same values as ``clip_grad_norm_`` and a step)."""
    if isinstance(optimizer, ChunkedAdadelta):
        optimizer.step(max_grad_norm=clip_norm)
        return
    if clip_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
    optimizer.step()


class EagerStep:
    """``--train-step eager`` as a step callable (module doc)."""

    def __init__(self, model: RNNEncoderDecoder, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                 device: torch.device, amp_dtype: torch.dtype | None) -> None:
        self.model, self.optimizer, self.cfg, self.device, self.amp_dtype = model, optimizer, cfg, device, amp_dtype
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
        set_capturable(optimizer, False)

    def __call__(self, batch: Batch) -> Tensor:
        src, src_len, tgt, tgt_len = batch
        on_device = (src.to(self.device), src_len, tgt.to(self.device), tgt_len)
        return train_step(self.model, self.optimizer, self.scaler, on_device, self.cfg.clip_norm, self.amp_dtype)


class StaticStep:
    """``--train-step static``, and given ``graphs`` (:class:`CudaGraphs`) ``captured`` (module doc)."""

    def __init__(self, model: RNNEncoderDecoder, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                 device: torch.device, amp_dtype: torch.dtype | None, graphs: CudaGraphs | None = None) -> None:
        self.model, self.optimizer, self.device, self.amp_dtype = model, optimizer, device, amp_dtype
        self.batch_size, self.clip_norm = cfg.batch_size, cfg.clip_norm
        self.params = list(model.parameters())
        self.grads = persistent_grads(self.params)
        set_capturable(optimizer, graphs is not None and device.type == "cuda")  # (CPU: tests' stand-in graphs)
        self.graphs = None if graphs is None else GraphedUpdates(self.update, lambda: optimizer_tensors(optimizer),
                                                                 graphs)

    def __call__(self, batch: Batch) -> Tensor:
        packed, key = self.pack(batch)
        if self.graphs is not None:
            return self.graphs(key, packed)
        return self.update(packed.to(self.device), key)

    def pack(self, batch: Batch) -> tuple[Tensor, tuple[int, int]]:
        """The minibatch as one host tensor [batch size, N + T + 2] (src, src_len, tgt, tgt_len) and
        its bucket (N, T); rows past the minibatch's are empty (ids </s>, lengths 0)."""
        src, src_len, tgt, tgt_len = (t.cpu() for t in batch)
        rows = src.shape[0]
        if not 0 < rows <= self.batch_size:
            raise ValueError(f"a static step takes 1 to {self.batch_size} pairs, got {rows}")
        for ids, lengths, what in ((src, src_len, "src"), (tgt, tgt_len, "tgt")):
            if int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]:
                raise ValueError(f"{what}_len must be in [1, {ids.shape[1]}] (it counts the </s>)")
        n, t = bucket_width(src.shape[1]), bucket_width(tgt.shape[1])
        packed = torch.zeros(self.batch_size, n + t + 2, dtype=torch.int64)
        packed[:rows, : src.shape[1]] = src
        packed[:rows, n] = src_len
        packed[:rows, n + 1 : n + 1 + tgt.shape[1]] = tgt
        packed[:rows, n + t + 1] = tgt_len
        return packed, (n, t)

    def update(self, inputs: Tensor, key: tuple[int, int]) -> Tensor:
        """One update from the packed batch on the device: what a CUDA graph captures (no host reads)."""
        n, t = key
        src, src_len = inputs[:, :n], inputs[:, n]
        tgt, tgt_len = inputs[:, n + 1 : n + 1 + t], inputs[:, n + t + 1]
        torch._foreach_zero_(self.grads)
        with autocast(self.device, self.amp_dtype, cache=False):
            log_likelihood = static_log_likelihood(self.model, src, src_len, tgt, tgt_len)
        loss = -log_likelihood.float().sum() / (tgt_len > 0).sum()  # the mean over the real pairs
        loss.backward()
        clip_and_step(self.optimizer, self.params, self.clip_norm)
        return loss.detach()


def make_train_step(mode: str, model: RNNEncoderDecoder, optimizer: torch.optim.Optimizer, cfg: TrainConfig,
                    device: torch.device, amp_dtype: torch.dtype | None) -> TrainStep:
    """The step callable for ``mode`` (resolved first with :func:`resolve_train_step`)."""
    mode = resolve_train_step(mode, device, amp_dtype)
    if mode == "eager":
        return EagerStep(model, optimizer, cfg, device, amp_dtype)
    return StaticStep(model, optimizer, cfg, device, amp_dtype, CudaGraphs(device) if mode == "captured" else None)
