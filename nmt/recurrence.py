"""The training path of the model's recurrences, with a hand-written backward through time.

Under autograd each time step is some thirty graph nodes, and each recurrent weight's gradient
arrives as one small ``[B, ·]ᵀ × [B, ·]`` matmul per step (64 rows for a batch: a fraction of a large
matmul's speed on a CPU), each added into the running sum. Here forward keeps what backward needs
(the state entering each step, the gates, candidates, attention weights and tanh values), backward
runs the recurrence in reverse with only the products that carry the gradient back through time,
and each weight's gradient is then ONE matmul over all steps: ``cat(inputs)ᵀ @ cat(output grads)``.

The equations are those of :class:`nmt.model.GRUWeights` and :meth:`nmt.model.AttentionNMT.attend`
(``tests/nmt/test_model.py`` finds the gradients equal to plain autograd's and to finite
differences). States, gates and softmaxes are in the weights' dtype; under autocast the matmuls
run in the autocast dtype, each weight cast once per update, as :mod:`neural.device` describes.

Layouts are time-major (``[T, B, ·]``), so that each step's slice is contiguous.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neural.device import matmul_dtype, no_autocast


def _mm(a: Tensor, b: Tensor, dtype: torch.dtype) -> Tensor:
    """``a @ b`` in ``dtype``, the result in ``a``'s dtype."""
    return torch.matmul(a.to(dtype), b.to(dtype)).to(a.dtype)


def _gru_backward(grad_h: Tensor, h_prev: Tensor, gates: Tensor, candidate: Tensor, gate_weight: Tensor,
                  cand_weight: Tensor, grad_pre: Tensor, mm_dtype: torch.dtype, keep: Tensor | None = None) -> Tensor:
    """One GRU step backwards: fills ``grad_pre`` = ∂[gate pre-activations (r, z) ; candidate
    pre-activation] and returns ∂h_{t−1}. ``keep`` (0/1) marks the rows whose state the step changed
    (a padded position passes its state through). Weights as stored (``[out, in]``, batched over a
    leading direction axis for the encoder)."""
    H = h_prev.shape[-1]
    r, z = gates[..., :H], gates[..., H:]
    grad_new = grad_h if keep is None else grad_h * keep
    grad_cand_pre = grad_pre[..., 2 * H :]
    torch.mul(grad_new * z, 1 - candidate * candidate, out=grad_cand_pre)
    grad_z = grad_new * (candidate - h_prev)
    grad_prev = grad_h - grad_new * z  # (1 − z) through the kept rows, all of it through the others
    grad_reset_h = _mm(grad_cand_pre, cand_weight, mm_dtype)
    grad_prev += grad_reset_h * r
    torch.mul(grad_reset_h * h_prev, r * (1 - r), out=grad_pre[..., :H])
    torch.mul(grad_z, z * (1 - z), out=grad_pre[..., H : 2 * H])
    grad_prev += _mm(grad_pre[..., : 2 * H], gate_weight, mm_dtype)
    return grad_prev


def _weight_grad(grad_out: Tensor, inputs: Tensor, dtype: torch.dtype) -> Tensor:
    """Σ over all steps and rows of grad_outᵀ inputs, as one matmul (a leading direction axis kept)."""
    if grad_out.dim() == 4:  # [T, D, B, ·]: one matrix per direction
        g = grad_out.transpose(0, 1).flatten(1, 2)
        x = inputs.transpose(0, 1).flatten(1, 2)
        return torch.bmm(g.transpose(1, 2).to(dtype), x.to(dtype))
    return torch.mm(grad_out.flatten(0, -2).t().to(dtype), inputs.flatten(0, -2).to(dtype))


class _EncoderRecurrence(torch.autograd.Function):
    """Both encoder directions at once, as a batch of two: states ``[J, 2, B, H]`` from the input
    maps ``[J, 2, B, 3H]`` (direction 1 in its own, reversed, order) and ``keep`` ``[J, 2, B, 1]``."""

    @staticmethod
    def forward(ctx, projected: Tensor, keep: Tensor, gate_weights: Tensor, cand_weights: Tensor) -> Tensor:
        steps, dirs, rows, three_h = projected.shape
        H = three_h // 3
        dtype = gate_weights.dtype
        mm_dtype = matmul_dtype(projected.device, dtype)
        with no_autocast(projected.device):
            gate_t = gate_weights.to(mm_dtype).transpose(1, 2)
            cand_t = cand_weights.to(mm_dtype).transpose(1, 2)
            projected = projected.to(dtype)
            keep = keep.to(dtype)
            states = projected.new_empty(steps, dirs, rows, H)
            gates = projected.new_empty(steps, dirs, rows, 2 * H)
            candidates = torch.empty_like(states)
            reset_h = torch.empty_like(states)
            h = projected.new_zeros(dirs, rows, H)
            for t in range(steps):
                torch.sigmoid(projected[t, :, :, : 2 * H] + _mm(h, gate_t, mm_dtype), out=gates[t])
                torch.mul(gates[t, :, :, :H], h, out=reset_h[t])
                torch.tanh(projected[t, :, :, 2 * H :] + _mm(reset_h[t], cand_t, mm_dtype), out=candidates[t])
                # h + keep ⊙ z ⊙ (h̃ − h): a padded position keeps its state
                torch.addcmul(h, keep[t] * gates[t, :, :, H:], candidates[t] - h, out=states[t])
                h = states[t]
        ctx.save_for_backward(keep, gate_weights, cand_weights, states, gates, candidates, reset_h)
        ctx.mm_dtype, ctx.projected_dtype = mm_dtype, projected.dtype
        return states

    @staticmethod
    def backward(ctx, grad_states: Tensor) -> tuple[Tensor | None, ...]:
        keep, gate_weights, cand_weights, states, gates, candidates, reset_h = ctx.saved_tensors
        mm_dtype = ctx.mm_dtype
        steps, dirs, rows, H = states.shape
        with no_autocast(states.device):
            gate_mm, cand_mm = gate_weights.to(mm_dtype), cand_weights.to(mm_dtype)
            grad_states = grad_states.to(states.dtype)
            grad_pre = states.new_empty(steps, dirs, rows, 3 * H)
            h_prev = torch.cat([states.new_zeros(1, dirs, rows, H), states[:-1]])
            grad_h = torch.zeros_like(states[0])
            for t in reversed(range(steps)):
                grad_h = grad_h + grad_states[t]
                grad_h = _gru_backward(grad_h, h_prev[t], gates[t], candidates[t], gate_mm, cand_mm, grad_pre[t],
                                       mm_dtype, keep[t])
            grad_gate_w = _weight_grad(grad_pre[..., : 2 * H], h_prev, mm_dtype).to(gate_weights.dtype)
            grad_cand_w = _weight_grad(grad_pre[..., 2 * H :], reset_h, mm_dtype).to(cand_weights.dtype)
        return grad_pre.to(ctx.projected_dtype), None, grad_gate_w, grad_cand_w


class _DecoderRecurrence(torch.autograd.Function):
    """The decoder with its attention: states ``[I, B, H]``, contexts ``[I, B, 2H]`` and attention
    weights ``[I, B, J]`` (not differentiable) from the embeddings' share of the input map
    ``[I, B, 3H]`` (bias included), s_0, the keys U_a h_j, the annotations and the source mask."""

    @staticmethod
    def forward(ctx, emb_projected: Tensor, first: Tensor, keys: Tensor, annotations: Tensor, src_mask: Tensor,
                state_weight: Tensor, v: Tensor, context_weight: Tensor, gate_weight: Tensor,
                cand_weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        steps, rows, three_h = emb_projected.shape
        H, J = three_h // 3, keys.shape[1]
        dtype = gate_weight.dtype
        device = emb_projected.device
        mm_dtype = matmul_dtype(device, dtype)
        with no_autocast(device):
            # tanh(a) = 2σ(2a) − 1, and a softmax ignores the constant −Σv it adds to each score:
            # the scores are σ(2 keys + 2 W_a s)·2v, a sigmoid being a quarter of a tanh's cost here.
            state_t = (2 * state_weight).to(mm_dtype).t()
            keys = 2 * keys
            context_t = context_weight.to(mm_dtype).t()
            gate_t, cand_t = gate_weight.to(mm_dtype).t(), cand_weight.to(mm_dtype).t()
            v_vec = 2 * v.reshape(-1).to(dtype)
            emb_projected, keys, annotations = emb_projected.to(dtype), keys.to(dtype), annotations.to(dtype)
            padding = ~src_mask
            states = emb_projected.new_empty(steps, rows, H)
            contexts = emb_projected.new_empty(steps, rows, annotations.shape[2])
            alphas = emb_projected.new_empty(steps, rows, J)
            halves = emb_projected.new_empty(steps, rows, J, keys.shape[2])  # σ(2a) = (tanh(a) + 1) / 2
            gates = emb_projected.new_empty(steps, rows, 2 * H)
            candidates = torch.empty_like(states)
            reset_h = torch.empty_like(states)
            s = first.to(dtype)
            for i in range(steps):
                torch.add(keys, _mm(s, state_t, mm_dtype).unsqueeze(1), out=halves[i]).sigmoid_()
                scores = torch.matmul(halves[i], v_vec).masked_fill_(padding, float("-inf"))
                alphas[i] = torch.softmax(scores, dim=-1)
                contexts[i] = torch.bmm(alphas[i].unsqueeze(1), annotations).squeeze(1)
                pre = emb_projected[i] + _mm(contexts[i], context_t, mm_dtype)
                torch.sigmoid(pre[:, : 2 * H] + _mm(s, gate_t, mm_dtype), out=gates[i])
                torch.mul(gates[i, :, :H], s, out=reset_h[i])
                torch.tanh(pre[:, 2 * H :] + _mm(reset_h[i], cand_t, mm_dtype), out=candidates[i])
                torch.lerp(s, candidates[i], gates[i, :, H:], out=states[i])
                s = states[i]
        ctx.save_for_backward(first, annotations, state_weight, v, context_weight, gate_weight, cand_weight,
                              states, contexts, alphas, halves, gates, candidates, reset_h)
        ctx.mm_dtype = mm_dtype
        ctx.dtypes = (emb_projected.dtype, first.dtype, keys.dtype, annotations.dtype)
        ctx.mark_non_differentiable(alphas)
        return states, contexts, alphas

    @staticmethod
    def backward(ctx, grad_states: Tensor, grad_contexts: Tensor, _grad_alphas: Tensor) -> tuple[Tensor | None, ...]:
        (first, annotations, state_weight, v, context_weight, gate_weight, cand_weight,
         states, contexts, alphas, halves, gates, candidates, reset_h) = ctx.saved_tensors
        mm_dtype = ctx.mm_dtype
        steps, rows, H = states.shape
        dtype = states.dtype
        with no_autocast(states.device):
            state_mm, context_mm = state_weight.to(mm_dtype), context_weight.to(mm_dtype)
            gate_mm, cand_mm = gate_weight.to(mm_dtype), cand_weight.to(mm_dtype)
            v_vec = 4 * v.reshape(-1).to(dtype)  # tanh'(a) = 1 − tanh(a)² = 4σ(2a)(1 − σ(2a))
            grad_states, grad_contexts = grad_states.to(dtype), grad_contexts.to(dtype)
            s_prev = torch.cat([first.to(dtype).unsqueeze(0), states[:-1]])
            grad_pre = states.new_empty(steps, rows, 3 * H)  # ∂ of the input map's output, every step
            grad_ctx = torch.empty_like(contexts)
            grad_scores = torch.empty_like(alphas)
            grad_query = states.new_empty(steps, rows, halves.shape[3])  # ∂ W_a s_{i−1}
            grad_keys = torch.zeros_like(halves[0])
            grad_s = torch.zeros_like(states[0])
            # Scratch reused by every step: a fresh allocation of this size per step costs as much as its product.
            products, grad_tanh_pre = torch.empty_like(annotations), torch.empty_like(grad_keys)
            for i in reversed(range(steps)):
                grad_s = grad_s + grad_states[i]
                grad_s = _gru_backward(grad_s, s_prev[i], gates[i], candidates[i], gate_mm, cand_mm, grad_pre[i],
                                       mm_dtype)
                torch.add(grad_contexts[i], _mm(grad_pre[i], context_mm, mm_dtype), out=grad_ctx[i])
                # a product and a sum: a batch of matrix-vector products is slower on a CPU
                grad_alpha = torch.mul(annotations, grad_ctx[i].unsqueeze(1), out=products).sum(2)
                alpha = alphas[i]
                torch.mul(alpha, grad_alpha - (alpha * grad_alpha).sum(-1, keepdim=True), out=grad_scores[i])
                half = halves[i]
                torch.addcmul(half, half, half, value=-1, out=grad_tanh_pre).mul_(v_vec)
                grad_tanh_pre.mul_(grad_scores[i].unsqueeze(2))
                grad_keys += grad_tanh_pre
                torch.sum(grad_tanh_pre, dim=1, out=grad_query[i])
                grad_s += _mm(grad_query[i], state_mm, mm_dtype)
            # Each weight's gradient once, over all steps.
            grad_state_w = _weight_grad(grad_query, s_prev, mm_dtype)
            # Σ ∂score · tanh = 2 Σ ∂score · σ(2a) − Σ ∂score, and each row's ∂scores sum to 0
            grad_v = 2 * torch.mm(grad_scores.reshape(1, -1), halves.reshape(-1, halves.shape[3]))
            grad_context_w = _weight_grad(grad_pre, contexts, mm_dtype)
            grad_gate_w = _weight_grad(grad_pre[..., : 2 * H], s_prev, mm_dtype)
            grad_cand_w = _weight_grad(grad_pre[..., 2 * H :], reset_h, mm_dtype)
            grad_annotations = torch.bmm(alphas.permute(1, 2, 0), grad_ctx.transpose(0, 1))
        emb_dtype, first_dtype, keys_dtype, ann_dtype = ctx.dtypes
        return (grad_pre.to(emb_dtype), grad_s.to(first_dtype), grad_keys.to(keys_dtype),
                grad_annotations.to(ann_dtype), None, grad_state_w.to(state_weight.dtype), grad_v.to(v.dtype),
                grad_context_w.to(context_weight.dtype), grad_gate_w.to(gate_weight.dtype),
                grad_cand_w.to(cand_weight.dtype))


def encoder_states(projected: Tensor, keep: Tensor, gate_weights: Tensor, cand_weights: Tensor) -> Tensor:
    """:class:`_EncoderRecurrence`: states ``[J, 2, B, H]`` of both directions."""
    return _EncoderRecurrence.apply(projected, keep, gate_weights, cand_weights)


def decoder_states(emb_projected: Tensor, first: Tensor, keys: Tensor, annotations: Tensor, src_mask: Tensor,
                   state_weight: Tensor, v: Tensor, context_weight: Tensor, gate_weight: Tensor,
                   cand_weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:class:`_DecoderRecurrence`: states ``[I, B, H]``, contexts ``[I, B, 2H]``, weights ``[I, B, J]``."""
    return _DecoderRecurrence.apply(emb_projected, first, keys, annotations, src_mask, state_weight, v,
                                    context_weight, gate_weight, cand_weight)
