"""The GPU output layer's fused log-sum-exp against the exact form, in float64.

On the CPU the kernel itself runs in Triton's interpreter (the same program, element by element);
on a GPU, compiled. Where Triton is not installed these tests skip: the scorer then keeps its
plain path, which the model tests cover.
"""

from __future__ import annotations

import pytest
import torch

from rescorer.model import lse_kernel
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.normalizer import log_normalizer, output_matrix

pytest.importorskip("triton", reason="Triton is not installed: the scorer uses its plain log-sum-exp")


@pytest.fixture
def kernel_device() -> torch.device:
    """cuda where present, else the CPU through Triton's interpreter (tests/conftest.py turns it on)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def reference(low: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(low.double() @ weight.double().T, dim=-1)


@pytest.mark.parametrize(("rows", "vocab", "k_dim"), [(1, 5, 3), (130, 1000, 101), (300, 257, 65)])
def test_matches_the_exact_log_sum_exp(kernel_device, rows, vocab, k_dim):
    """Partial row blocks, a partial last vocabulary tile and K below its power of two included."""
    gen = torch.Generator().manual_seed(rows + vocab)
    low = torch.randn(rows, k_dim, generator=gen) * 2.0
    weight = torch.randn(vocab, k_dim, generator=gen) * 0.5
    got = lse_kernel.log_sum_exp(low.to(kernel_device), weight.to(kernel_device), tf32=False).cpu()
    expected = reference(low, weight)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), expected, rtol=1e-6, atol=1e-5), (got.double() - expected).abs().max()


def test_large_logits_neither_overflow_nor_lose_the_small_words(kernel_device):
    """Logits of ±500 (exp overflows fp32) and one row where a late word dominates."""
    low = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    weight = torch.zeros(300, 2)
    weight[:, 0] = torch.linspace(-500, 500, 300)
    weight[299, 1] = 80.0  # only in the last tile
    got = lse_kernel.log_sum_exp(low.to(kernel_device), weight.to(kernel_device), tf32=False).cpu()
    assert torch.isfinite(got).all()
    assert torch.allclose(got.double(), reference(low, weight), rtol=1e-6, atol=1e-4)


def test_strided_weight_view_as_the_output_layer_passes_it(kernel_device):
    """[G_l | bias | 1][:, :-1]: a view whose rows are one element longer than K."""
    gen = torch.Generator().manual_seed(7)
    full = torch.randn(500, 12, generator=gen)
    low = torch.randn(40, 11, generator=gen)
    weight = full.to(kernel_device)[:, :-1]
    got = lse_kernel.log_sum_exp(low.to(kernel_device), weight, tf32=False).cpu()
    assert torch.allclose(got.double(), reference(low, full[:, :-1]), rtol=1e-6, atol=1e-5)


def test_the_model_normaliser_through_the_kernel_equals_the_plain_one(kernel_device, monkeypatch):
    """The output layer's own call (G_r s with a 1 appended, [G_l | bias]) gives what it gives without."""
    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=50, tgt_vocab_size=700, hidden=16, embedding=8, maxout_units=8,
                         output_rank=6, init_std=0.5)
    model = RNNEncoderDecoder(config).eval().to(kernel_device)
    low = torch.randn(90, 6, device=kernel_device) * 3
    with torch.inference_mode():
        matrix = output_matrix(model.out_vocab)
        monkeypatch.setattr("rescorer.model.normalizer.use_kernel", lambda low: False)
        plain = log_normalizer(low, torch.float32, matrix)
        monkeypatch.setattr("rescorer.model.normalizer.use_kernel", lambda low: True)
        fused = log_normalizer(low, torch.float32, matrix)
    assert torch.allclose(fused.cpu(), plain.cpu(), rtol=1e-6, atol=1e-5)


def test_bf16_operands_accumulate_in_fp32(kernel_device):
    if kernel_device.type != "cuda":
        pytest.skip("Triton's interpreter has no bf16 (NumPy reads the raw bits): checked on a GPU")
    gen = torch.Generator().manual_seed(3)
    low = torch.randn(64, 33, generator=gen).bfloat16()
    weight = torch.randn(200, 33, generator=gen).bfloat16()
    got = lse_kernel.log_sum_exp(low.to(kernel_device), weight.to(kernel_device)).cpu()
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), reference(low.float(), weight.float()), rtol=1e-5, atol=1e-3)


def test_tf32_products_round_their_operands_to_nearest(kernel_device):
    """TF32 operands are rounded (as cuBLAS does), not truncated: the error is unbiased.

    The interpreter multiplies the rounded fp32 values exactly, which checks the rounding itself;
    on a GPU the tensor cores then multiply them exactly too (TF32 × TF32 fits fp32).
    """
    gen = torch.Generator().manual_seed(11)
    low = torch.randn(256, 101, generator=gen) * 3
    weight = torch.randn(3000, 101, generator=gen) * 0.3

    def rounded(x: torch.Tensor) -> torch.Tensor:  # nearest TF32, ties away from zero, in fp32 bits
        return ((x.view(torch.int32) + 0x1000) & -8192).view(torch.float32)

    got = lse_kernel.log_sum_exp(low.to(kernel_device), weight.to(kernel_device), tf32=True).cpu().double()
    expected = reference(rounded(low), rounded(weight))
    assert torch.allclose(got, expected, rtol=1e-6, atol=2e-5), (got - expected).abs().max()
    truncated = reference(low.view(torch.int32).bitwise_and(-8192).view(torch.float32),
                          weight.view(torch.int32).bitwise_and(-8192).view(torch.float32))
    assert (got - truncated).abs().max() > 1e-3  # it would tell truncation apart
