"""The training path of the softmax output layer: log p(y | s) = (G s)_y + b_y − log Σ_w exp((G s)_w + b_w).

Autograd on the plain form stores the [positions, V] logits (15,001 columns at the paper's
shortlist), and on CPU, where the vocabulary runs in cache-sized blocks, every block's slice of
G_l gets a full-size zero-filled gradient in backward: at paper sizes those fills and the adds
that merge them took a fifth of a training step. This function computes exactly the same values
and gradients, blockwise and in two passes with nothing [positions, V] kept between them:

* forward: per vocabulary block, the logits by one matmul, folded into a running log-sum-exp;
* backward: per block, the logits again by one matmul (recomputed rather than stored), then
  p = softmax · g in place and two matmuls for the gradients of G_r s and of the block of G_l,
  written straight into the one gradient buffer; the −g at each target word (the picked logit's
  part) is a gather and two index_adds.

The recomputation costs one more [P, r] × [r, V] matmul per step (4 instead of 3 for this layer)
and saves every pass over stored logits. On a GPU one block spans the whole vocabulary.
Under autocast the matmuls run in the autocast dtype, as the plain form's would, while the
log-sum-exp, the softmax and the results stay in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Vocabulary columns per block on CPU: a [P, block] buffer of logits for a 64-pair minibatch
# (a few hundred target positions) stays in L2 through the matmul, the exp and the two gradient
# matmuls that read it.
CPU_TRAIN_BLOCK_VOCAB = 1024


def _matmul_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype the plain form's matmuls would run in: the autocast dtype when autocast is on."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


class _TargetLogProbs(torch.autograd.Function):
    """log softmax(W low + b)[targets] per row, blocked over the vocabulary (module doc)."""

    @staticmethod
    def forward(ctx, low: Tensor, weight: Tensor, bias: Tensor, targets: Tensor, block: int) -> Tensor:  # noqa: ANN001
        score_dtype = torch.promote_types(weight.dtype, torch.float32)
        mm_dtype = _matmul_dtype(low.device, weight.dtype)
        with torch.autocast(low.device.type, enabled=False):
            low_mm, weight_mm = low.to(mm_dtype), weight.to(mm_dtype)
            vocab = weight.shape[0]
            running_max = torch.full((low.shape[0],), -torch.inf, dtype=score_dtype, device=low.device)
            running_sum = torch.zeros(low.shape[0], dtype=score_dtype, device=low.device)
            for j in range(0, vocab, block):
                logits = torch.mm(low_mm, weight_mm[j : j + block].t()).to(score_dtype).add_(bias[j : j + block])
                block_max = logits.amax(dim=1)
                new_max = torch.maximum(running_max, block_max)
                running_sum.mul_(torch.exp(running_max - new_max))
                running_sum += logits.sub_(new_max.unsqueeze(1)).exp_().sum(dim=1)
                running_max = new_max
            log_norm = running_sum.log_().add_(running_max)
            picked = (low_mm.to(score_dtype) * weight_mm[targets].to(score_dtype)).sum(-1)
            picked += bias[targets].to(score_dtype)
        ctx.save_for_backward(low, weight, bias, targets, log_norm)
        ctx.block, ctx.mm_dtype = block, mm_dtype
        return picked - log_norm

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        low, weight, bias, targets, log_norm = ctx.saved_tensors
        block, mm_dtype = ctx.block, ctx.mm_dtype
        score_dtype = log_norm.dtype
        with torch.autocast(low.device.type, enabled=False):
            grad = grad.to(score_dtype)
            low_mm, weight_mm = low.to(mm_dtype), weight.to(mm_dtype)
            grad_low = torch.zeros(low.shape, dtype=score_dtype, device=low.device)
            grad_weight = torch.empty(weight.shape, dtype=score_dtype, device=low.device)
            grad_bias = torch.empty(bias.shape, dtype=score_dtype, device=low.device)
            for j in range(0, weight.shape[0], block):
                w = weight_mm[j : j + block]
                # ∂(−g·log Σ exp(logits))/∂logits = −g·softmax, recomputed from the logits.
                neg_p = torch.mm(low_mm, w.t()).to(score_dtype).add_(bias[j : j + block])
                neg_p.sub_(log_norm.unsqueeze(1)).exp_().mul_(-grad.unsqueeze(1))
                neg_p_mm = neg_p.to(mm_dtype)
                grad_low += torch.mm(neg_p_mm, w)
                grad_weight[j : j + block] = torch.mm(neg_p_mm.t(), low_mm)
                torch.sum(neg_p, dim=0, out=grad_bias[j : j + block])
            # The picked logit's part: +g at each row's target word.
            grad_low += grad.unsqueeze(1) * weight[targets].to(score_dtype)
            grad_weight.index_add_(0, targets, grad.unsqueeze(1) * low.to(score_dtype))
            grad_bias.index_add_(0, targets, grad)
        return grad_low.to(low.dtype), grad_weight.to(weight.dtype), grad_bias.to(bias.dtype), None, None


def target_log_probs(low: Tensor, weight: Tensor, bias: Tensor, targets: Tensor, block: int | None = None) -> Tensor:
    """log softmax(weight @ low_i + bias)[targets_i] for each row i of ``low`` ([P, r] → [P]).

    ``weight`` is G_l ([V, r]), ``bias`` its bias ([V]), ``low`` = G_r s. Differentiable in
    ``low``, ``weight`` and ``bias``; ``block`` vocabulary columns per block (default: the CPU
    block size on CPU, the whole vocabulary elsewhere).
    """
    if block is None:
        block = CPU_TRAIN_BLOCK_VOCAB if low.device.type == "cpu" else weight.shape[0]
    return _TargetLogProbs.apply(low, weight, bias, targets, max(1, int(block)))
