"""Reranking fixed n-best lists: columns, 1-best, tuning on the lists, and the oracle against brute force."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from mert.bleu import References, bleu_stats_batch, corpus_bleu
from mert.rerank import (
    RerankError,
    bleu_statistics,
    one_best,
    oracle_bleu,
    oracle_rows,
    tune_on_lists,
    with_columns,
)
from moses_integration.nbest import load_nbest_arrays

REFS = ["the cat sat on the mat", "a dog ran in the park", "it rains in paris today"]
# Per sentence: Moses' 1-best (a poor one), then the reference itself, then a middling one.
HYPS = [
    ["cat the mat on sat", "the cat sat on the mat", "the cat sat on a mat"],
    ["dog a park ran", "a dog ran in the park", "a dog ran in park"],
    ["rains it paris", "it rains in paris today", "it rains in paris"],
]


def write_list(path: Path, lm: list[list[float]]) -> Path:
    """A 3-best list per sentence, best first under LM0 (one column) and a constant word penalty."""
    lines = []
    for s, (hyps, scores) in enumerate(zip(HYPS, lm, strict=True)):
        for hyp, score in zip(hyps, scores, strict=True):
            lines.append(f"{s} ||| {hyp} ||| LM0= {score} WordPenalty0= -1 ||| {score}\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture
def lists(tmp_path: Path):
    arrays = load_nbest_arrays(write_list(tmp_path / "dev.nbest", [[-1.0, -2.0, -3.0]] * 3))
    return arrays, References.from_lines([REFS])


def test_per_sentence_keeps_each_sentences_first_hypotheses(lists, tmp_path: Path) -> None:
    arrays = load_nbest_arrays(tmp_path / "dev.nbest", per_sentence=2)
    assert arrays.hypotheses == [h for hyps in HYPS for h in hyps[:2]]
    assert arrays.offsets.tolist() == [0, 2, 4, 6]


def test_one_best_is_the_argmax_by_brute_force(lists) -> None:
    arrays, _ = lists
    extra = np.array([0.0, 5.0, 1.0] * 3)
    both = with_columns(arrays, [("Oracle0", extra)])
    assert both.feature_names[-1] == ("Oracle0", 1)
    rng = np.random.default_rng(1)
    for _ in range(20):
        w = rng.normal(size=3)
        expected = [max(range(3), key=lambda j, s=s: (float(both.features[3 * s + j] @ w), -j)) for s in range(3)]
        assert one_best(both, w) == [HYPS[s][j] for s, j in enumerate(expected)]


def test_with_columns_refuses_a_column_of_another_length_or_name(lists) -> None:
    arrays, _ = lists
    with pytest.raises(RerankError, match="has 8 values for the 9 hypotheses"):
        with_columns(arrays, [("X0", np.zeros(8))])
    with pytest.raises(RerankError, match="LM0 is in"):
        with_columns(arrays, [("LM0", np.zeros(9))])


def test_tuning_on_the_lists_finds_a_feature_that_knows_the_reference(lists) -> None:
    arrays, refs = lists
    stats = bleu_statistics(arrays, refs)
    knows = with_columns(arrays, [("Knows0", np.array([0.0, 1.0, 0.0] * 3))])
    tuned = tune_on_lists(knows, stats, np.array([1.0, 0.0, 0.0]), fixed=np.array([False, True, False]),
                          restarts=5, seed=1)
    assert tuned.start_bleu < 50 and tuned.dev_bleu == pytest.approx(100.0)
    assert one_best(knows, tuned.weights) == REFS
    assert tuned.weights[1] == 0.0  # the fixed word penalty stays where it started
    assert set(tuned.named()) == {"LM0_0", "WordPenalty0_0", "Knows0_0"}


def test_a_feature_without_information_gains_nothing_over_the_lists_alone(lists) -> None:
    arrays, refs = lists
    stats = bleu_statistics(arrays, refs)
    alone = tune_on_lists(arrays, stats, np.array([1.0, 0.0]), fixed=np.array([False, True]), restarts=5, seed=1)
    noise = with_columns(arrays, [("Flat0", np.ones(9))])
    flat = tune_on_lists(noise, stats, np.array([1.0, 0.0, 0.0]), fixed=np.array([False, True, False]),
                         restarts=5, seed=1)
    assert flat.dev_bleu == pytest.approx(alone.dev_bleu)


def brute_force_oracle(stats: np.ndarray, offsets: np.ndarray) -> float:
    ranges = [range(offsets[s], offsets[s + 1]) for s in range(len(offsets) - 1)]
    return max(float(corpus_bleu(stats[list(pick)].sum(axis=0), smooth="exp")) for pick in itertools.product(*ranges))


def test_oracle_is_the_brute_force_best_where_each_sentence_has_a_best_choice(lists) -> None:
    arrays, refs = lists
    stats = bleu_statistics(arrays, refs)
    assert oracle_rows(stats, arrays.offsets).tolist() == [1, 4, 7]  # the references themselves
    assert oracle_bleu(stats, arrays.offsets) == pytest.approx(100.0)
    assert oracle_bleu(stats, arrays.offsets) == pytest.approx(brute_force_oracle(stats, arrays.offsets))
    assert oracle_bleu(stats, arrays.offsets, size=1) == pytest.approx(
        float(corpus_bleu(stats[[0, 3, 6]].sum(axis=0), smooth="exp")))


def test_oracle_on_random_lists_lies_between_the_1best_and_brute_force() -> None:
    rng = np.random.default_rng(7)
    words = ["a", "b", "c", "d", "e", "f"]
    hits = 0
    for _ in range(15):
        refs = [" ".join(rng.choice(words, size=6)) for _ in range(4)]
        hyps = [[" ".join(rng.choice(words, size=int(rng.integers(3, 8)))) for _ in range(3)] for _ in refs]
        stats = bleu_stats_batch([h.split() for hs in hyps for h in hs], np.repeat(np.arange(4), 3),
                                 References.from_lines([refs]))
        offsets = np.arange(0, 13, 3)
        found, best = oracle_bleu(stats, offsets), brute_force_oracle(stats, offsets)
        first = float(corpus_bleu(stats[offsets[:-1]].sum(axis=0), smooth="exp"))
        assert first - 1e-9 <= found <= best + 1e-9
        hits += found == pytest.approx(best)
    assert hits >= 10  # coordinate ascent finds the true oracle on most small lists


def test_statistics_counted_in_blocks_of_sentences_are_those_counted_at_once(lists) -> None:
    arrays, refs = lists
    whole = bleu_stats_batch([h.split() for h in arrays.hypotheses], arrays.sent_ids, refs)
    for block in (1, 2, 4, 5, 9, 100):
        assert np.array_equal(bleu_statistics(arrays, refs, block=block), whole)
