"""Device choice and mixed precision, in one place so training and scoring agree.

GPU-only branches are kept to the choice of dtype: the code that runs under autocast is the same
on CPU and CUDA, so CPU tests exercise the logic that runs on the GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def select_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present; an explicit ``cuda`` without a GPU is a clear error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was requested but torch sees no CUDA device")
    return device


def autocast_dtype(device: torch.device, precision: str = "auto") -> torch.dtype | None:
    """Reduced precision only on CUDA: bf16 where supported (no loss scaling needed), else fp16.

    ``precision`` is ``auto``, ``fp32``, ``bf16`` or ``fp16``. On CPU ``auto`` keeps fp32, since
    CPU bf16 matmuls are slower than fp32 on most machines.
    """
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return None


@contextlib.contextmanager
def autocast(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA OOM across torch versions (OutOfMemoryError subclasses RuntimeError)."""
    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc)
