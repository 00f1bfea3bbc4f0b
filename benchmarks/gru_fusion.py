"""What a fused GRU step would gain: the element-wise part of a step, eager against compiled, interleaved.

Usage: python -m benchmarks.gru_fusion [--sizes 256,1000] [--rows 64] [--rounds 5] [--threads 1]

A fused GRU step (the gate arithmetic of a time step in one pass) can only remove the element-wise
time of the recurrences; ``benchmarks.train_speed``'s profile prints how large that is in an update
(its "recurrences" line). This measures how much of it one compiled pass removes, on the operations
the training runs between the matmuls:

* the backward step of ``nmt.recurrence._gru_backward`` (the two matmuls aside): from ∂h, the gates,
  the candidate and the state that entered, ∂ of the three pre-activations and the part of
  ∂h⟨t−1⟩ that does not go through a matmul;
* the decoder attention's scores of ``nmt.recurrence._DecoderRecurrence``: σ(keys + W_a s)·v over
  ``[rows, 28, width]`` (a 28-word source).

Each kind runs as written (eager) and through ``torch.compile``, the two alternated for
``--rounds`` rounds; the best round of each is printed, with the bytes its operands and results
cross per call against the memory bandwidth measured in the same run (``c = a + b``), and the
largest difference between the two results. The compiled call is specialised to its shapes, as
a training's would be to every distinct row count.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import Tensor

from benchmarks.machine_peak import memory_bandwidth
from infrastructure.threads import limit_threads

SOURCE_WORDS = 28


def gru_backward_elementwise(grad_h: Tensor, z: Tensor, cand: Tensor, h_prev: Tensor, grad_reset_h: Tensor,
                             r: Tensor) -> tuple[Tensor, ...]:
    """∂ of the candidate's, z's and r's pre-activations and ∂h⟨t−1⟩ but its matmul part (one step, no padding)."""
    grad_cand_pre = (grad_h * z) * (1 - cand * cand)
    grad_z_pre = grad_h * (cand - h_prev) * (z * (1 - z))
    grad_prev = grad_h - grad_h * z + grad_reset_h * r
    grad_r_pre = (grad_reset_h * h_prev) * (r * (1 - r))
    return grad_cand_pre, grad_z_pre, grad_prev, grad_r_pre


def attention_scores(keys: Tensor, query: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """σ(keys + W_a s) (kept for backward) and its scores ·v."""
    half = torch.sigmoid(keys + query.unsqueeze(1))
    return half, half @ v


def _per_call(function: Callable, args: list[Tensor], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        function(*args)
    return (time.perf_counter() - started) / calls


def compare(name: str, function: Callable, args: list[Tensor], rounds: int, bandwidth: float) -> None:
    """Eager and compiled ``function`` on ``args``, alternated for ``rounds`` rounds of ~0.1 s each."""
    compiled = torch.compile(function, dynamic=False)
    for f in (function, compiled):  # warm-up: the compilation, the caches
        _per_call(f, args, 5)
    calls = max(1, int(0.1 / max(_per_call(function, args, 3), 1e-7)))
    eager, fused = [], []
    for _ in range(rounds):
        eager.append(_per_call(function, args, calls))
        fused.append(_per_call(compiled, args, calls))
    outputs = function(*args)
    moved = sum(a.numel() * a.element_size() for a in [*args, *outputs])
    difference = max((a - b).abs().max().item() for a, b in zip(outputs, compiled(*args), strict=True))
    e, c = min(eager), min(fused)
    print(f"{name}: eager {e * 1e6:.0f} us ({moved / e / 1e9:.1f} GB/s = {100 * moved / e / bandwidth:.0f}% of the "
          f"memory bandwidth), compiled {c * 1e6:.0f} us ({100 * moved / c / bandwidth:.0f}%): {e / c:.2f}x; "
          f"largest difference {difference:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="256,1000", help="comma-separated state widths H")
    parser.add_argument("--rows", type=int, default=64, help="rows of a step (the minibatch)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    limit_threads(args.threads)
    torch.manual_seed(0)
    bandwidth = memory_bandwidth("cpu")
    print(f"memory bandwidth measured (c = a + b, fp32): {bandwidth / 1e9:.1f} GB/s; {torch.get_num_threads()} "
          f"thread(s), fp32")
    for width in (int(w) for w in args.sizes.split(",")):
        compare(f"GRU backward step, H={width} rows={args.rows}", gru_backward_elementwise,
                [torch.rand(args.rows, width) for _ in range(6)], args.rounds, bandwidth)
        compare(f"attention scores, A={width} rows={args.rows} source={SOURCE_WORDS}", attention_scores,
                [torch.randn(args.rows, SOURCE_WORDS, width), torch.randn(args.rows, width), torch.randn(width)],
                args.rounds, bandwidth)


if __name__ == "__main__":
    main()
