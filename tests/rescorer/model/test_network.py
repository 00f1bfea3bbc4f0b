"""The RNN Encoder–Decoder against SPEC §1: equations, normalisation, masking, gradients, init."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rescorer.model.config import ModelConfig
from rescorer.model.flops import count_flops_per_pair
from rescorer.model.generation import next_word_log_probs, start_decoding, top_k_by_chunks
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.normalizer import log_normalizer, output_matrix

SMALL = ModelConfig(src_vocab_size=9, tgt_vocab_size=8, hidden=6, embedding=4, maxout_units=5, output_rank=3)
RECURRENT = ("enc_rec_gates.weight", "enc_rec_cand.weight", "dec_rec.weight")


def _randomised(config: ModelConfig, seed: int, std: float = 0.5) -> RNNEncoderDecoder:
    """A model whose every parameter (biases included) is random, so each term shows in the output."""
    torch.manual_seed(seed)
    model = RNNEncoderDecoder(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, std)
    return model


def _batch(seqs: list[list[int]], pad: int = 0, extra: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into [B, max_len + extra] and return it with the lengths."""
    width = max(len(s) for s in seqs) + extra
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
    return ids, torch.tensor([len(s) for s in seqs])


def _decode_steps(model: RNNEncoderDecoder, c: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder states h'⟨t⟩ [B, T, d] and log p(· | y_<t, X) [B, T, V] along ``tgt`` [B, T].

    By the decoder step generation runs (rescorer.analysis.sampling), fed ``tgt`` as the previous words.
    """
    start = start_decoding(model, c)
    h, prev, states, dists = start.state, None, [], []
    for t in range(tgt.shape[1]):
        h, log_probs = next_word_log_probs(model, start, torch.arange(tgt.shape[0]), h, prev)
        states.append(h)
        dists.append(log_probs)
        prev = tgt[:, t]
    return torch.stack(states, dim=1), torch.stack(dists, dim=1)


# ----------------------------------------------------------------------------- NumPy reference


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class NumpyReference:
    """SPEC §1 written out step by step, one sequence at a time, in float64.

    Only the parameter layout documented in rescorer/model/network.py is shared with the module: the
    blocks are read out of its parameters and every equation is re-implemented here.
    """

    def __init__(self, model: RNNEncoderDecoder) -> None:
        p = {name: t.detach().double().numpy().copy() for name, t in model.named_parameters()}
        d = model.config.hidden
        self.E_x, self.E_y = p["src_embed.weight"], p["tgt_embed.weight"]
        w, b = p["enc_input.weight"], p["enc_input.bias"]
        self.W_r, self.W_z, self.W = w[:d], w[d : 2 * d], w[2 * d :]
        self.b_r, self.b_z, self.b = b[:d], b[d : 2 * d], b[2 * d :]
        u = p["enc_rec_gates.weight"]
        self.U_r, self.U_z, self.U = u[:d], u[d:], p["enc_rec_cand.weight"]
        self.V, self.b_V = p["enc_summary.weight"], p["enc_summary.bias"]
        self.V2, self.b_V2 = p["dec_init.weight"], p["dec_init.bias"]
        w, b = p["dec_input.weight"], p["dec_input.bias"]
        self.W2_r, self.W2_z, self.W2 = w[:d], w[d : 2 * d], w[2 * d :]
        self.b2_r, self.b2_z, self.b2 = b[:d], b[d : 2 * d], b[2 * d :]
        u = p["dec_rec.weight"]
        self.U2_r, self.U2_z, self.U2 = u[:d], u[d : 2 * d], u[2 * d :]
        cc = p["dec_context.weight"]
        self.C_r, self.C_z, self.C = cc[:d], cc[d : 2 * d], cc[2 * d :]
        self.b_in = p["dec_cand_bias"]
        self.O_h, self.O_y = p["out_hidden.weight"], p["out_prev.weight"]
        self.O_c, self.b_o = p["out_context.weight"], p["out_context.bias"]
        self.G_r = p["out_rank.weight"]
        self.G_l, self.b_G = p["out_vocab.weight"], p["out_vocab.bias"]
        self.d, self.emb = d, model.config.embedding

    def encoder_states(self, xs: list[int]) -> list[np.ndarray]:
        h = np.zeros(self.d)
        states = []
        for x in xs:
            e = self.E_x[x]
            r = _sigmoid(self.W_r @ e + self.b_r + self.U_r @ h)
            z = _sigmoid(self.W_z @ e + self.b_z + self.U_z @ h)
            h_tilde = np.tanh(self.W @ e + self.b + self.U @ (r * h))  # reset BEFORE the product
            h = z * h + (1 - z) * h_tilde
            states.append(h)
        return states

    def encode(self, xs: list[int]) -> np.ndarray:
        return np.tanh(self.V @ self.encoder_states(xs)[-1] + self.b_V)

    def decode(self, c: np.ndarray, ys: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Decoder states and the full log-distributions at each step."""
        h = np.tanh(self.V2 @ c + self.b_V2)
        e_prev = np.zeros(self.emb)  # e(y_0) = 0
        states, dists = [], []
        for y in ys:
            r = _sigmoid(self.W2_r @ e_prev + self.b2_r + self.U2_r @ h + self.C_r @ c)
            z = _sigmoid(self.W2_z @ e_prev + self.b2_z + self.U2_z @ h + self.C_z @ c)
            # reset AFTER the product, on (U' h' + C c)
            h_tilde = np.tanh(self.W2 @ e_prev + self.b2 + r * (self.U2 @ h + self.C @ c + self.b_in))
            h = z * h + (1 - z) * h_tilde
            s_prime = self.O_h @ h + self.O_y @ e_prev + self.O_c @ c + self.b_o
            s = np.array([max(s_prime[2 * i], s_prime[2 * i + 1]) for i in range(len(s_prime) // 2)])
            logits = self.G_l @ (self.G_r @ s) + self.b_G
            top = logits.max()
            dists.append(logits - (top + math.log(np.exp(logits - top).sum())))
            states.append(h)
            e_prev = self.E_y[y]
        return states, dists

    def log_prob(self, xs: list[int], ys: list[int]) -> float:
        _, dists = self.decode(self.encode(xs), ys)
        return float(sum(dist[y] for dist, y in zip(dists, ys, strict=True)))


PAIRS = [
    ([3, 4, 5, 0], [2, 6, 0]),
    ([8, 0], [7, 3, 5, 1, 0]),
    ([1, 2, 7, 7, 6, 0], [0]),
]


@pytest.fixture(scope="module")
def reference_pair() -> tuple[RNNEncoderDecoder, NumpyReference]:
    model = _randomised(SMALL, seed=11).double()
    return model, NumpyReference(model)


def test_encoder_steps_match_numpy_reference(
    reference_pair: tuple[RNNEncoderDecoder, NumpyReference],
) -> None:
    """Every encoder step h⟨t⟩, seen through ``encode`` of the t-word prefix: c = tanh(V h⟨t⟩ + b).

    The prefixes share one batch padded past the longest (padding id 7), so the short ones also
    show that padding steps leave h⟨N⟩ alone.
    """
    model, ref = reference_pair
    prefixes = [xs[:t] for xs, _ in PAIRS for t in range(1, len(xs) + 1)]
    src, src_len = _batch(prefixes, pad=7, extra=2)
    with torch.no_grad():
        c = model.encode(src, src_len).numpy()
    for b, xs in enumerate(prefixes):
        np.testing.assert_allclose(c[b], ref.encode(xs), atol=1e-10, rtol=0)


def test_decoder_steps_and_log_prob_match_numpy_reference(
    reference_pair: tuple[RNNEncoderDecoder, NumpyReference],
) -> None:
    model, ref = reference_pair
    src, src_len = _batch([s for s, _ in PAIRS])
    tgt, tgt_len = _batch([t for _, t in PAIRS])
    with torch.no_grad():
        c = model.encode(src, src_len)
        states, dists = (x.numpy() for x in _decode_steps(model, c, tgt))
        tokens = model.token_logprobs(c, tgt, tgt_len).numpy()
        scores = model(src, src_len, tgt, tgt_len).numpy()
    for b, (xs, ys) in enumerate(PAIRS):
        ref_states, ref_dists = ref.decode(ref.encode(xs), ys)
        np.testing.assert_allclose(states[b, : len(ys)], np.stack(ref_states), atol=1e-10, rtol=0)
        np.testing.assert_allclose(dists[b, : len(ys)], np.stack(ref_dists), atol=1e-10, rtol=0)
        picked = [dist[y] for dist, y in zip(ref_dists, ys, strict=True)]
        np.testing.assert_allclose(tokens[b, : len(ys)], picked, atol=1e-10, rtol=0)
        assert np.all(tokens[b, len(ys) :] == 0.0)
        assert scores[b] == pytest.approx(ref.log_prob(xs, ys), abs=1e-9)
        assert scores[b] < 0


def test_reset_placement_matters(reference_pair: tuple[RNNEncoderDecoder, NumpyReference]) -> None:
    """Swapping the encoder's reset-before for reset-after changes the states: the test has teeth."""
    model, ref = reference_pair
    xs = PAIRS[0][0]
    h = np.zeros(ref.d)
    for x in xs:
        e = ref.E_x[x]
        r = _sigmoid(ref.W_r @ e + ref.b_r + ref.U_r @ h)
        z = _sigmoid(ref.W_z @ e + ref.b_z + ref.U_z @ h)
        h = z * h + (1 - z) * np.tanh(ref.W @ e + ref.b + r * (ref.U @ h))
    src, src_len = _batch([xs])
    with torch.no_grad():
        got = model.encode(src, src_len)[0].numpy()
    np.testing.assert_allclose(got, ref.encode(xs), atol=1e-10, rtol=0)
    assert np.abs(got - np.tanh(ref.V @ h + ref.b_V)).max() > 1e-3


# ----------------------------------------------------------------------------- normalisation


def test_probabilities_over_all_target_phrases_sum_to_one() -> None:
    """Σ_Y p(Y|X) over phrases of length ≤ L rises monotonically toward 1 (and never exceeds it).

    Telescoping makes it exact: S_L + (mass of the L-word prefixes without </s>) = 1.
    """
    config = ModelConfig(
        src_vocab_size=6, tgt_vocab_size=5, hidden=5, embedding=3, maxout_units=4, output_rank=3
    )
    model = _randomised(config, seed=3, std=0.7).double()
    with torch.no_grad():
        model.out_vocab.bias[0] += 2.5  # p(</s>) ≈ 0.6–0.7 per step, so the tail mass shrinks fast
    words = range(1, config.tgt_vocab_size)  # [UNK] and the 3 real words; </s> ends a phrase
    src, src_len = _batch([[2, 4, 3, 0]])
    sums = []
    with torch.no_grad():
        c = model.encode(src, src_len)
        for length in range(1, 7):
            prefixes = [list(p) for p in itertools.product(words, repeat=length - 1)]
            tgt, tgt_len = _batch([p + [0] for p in prefixes])
            mass = model.score_targets(c.expand(len(prefixes), -1), tgt, tgt_len).exp().sum().item()
            sums.append(mass + (sums[-1] if sums else 0.0))
            open_prefixes = [list(p) for p in itertools.product(words, repeat=length)]
            tgt, tgt_len = _batch(open_prefixes)
            tail = model.score_targets(c.expand(len(open_prefixes), -1), tgt, tgt_len).exp().sum().item()
            assert sums[-1] + tail == pytest.approx(1.0, abs=1e-9)
    assert all(b > a for a, b in itertools.pairwise(sums))
    assert max(sums) <= 1.0 + 1e-6
    assert sums[0] < 0.9  # the model is far from "always </s>", so the test is not trivial
    assert sums[-1] > 0.99


@pytest.fixture(scope="module")
def paper_model() -> RNNEncoderDecoder:
    """The paper-size model (15,000-word shortlists: 15,001 ids), built once for several tests."""
    torch.manual_seed(0)
    return RNNEncoderDecoder(ModelConfig(src_vocab_size=15001, tgt_vocab_size=15001))


def test_paper_size_model_shapes_and_normalised_steps(paper_model: RNNEncoderDecoder) -> None:
    config = paper_model.config
    assert (config.hidden, config.embedding, config.maxout_units, config.output_rank) == (1000, 100, 500, 100)
    assert paper_model.out_vocab.weight.shape == (15001, 100)
    assert paper_model.out_hidden.weight.shape == (1000, 1000)  # s' has 2 × 500 units
    src, src_len = _batch([[5, 17, 14999, 0], [15000, 0]])
    tgt, tgt_len = _batch([[7, 1, 0], [3, 4, 5, 6, 0]])
    with torch.no_grad():
        c = paper_model.encode(src, src_len)
        _, dists = _decode_steps(paper_model, c, tgt)
        scores = paper_model.score_targets(c, tgt, tgt_len)
    assert dists.shape == (2, 5, 15001) and dists.dtype == torch.float32
    torch.testing.assert_close(dists.exp().sum(-1), torch.ones(2, 5), atol=1e-4, rtol=0)
    # at init the network is nearly uniform: log p(Y|X) ≈ −M log V
    expected = -tgt_len.double() * math.log(15001)
    torch.testing.assert_close(scores.double(), expected, atol=0.05, rtol=0)


# ----------------------------------------------------------------------------- masking


def test_scores_independent_of_padding_and_batch_composition() -> None:
    model = _randomised(SMALL, seed=5, std=0.3)
    pairs = [*PAIRS, ([6, 6, 6, 6, 6, 0], [4, 4, 4, 4, 4, 4, 0]), ([2, 0], [3, 0])]
    with torch.no_grad():
        alone = torch.cat([model(*_batch([s]), *_batch([t])) for s, t in pairs])
        src, src_len = _batch([s for s, _ in pairs], pad=7, extra=3)
        tgt, tgt_len = _batch([t for _, t in pairs], pad=5, extra=2)
        batched = model(src, src_len, tgt, tgt_len)
        # reversed order, out-of-range padding ids: still the same scores
        src_r, src_len_r = _batch([s for s, _ in reversed(pairs)], pad=-1, extra=1)
        tgt_r, tgt_len_r = _batch([t for _, t in reversed(pairs)], pad=10**6, extra=4)
        reordered = model(src_r, src_len_r, tgt_r, tgt_len_r).flip(0)
        tokens = model.token_logprobs(model.encode(src, src_len), tgt, tgt_len)
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(reordered, alone, atol=1e-5, rtol=0)
    assert tokens.shape == tgt.shape
    assert torch.all(tokens[torch.arange(tgt.shape[1]) >= tgt_len.unsqueeze(1)] == 0)


def test_bad_lengths_are_rejected() -> None:
    model = RNNEncoderDecoder(SMALL)
    src, src_len = _batch([[3, 0]])
    with pytest.raises(ValueError, match="src_len"):
        model.encode(src, torch.tensor([3]))
    with pytest.raises(ValueError, match="src_len"):
        model.encode(src, torch.tensor([0]))
    with pytest.raises(ValueError, match="tgt_len"):
        model(src, src_len, src, torch.tensor([2, 2]))


# ----------------------------------------------------------------------------- gradients, init


def test_gradient_reaches_every_parameter() -> None:
    model = _randomised(SMALL, seed=9, std=0.3)
    src, src_len = _batch([s for s, _ in PAIRS])
    tgt, tgt_len = _batch([t for _, t in PAIRS])
    loss = -model(src, src_len, tgt, tgt_len).mean()
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_init_orthogonal_recurrent_and_small_gaussian_elsewhere(paper_model: RNNEncoderDecoder) -> None:
    d = paper_model.config.hidden
    eye = torch.eye(d)
    params = dict(paper_model.named_parameters())
    for name in RECURRENT:
        weight = params[name].detach()
        for start in range(0, weight.shape[0], d):
            block = weight[start : start + d]
            torch.testing.assert_close(block @ block.T, eye, atol=2e-5, rtol=0)
    # the stacked blocks are independent draws, not copies of one matrix
    assert not torch.allclose(params["dec_rec.weight"][:d], params["dec_rec.weight"][d : 2 * d])
    for name, param in params.items():
        if name in RECURRENT:
            continue
        if name.endswith("bias"):
            assert torch.count_nonzero(param) == 0, name
        else:
            assert param.std().item() == pytest.approx(0.01, rel=0.03), name
            assert abs(param.mean().item()) < 1e-3, name


def test_init_is_repeatable_under_a_seed() -> None:
    torch.manual_seed(42)
    a = RNNEncoderDecoder(SMALL)
    torch.manual_seed(42)
    b = RNNEncoderDecoder(SMALL)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


# ----------------------------------------------------------------------------- autocast, flops


def test_autocast_keeps_log_softmax_in_float32() -> None:
    """The CUDA bf16/fp16 path, exercised with CPU autocast: logits are cast before the softmax."""
    model = _randomised(SMALL, seed=13, std=0.3)
    src, src_len = _batch([s for s, _ in PAIRS])
    tgt, tgt_len = _batch([t for _, t in PAIRS])
    with torch.no_grad():
        exact = model(src, src_len, tgt, tgt_len)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = model(src, src_len, tgt, tgt_len)
            _, dists = _decode_steps(model, model.encode(src, src_len), tgt)
    assert mixed.dtype == torch.float32 and dists.dtype == torch.float32
    torch.testing.assert_close(mixed, exact, atol=0.15, rtol=0.02)
    torch.testing.assert_close(dists.exp().sum(-1), torch.ones(dists.shape[:2]), atol=1e-5, rtol=0)


def test_cpu_softmax_normaliser_is_exact_also_when_a_rare_word_dominates() -> None:
    """The CPU scoring path shifts later vocabulary blocks by the first block's maximum; a logit
    far above it (here word 4500, in the third block, for half of the rows) must not overflow."""
    config = ModelConfig(src_vocab_size=10, tgt_vocab_size=5000, hidden=8, embedding=4, maxout_units=4, output_rank=6)
    torch.manual_seed(0)
    model = RNNEncoderDecoder(config).eval()
    with torch.no_grad():
        model.out_vocab.weight.normal_(0, 1)
        model.out_vocab.bias.normal_(0, 1)
        model.out_vocab.weight[4500] = torch.tensor([10.0, 0, 0, 0, 0, 0])
        low = torch.randn(64, 6)
        low[::2, 0] = 30.0  # logit of word 4500 about 300 in even rows
        expected = torch.logsumexp(
            low.double() @ model.out_vocab.weight.double().t() + model.out_vocab.bias.double(), dim=-1
        )
        got = log_normalizer(low, torch.float32, output_matrix(model.out_vocab))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-6)


@pytest.mark.parametrize(("src_len", "tgt_len"), [(1, 1), (4, 3), (7, 9)])
def test_flop_count_matches_torch_flop_counter(src_len: int, tgt_len: int) -> None:
    config = ModelConfig(
        src_vocab_size=50, tgt_vocab_size=70, hidden=12, embedding=5, maxout_units=7, output_rank=4
    )
    model = RNNEncoderDecoder(config)
    src = torch.randint(1, 50, (1, src_len))
    tgt = torch.randint(1, 70, (1, tgt_len))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(src, torch.tensor([src_len]), tgt, torch.tensor([tgt_len]))
    assert counter.get_total_flops() == count_flops_per_pair(config, src_len, tgt_len)


@pytest.mark.parametrize(("vocab", "k", "rows"),
                         [(15001, 10, 130), (15001, 1, 3), (640, 10, 5), (100, 4, 2), (129, 2, 0)])
def test_top_k_by_chunks_is_torch_topk(vocab, k, rows):
    """The beam search's top-k through chunk maxima gives torch.topk's values and columns, also when
    the best word is in the tail past the last whole chunk, and for a slice of a wider tensor."""
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(rows, vocab + 7, generator=gen)[:, :vocab] * 3  # not contiguous
    for _ in range(2):
        values, columns = top_k_by_chunks(logits, k)
        expected = logits.topk(k, dim=1)
        assert torch.equal(values, expected.values) and torch.equal(columns, expected.indices)
        logits[:, -1] = 100.0  # now every row's best word is the last one, in the tail
