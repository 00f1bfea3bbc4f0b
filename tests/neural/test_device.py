"""Precision choices: exact scores unless a reduced precision is named, and TF32 only inside a run."""

from __future__ import annotations

import math

import pytest
import torch

from neural.device import (
    CPU_BF16_PAYS_AT,
    autocast_dtype,
    cpu_bf16_speedup,
    matmul_precision,
    scoring_precision,
    training_precision,
)


def test_scores_are_fp32_unless_a_precision_is_named():
    assert scoring_precision("auto") == "fp32"
    assert [scoring_precision(p) for p in ("fp32", "tf32", "bf16", "fp16")] == ["fp32", "tf32", "bf16", "fp16"]


def test_tf32_and_fp32_autocast_nothing():
    cpu = torch.device("cpu")
    assert autocast_dtype(cpu, "fp32") is None and autocast_dtype(cpu, "tf32") is None
    assert autocast_dtype(cpu, "auto") is None  # CPU bf16 matmuls are slower than fp32
    assert autocast_dtype(cpu, "bf16") is torch.bfloat16


@pytest.mark.parametrize("before", [False, True])
def test_tf32_switch_holds_inside_the_run_only(before):
    torch.backends.cuda.matmul.allow_tf32 = before
    try:
        with matmul_precision("tf32"):
            assert torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32 is before
        with pytest.raises(RuntimeError), matmul_precision("fp32"):
            assert not torch.backends.cuda.matmul.allow_tf32  # exact fp32 even if it was on
            raise RuntimeError("a run that fails")
        assert torch.backends.cuda.matmul.allow_tf32 is before
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def test_the_cpu_bf16_measure_is_made_once_per_width_and_leaves_the_threads_as_they_were():
    """``auto``'s measure of a CPU's bf16 matmuls against its fp32 ones: a ratio (0 where oneDNN has no
    native bf16), the same each time it is asked in a process (a run and its checks must agree on the
    precision), and the process's torch threads untouched although it measures on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first = cpu_bf16_speedup(64)
        assert first >= 0 and math.isfinite(first)
        assert cpu_bf16_speedup(64) == first
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    assert training_precision(cpu, "auto", 64) == ("bf16" if first >= CPU_BF16_PAYS_AT else "fp32")
    assert training_precision(cpu, "fp16", 64) == "fp16"
