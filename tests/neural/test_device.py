"""Precision choices: exact scores unless a reduced precision is named, and TF32 only inside a run."""

from __future__ import annotations

import pytest
import torch

from neural.device import autocast_dtype, matmul_precision, scoring_precision


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
