"""The machine's measured matmul throughput per precision, and its memory bandwidth: the yardsticks
the benchmarks report against.

A fraction of a measured peak says more than pairs/s alone: it tells how much of the hardware the
implementation uses, on whatever machine the benchmark runs. Each precision is measured in its own
dtype (:func:`matmul_peaks`): a bf16 run's share is of the bf16 peak, which on a CPU with AMX is
several times the fp32 one, and on a CPU with AVX512-BF16 alone can be below it (docs/training-speed.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

import torch

#: The environment variable that sets how long each yardstick is timed, in seconds, where a caller
#: gives no window of its own (default :data:`WINDOW_SECONDS`). The smoke tests and gpu_suite.sh's
#: CPU check set it short: they check what a benchmark prints, and a benchmark measures its yardsticks
#: up to six times (before and after, per wall- and CPU-second), 2 s each.
WINDOW_ENV = "BENCHMARK_PEAK_SECONDS"
WINDOW_SECONDS = 2.0


def window(seconds: float | None) -> float:
    """``seconds``, or the default window (:data:`WINDOW_ENV`, else :data:`WINDOW_SECONDS`)."""
    if seconds is not None:
        return seconds
    value = os.environ.get(WINDOW_ENV, "")
    try:
        chosen = float(value) if value else WINDOW_SECONDS
    except ValueError:
        raise SystemExit(f"{WINDOW_ENV}={value!r}: not a number of seconds") from None
    if not chosen > 0:
        raise SystemExit(f"{WINDOW_ENV}={value!r}: must be above 0 seconds")
    return chosen


# The dtype each --precision multiplies in. tf32 is fp32 storage; on CUDA its peak is measured
# with TF32 allowed, on the CPU (which has no TF32) it is the fp32 peak.
PEAK_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _size_within(device: torch.device, dtype: torch.dtype, size: int, seconds: float) -> int:
    """``size``, or a smaller power-of-two side whose 4 products take at most ``2 * seconds`` at the rate one
    256-sided product shows (never below 256)."""
    probe = 256
    if device.type == "cuda" or size <= probe:
        return size
    a = torch.randn(probe, probe, dtype=dtype)
    torch.mm(a, a)
    t0 = time.perf_counter()
    torch.mm(a, a)
    rate = 2 * probe**3 / max(time.perf_counter() - t0, 1e-9)
    while size > probe and 4 * 2 * size**3 / rate > 2 * seconds:
        size //= 2
    return size


def matmul_peak_flops(device: torch.device | str = "cpu", size: int = 2048, seconds: float | None = None,
                      clock: Callable[[], float] = time.perf_counter, dtype: torch.dtype = torch.float32) -> float:
    """Best sustained FLOP/s of a square matmul (fp32 unless ``dtype``), after a warm-up.

    ``clock=time.process_time`` gives FLOPs per CPU-second instead (CPU only): on a shared
    machine, where other processes take turns on the cores, that yardstick moves less. On a GPU
    pass ``size=8192``: 2048 is too small to fill one, and ``dtype=torch.bfloat16`` gives the
    yardstick of code that runs its matmuls in bf16 (fp32 matmuls use TF32 only where torch's
    global switch allows it). On the CPU a bf16 matmul of plain bf16 tensors runs in oneDNN's
    bf16 kernels (AMX tiles or AVX512-BF16 dot products; ``ONEDNN_VERBOSE=1`` names the one used).
    A CPU without bf16 units emulates them hundreds of times slower: there ``size`` shrinks (to 256 at
    least) until a round of 4 products fits in twice ``seconds``, so that the figure still comes in seconds.
    """
    device = torch.device(device)
    seconds = window(seconds)
    size = _size_within(device, dtype, size, seconds)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)

    def four_products() -> None:
        for _ in range(4):
            torch.mm(a, b, out=out)

    return best_rate(four_products, 4 * 2 * size**3, device, seconds, clock)


def best_rate(work: Callable[[], None], amount: float, device: torch.device, seconds: float,
              clock: Callable[[], float]) -> float:
    """The best ``amount`` per second (per ``clock``) of ``work`` run again and again for ``seconds``: the
    timing loop of every yardstick here, the GPU synchronised around each round."""
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = clock()
        work()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, amount / max(clock() - t0, 1e-9))
    return best


def peak_name(device: torch.device, precision: str, width: int | None = None) -> str:
    """The peak a training precision's run is a share of: its matmuls' dtype, ``auto`` resolved as a
    training of a model of that ``width`` resolves it (neural.device.training_precision)."""
    from neural.device import autocast_dtype, training_precision

    amp = autocast_dtype(device, training_precision(device, precision, width))
    if amp is not None:
        return "bf16" if amp == torch.bfloat16 else "fp16"
    return "tf32" if precision == "tf32" else "fp32"


def matmul_peaks(device: torch.device | str, precisions: Iterable[str], size: int | None = None,
                 seconds: float | None = None, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """The matmul peak of each precision (FLOP/s, or per CPU-second with ``time.process_time``), each in its dtype.

    Why one function: a benchmark that compares precisions must divide each one's throughput by
    its own peak; reusing the fp32 figure for bf16 (as the CPU branch of ``precision.py`` once
    did) hid the CPU's bf16 units. ``size`` defaults to 8192 on a GPU and 2048 on a CPU.
    """
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 2048)
    measured: dict[tuple[torch.dtype, bool], float] = {}
    peaks: dict[str, float] = {}
    for name in precisions:
        if name not in PEAK_DTYPES:
            raise ValueError(f"no matmul peak for precision {name!r}: one of {', '.join(PEAK_DTYPES)}")
        key = (PEAK_DTYPES[name], name == "tf32" and device.type == "cuda")  # the CPU has no TF32
        if key not in measured:
            before = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = key[1]
            try:
                measured[key] = matmul_peak_flops(device, size=size, seconds=seconds, clock=clock, dtype=key[0])
            finally:
                torch.backends.cuda.matmul.allow_tf32 = before
        peaks[name] = measured[key]
    return peaks


def memory_bandwidth(device: torch.device | str = "cpu", elements: int = 1 << 25, seconds: float | None = None,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """Best sustained bytes/s of ``c = a + b`` over fp32 vectors of ``elements`` (128 MB each by default,
    far beyond any cache), after a warm-up: the yardstick of memory-bound work such as the optimiser's
    update, which reads and writes its streams once each and does too little arithmetic to be held
    back by it. Counted as 3 streams of 4 bytes per element (two read, one written); ``clock`` as in
    :func:`matmul_peak_flops`.
    """
    device = torch.device(device)
    a = torch.rand(elements, device=device)
    b = torch.rand(elements, device=device)
    out = torch.empty(elements, device=device)
    torch.add(a, b, out=out)
    return best_rate(lambda: torch.add(a, b, out=out), 3 * 4 * elements, device, window(seconds), clock)


if __name__ == "__main__":
    for name, flops in matmul_peaks("cpu", ("fp32", "bf16")).items():
        print(f"{name} matmul peak: {flops / 1e9:.1f} GFLOP/s on {torch.get_num_threads()} threads")
