"""The output layer's log-normaliser on a GPU without materialising the logits: a Triton kernel.

Scoring needs, for every decoder node, only log Σ_w exp((G s)_w + b_w) and the picked logit.
Computed the plain way, the logits of a tree group are [nodes, V] floats (about 15 GB for a
100,000-line chunk at V = 15,001) written once and read four to six times by the log-sum-exp's
separate passes: on an H100 those passes were about half of the scorer's time in TF32. Here each
program takes a block of rows, keeps their [rows, K] factors in registers, walks the vocabulary
in tiles of W (which stays in L2) and keeps an online maximum and sum per row, so the logits never
leave the chip. Same mathematics (the exact log-sum-exp; SPEC §1); only the summation order of
the dot products differs, as between any two matmul kernels. It serves the TF32 and bf16/fp16
precisions (``--precision tf32|bf16``): fp32 operands are multiplied in TF32 where torch's TF32
switch for matmuls is on, as the cuBLAS matmuls around them are; in full fp32 (``ieee``)
otherwise, which is exact but slow, so the default fp32 scoring keeps the plain path
(:func:`use_kernel`).

Triton ships with torch's CUDA builds. Where it is missing, or the tensors are on the CPU, the
callers keep their plain path; tests run the kernel itself on the CPU in Triton's interpreter.
"""

from __future__ import annotations

import functools

import torch

BLOCK_ROWS = 256  # rows per program (H100: 8.1 ms TF32, 6.7 bf16 for 400k rows; 128: 10.5, 8.0)
BLOCK_VOCAB = 64  # words per tile of W
NUM_WARPS = 8


tl = None  # triton.language, imported by _kernel(): CPU installs may lack Triton


def _log_sum_exp_program(a_ptr, w_ptr, out_ptr, rows, vocab, k_dim, stride_a, stride_w,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         PRECISION: tl.constexpr):
    """One block of rows: [BLOCK_M, K] factors against every tile of W, online max and sum."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + offs_m[:, None] * stride_a + offs_k[None, :],
                mask=(offs_m[:, None] < rows) & (offs_k[None, :] < k_dim), other=0.0)
    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, vocab, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        w = tl.load(w_ptr + offs_n[None, :] * stride_w + offs_k[:, None],
                    mask=(offs_n[None, :] < vocab) & (offs_k[:, None] < k_dim), other=0.0)
        logits = tl.dot(a, w, input_precision=PRECISION)
        logits = tl.where(offs_n[None, :] < vocab, logits, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(logits, axis=1))
        scaled = tl.sum(tl.exp(logits - new_max[:, None]), axis=1)
        running_sum = running_sum * tl.exp(running_max - new_max) + scaled
        running_max = new_max
    tl.store(out_ptr + offs_m, running_max + tl.log(running_sum), mask=offs_m < rows)


@functools.cache
def _kernel():
    """The Triton kernel, or None without Triton (jit-compiled on first launch)."""
    global tl
    try:
        import triton
        import triton.language
    except ImportError:
        return None
    tl = triton.language
    return triton.jit(_log_sum_exp_program)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 → the nearest TF32 (10-bit mantissa; ties away from zero), kept in fp32 bits.

    The tensor cores read only the top 19 bits of an fp32 operand, i.e. they truncate; cuBLAS
    rounds first. Truncation shrinks every product the same way, which biased each normaliser
    against the picked logit (computed in fp32): on an H100, mean |Δ log p| 0.038 against fp32
    with truncation, 0.0014 with rounding (cuBLAS's TF32: 0.0017). Rounded once here, before
    the launch, rather than per tile in the kernel, where every program re-rounded all of W.
    """
    return ((x.contiguous().view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def kernel_available() -> bool:
    return _kernel() is not None


def use_kernel(low: torch.Tensor) -> bool:
    """Whether :func:`log_sum_exp` should run for these factors: on CUDA, with Triton present, for
    TF32 or half-precision products.

    Full-fp32 products stay with cuBLAS and the plain log-sum-exp: on an H100, Triton's fp32 dot
    (``ieee``) ran 25x slower than that, and its three-TF32 emulation (``tf32x3``) no faster
    (86.7 against 91.2 ms for 400,000 rows at V = 15,001), so the kernel gains nothing there.
    """
    return low.is_cuda and (low.dtype != torch.float32 or _tf32_enabled()) and kernel_available()


def _tf32_enabled() -> bool:
    return bool(torch.backends.cuda.matmul.allow_tf32)


def log_sum_exp(low: torch.Tensor, weight: torch.Tensor, tf32: bool | None = None) -> torch.Tensor:
    """log Σ_w exp(low · weight_w) per row: ``torch.logsumexp(low @ weight.T, -1)``, as float32.

    ``low`` [rows, K] and ``weight`` [V, K] (any row stride; the last dimension contiguous). In
    the output layer, K = rank + 1: G_r s with a constant 1 appended, against [G_l | bias].
    bf16/fp16 operands are multiplied as such with fp32 accumulation (autocast scoring); fp32
    ones in exact fp32, or TF32 where ``tf32`` (default: torch's matmul TF32 switch) says so.
    """
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("the fused log-sum-exp needs Triton, which this torch installation lacks")
    if low.dim() != 2 or weight.dim() != 2 or low.shape[1] != weight.shape[1]:
        raise ValueError(f"low [rows, K] and weight [V, K] expected, got {tuple(low.shape)} and {tuple(weight.shape)}")
    if low.dtype != weight.dtype:
        weight = weight.to(low.dtype)
    if low.stride(1) != 1:
        low = low.contiguous()
    if weight.stride(1) != 1:
        weight = weight.contiguous()
    rows, k_dim = low.shape
    out = torch.empty(rows, dtype=torch.float32, device=low.device)
    if rows == 0:
        return out
    tf32 = _tf32_enabled() if tf32 is None else tf32
    precision = "tf32" if tf32 else "ieee"  # for fp32 operands; half-precision ones ignore it
    if tf32 and low.dtype == torch.float32:
        low, weight = round_to_tf32(low), round_to_tf32(weight)
    block_k = max(16, 1 << (k_dim - 1).bit_length())
    grid = ((rows + BLOCK_ROWS - 1) // BLOCK_ROWS,)
    kernel[grid](low, weight, out, rows, weight.shape[0], k_dim, low.stride(0), weight.stride(0),
                 BLOCK_M=BLOCK_ROWS, BLOCK_N=BLOCK_VOCAB, BLOCK_K=block_k, PRECISION=precision, num_warps=NUM_WARPS)
    return out
