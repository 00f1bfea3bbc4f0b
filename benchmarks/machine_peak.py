"""The machine's measured fp32 matmul throughput: the yardstick every benchmark reports against.

A fraction of a measured peak says more than pairs/s alone: it tells how much of the hardware the
implementation uses, on whatever machine the benchmark runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def matmul_peak_flops(device: torch.device | str = "cpu", size: int = 2048, seconds: float = 2.0,
                      clock: Callable[[], float] = time.perf_counter, dtype: torch.dtype = torch.float32) -> float:
    """Best sustained FLOP/s of a square matmul (fp32 unless ``dtype``), after a warm-up.

    ``clock=time.process_time`` gives FLOPs per CPU-second instead (CPU only): on a shared
    machine, where other processes take turns on the cores, that yardstick moves less. On a GPU
    pass ``size=8192``: 2048 is too small to fill one, and ``dtype=torch.bfloat16`` gives the
    yardstick of code that runs its matmuls in bf16 (fp32 matmuls use TF32 only where torch's
    global switch allows it).
    """
    device = torch.device(device)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = clock()
        for _ in range(4):
            torch.mm(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 4 * 2 * size**3 / max(clock() - t0, 1e-9))
    return best


if __name__ == "__main__":
    print(f"fp32 matmul peak: {matmul_peak_flops() / 1e9:.1f} GFLOP/s on {torch.get_num_threads()} threads")
