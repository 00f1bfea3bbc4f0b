"""The batched beam search: the same targets as one source at a time, with the model's exact log p."""

from __future__ import annotations

import itertools

import pytest
import torch

from neural.vocab import EOS_ID
from rescorer.model import block_sizes
from rescorer.model.config import ModelConfig
from rescorer.model.generation import next_word_log_probs, next_word_top_k, start_decoding
from rescorer.model.network import RNNEncoderDecoder
from rescorer.proposals.beam import beam_search_batch, encode_sources, search_sources

SOURCES = [[2], [3, 4], [4, 2, 5], [5, 5], [2, 3, 4, 5, 6], [6]]


def _model(seed: int = 3, *, dtype: torch.dtype = torch.float64, vocab: int = 9, eos_bias: float = 1.0):
    torch.manual_seed(seed)
    config = ModelConfig(src_vocab_size=7, tgt_vocab_size=vocab, hidden=12, embedding=5, maxout_units=6,
                         output_rank=4, init_std=0.7)
    model = RNNEncoderDecoder(config).to(dtype).eval()
    with torch.no_grad():
        model.out_vocab.bias[EOS_ID] = eos_bias
    return model


def _scores(model: RNNEncoderDecoder, c: torch.Tensor, targets: list[tuple[int, ...]]) -> list[float]:
    """log p(Y | X) of each target for the one summary c [1, d], by the scoring path."""
    length = max(len(t) for t in targets) + 1
    tgt = torch.zeros(len(targets), length, dtype=torch.long)
    for row, ids in enumerate(targets):
        tgt[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    lengths = torch.tensor([len(t) + 1 for t in targets])
    with torch.no_grad():
        return model.score_targets(c.expand(len(targets), -1), tgt, lengths).tolist()


@pytest.mark.parametrize("width", [1, 3, 7])
def test_a_batch_of_sources_finds_what_each_source_finds_alone(width) -> None:
    model = _model()
    c = encode_sources(model, SOURCES, torch.device("cpu"))
    together = beam_search_batch(model, c, width, max_words=6)
    alone = [beam_search_batch(model, c[i : i + 1], width, max_words=6)[0] for i in range(len(SOURCES))]
    assert len(together) == len(SOURCES)
    for mine, single in zip(together, alone, strict=True):
        assert [h.ids for h in mine] == [h.ids for h in single]
        assert [h.log_p for h in mine] == pytest.approx([h.log_p for h in single], abs=1e-12)
        assert 1 <= len(mine) <= width


def test_finished_targets_carry_the_exact_log_p_of_score_targets() -> None:
    for dtype, tolerance in [(torch.float64, 1e-10), (torch.float32, 2e-5)]:
        model = _model(dtype=dtype)
        c = encode_sources(model, SOURCES, torch.device("cpu"))
        for i, found in enumerate(beam_search_batch(model, c, 5, max_words=8)):
            done = [h for h in found if h.finished]
            assert done, "every source finishes some target within 8 words"
            assert all(EOS_ID not in h.ids for h in done)
            assert [h.log_p for h in done] == sorted((h.log_p for h in done), reverse=True)
            expected = _scores(model, c[i : i + 1], [h.ids for h in done])
            assert [h.log_p for h in done] == pytest.approx(expected, abs=tolerance)


def test_a_wide_beam_is_exact_search_on_a_tiny_vocabulary() -> None:
    """Wider than every expansion: the best short targets are exactly the brute-force best."""
    model = _model(vocab=5, eos_bias=1.5)
    c = encode_sources(model, SOURCES[:3], torch.device("cpu"))
    found = beam_search_batch(model, c, 200, max_words=4)
    words = range(1, 5)
    short = [()] + [t for k in (1, 2, 3) for t in itertools.product(words, repeat=k)]
    for i, hypotheses in enumerate(found):
        brute = dict(zip(short, _scores(model, c[i : i + 1], short), strict=True))
        best = sorted(short, key=lambda t: -brute[t])[:6]
        by_ids = {h.ids: h.log_p for h in hypotheses if h.finished}
        assert [by_ids[t] for t in best] == pytest.approx([brute[t] for t in best], abs=1e-10)
        assert [h.ids for h in hypotheses if h.finished and len(h.ids) <= 3][:6] == best


def test_targets_are_cut_at_max_words_and_scored_without_their_missing_end() -> None:
    model = _model(eos_bias=-8.0)  # </s> is very unlikely: most hypotheses run to the limit
    c = encode_sources(model, SOURCES[:2], torch.device("cpu"))
    for i, found in enumerate(beam_search_batch(model, c, 4, max_words=3)):
        assert all(len(h.ids) <= 3 for h in found)
        cut = [h for h in found if not h.finished]
        assert cut and all(len(h.ids) == 3 for h in cut)
        steps = torch.tensor([list(h.ids) + [EOS_ID] for h in cut])
        with torch.no_grad():
            per_word = model.token_logprobs(c[i : i + 1].expand(len(cut), -1), steps, torch.full((len(cut),), 4))
        assert [h.log_p for h in cut] == pytest.approx(per_word[:, :3].sum(1).tolist(), abs=1e-10)


def test_search_in_small_batches_gives_the_same_targets() -> None:
    model = _model()
    whole = list(search_sources(model, SOURCES, 3, max_words=6))
    pieces = list(search_sources(model, SOURCES, 3, max_words=6, rows_per_step=4))  # one source per batch
    assert [[h.ids for h in f] for f in whole] == [[h.ids for h in f] for f in pieces]
    with pytest.raises(ValueError, match="width"):
        list(search_sources(model, SOURCES, 0))


def test_the_top_k_step_is_the_log_probability_steps_best_k(monkeypatch) -> None:
    monkeypatch.setattr(block_sizes, "CPU_GENERATION_BLOCK_ROWS", 3)  # several blocks of rows
    for dtype, tolerance in [(torch.float64, 1e-12), (torch.float32, 1e-5)]:
        model = _model(dtype=dtype)
        rows = torch.tensor([0, 0, 1, 2, 3, 4, 5, 5])
        prev = torch.tensor([2, 3, 4, 5, 6, 7, 8, 2])
        with torch.inference_mode():
            start = start_decoding(model, encode_sources(model, SOURCES, torch.device("cpu")))
            h = start.state[rows]
            h_full, log_probs = next_word_log_probs(model, start, rows, h, prev)
            h_top, values, ids = next_word_top_k(model, start, rows, h, prev, 4)
        expected_values, expected_ids = log_probs.topk(4, dim=1)
        assert torch.equal(h_full, h_top) and torch.equal(ids, expected_ids)
        torch.testing.assert_close(values, expected_values, rtol=0, atol=tolerance)


def test_a_bf16_search_finds_the_fp32_targets_with_log_p_close_to_them() -> None:
    """``amp_dtype=bfloat16``: the matmuls in bf16, the states and log-softmax in fp32;
    on a vocabulary with clear winners the same targets, each log p within 0.02 nats per word step
    of fp32's (the bound scoring's mean |Δ log p| is held to)."""
    model = _model(dtype=torch.float32, vocab=40)
    exact = list(search_sources(model, SOURCES, 3, max_words=6))
    mixed = list(search_sources(model, SOURCES, 3, max_words=6, amp_dtype=torch.bfloat16))
    differs = False
    for a, b in zip(exact, mixed, strict=True):
        assert [h.ids for h in a] == [h.ids for h in b]
        for x, y in zip(a, b, strict=True):
            assert abs(x.log_p - y.log_p) <= 0.02 * (len(x.ids) + 1), (x, y)
            differs |= x.log_p != y.log_p
    assert differs  # it did run in bf16


def test_the_collecting_search_keeps_every_finished_target_of_a_full_beam_at_every_length() -> None:
    """collect=True (the reranking's candidates): finished targets do not take a slot, so each source
    keeps `width` live hypotheses to max_words and returns every target ended on the way, exact log p."""
    model = _model(eos_bias=1.5, vocab=5)  # few words: </s> is often among a step's best extensions
    c = encode_sources(model, SOURCES, torch.device("cpu"))
    plain = beam_search_batch(model, c, 3, max_words=6)
    collected = beam_search_batch(model, c, 3, max_words=6, collect=True)
    for i, (few, many) in enumerate(zip(plain, collected, strict=True)):
        assert all(h.finished for h in many) and len({h.ids for h in many}) == len(many)
        assert [h.log_p for h in many] == sorted((h.log_p for h in many), reverse=True)
        if many:
            expected = _scores(model, c[i : i + 1], [h.ids for h in many])
            assert [h.log_p for h in many] == pytest.approx(expected, abs=1e-10)
        assert len(few) <= 3  # the plain search stops at `width` finished targets
    assert sum(len(many) > 3 for many in collected) >= 3
    assert max(len(h.ids) for many in collected for h in many) > max(len(h.ids) for few in plain for h in few
                                                                     if h.finished)
