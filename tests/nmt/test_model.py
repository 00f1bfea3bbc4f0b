"""The attention encoder–decoder against ground truth: finite differences, a naive per-step sum,
one pair or one sentence at a time, greedy search, a toy task it must learn exactly, and the training
path's hand-written backward (nmt.recurrence, neural.output_layer) against plain autograd."""

from __future__ import annotations

import random

import pytest
import torch

from nmt.model import BOS_ID, EOS_ID, AttentionNMT, NMTConfig, PairBatch, make_batch, pair_log_probs
from nmt.scoring import score_grouped, score_pairs
from nmt.search import beam_search, greedy_search

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float32, **sizes: int) -> AttentionNMT:
    torch.manual_seed(seed)
    config = NMTConfig(**{"src_vocab": 11, "tgt_vocab": 13, "embedding": 6, "hidden": 5, "alignment": 4,
                          "maxout": 3, **sizes})
    model = AttentionNMT(config).to(dtype)
    with torch.no_grad():  # larger weights than the default init: peaked distributions, decisive tests
        for p in model.parameters():
            p.mul_(3.0)
    return model.eval()


def random_ids(rng: random.Random, vocab: int, low: int = 1, high: int = 6) -> list[int]:
    return [rng.randrange(EOS_ID + 1, vocab) for _ in range(rng.randint(low, high))]


def naive_log_prob(model: AttentionNMT, src: list[int], tgt: list[int]) -> float:
    """Σ_i log_softmax(step i)[y_i], one sentence, one step at a time through decoder_step."""
    annotations, first = model.encode(torch.tensor([src + [EOS_ID]]), torch.ones(1, len(src) + 1, dtype=torch.bool))
    keys = model.annotation_keys(annotations)
    mask = torch.ones(1, len(src) + 1, dtype=torch.bool)
    state, total = first, 0.0
    for y_prev, y in zip([BOS_ID] + tgt, tgt + [EOS_ID], strict=True):
        log_probs, state = model.decoder_step(torch.tensor([y_prev]), state, keys, annotations, mask)
        total += float(log_probs[0, y])
    return total


def test_gradients_equal_finite_differences():
    model = tiny_model(dtype=torch.float64, embedding=3, hidden=3, alignment=2, maxout=2).train()
    rng = random.Random(1)
    batch = make_batch([random_ids(rng, 11, 1, 4) for _ in range(3)], [random_ids(rng, 13, 1, 4) for _ in range(3)])
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in model.parameters())

    def loss(*values: torch.Tensor) -> torch.Tensor:
        state = dict(zip(names, values, strict=True))
        out = torch.func.functional_call(model, state, (batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out,
                                                        batch.tgt_mask))
        return -out.double().sum()

    assert torch.autograd.gradcheck(loss, params, eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=True)


def test_attention_weights_sum_to_one_and_ignore_padding():
    model = tiny_model()
    batch = make_batch([[4, 5, 6, 7, 8], [9, 4]], [[5, 6, 7], [8]])
    annotations, first = model.encode(batch.src, batch.src_mask)
    _, weights = model.decoder_outputs(annotations, first, batch.src_mask, batch.tgt_in)
    assert torch.allclose(weights.sum(-1), torch.ones(2, weights.shape[1]), atol=1e-6)
    assert torch.all(weights[1, :, 3:] == 0)  # the short source has 2 units + EOS
    assert torch.all(weights[0] > 0)


def test_padding_a_batch_changes_no_score():
    model = tiny_model(dtype=torch.float64)
    rng = random.Random(2)
    sources = [random_ids(rng, 11) for _ in range(6)]
    targets = [random_ids(rng, 13) for _ in range(6)]
    together = pair_log_probs(model, make_batch(sources, targets))
    alone = torch.cat([pair_log_probs(model, make_batch([s], [t])) for s, t in zip(sources, targets, strict=True)])
    assert torch.allclose(together, alone, atol=1e-10)
    assert len({len(s) for s in sources}) > 1 and len({len(t) for t in targets}) > 1  # padding did happen


def test_the_scorer_equals_the_naive_sum_of_per_step_log_softmax():
    model = tiny_model()
    rng = random.Random(3)
    sources = [random_ids(rng, 11) for _ in range(8)]
    targets = [random_ids(rng, 13) for _ in range(8)]
    with torch.no_grad():
        naive = [naive_log_prob(model, s, t) for s, t in zip(sources, targets, strict=True)]
    scored = score_pairs(model, sources, targets)
    assert scored == pytest.approx(naive, abs=1e-5)
    normalised = score_pairs(model, sources, targets, normalize=True)
    assert normalised == pytest.approx([v / (len(t) + 1) for v, t in zip(naive, targets, strict=True)], abs=1e-5)
    assert max(abs(v) for v in naive) > 1  # not a flat model


def test_batched_nbest_scoring_equals_one_hypothesis_at_a_time():
    model = tiny_model()
    rng = random.Random(4)
    sources = [random_ids(rng, 11) for _ in range(3)]
    groups = [0, 0, 0, 1, 1, 2, 2, 2, 2]
    hypotheses = [random_ids(rng, 13, 1, 8) for _ in groups]
    batched = score_grouped(model, sources, groups, hypotheses, batch_rows=3)
    alone = [score_grouped(model, [sources[g]], [0], [h])[0] for g, h in zip(groups, hypotheses, strict=True)]
    assert batched == pytest.approx(alone, abs=1e-5)


def test_hypotheses_sharing_prefixes_score_as_each_alone_through_the_naive_sum():
    """An n-best list's hypotheses share their prefixes (decoded once each); a hypothesis that is a
    prefix of another, one seen twice and an empty one each get the naive per-step sum of their own."""
    model = tiny_model()
    rng = random.Random(6)
    sources = [random_ids(rng, 11) for _ in range(4)]
    stems = [random_ids(rng, 13, 3, 6) for _ in sources]
    groups, hypotheses = [], []
    for g, stem in enumerate(stems):
        variants = [stem, stem[:2], stem + random_ids(rng, 13, 1, 3), stem[:1] + random_ids(rng, 13, 1, 4), stem, []]
        variants += [stem[:rng.randint(0, len(stem))] + random_ids(rng, 13, 1, 3) for _ in range(6)]
        groups += [g] * len(variants)
        hypotheses += variants
    order = list(range(len(groups)))
    rng.shuffle(order)  # the n-best scorer is given hypotheses in any order
    groups, hypotheses = [groups[i] for i in order], [hypotheses[i] for i in order]
    with torch.no_grad():
        naive = [naive_log_prob(model, sources[g], h) for g, h in zip(groups, hypotheses, strict=True)]
        forced = pair_log_probs(model, make_batch([sources[g] for g in groups], hypotheses)).tolist()
    for rows in (1, 5, 512):  # chunks of sources, and depths split across steps
        scored = score_grouped(model, sources, groups, hypotheses, batch_rows=rows)
        assert scored == pytest.approx(naive, abs=1e-5)
        assert scored == pytest.approx(forced, abs=1e-5)  # and the teacher-forced training path's
    assert len({round(v, 6) for v in naive}) > len(naive) // 2  # distinct values: not a flat model


def test_batched_beam_search_equals_one_sentence_at_a_time_and_beam_one_is_greedy():
    model = tiny_model()
    rng = random.Random(5)
    sources = [random_ids(rng, 11) for _ in range(5)]
    batched = beam_search(model, sources, beam=4, nbest=4)
    for source, found in zip(sources, batched, strict=True):
        alone = beam_search(model, [source], beam=4, nbest=4)[0]
        assert [h.ids for h in found] == [h.ids for h in alone]
        assert [h.log_prob for h in found] == pytest.approx([h.log_prob for h in alone], abs=1e-5)
        for h in found:  # the search's log-probabilities are the model's
            with torch.no_grad():
                assert h.log_prob == pytest.approx(naive_log_prob(model, source, list(h.ids)), abs=1e-4)
        assert len(found) == 4 and found[0].log_prob >= found[-1].log_prob
    greedy = greedy_search(model, sources)
    beam_one = beam_search(model, sources, beam=1)
    assert [h.ids for h in greedy] == [b[0].ids for b in beam_one]
    assert [h.log_prob for h in greedy] == pytest.approx([b[0].log_prob for b in beam_one], abs=1e-6)
    wider = beam_search(model, sources, beam=8)
    assert all(w[0].log_prob >= g.log_prob - 1e-6 for w, g in zip(wider, greedy, strict=True))
    assert any(w[0].log_prob > g.log_prob + 1e-6 for w, g in zip(wider, greedy, strict=True))


def reference_beam(model: AttentionNMT, src: list[int], beam: int,
                   max_length: int) -> list[tuple[tuple[int, ...], float]]:
    """SPEC §7's search written plainly for one sentence: every prefix rescored from the start, all
    expansions ranked together, each hypothesis that ends narrowing the beam by one."""
    live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    finished: list[tuple[tuple[int, ...], float]] = []
    width = beam
    while width > 0 and live:
        candidates = []
        for prefix, _ in live:
            total = naive_log_prob(model, src, list(prefix)) - _final_eos(model, src, list(prefix))
            log_probs = _next_log_probs(model, src, list(prefix))
            units = [EOS_ID] if len(prefix) + 1 >= max_length else range(log_probs.shape[0])
            candidates += [(prefix + (u,), total + float(log_probs[u])) for u in units]
        candidates.sort(key=lambda c: -c[1])
        live = []
        for ids, value in candidates[:width]:
            if ids[-1] == EOS_ID:
                finished.append((ids[:-1], value))
            else:
                live.append((ids, value))
        width -= sum(1 for ids, _ in candidates[:width] if ids[-1] == EOS_ID)
    return sorted(finished, key=lambda f: -f[1])


def _next_log_probs(model: AttentionNMT, src: list[int], prefix: list[int]) -> torch.Tensor:
    annotations, first = model.encode(torch.tensor([src + [EOS_ID]]), torch.ones(1, len(src) + 1, dtype=torch.bool))
    keys, mask, state = model.annotation_keys(annotations), torch.ones(1, len(src) + 1, dtype=torch.bool), first
    for y_prev in [BOS_ID] + prefix:
        log_probs, state = model.decoder_step(torch.tensor([y_prev]), state, keys, annotations, mask)
    return log_probs[0]


def _final_eos(model: AttentionNMT, src: list[int], prefix: list[int]) -> float:
    return float(_next_log_probs(model, src, prefix)[EOS_ID])


@torch.no_grad()
def test_the_beam_search_is_the_reference_search_narrowing_by_one_as_each_hypothesis_ends():
    model = tiny_model(seed=7)
    model.output.bias[EOS_ID] += 2.0  # hypotheses end at different lengths, most before the limit
    rng = random.Random(7)
    sources = [random_ids(rng, 11, 1, 3) for _ in range(3)]
    found = beam_search(model, sources, beam=3, nbest=10, max_length=8)  # every hypothesis that ended
    for source, hypotheses in zip(sources, found, strict=True):
        assert len(hypotheses) == 3  # the beam closed after 3 ended
        expected = reference_beam(model, source, 3, 8)
        assert [h.ids for h in hypotheses] == [ids for ids, _ in expected]
        assert [h.log_prob for h in hypotheses] == pytest.approx([v for _, v in expected], abs=1e-5)


def test_the_searches_stop_at_the_length_limit_with_eos():
    model = tiny_model()
    with torch.no_grad():
        model.output.bias[EOS_ID] = -1e4  # EOS never wins: only the limit ends a hypothesis
    found = beam_search(model, [[4, 5]], beam=3, max_length=4)[0][0]
    assert len(found.ids) == 3 and found.log_prob < -1e3
    assert [h.ids for h in beam_search(model, [[4, 5]], beam=3, nbest=3, max_length=1)[0]] == [()]
    assert len(greedy_search(model, [[4, 5]], max_length=4)[0].ids) == 3


@pytest.mark.slow
def test_a_tiny_model_learns_to_reverse_and_translates_exactly():
    torch.manual_seed(0)
    rng = random.Random(0)
    model = AttentionNMT(NMTConfig(src_vocab=10, tgt_vocab=10, embedding=16, hidden=24, alignment=16, maxout=16))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    steps = 160
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1 - i / steps)
    for _ in range(steps):
        sources = [random_ids(rng, 10, 1, 5) for _ in range(32)]
        batch = make_batch(sources, [s[::-1] for s in sources])
        loss = -pair_log_probs(model, batch).sum() / batch.target_tokens
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    model.eval()
    tests = [random_ids(rng, 10, 1, 5) for _ in range(40)]
    with torch.no_grad():
        batch = make_batch(tests, [s[::-1] for s in tests])
        assert float(-pair_log_probs(model, batch).sum() / batch.target_tokens) < 0.02
    found = beam_search(model, tests, beam=3)
    assert [list(f[0].ids) for f in found] == [s[::-1] for s in tests]


def test_decoded_hypotheses_are_single_spaced_even_when_cut_after_a_word_boundary():
    """A hypothesis cut at the length limit can end in the word-boundary unit alone; its text must not
    end in a blank (Moses' n-best format and BLEU would read an empty token)."""
    from nmt.subwords import train_subwords

    subwords = train_subwords(["le chat est noir", "la maison est grande", "un chat noir"] * 20, 400)
    boundary = subwords.processor.piece_to_id("▁")
    ids = subwords.encode(["le chat"])[0]
    assert subwords.decode([ids + [boundary], [boundary] + ids + [boundary, boundary]]) == ["le chat", "le chat"]


# ----------------------------------------------------------------------------- the training path

HAND_WRITTEN = {"_EncoderRecurrenceBackward", "_DecoderRecurrenceBackward", "_TargetLogProbsBackward"}


def graph_nodes(tensor: torch.Tensor) -> set[str]:
    """The names of the backward nodes ``tensor`` depends on."""
    seen, todo, names = set(), [tensor.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def gradients(model: AttentionNMT, batch: PairBatch, *, hand_written: bool,
              row: int | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The pairs' log p and each parameter's gradient of their sum (of pair ``row`` alone if given)."""
    model.hand_written_backward = hand_written
    model.zero_grad(set_to_none=True)
    log_probs = pair_log_probs(model, batch)
    assert (graph_nodes(log_probs) >= HAND_WRITTEN) == hand_written  # the path under test is the one taken
    (log_probs.sum() if row is None else log_probs[row]).backward()
    return log_probs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def padded_batch(seed: int, pairs: int = 5) -> PairBatch:
    rng = random.Random(seed)
    return make_batch([random_ids(rng, 11, 1, 7) for _ in range(pairs)],
                      [random_ids(rng, 13, 1, 7) for _ in range(pairs)])


def assert_same_gradients(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rtol: float) -> None:
    for name, value in expected.items():
        scale = float(value.abs().max())
        assert scale > 0, name  # every parameter takes part
        assert float((got[name] - value).abs().max()) <= rtol * scale, name


@pytest.mark.parametrize("seed", [1, 2])
def test_the_hand_written_backward_equals_plain_autograd_for_every_parameter(seed):
    model = tiny_model(seed, dtype=torch.float64).train()
    batch = padded_batch(seed)
    assert not bool(batch.src_mask.all()) and not bool(batch.tgt_mask.all())  # padding on both sides
    plain_values, plain = gradients(model, batch, hand_written=False)
    values, got = gradients(model, batch, hand_written=True)
    torch.testing.assert_close(values, plain_values, rtol=1e-12, atol=1e-12)
    assert_same_gradients(got, plain, rtol=1e-10)


def test_padding_a_batch_changes_no_gradient():
    model = tiny_model(3, dtype=torch.float64).train()
    rng = random.Random(3)
    short = ([5, 6], [7, 8, 9])
    longer = [(random_ids(rng, 11, 6, 8), random_ids(rng, 13, 6, 8)) for _ in range(3)]
    alone = make_batch([short[0]], [short[1]])
    together = make_batch([short[0]] + [s for s, _ in longer], [short[1]] + [t for _, t in longer])
    value_alone, grads_alone = gradients(model, alone, hand_written=True)
    values, grads_in_batch = gradients(model, together, hand_written=True, row=0)
    torch.testing.assert_close(values[:1], value_alone, rtol=1e-12, atol=1e-12)
    assert_same_gradients(grads_in_batch, grads_alone, rtol=1e-10)


def test_under_bf16_autocast_the_hand_written_backward_stays_near_plain_autograd():
    """What a GPU's default training precision runs: matmuls in bf16, states and softmaxes in fp32."""
    model = tiny_model(4, embedding=16, hidden=16, alignment=16, maxout=8).train()
    batch = padded_batch(4, pairs=6)
    _, exact = gradients(model, batch, hand_written=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain_values, plain = gradients(model, batch, hand_written=False)
        values, got = gradients(model, batch, hand_written=True)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, plain_values, rtol=0.03, atol=0.1)
    for name, value in plain.items():
        # bf16 keeps 8 bits: both paths are ~1% from fp32, and no nearer to each other
        scale = float(exact[name].abs().max())
        assert float((got[name] - exact[name]).abs().max()) <= 0.05 * scale, name
        assert float((value - exact[name]).abs().max()) <= 0.05 * scale, name
