"""Och's exact line search against brute force: an exact per-sentence oracle and dense grids."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from mert.bleu import NUM_STATS, bleu_stats_batch, corpus_bleu, read_references
from mert.line_search import (
    OUTER_STEP_MIN,
    MertData,
    line_search,
    line_search_batch,
    line_search_points,
)
from moses_integration.nbest import load_nbest_arrays
from shared_paths import shared_file

# --------------------------------------------------------------------------------------------
# Brute force


def grid_scores(data: MertData, w: np.ndarray, d: np.ndarray, gammas: np.ndarray) -> np.ndarray:
    """Corpus BLEU at every γ of a grid: argmax per sentence (first on ties), stats summed."""
    a = data.features @ w
    b = data.features @ d
    out = np.empty(len(gammas))
    for lo in range(0, len(gammas), 256):
        g = gammas[lo : lo + 256]
        scores = np.vstack([a[:, None] + b[:, None] * g[None, :], np.full((1, len(g)), -np.inf)])
        col = scores[data.pad_index].argmax(axis=1)  # [S, G]
        hyp = data.pad_index[np.arange(data.num_sentences)[:, None], col]
        out[lo : lo + 256] = corpus_bleu(data.stats[hyp].sum(axis=0))
    return out


def oracle_best(data: MertData, w: np.ndarray, d: np.ndarray) -> float:
    """Best corpus BLEU along the line, found without any envelope algorithm.

    Per sentence, every pairwise crossing of its lines is a possible change of winner; the
    winner is evaluated by argmax between consecutive crossings, and the γ where it changes
    are kept. All sentences' change points are merged and the BLEU of every interval between
    them is evaluated at its midpoint (intervals narrower than 1e-9 are float noise).
    """
    a_all = data.features @ w
    b_all = data.features @ d
    changes = []
    for s in range(data.num_sentences):
        lo, hi = data.offsets[s], data.offsets[s + 1]
        a, b = a_all[lo:hi], b_all[lo:hi]
        with np.errstate(divide="ignore", invalid="ignore"):
            x = (a[:, None] - a[None, :]) / (b[None, :] - b[:, None])
        xs = np.unique(x[np.isfinite(x)])
        if not len(xs):
            continue
        mids = np.concatenate([[xs[0] - 1], (xs[:-1] + xs[1:]) / 2, [xs[-1] + 1]])
        win = np.argmax(a[None, :] + mids[:, None] * b[None, :], axis=1)
        changes.append(xs[win[1:] != win[:-1]])
    pts = np.unique(np.concatenate(changes)) if changes else np.zeros(0)
    if len(pts):
        keep = np.concatenate([[True], np.diff(pts) > 1e-9 * np.maximum(1, np.abs(pts[1:]))])
        pts = pts[keep]
        probes = np.concatenate([[pts[0] - 1], (pts[:-1] + pts[1:]) / 2, [pts[-1] + 1]])
    else:
        probes = np.zeros(1)
    return float(grid_scores(data, w, d, probes).max())


def random_data(seed: int, sentences: int = 25, max_hyps: int = 30, features: int = 5) -> MertData:
    """Random n-best sets with the awkward cases real lists have: integer features (many equal
    slopes), a mostly-zero column, exactly repeated feature vectors, single-hypothesis sentences."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_hyps + 1, sentences)
    sizes[0] = 1
    total = int(sizes.sum())
    feats = rng.normal(size=(total, features))
    feats[:, 1] = rng.integers(-3, 4, total)  # word-penalty-like
    feats[:, 2] = np.where(rng.random(total) < 0.8, 0.0, rng.normal(size=total))  # mostly 0
    dup = rng.random(total) < 0.1
    feats[dup] = feats[np.maximum(np.flatnonzero(dup) - 1, 0)]
    hyp_len = rng.integers(3, 30, total)
    stats = np.zeros((total, NUM_STATS), dtype=np.int64)
    prev = hyp_len
    for n in range(4):
        t = np.maximum(hyp_len - n, 0)
        m = np.minimum(rng.integers(0, t + 1), prev)
        stats[:, 2 * n], stats[:, 2 * n + 1] = m, t
        prev = m
    stats[:, 8] = hyp_len
    stats[:, 9] = rng.integers(3, 30, sentences).repeat(sizes)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return MertData(feats, stats, offsets)


def check_direction(data: MertData, w: np.ndarray, d: np.ndarray, gamma: float, bleu: float) -> None:
    # What the search reports is real: scoring the returned point gives the returned BLEU.
    assert data.score(w + gamma * d) == pytest.approx(bleu, abs=1e-9)
    # It is the best along the line: no interval of the exact oracle and no grid point is better.
    assert bleu >= oracle_best(data, w, d) - 1e-9
    grid = np.linspace(-5 * (abs(gamma) + 1), 5 * (abs(gamma) + 1), 801)
    assert bleu >= grid_scores(data, w, d, grid).max() - 1e-9


# --------------------------------------------------------------------------------------------
# Random n-best sets


@pytest.mark.parametrize("seed", range(6))
def test_random_sets_against_oracle(seed: int) -> None:
    data = random_data(seed)
    rng = np.random.default_rng(100 + seed)
    w = rng.normal(size=data.num_features)
    directions = np.vstack([np.eye(data.num_features), rng.normal(size=(3, data.num_features))])
    result = line_search_batch(data, w, directions)
    for d, gamma, bleu in zip(directions, result.gammas, result.bleus, strict=True):
        check_direction(data, w, d, float(gamma), float(bleu))


def test_exp_smoothing_is_searched_consistently() -> None:
    """With sacrebleu's "exp" smoothing (scores are > 0 even without 4-gram matches)."""
    data = random_data(21, sentences=3, max_hyps=8)
    rng = np.random.default_rng(2)
    w = rng.normal(size=data.num_features)
    for d in np.vstack([np.eye(data.num_features), rng.normal(size=(3, data.num_features))]):
        gamma, bleu = line_search(data, w, d, smooth="exp")
        assert data.score(w + gamma * d, smooth="exp") == pytest.approx(bleu, abs=1e-9)
        grid_best = max(data.score(w + g * d, smooth="exp") for g in np.linspace(-10, 10, 201))
        assert bleu >= grid_best - 1e-9


def test_single_direction_api_and_points_batch_agree() -> None:
    data = random_data(11)
    rng = np.random.default_rng(5)
    points = rng.normal(size=(4, data.num_features))
    directions = np.vstack([np.eye(data.num_features), rng.normal(size=(2, data.num_features))])
    together = line_search_points(data, points, directions)
    assert together.gammas.shape == (4, len(directions))
    for p, w in enumerate(points):
        alone = line_search_batch(data, w, directions)
        # Equal up to rounding: BLAS may sum X·w in another order for several points.
        np.testing.assert_allclose(together.gammas[p], alone.gammas, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(together.bleus[p], alone.bleus, rtol=1e-12)
        gamma, bleu = line_search(data, w, directions[-1])
        assert (gamma, bleu) == (alone.gammas[-1], alone.bleus[-1])


def test_degenerate_directions_stay_put() -> None:
    data = random_data(2)
    w = np.random.default_rng(0).normal(size=data.num_features)
    gamma, bleu = line_search(data, w, np.zeros(data.num_features))
    assert gamma == 0.0 and bleu == pytest.approx(data.score(w), abs=1e-12)
    # Every hypothesis moves by the same amount: nothing changes anywhere on the line.
    shifted = MertData(np.hstack([data.features, np.ones((len(data.features), 1))]), data.stats, data.offsets)
    d = np.zeros(data.num_features + 1)
    d[-1] = 1.0
    gamma, bleu = line_search(shifted, np.append(w, 0.0), d)
    assert gamma == 0.0 and bleu == pytest.approx(data.score(w), abs=1e-12)


def test_unbounded_best_interval_uses_a_finite_stand_in() -> None:
    """Two hypotheses, the better one wins only for γ > 1: the answer is 1 + OUTER_STEP_MIN."""
    stats = np.array([[1, 4, 0, 3, 0, 2, 0, 1, 4, 4], [4, 4, 3, 3, 2, 2, 1, 1, 4, 4]])
    data = MertData(np.array([[1.0, 0.0], [0.0, 1.0]]), stats, np.array([0, 2]))
    gamma, bleu = line_search(data, np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert gamma == pytest.approx(1.0 + OUTER_STEP_MIN)
    assert bleu == pytest.approx(100.0)
    gamma, bleu = line_search(data, np.array([1.0, 0.0]), np.array([0.0, -1.0]))
    assert gamma == pytest.approx(-1.0 - OUTER_STEP_MIN) and bleu == pytest.approx(100.0)


def test_current_interval_is_kept_when_it_is_among_the_best() -> None:
    stats = np.array([[4, 4, 3, 3, 2, 2, 1, 1, 4, 4], [4, 4, 3, 3, 2, 2, 1, 1, 4, 4]])  # equal BLEU
    data = MertData(np.array([[1.0, 0.0], [0.0, 1.0]]), stats, np.array([0, 2]))
    gamma, bleu = line_search(data, np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert gamma == 0.0 and bleu == pytest.approx(100.0)


def test_identical_lines_follow_argmax_tie_breaking() -> None:
    """Repeated feature vectors with different BLEU: the first one is what a decoder score picks."""
    feats = np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    stats = np.array(
        [[1, 4, 0, 3, 0, 2, 0, 1, 4, 4], [4, 4, 3, 3, 2, 2, 1, 1, 4, 4]] * 2
    )
    data = MertData(feats, stats, np.array([0, 4]))
    w = np.array([1.0, 0.0])
    for d in (np.array([0.0, 1.0]), np.array([1.0, -1.0]), np.array([-1.0, 1.0])):
        gamma, bleu = line_search(data, w, d)
        assert data.score(w + gamma * d) == pytest.approx(bleu)
        assert bleu == pytest.approx(corpus_bleu(stats[0])) or bleu == pytest.approx(corpus_bleu(stats[2]))


# --------------------------------------------------------------------------------------------
# The real n-best list


@lru_cache(maxsize=1)
def fixture_data() -> tuple[MertData, np.ndarray]:
    arrays = load_nbest_arrays(shared_file("fixtures/hansard-enfr/nbest/dev.nbest.gz"))
    refs = read_references([shared_file("fixtures/hansard-enfr/data/dev.tok.tc.fr")], expected_sentences=200)
    stats = bleu_stats_batch([h.split() for h in arrays.hypotheses], arrays.sent_ids, refs)
    init = np.array(shared_file("fixtures/hansard-enfr/nbest/init.opt").read_text().splitlines()[0].split(), float)
    return MertData(arrays.features, stats, arrays.offsets), init


def test_fixture_subset_against_oracle() -> None:
    data, w = fixture_data()
    cut = int(data.offsets[30])
    subset = MertData(data.features[:cut], data.stats[:cut], data.offsets[:31])
    rng = np.random.default_rng(9)
    directions = np.vstack([np.eye(14), rng.normal(size=(2, 14))])
    result = line_search_batch(subset, w, directions)
    for d, gamma, bleu in zip(directions, result.gammas, result.bleus, strict=True):
        check_direction(subset, w, d, float(gamma), float(bleu))


def test_full_fixture_unit_directions_against_grid() -> None:
    data, w = fixture_data()
    assert data.score(w) == pytest.approx(24.0541, abs=5e-5)
    result = line_search_batch(data, w, np.eye(14))
    assert result.bleus.max() > 25.5  # README: mert climbs from 24.05
    for k in range(14):
        d = np.eye(14)[k]
        gamma, bleu = float(result.gammas[k]), float(result.bleus[k])
        assert data.score(w + gamma * d) == pytest.approx(bleu, abs=1e-9)
        grid = np.concatenate([np.linspace(-10, 10, 401), gamma + np.linspace(-0.05, 0.05, 101)])
        assert bleu >= grid_scores(data, w, d, grid).max() - 1e-9
