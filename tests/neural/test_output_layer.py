"""The training path of the softmax output layer (neural.output_layer) against autograd on the plain
log-softmax, in float64, with any vocabulary block; and its bf16 adds in one dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from neural.output_layer import target_log_probs


@pytest.mark.parametrize("block", [1, 4, 7, 31, 1000])
def test_output_layer_gradients_with_any_vocabulary_block(block: int) -> None:
    g = torch.Generator().manual_seed(block)
    low = torch.randn(9, 3, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(31, 3, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(31, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.tensor([0, 30, 5, 5, 17, 1, 29, 0, 12])
    upstream = torch.randn(9, dtype=torch.float64, generator=g)
    plain = F.log_softmax(low @ weight.t() + bias, dim=-1).gather(1, targets[:, None])[:, 0]
    fast = target_log_probs(low, weight, bias, targets, block)
    torch.testing.assert_close(fast, plain, atol=1e-12, rtol=0)
    for a, b in zip(torch.autograd.grad((fast * upstream).sum(), (low, weight, bias)),
                    torch.autograd.grad((plain * upstream).sum(), (low, weight, bias)), strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_output_layer_backward_twice_through_a_retained_graph() -> None:
    """Backward reads what forward kept without changing it, so a second backward agrees."""
    g = torch.Generator().manual_seed(7)
    low = torch.randn(6, 3, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(20, 3, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.zeros(20, dtype=torch.float64, requires_grad=True)
    out = target_log_probs(low, weight, bias, torch.arange(6), block=8).sum()
    first = torch.autograd.grad(out, (low, weight), retain_graph=True)
    second = torch.autograd.grad(out, (low, weight))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_output_layer_survives_logits_far_from_zero() -> None:
    """The running log-sum-exp must not overflow where one logit is ~1000 (exp would be inf)."""
    low = torch.tensor([[1000.0], [-1000.0]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[1.0], [0.5], [-1.0]], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    fast = target_log_probs(low, weight, bias, torch.tensor([1, 2]), block=1)
    plain = F.log_softmax(low @ weight.t() + bias, dim=-1)[[0, 1], [1, 2]]
    torch.testing.assert_close(fast, plain)
    fast.sum().backward()
    assert torch.isfinite(low.grad).all() and torch.isfinite(weight.grad).all()


class _MixedDtypeAdds(TorchDispatchMode):
    """Records the element-wise adds whose two tensor operands differ in dtype (a slow converting loop)."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[tuple[torch.dtype, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.add.Tensor, torch.ops.aten.add_.Tensor, torch.ops.aten.add.out) \
                and isinstance(args[1], torch.Tensor) and args[1].dim() > 0 and args[0].dtype != args[1].dtype:
            self.mixed.append((args[0].dtype, args[1].dtype))
        return func(*args, **(kwargs or {}))


def test_output_layer_under_bf16_adds_its_bias_in_one_dtype() -> None:
    """The bf16 logits are widened to fp32 before the fp32 bias is added: the same values as the
    mixed add, without its per-element conversion (1.5× the time on a 1,024-word block)."""
    g = torch.Generator().manual_seed(0)
    low, weight = torch.randn(40, 6, generator=g), torch.randn(300, 6, generator=g, requires_grad=True)
    bias, targets = torch.randn(300, generator=g), torch.randint(0, 300, (40,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16), _MixedDtypeAdds() as adds:
        fast = target_log_probs(low, weight, bias, targets, block=64)
    assert adds.mixed == []
    low_bf16, weight_bf16 = low.bfloat16().float(), weight.detach().bfloat16().float()
    logits = (low.bfloat16() @ weight.detach().bfloat16().t()).float() + bias  # bf16 products, fp32 softmax
    picked = (low_bf16 * weight_bf16[targets]).sum(1) + bias[targets]
    expected = picked - logits.logsumexp(1)
    torch.testing.assert_close(fast, expected, rtol=0, atol=1e-5)
