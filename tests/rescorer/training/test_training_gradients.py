"""The fast training path (hand-written backward of rescorer.model.gru and neural.output_layer) against
autograd on the plain SPEC §1 equations, written out one pair and one step at a time in float64."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rescorer.model.config import ModelConfig
from rescorer.model.gru import decoder_recurrence
from rescorer.model.network import RNNEncoderDecoder

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
