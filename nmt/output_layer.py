"""The output layer's training path: log p(y_i) = (V η_i + b)[y_i] − log Σ exp(V η_i + b), with a hand-written backward.

Autograd's cross-entropy keeps the log-softmax and, backwards, fills a zero tensor of the whole
``[rows, vocabulary]`` size for the picked units' gradient, then runs the log-softmax's backward and
copies it once more for the bias and weight products: three passes over the largest tensor of an
update. Here backward forms ∂logits = g ⊙ (onehot − softmax) in one buffer (exp of the kept
log-softmax, scaled in place, the picked units added) and uses it for the three products.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neural.device import matmul_dtype, no_autocast


class _PickedLogProbs(torch.autograd.Function):
    """log p of each row's target ``[rows]``, fp32 (the weights' dtype when wider)."""

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, bias: Tensor, targets: Tensor) -> Tensor:
        mm_dtype = matmul_dtype(features.device, weight.dtype)
        with no_autocast(features.device):
            logits = torch.addmm(bias.to(mm_dtype), features.to(mm_dtype), weight.to(mm_dtype).t())
            if logits.dtype in (torch.bfloat16, torch.float16):
                logits = logits.float()  # the softmax sums in fp32
            log_probs = torch.log_softmax(logits, dim=1)
        ctx.save_for_backward(features, weight, targets, log_probs)
        ctx.mm_dtype = mm_dtype
        return log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        features, weight, targets, log_probs = ctx.saved_tensors
        mm_dtype = ctx.mm_dtype
        with no_autocast(features.device):
            grad = grad.to(log_probs.dtype)
            grad_logits = torch.exp(log_probs).mul_(-grad.unsqueeze(1))
            grad_logits[torch.arange(len(targets), device=targets.device), targets] += grad
            grad_bias = grad_logits.sum(0).to(weight.dtype)
            grad_logits = grad_logits.to(mm_dtype)
            grad_features = torch.mm(grad_logits, weight.to(mm_dtype)).to(features.dtype)
            grad_weight = torch.mm(grad_logits.t(), features.to(mm_dtype)).to(weight.dtype)
        return grad_features, grad_weight, grad_bias, None


def picked_log_probs(features: Tensor, weight: Tensor, bias: Tensor, targets: Tensor) -> Tensor:
    """log softmax(features Wᵀ + b)[targets] of each row ``[rows]``: the output layer with its loss."""
    return _PickedLogProbs.apply(features, weight, bias, targets)
