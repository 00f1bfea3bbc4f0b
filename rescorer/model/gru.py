"""The training path of the two GRU recurrences (SPEC §1), with a hand-written backward through time.

Under autograd each time step of a recurrence is a handful of graph nodes, and the gradient of a
recurrent matrix arrives as one small [rows, d]ᵀ × [rows, d] matmul per step (64 rows for a
paper minibatch: half the speed of a large matmul on a CPU), each added into the running sum
(a pass over the whole matrix, 12 MB at paper sizes, per step). Here the forward keeps what
backward needs (gates, candidates, the states that entered each step) and backward runs the
recurrence in reverse with only the [rows, 3d] × [3d, d] products that carry the gradient back
through time; the recurrent matrices' gradients are then one large matmul each over all steps.

The equations are exactly those of :class:`rescorer.model.network.RNNEncoderDecoder` (its
``encoder_step``/``decoder_step``, additions folded into addmm the same way), as the same
operations: the tests find the training and scoring paths' log-probabilities equal within 1e-12,
and the gradients equal to autograd on the plain equations in float64 within 1e-8. Under
autocast the matmuls run in the autocast dtype and the states, gates and gradients in the
states' dtype, as the plain path does; each weight is cast to the matmul dtype once per update
(forward casts it, backward reuses that copy), never per time step, which at paper sizes would
be 3M weights converted per decoder step each way; and where the optimiser keeps the cast copy
current (:mod:`neural.weight_copies`), not even that.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from neural.device import matmul_dtype, no_autocast
from neural.weight_copies import matmul_weight
from rescorer.model import block_sizes


def _mm(a: Tensor, b: Tensor, dtype: torch.dtype, out_dtype: torch.dtype) -> Tensor:
    return torch.mm(a.to(dtype), b.to(dtype)).to(out_dtype)


def _addmm(bias: Tensor, a: Tensor, b: Tensor, dtype: torch.dtype, out_dtype: torch.dtype) -> Tensor:
    return torch.addmm(bias.to(dtype), a.to(dtype), b.to(dtype)).to(out_dtype)


class _DecoderRecurrence(torch.autograd.Function):
    """All decoder states h'⟨1..T⟩ ([T, B, d]) from h'⟨0⟩ and the per-step inputs."""

    @staticmethod
    def forward(ctx, h0: Tensor, gate_inputs: Tensor, cand_inputs: Tensor, cand_context: Tensor,
                weight: Tensor) -> Tensor:
        steps, d = gate_inputs.shape[0], h0.shape[1]
        state_dtype = h0.dtype
        mm_dtype = matmul_dtype(h0.device, weight.dtype)
        with no_autocast(h0.device):
            weight_mm = matmul_weight(weight, mm_dtype)  # once per update, not per step (fp32: the weight)
            gate_weight, cand_weight = weight_mm[: 2 * d].t(), weight_mm[2 * d :].t()
            cand_context_mm = cand_context.to(mm_dtype)
            states = h0.new_empty(steps, *h0.shape)
            gates = h0.new_empty(steps, h0.shape[0], 2 * d)
            candidates = torch.empty_like(states)
            recurrent = torch.empty_like(states)
            h = h0
            for t in range(steps):
                torch.sigmoid(_addmm(gate_inputs[t], h, gate_weight, mm_dtype, state_dtype), out=gates[t])
                r, z = gates[t, :, :d], gates[t, :, d:]
                recurrent[t] = _addmm(cand_context_mm, h, cand_weight, mm_dtype, state_dtype)
                torch.tanh(torch.addcmul(cand_inputs[t], r, recurrent[t]), out=candidates[t])
                torch.lerp(candidates[t], h, z, out=states[t])
                h = states[t]
        ctx.save_for_backward(h0, weight_mm, states, gates, candidates, recurrent)
        ctx.mm_dtype, ctx.weight_dtype = mm_dtype, weight.dtype
        return states

    @staticmethod
    def backward(ctx, grad_states: Tensor) -> tuple[Tensor | None, ...]:
        h0, weight, states, gates, candidates, recurrent = ctx.saved_tensors  # weight as forward cast it
        steps, d, mm_dtype = states.shape[0], h0.shape[1], ctx.mm_dtype
        with no_autocast(h0.device):
            grad_states = grad_states.to(states.dtype)
            # [∂gate pre-activations (r, z), ∂(U' h + C c + b)] of every step: [T, B, 3d].
            grad_pre = states.new_empty(steps, h0.shape[0], 3 * d)
            grad_cand_inputs = torch.empty_like(states)
            grad_h = torch.zeros_like(h0)
            for t in reversed(range(steps)):
                grad_h += grad_states[t]
                h_prev = states[t - 1] if t > 0 else h0
                r, z, n, q = gates[t, :, :d], gates[t, :, d:], candidates[t], recurrent[t]
                # h = n + z (h_prev − n): ∂n = ∂h (1 − z), ∂z = ∂h (h_prev − n), ∂h_prev = ∂h z + ...
                grad_n_pre = torch.mul(grad_h, 1 - z).mul_(1 - n * n)  # through tanh
                grad_cand_inputs[t] = grad_n_pre
                torch.mul(grad_n_pre, r, out=grad_pre[t, :, 2 * d :])
                torch.mul(grad_n_pre, q, out=grad_pre[t, :, :d]).mul_(r * (1 - r))
                torch.mul(grad_h, h_prev - n, out=grad_pre[t, :, d : 2 * d]).mul_(z * (1 - z))
                grad_h = torch.addcmul(_mm(grad_pre[t], weight, mm_dtype, states.dtype), grad_h, z)
            entered = torch.cat([h0.unsqueeze(0), states[:-1]]).flatten(0, 1)  # h'⟨t−1⟩ of every step
            grad_weight = _mm(grad_pre.flatten(0, 1).t(), entered, mm_dtype, ctx.weight_dtype)
            grad_gate_inputs = grad_pre[:, :, : 2 * d]
            grad_cand_context = grad_pre[:, :, 2 * d :].sum(0)
        return grad_h, grad_gate_inputs, grad_cand_inputs, grad_cand_context, grad_weight


class _EncoderRecurrence(torch.autograd.Function):
    """h⟨N⟩ of each row ([B, d], rows sorted longest first) from the per-step input projections.

    ``running[t]`` rows are still reading at step t (the first ones); a finished row keeps its
    state, exactly as the encoder of :meth:`RNNEncoderDecoder.encode` does.
    """

    @staticmethod
    def forward(ctx, inputs: Tensor, gate_weight: Tensor, cand_weight: Tensor,
                running: list[int], state_dtype: torch.dtype) -> Tensor:
        batch, d = inputs.shape[1], cand_weight.shape[0]
        mm_dtype = matmul_dtype(inputs.device, cand_weight.dtype)
        with no_autocast(inputs.device):
            # The weights cast once per update, not per step (no-ops in fp32); kept for backward.
            gate_weight_mm, cand_weight_mm = matmul_weight(gate_weight, mm_dtype), matmul_weight(cand_weight, mm_dtype)
            offsets = [0]
            for n in running:
                offsets.append(offsets[-1] + n)
            # The packed steps' rows, the K of the weights' gradients, rounded up to a fixed set of sizes
            # (block_sizes.TRAIN_PACKED_ROWS): the rows past the steps' are zero in the gradients' operands.
            packed = _round_up(offsets[-1], shape_multiple(block_sizes.TRAIN_PACKED_ROWS, inputs.device, mm_dtype))
            entered = inputs.new_empty(packed, d, dtype=state_dtype)  # h⟨t−1⟩ of running rows
            entered[offsets[-1] :] = 0
            gates = inputs.new_empty(packed, 2 * d, dtype=state_dtype)
            candidates = inputs.new_empty(packed, d, dtype=state_dtype)
            h = inputs.new_zeros(batch, d, dtype=state_dtype)
            for t, n in enumerate(running):
                lo, hi = offsets[t], offsets[t + 1]
                entered[lo:hi] = h[:n]
                g = torch.sigmoid(_addmm(inputs[t, :n, : 2 * d], h[:n], gate_weight_mm.t(), mm_dtype, state_dtype),
                                  out=gates[lo:hi])
                r, z = g[:, :d], g[:, d:]
                pre = _addmm(inputs[t, :n, 2 * d :], r * h[:n], cand_weight_mm.t(), mm_dtype, state_dtype)
                torch.tanh(pre, out=candidates[lo:hi])
                h[:n] = torch.lerp(candidates[lo:hi], h[:n], z)
        ctx.save_for_backward(gate_weight_mm, cand_weight_mm, entered, gates, candidates)
        ctx.running, ctx.offsets, ctx.mm_dtype = running, offsets, mm_dtype
        ctx.weight_dtypes = gate_weight.dtype, cand_weight.dtype
        ctx.input_shape, ctx.input_dtype = inputs.shape, inputs.dtype
        return h

    @staticmethod
    def backward(ctx, grad_h_final: Tensor) -> tuple[Tensor | None, ...]:
        gate_weight, cand_weight, entered, gates, candidates = ctx.saved_tensors
        running, offsets, mm_dtype = ctx.running, ctx.offsets, ctx.mm_dtype
        d, state_dtype = cand_weight.shape[0], entered.dtype  # the weights as forward cast them
        with no_autocast(grad_h_final.device):
            grad_h = grad_h_final.to(state_dtype).clone()
            grad_inputs = grad_h.new_zeros(ctx.input_shape)
            grad_gates = torch.empty_like(gates)  # ∂ pre-activations of r, z (packed rows)
            grad_cand = torch.empty_like(candidates)  # ∂ pre-activation of the candidate
            reset_entered = torch.empty_like(entered)  # r ⊙ h⟨t−1⟩, the candidate matmul's input
            for padding in (grad_gates, grad_cand, reset_entered):  # the rows past the steps' (forward)
                padding[offsets[-1] :] = 0
            for t in reversed(range(len(running))):
                n, lo, hi = running[t], offsets[t], offsets[t + 1]
                g_h, h_prev = grad_h[:n], entered[lo:hi]
                r, z, cand = gates[lo:hi, :d], gates[lo:hi, d:], candidates[lo:hi]
                torch.mul(r, h_prev, out=reset_entered[lo:hi])
                torch.mul(g_h, 1 - z, out=grad_cand[lo:hi]).mul_(1 - cand * cand)
                grad_reset_entered = _mm(grad_cand[lo:hi], cand_weight, mm_dtype, state_dtype)
                torch.mul(grad_reset_entered, h_prev, out=grad_gates[lo:hi, :d]).mul_(r * (1 - r))
                torch.mul(g_h, h_prev - cand, out=grad_gates[lo:hi, d:]).mul_(z * (1 - z))
                grad_prev = torch.addcmul(_mm(grad_gates[lo:hi], gate_weight, mm_dtype, state_dtype), g_h, z)
                grad_prev.addcmul_(grad_reset_entered, r)
                grad_h[:n] = grad_prev
                grad_inputs[t, :n, : 2 * d] = grad_gates[lo:hi]
                grad_inputs[t, :n, 2 * d :] = grad_cand[lo:hi]
            grad_gate_weight = _mm(grad_gates.t(), entered, mm_dtype, ctx.weight_dtypes[0])
            grad_cand_weight = _mm(grad_cand.t(), reset_entered, mm_dtype, ctx.weight_dtypes[1])
        return grad_inputs.to(ctx.input_dtype), grad_gate_weight, grad_cand_weight, None, None


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def shape_multiple(size: int, device: torch.device, mm_dtype: torch.dtype) -> int:
    """``size`` (one of ``block_sizes.TRAIN_*``) where training's matmuls, running in ``mm_dtype`` on
    ``device``, build a kernel for each new shape: bf16 or fp16 on the CPU (oneDNN). Else 1, the exact
    shapes, which run faster where a new shape costs nothing (block_sizes' note)."""
    reduced = device.type == "cpu" and mm_dtype in (torch.bfloat16, torch.float16)
    return size if reduced or (device.type == "cpu" and block_sizes.TRAIN_FIXED_SHAPES_IN_FP32) else 1


def step_rows(running: list[int], batch: int, multiple: int) -> list[int]:
    """The rows each encoder step runs, each of ``running`` (the rows still reading, longest first)
    rounded up to a multiple of ``multiple`` (:func:`shape_multiple`), at most ``batch``: the steps'
    matmuls then have one of a few row counts. The rows added must hold their state
    (:func:`hold_state_at_padding`)."""
    return [min(batch, _round_up(n, multiple)) for n in running]


def hold_state_at_padding(inputs: Tensor, mask: Tensor) -> Tensor:
    """The encoder's step inputs ([T, B, 3d]: [W_r; W_z; W] e + b) with the update gate's pre-activation
    +inf where ``mask`` ([B, T]) is False, so that a step run on a padded position changes nothing.

    There z = 1 exactly and the GRU returns h⟨t−1⟩ bit for bit (``lerp`` with weight 1 returns its end
    point); the hand-written backward then passes the gradient through unchanged and gives the step's
    inputs and weights exactly zero gradient (z(1 − z) = 0, 1 − z = 0).
    """
    d = inputs.shape[-1] // 3
    update_gate = (torch.arange(3 * d, device=inputs.device) // d) == 1  # the z block of [r; z; candidate]
    return inputs.masked_fill(~mask.t().unsqueeze(2) & update_gate, math.inf)


def decoder_recurrence(h0: Tensor, gate_inputs: Tensor, cand_inputs: Tensor, cand_context: Tensor,
                       weight: Tensor) -> Tensor:
    """Decoder states [T, B, d] (module doc); ``weight`` is [U'_r; U'_z; U'] ([3d, d])."""
    return _DecoderRecurrence.apply(h0, gate_inputs, cand_inputs, cand_context, weight)


def encoder_recurrence(inputs: Tensor, gate_weight: Tensor, cand_weight: Tensor, running: list[int],
                       state_dtype: torch.dtype) -> Tensor:
    """Final encoder states [B, d] of rows sorted longest first (module doc)."""
    return _EncoderRecurrence.apply(inputs, gate_weight, cand_weight, running, state_dtype)
