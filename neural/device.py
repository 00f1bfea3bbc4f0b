"""Device choice and mixed precision, in one place so training and scoring agree.

GPU-only branches are kept to the choice of dtype: the code that runs under autocast is the same
on CPU and CUDA, so CPU tests exercise the logic that runs on the GPU.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

import torch

from infrastructure.errors import UserError
from neural.config import CPU_BF16_PAYS_AT


def select_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present; an explicit ``cuda`` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but torch sees no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s), numbered from 0")
    return device


def scoring_precision(precision: str) -> str:
    """The precision scores are computed in: ``auto`` is exact fp32 on every device (SPEC §1).

    Measured on an H100 with a trained paper-size model over the 2.88M-line fixture table
    (docs/gpu.md): TF32 moves log p by 0.0014 nats on average (at most 0.026) and changes 0.009%
    of the sources' best targets; bf16 by 0.014 nats (at most 0.30), changing 0.083% of them, and
    is slower than TF32. Both are named options (``--precision tf32|bf16``), never the default. On
    the CPU ``bf16`` runs the matmuls on the CPU's bf16 units with fp32 states and an fp32-summed
    softmax (:func:`rescorer.model.normalizer.log_normalizer_in_place`); what it
    gains and changes there is in docs/training-speed.md.
    """
    return "fp32" if precision == "auto" else precision


def training_precision(device: torch.device, precision: str, width: int | None = None) -> str:
    """The precision a training run uses: ``auto`` is bf16 autocast on CUDA, and on a CPU bf16 where
    :func:`cpu_bf16_speedup` at the model's ``width`` reaches :data:`CPU_BF16_PAYS_AT`, else fp32.

    Why measure rather than read the CPU's flags: the same flags mean opposite things. AVX512-BF16
    matmuls were 0.55× fp32's on one Xeon and 3.6–4.3× on a Zen 5 EPYC, and what decides is whether a
    whole update gets faster, not its matmuls (docs/training-speed.md). The measure takes 0.1–0.8 s
    once per process and width; without ``width`` (a check made before the model's size
    is known) a CPU keeps fp32. On CUDA ``auto`` is what :func:`autocast_dtype` picks (bf16 where
    supported, else fp16). Any other choice is kept as given; the result is always a concrete name,
    the one a run prints and records.
    """
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if autocast_dtype(device, "auto") == torch.bfloat16 else "fp16"
    if width is None:
        return "fp32"
    return "bf16" if cpu_bf16_speedup(width) >= CPU_BF16_PAYS_AT else "fp32"


def cpu_bf16_speedup(width: int) -> float:
    """How many times as fast this CPU multiplies in bf16 as in fp32 at a training's typical shape,
    ``(64 × width)·(width × 3·width)`` (a minibatch's recurrent product); 0.0 where oneDNN has no
    native bf16 kernels (it would emulate them, hundreds of times slower). Measured on one thread,
    where another job's load moves it least (on a 2-core machine beside a compile, two threads' ratio
    at width 256 ranged 2.5–3.6, one thread's 3.6–3.7), in interleaved rounds whose best is kept."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return 0.0
    return _measured_speedup(width)


@functools.cache
def _measured_speedup(width: int) -> float:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _speedup_on_this_thread(width)
    finally:
        torch.set_num_threads(threads)


def _speedup_on_this_thread(width: int) -> float:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(64, width, generator=generator)
    b = torch.randn(width, 3 * width, generator=generator)
    operands = {dtype: (a.to(dtype), b.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    best = dict.fromkeys(operands, 0.0)
    with torch.inference_mode():
        for x, y in operands.values():
            torch.mm(x, y)  # kernels built (oneDNN makes one per shape) before the clock starts
        for _ in range(_SPEEDUP_ROUNDS):
            for dtype, (x, y) in operands.items():
                count, start = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - start) < _SPEEDUP_ROUND_SECONDS:
                    torch.mm(x, y)
                    count += 1
                best[dtype] = max(best[dtype], count / elapsed)
    return best[torch.bfloat16] / best[torch.float32]


_SPEEDUP_ROUNDS, _SPEEDUP_ROUND_SECONDS = 5, 0.01


def describe_precision(precision: str) -> str:
    """What a training precision (as :func:`training_precision` resolves it) computes in, in words."""
    if precision in ("bf16", "fp16"):
        return (f"matmuls in {precision} with fp32 accumulation; the rest (states, gates, softmax, gradients, "
                "the optimiser) in fp32")
    return "TF32 matmuls, the rest in fp32" if precision == "tf32" else "everything in fp32"


def autocast_dtype(device: torch.device, precision: str = "auto") -> torch.dtype | None:
    """Reduced precision only on CUDA: bf16 where supported (no loss scaling needed), else fp16.

    ``precision`` is one of :data:`neural.config.PRECISIONS`. ``auto`` means bf16 autocast on CUDA for training
    (scoring resolves it with :func:`scoring_precision` first, training with
    :func:`training_precision`, which on a CPU measures whether bf16 pays); left unresolved on a CPU it
    keeps fp32.
    ``tf32`` autocasts nothing: its fp32 matmuls use TF32 through :func:`matmul_precision`.
    """
    if precision in ("fp32", "tf32"):
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None


@contextlib.contextmanager
def autocast(device: torch.device, dtype: torch.dtype | None, cache: bool = True) -> Iterator[None]:
    """Autocast to ``dtype`` inside the block (nothing for None). ``cache=False`` for a block that
    a CUDA graph captures: autocast's cache of cast weights must not outlive the capture."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype, cache_enabled=cache):
        yield


def matmul_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype a plain matmul would run in on ``device``: the autocast dtype when autocast is on.

    For the hand-written training Functions (:mod:`rescorer.model.gru`, :mod:`neural.output_layer`),
    which turn autocast off inside (:func:`no_autocast`) and cast themselves.
    """
    if torch.amp.is_autocast_available(device.type) and torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return dtype


def no_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off on ``device``; nothing where it has none (the meta device, on which a test runs
    the static training step to show that it never reads a value on the host)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


@contextlib.contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """fp32 matmuls on CUDA in TF32 inside the block for ``tf32``, in full fp32 for anything else.

    torch's switch is global, so it is set for the run and restored after it; the fused output
    layer (:mod:`rescorer.model.lse_kernel`) reads the same switch.
    """
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA OOM across torch versions (OutOfMemoryError subclasses RuntimeError)."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc)
