"""The batched scorer: budgets respected, sharing and sorting exact, out-of-memory recovered."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline import scoring
from rescorer.pipeline.scoring import CPU_TOKEN_BUDGET, PairScorer, ScoringOptions, auto_token_budget
from rescorer.pipeline.scoring_plan import source_groups
from rescorer.tables.chunks import TokenIds

CONFIG = ModelConfig(src_vocab_size=30, tgt_vocab_size=40, hidden=16, embedding=8, maxout_units=8, output_rank=6)


def ragged(seqs: list[list[int]]) -> TokenIds:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    ids = np.array([i for s in seqs for i in s], dtype=np.int32)
    return TokenIds(offsets, ids, np.zeros(len(seqs), dtype=np.int32))


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = RNNEncoderDecoder(CONFIG).eval()
    sources = ragged([list(rng.integers(2, 30, rng.integers(1, 8))) for _ in range(12)])
    source_of_row = rng.integers(0, 12, 60)
    targets = ragged([list(rng.integers(2, 40, rng.integers(1, 9))) for _ in range(60)])
    return model, sources, source_of_row, targets


def one_at_a_time(model, sources, source_of_row, targets) -> np.ndarray:
    out = []
    for row, src_index in enumerate(source_of_row):
        s = sources.ids[sources.offsets[src_index] : sources.offsets[src_index + 1]].tolist() + [0]
        t = targets.ids[targets.offsets[row] : targets.offsets[row + 1]].tolist() + [0]
        with torch.no_grad():
            score = model(torch.tensor([s]), torch.tensor([len(s)]), torch.tensor([t]), torch.tensor([len(t)]))
        out.append(score.item())
    return np.array(out)


@pytest.mark.parametrize("share, sort, budget", [(True, True, 64), (False, False, 64), (True, False, 10_000)])
def test_scores_equal_one_pair_at_a_time(problem, share, sort, budget):
    model, sources, source_of_row, targets = problem
    scorer = PairScorer(model, torch.device("cpu"),
                        options=ScoringOptions(token_budget=budget, share_sources=share, sort_by_length=sort))
    got = scorer.score(sources, source_of_row, targets)
    np.testing.assert_allclose(got, one_at_a_time(*problem), atol=1e-5)


def test_batches_respect_the_token_budget(problem):
    model, _, _, targets = problem
    scorer = PairScorer(model, torch.device("cpu"), options=ScoringOptions(token_budget=40))
    lengths = targets.lengths + 1
    batches = scorer._batches(lengths)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    for rows in batches:
        assert len(rows) == 1 or len(rows) * lengths[rows].max() <= 40


def test_out_of_memory_halves_the_batch_and_loses_nothing(problem, monkeypatch):
    model, sources, source_of_row, targets = problem
    expected = PairScorer(model, torch.device("cpu")).score(sources, source_of_row, targets)
    real = scoring.score_prefix_tree
    calls = []

    def flaky(model, c, tree):
        calls.append(tree.rows)
        if tree.rows > 8:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, c, tree)

    monkeypatch.setattr(scoring, "score_prefix_tree", flaky)
    scorer = PairScorer(model, torch.device("cpu"), options=ScoringOptions(token_budget=100_000))
    got = scorer.score(sources, source_of_row, targets)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert max(calls) > 8 and scorer.token_budget < 100_000


def test_other_errors_are_not_swallowed(problem, monkeypatch):
    model, sources, source_of_row, targets = problem
    monkeypatch.setattr(scoring, "score_prefix_tree", lambda *a: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        PairScorer(model, torch.device("cpu")).score(sources, source_of_row, targets)


def test_cpu_budget_is_fixed():
    assert auto_token_budget(torch.device("cpu"), CONFIG) == CPU_TOKEN_BUDGET


def test_gpu_budget_does_not_follow_megabytes_of_free_memory(monkeypatch):
    """Two runs on the same GPU see free memory differ by a few MB: the same budget, so the same
    groups and bytes; the budget is a power of two no larger than half the free memory allows."""
    gib = 1 << 30
    paper = ModelConfig(src_vocab_size=15000, tgt_vocab_size=15000, hidden=1000, embedding=100, maxout_units=500,
                        output_rank=100)
    per_token = 4 * (2 * paper.tgt_vocab_size + 12 * paper.hidden)
    budgets = []
    for free in (40 * gib, 40 * gib - 7 * (1 << 20), 40 * gib + 3 * (1 << 20)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 80 * gib))
        budgets.append(auto_token_budget(torch.device("cuda"), paper))
    assert len(set(budgets)) == 1
    budget = budgets[0]
    raw = min(1 << 20, 40 * gib // 2 // per_token)
    assert budget & (budget - 1) == 0 and raw // 2 < budget <= raw


def test_mixed_precision_path_stays_close(problem):
    """The CUDA bf16 path (autocast matmuls, fp32 states and softmax), run here under CPU autocast."""
    model, sources, source_of_row, targets = problem
    exact = PairScorer(model, torch.device("cpu")).score(sources, source_of_row, targets)
    mixed = PairScorer(model, torch.device("cpu"), amp_dtype=torch.bfloat16).score(sources, source_of_row, targets)
    assert np.isfinite(mixed).all()
    np.testing.assert_allclose(mixed, exact, atol=0.1, rtol=0.02)


def test_source_groups_keep_each_source_whole_within_the_budget(problem):
    """A source's targets are decoded in one group (their shared prefixes once), about 40 tokens a group."""
    _, _, source_of_row, targets = problem
    tokens = targets.lengths + 1
    groups = source_groups(source_of_row, tokens, 40, sort_by_length=True)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(source_of_row)))
    group_of = {}
    for g, rows in enumerate(groups):
        for src in set(source_of_row[rows].tolist()):
            assert group_of.setdefault(src, g) == g  # all of a source's targets decoded together
        largest_source = max(tokens[source_of_row == s].sum() for s in set(source_of_row[rows].tolist()))
        assert tokens[rows].sum() <= 40 + largest_source


def test_a_plan_made_before_the_budget_was_halved_is_made_again(problem, monkeypatch):
    """Plans are built ahead in worker processes; after an out-of-memory halving they must not OOM again."""
    model, sources, source_of_row, targets = problem
    expected = PairScorer(model, torch.device("cpu")).score(sources, source_of_row, targets)
    scorer = PairScorer(model, torch.device("cpu"), options=ScoringOptions(token_budget=100_000))
    early = scorer.plan(sources, source_of_row, targets)
    scorer.token_budget = 40  # as an out-of-memory error would have left it
    calls, real = [], scoring.score_prefix_tree
    monkeypatch.setattr(scoring, "score_prefix_tree",
                        lambda model, c, tree: calls.append(tree.rows) or real(model, c, tree))
    got = scorer.score_plan(early)
    now = scorer.plan(sources, source_of_row, targets)
    assert len(early.decoder_groups) == 1 and len(calls) == len(now.decoder_groups) > 1
    np.testing.assert_allclose(got, expected, atol=1e-6)
