"""The fast training path (hand-written backward of rescorer.model.gru and rescorer.model.output_layer) against
autograd on the plain SPEC §1 equations, written out one pair and one step at a time in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rescorer.model.config import ModelConfig
from rescorer.model.gru import decoder_recurrence
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.output_layer import target_log_probs

CONFIG = ModelConfig(src_vocab_size=23, tgt_vocab_size=31, hidden=7, embedding=5, maxout_units=4, output_rank=3)


def _model(seed: int) -> RNNEncoderDecoder:
    """A float64 model whose every parameter is random, so every term shows in the gradients."""
    torch.manual_seed(seed)
    model = RNNEncoderDecoder(CONFIG).double()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5)
    return model


def plain_log_prob(m: RNNEncoderDecoder, xs: list[int], ys: list[int]) -> torch.Tensor:
    """log p(Y|X) from SPEC §1 as written: matrix-vector products, one step at a time, no batching."""
    d = m.config.hidden
    h = torch.zeros(d, dtype=torch.float64)
    for x in xs:
        a = m.enc_input.weight @ m.src_embed.weight[x] + m.enc_input.bias
        r = torch.sigmoid(a[:d] + m.enc_rec_gates.weight[:d] @ h)
        z = torch.sigmoid(a[d : 2 * d] + m.enc_rec_gates.weight[d:] @ h)
        candidate = torch.tanh(a[2 * d :] + m.enc_rec_cand.weight @ (r * h))
        h = z * h + (1 - z) * candidate
    c = torch.tanh(m.enc_summary.weight @ h + m.enc_summary.bias)
    h = torch.tanh(m.dec_init.weight @ c + m.dec_init.bias)
    u, cw = m.dec_rec.weight, m.dec_context.weight
    e_prev = torch.zeros(m.config.embedding, dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    for y in ys:
        a = m.dec_input.weight @ e_prev + m.dec_input.bias
        r = torch.sigmoid(a[:d] + u[:d] @ h + cw[:d] @ c)
        z = torch.sigmoid(a[d : 2 * d] + u[d : 2 * d] @ h + cw[d : 2 * d] @ c)
        candidate = torch.tanh(a[2 * d :] + r * (u[2 * d :] @ h + cw[2 * d :] @ c + m.dec_cand_bias))
        h = z * h + (1 - z) * candidate
        pre = m.out_hidden.weight @ h + m.out_prev.weight @ e_prev + m.out_context.weight @ c + m.out_context.bias
        s = pre.view(-1, 2).amax(-1)
        logits = m.out_vocab.weight @ (m.out_rank.weight @ s) + m.out_vocab.bias
        total = total + F.log_softmax(logits, -1)[y]
        e_prev = m.tgt_embed.weight[y]
    return total


def _pairs() -> tuple[list[list[int]], list[list[int]]]:
    """Sources and targets of mixed lengths (1 to 7, ties included), each ending in </s> = 0."""
    g = torch.Generator().manual_seed(5)
    src_lens, tgt_lens = [6, 1, 4, 3, 6, 7, 2], [2, 7, 1, 5, 3, 3, 6]
    srcs = [torch.randint(2, CONFIG.src_vocab_size, (n - 1,), generator=g).tolist() + [0] for n in src_lens]
    tgts = [torch.randint(1, CONFIG.tgt_vocab_size, (n - 1,), generator=g).tolist() + [0] for n in tgt_lens]
    return srcs, tgts


def _padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(seqs), max(map(len, seqs))), 3, dtype=torch.long)  # padding ids are arbitrary
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids, torch.tensor([len(s) for s in seqs])


def test_training_gradients_equal_autograd_on_the_plain_equations() -> None:
    model = _model(seed=3)
    srcs, tgts = _pairs()
    weights = torch.randn(len(srcs), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    fast = model(*_padded(srcs), *_padded(tgts))
    fast_grads = torch.autograd.grad((fast * weights).sum(), list(model.parameters()))
    plain = torch.stack([plain_log_prob(model, x, y) for x, y in zip(srcs, tgts, strict=True)])
    plain_grads = torch.autograd.grad((plain * weights).sum(), list(model.parameters()))
    torch.testing.assert_close(fast.detach(), plain.detach(), atol=1e-10, rtol=0)
    for (name, _), a, b in zip(model.named_parameters(), fast_grads, plain_grads, strict=True):
        assert b.abs().max() > 1e-3, f"{name}: the test would not see a wrong gradient"
        torch.testing.assert_close(a, b, atol=1e-8, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


def test_training_values_equal_the_scoring_path() -> None:
    """With gradients on, the model runs rescorer.gru/output_layer; without, the scoring code."""
    model = _model(seed=4)
    srcs, tgts = _pairs()
    batch = (*_padded(srcs), *_padded(tgts))
    with torch.no_grad():
        scored = model(*batch)
    trained = model(*batch)
    assert trained.grad_fn is not None
    torch.testing.assert_close(trained.detach(), scored, atol=1e-12, rtol=0)


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


def test_decoder_recurrence_under_autocast_keeps_states_and_gradients_in_float32() -> None:
    """The GPU mixed-precision path, exercised with CPU bf16 autocast: close to the fp32 result."""
    g = torch.Generator().manual_seed(2)
    d, steps, batch = 8, 5, 4
    args = [torch.randn(batch, d, generator=g), torch.randn(steps, batch, 2 * d, generator=g),
            torch.randn(steps, batch, d, generator=g), torch.randn(batch, d, generator=g),
            torch.randn(3 * d, d, generator=g) * 0.3]
    leaves = [a.requires_grad_() for a in args]
    exact = decoder_recurrence(*leaves)
    exact_grads = torch.autograd.grad(exact.sum(), leaves)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = decoder_recurrence(*leaves)
    mixed_grads = torch.autograd.grad(mixed.sum(), leaves)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed, exact, atol=0.05, rtol=0.05)
    for a, b in zip(mixed_grads, exact_grads, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=0.15, rtol=0.1)


def test_mixed_precision_training_gradients_are_close_to_float32() -> None:
    """The CUDA bf16 path of the whole model (encoder, decoder, output layer), run with CPU autocast."""
    model = _model(seed=6).float()
    srcs, tgts = _pairs()
    batch = (*_padded(srcs), *_padded(tgts))
    exact = torch.autograd.grad(model(*batch).sum(), list(model.parameters()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed_scores = model(*batch)
    assert mixed_scores.dtype == torch.float32
    mixed = torch.autograd.grad(mixed_scores.sum(), list(model.parameters()))
    for (name, _), a, b in zip(model.named_parameters(), mixed, exact, strict=True):
        assert a.dtype == torch.float32, name
        scale = float(b.abs().max())
        torch.testing.assert_close(a, b, atol=0.05 * scale, rtol=0.05, msg=lambda m, n=name: f"{n}: {m}")


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
