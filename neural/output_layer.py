"""The training path of the softmax output layer: log p(y | s) = (G s)_y + b_y − log Σ_w exp((G s)_w + b_w).

Autograd on the plain form, where the CPU vocabulary runs in cache-sized blocks, gave every
block's slice of G_l its own full-size zero-filled gradient in backward and stored each block's
logits and log-sum-exp for the generic logsumexp backward: at paper sizes those fills and the
adds that merged them took a fifth of a training step. This function computes the same values
and gradients (checked against autograd in float64) with one pass over the vocabulary each way:

* forward, per vocabulary block: the logits by one matmul, then exp(logits − the block's row
  maximum) in place, kept for backward with the block maxima; log Σ combines the blocks exactly;
* backward, per block: −g · softmax is the kept block times exp(max − log Σ) · (−g) per row,
  then two matmuls for the gradients of G_r s and of the block of G_l, written straight into
  the one gradient buffer; the picked logit's part (+g at each target word) is a gather and two
  index_adds.

Keeping exp(logits − max) ([positions, V], 18 MB for a 64-pair paper minibatch) instead of
recomputing it in backward saves a matmul and an exp pass per block: measured on this machine
(1 thread, ``benchmarks/train_speed.py``) 11% faster training at SCALE=small's sizes and 1–2%
at the paper's. On a GPU one block spans the whole vocabulary. Under autocast the matmuls run
in the autocast dtype, as the plain form's would, while the exp, the log-sum-exp and the
gradients stay in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neural.device import matmul_dtype, no_autocast
from neural.weight_copies import matmul_weight

# Vocabulary columns per block on CPU; a [P, block] block of logits for a 64-pair minibatch (a few
# hundred target positions) stays in L2 between its matmul, its maximum and its exp.
CPU_TRAIN_BLOCK_VOCAB = 1024


class _TargetLogProbs(torch.autograd.Function):
    """log softmax(W low + b)[targets] per row, blocked over the vocabulary (module doc)."""

    @staticmethod
    def forward(ctx, low: Tensor, weight: Tensor, bias: Tensor, targets: Tensor, block: int) -> Tensor:
        score_dtype = torch.promote_types(weight.dtype, torch.float32)
        mm_dtype = matmul_dtype(low.device, weight.dtype)
        with no_autocast(low.device):
            low_mm, weight_mm = low.to(mm_dtype), matmul_weight(weight, mm_dtype)
            rows, vocab = low.shape[0], weight.shape[0]
            blocks = range(0, vocab, block)
            # exp(logits − the block's row maximum) of every block, each block contiguous ([rows,
            # width] at offset rows · j), kept for backward; with the maxima and the row sums.
            kept = low.new_empty(rows * vocab, dtype=score_dtype)
            block_max = low.new_empty(len(blocks), rows, dtype=score_dtype)
            sums = torch.empty_like(block_max)
            for k, j in enumerate(blocks):
                w = weight_mm[j : j + block]
                logits = kept[rows * j : rows * (j + w.shape[0])].view(rows, w.shape[0])
                if mm_dtype == score_dtype:
                    torch.addmm(bias[j : j + block], low_mm, w.t(), out=logits)
                else:
                    # Widened, then the bias added in one dtype: a bf16 + fp32 add converts per element
                    # (1.5× the time of this copy and add, same values).
                    logits.copy_(torch.mm(low_mm, w.t())).add_(bias[j : j + block])
                torch.amax(logits, dim=1, out=block_max[k])
                torch.sum(logits.sub_(block_max[k].unsqueeze(1)).exp_(), dim=1, out=sums[k])
            overall = block_max.amax(dim=0)
            log_norm = (sums * torch.exp(block_max - overall)).sum(dim=0).log_().add_(overall)
            picked = (low_mm.to(score_dtype) * weight_mm[targets].to(score_dtype)).sum(-1)
            picked += bias[targets].to(score_dtype)
        # The operands as cast for the matmuls (the weight once per update), so backward casts nothing again.
        ctx.save_for_backward(low_mm, weight_mm, targets, kept, torch.exp(block_max - log_norm))
        ctx.block, ctx.mm_dtype, ctx.dtypes = block, mm_dtype, (low.dtype, weight.dtype)
        return picked - log_norm

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        low_mm, weight_mm, targets, kept, scale = ctx.saved_tensors
        block, mm_dtype, (low_dtype, weight_dtype) = ctx.block, ctx.mm_dtype, ctx.dtypes
        score_dtype, rows = kept.dtype, low_mm.shape[0]
        with no_autocast(low_mm.device):
            grad = grad.to(score_dtype)
            grad_low = torch.zeros(low_mm.shape, dtype=score_dtype, device=low_mm.device)
            grad_weight = torch.empty(weight_mm.shape, dtype=score_dtype, device=low_mm.device)
            grad_bias = torch.empty(weight_mm.shape[0], dtype=score_dtype, device=low_mm.device)
            buffer = kept.new_empty(rows * min(block, weight_mm.shape[0]))
            for k, j in enumerate(range(0, weight_mm.shape[0], block)):
                w = weight_mm[j : j + block]
                width = w.shape[0]
                # −g · softmax = −g · exp(logits − m_k) · exp(m_k − log Σ), from what forward kept
                # (not in place: a second backward through a retained graph must find it intact).
                neg_p = torch.mul(kept[rows * j : rows * (j + width)].view(rows, width),
                                  (scale[k] * -grad).unsqueeze(1), out=buffer[: rows * width].view(rows, width))
                if mm_dtype == score_dtype:
                    grad_low.addmm_(neg_p, w)
                    torch.mm(neg_p.t(), low_mm, out=grad_weight[j : j + width])
                else:
                    neg_p_mm = neg_p.to(mm_dtype)
                    # Widened before it is added: a bf16 + fp32 add converts per element inside the add.
                    grad_low += torch.mm(neg_p_mm, w).to(score_dtype)
                    grad_weight[j : j + width] = torch.mm(neg_p_mm.t(), low_mm)
                torch.sum(neg_p, dim=0, out=grad_bias[j : j + block])
            # The picked logit's part: +g at each row's target word.
            grad_low += grad.unsqueeze(1) * weight_mm[targets].to(score_dtype)
            grad_weight.index_add_(0, targets, grad.unsqueeze(1) * low_mm.to(score_dtype))
            grad_bias.index_add_(0, targets, grad)
        return grad_low.to(low_dtype), grad_weight.to(weight_dtype), grad_bias.to(weight_dtype), None, None


def target_log_probs(low: Tensor, weight: Tensor, bias: Tensor, targets: Tensor, block: int | None = None) -> Tensor:
    """log softmax(weight @ low_i + bias)[targets_i] for each row i of ``low`` ([P, r] → [P]).

    ``weight`` is G_l ([V, r]), ``bias`` its bias ([V]), ``low`` = G_r s. Differentiable in
    ``low``, ``weight`` and ``bias``; ``block`` vocabulary columns per block (default: the CPU
    block size on CPU, the whole vocabulary elsewhere).
    """
    if block is None:
        block = CPU_TRAIN_BLOCK_VOCAB if low.device.type == "cpu" else weight.shape[0]
    return _TargetLogProbs.apply(low, weight, bias, targets, max(1, int(block)))
