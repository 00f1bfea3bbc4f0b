"""Significance over tuning runs: agrees with sacreBLEU's own paired bootstrap on one run, resamples
sentences (not run segments) when pooling, and the detectable difference is the test's threshold."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sacrebleu.metrics import BLEU
from scipy import stats

from infrastructure.errors import UserError
from mert.evaluate import paired_bootstrap
from mert.significance import (
    RunsTest,
    bleu_from_statistics,
    detectable_delta,
    pooled_bootstrap,
    runs_test,
    runs_test_from_statistics,
    sentence_sd,
    sentence_sd_from_p_values,
    sentence_sd_from_threshold,
)

WORDS = [f"w{i}" for i in range(60)]


def _corpus(seed: int, sentences: int = 120) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 15)))) for _ in range(sentences)]


def _noisy(refs: list[str], error_rate: float, seed: int) -> list[str]:
    """Each reference word replaced by a random one with probability ``error_rate``."""
    rng = np.random.default_rng(seed)
    out = []
    for ref in refs:
        words = [w if rng.random() > error_rate else str(rng.choice(WORDS)) for w in ref.split()]
        out.append(" ".join(words))
    return out


REFS = _corpus(1)


def test_one_run_is_sacrebleus_paired_bootstrap():
    base, system = _noisy(REFS, 0.5, 2), _noisy(REFS, 0.4, 3)
    ours = pooled_bootstrap([base], [system], [REFS], samples=300)
    theirs = paired_bootstrap(("base", base), ("sys", system), [REFS], samples=300)
    assert ours.baseline_bleu == pytest.approx(theirs.baseline_bleu, abs=1e-9)
    assert ours.system_bleu == pytest.approx(theirs.system_bleu, abs=1e-9)
    assert ours.p_value == pytest.approx(theirs.p_value, abs=2 / 301)  # float32 vs float64 statistics at most


def test_pooling_copies_of_one_run_adds_no_evidence():
    """A cluster bootstrap: three identical runs are one run's evidence, not three times as much (pooling
    them as independent segments would shrink p)."""
    base, system = _noisy(REFS, 0.5, 4), _noisy(REFS, 0.45, 5)
    one = pooled_bootstrap([base], [system], [REFS], samples=200)
    three = pooled_bootstrap([base] * 3, [system] * 3, [REFS], samples=200)
    assert three.delta == pytest.approx(one.delta, abs=1e-9) and three.p_value == pytest.approx(one.p_value)
    assert three.runs == 3


def test_identical_outputs_are_not_significant():
    base = _noisy(REFS, 0.5, 6)
    result = pooled_bootstrap([base, base], [list(base), list(base)], [REFS], samples=50)
    assert result.p_value == 1.0 and result.delta == 0.0 and result.threshold == 0.0


def test_detectable_delta_is_the_threshold_of_the_test():
    """p < 0.05 exactly when |Δ| exceeds the detectable difference measured on the same pair."""
    a, b = _noisy(REFS, 0.5, 7), _noisy(REFS, 0.5, 8)
    threshold = detectable_delta([a], [b], [REFS], samples=400)
    result = pooled_bootstrap([a], [b], [REFS], samples=400)
    assert threshold > 0
    assert (result.p_value < 0.05) == (abs(result.delta) > threshold)
    assert result.threshold == pytest.approx(threshold)  # the same pair: the test's own threshold
    far = pooled_bootstrap([a], [_noisy(REFS, 0.1, 9)], [REFS], samples=400)
    assert abs(far.delta) > threshold and far.p_value < 0.05


def test_more_sentences_detect_smaller_differences():
    refs = _corpus(10, sentences=480)
    small = detectable_delta([_noisy(REFS, 0.5, 11)], [_noisy(REFS, 0.5, 12)], [REFS], samples=300)
    large = detectable_delta([_noisy(refs, 0.5, 11)], [_noisy(refs, 0.5, 12)], [refs], samples=300)
    assert large < small


def test_runs_must_pair_up():
    with pytest.raises(UserError, match="pair them by run"):
        pooled_bootstrap([REFS], [REFS, REFS], [REFS])


# The test over runs: MERT's variance between tunings and the test set's sampling.

def _mean_score(sums: np.ndarray) -> np.ndarray:
    """A metric whose bootstrap variance has a closed form: the mean of per-sentence scores
    (statistics: [score, 1])."""
    return sums[..., 0] / sums[..., 1]


def _linear_stats(scores: np.ndarray) -> np.ndarray:
    return np.stack([scores, np.ones_like(scores)], axis=-1)


def test_bleu_from_statistics_is_sacrebleus_on_every_kind_of_corpus():
    """Zero matches at some orders (exp smoothing), no 4-grams at all, short output (brevity
    penalty), no output: the array arithmetic gives sacreBLEU's score to the last digit."""
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(300):
        total = np.sort(rng.integers(0, 40, size=4))[::-1]
        correct = np.minimum(total, rng.integers(0, 12, size=4) * (rng.random(4) > 0.3))
        rows.append([total[0] + rng.integers(0, 5), rng.integers(1, 60), *correct, *total])
    rows += [[0, 5, 0, 0, 0, 0, 0, 0, 0, 0], [3, 3, 3, 2, 1, 0, 3, 2, 1, 0], [9, 12, 0, 0, 0, 0, 9, 8, 7, 6]]
    ours = bleu_from_statistics(np.array(rows))
    theirs = [BLEU()._compute_score_from_stats(list(map(int, r))).score for r in rows]
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12)


def test_runs_test_by_hand():
    """Δ_k = 0.1, 0.3, 0.5 and σ_sent = 0.1: s²_runs = 0.04, s²/R = 0.04/3, Var = 0.04/3 + 0.01 = 0.07/3,
    df = (0.07/3)² / ((0.04/3)² / 2) = 2 · 49/16 = 6.125."""
    test = RunsTest((0.1, 0.3, 0.5), 0.1)
    assert test.mean_delta == pytest.approx(0.3) and test.run_sd == pytest.approx(0.2)
    assert test.standard_error == pytest.approx(math.sqrt(0.07 / 3))
    assert test.degrees_of_freedom == pytest.approx(6.125)
    half = stats.t.ppf(0.975, 6.125) * math.sqrt(0.07 / 3)
    assert test.interval == pytest.approx((0.3 - half, 0.3 + half))
    assert test.p_value == pytest.approx(2 * stats.t.sf(0.3 / math.sqrt(0.07 / 3), 6.125))
    assert 2.43 < stats.t.ppf(0.975, 6.125) < 2.45  # between t(6) = 2.447 and t(7) = 2.365 of the tables
    # No sentence noise: the plain t test over 3 runs, t(2) = 4.303 from the tables.
    runs_only = RunsTest((0.1, 0.3, 0.5), 0.0)
    assert runs_only.degrees_of_freedom == pytest.approx(2)
    assert runs_only.interval == pytest.approx((0.3 - 4.3027 * 0.2 / math.sqrt(3), 0.3 + 4.3027 * 0.2 / math.sqrt(3)),
                                               abs=1e-4)
    # Runs that agree: the sentences' normal interval, 1.96 σ_sent.
    agreeing = RunsTest((0.3, 0.3, 0.3), 0.1)
    assert agreeing.degrees_of_freedom == math.inf
    assert agreeing.interval == pytest.approx((0.3 - 0.196, 0.3 + 0.196), abs=1e-4)
    single = RunsTest((0.4,), 0.1)
    assert single.run_sd is None and single.interval is None and single.p_value is None


def test_sentence_variance_by_hand_resamples_the_same_sentences_in_every_run():
    """Mean-of-scores metric, 3 sentences: the mean over runs of system − baseline per sentence is
    d = (+1, 0, −1), so the ideal bootstrap variance of Δ̄ is Var_population(d) / 3 = (2/3) / 3 = 2/9.
    Each run alone varies far more (run 1: d = (4, 0, −4)); resampling runs apart would count it."""
    base = _linear_stats(np.array([[10.0, 10.0, 10.0], [10.0, 10.0, 10.0]]))
    system = _linear_stats(np.array([[14.0, 10.0, 6.0], [8.0, 10.0, 12.0]]))
    sd = sentence_sd(base, system, samples=20000, score=_mean_score)
    assert sd == pytest.approx(math.sqrt(2 / 9), rel=0.02)
    test = runs_test_from_statistics(base, system, samples=20000, score=_mean_score)
    assert test.deltas == pytest.approx((0.0, 0.0)) and test.sentence_sd == sd


def test_sentence_variance_of_bleu_is_the_brute_force_bootstrap():
    """Three sentences: the ideal bootstrap enumerates all 27 equally likely resamples, with
    sacreBLEU's own scoring; the sampled bootstrap agrees with it."""
    base = np.array([[[5, 6, 4, 2, 1, 0, 5, 4, 3, 2], [7, 7, 6, 4, 3, 2, 7, 6, 5, 4], [4, 5, 2, 1, 0, 0, 4, 3, 2, 1]],
                     [[6, 6, 5, 3, 1, 0, 6, 5, 4, 3], [7, 7, 5, 3, 2, 1, 7, 6, 5, 4], [4, 5, 3, 1, 0, 0, 4, 3, 2, 1]]],
                    dtype=float)
    system = base.copy()
    system[0, 0, 2:6] = [5, 4, 3, 1]
    system[1, 2, 2:6] = [4, 3, 1, 0]
    system[1, 1, 2:6] = [4, 2, 1, 0]

    def bleu(stats_: np.ndarray) -> float:
        return BLEU()._compute_score_from_stats(list(map(int, stats_))).score

    means = []
    for resample in itertools.product(range(3), repeat=3):
        means.append(np.mean([bleu(system[k, list(resample)].sum(0)) - bleu(base[k, list(resample)].sum(0))
                              for k in range(2)]))
    exact = float(np.std(means))
    assert exact > 1  # a case with something to measure
    assert sentence_sd(base, system, samples=20000) == pytest.approx(exact, rel=0.03)
    test = runs_test_from_statistics(base, system, samples=200)
    assert test.deltas == pytest.approx([bleu(system[k].sum(0)) - bleu(base[k].sum(0)) for k in range(2)])


def test_runs_test_on_text_is_corpus_sacrebleu_per_run():
    base = [_noisy(REFS, 0.5, 20 + k) for k in range(3)]
    system = [_noisy(REFS, 0.4, 30 + k) for k in range(3)]
    test = runs_test(base, system, [REFS], samples=300)
    for k in range(3):
        one = paired_bootstrap(("b", base[k]), ("s", system[k]), [REFS], samples=10)
        assert test.deltas[k] == pytest.approx(one.system_bleu - one.baseline_bleu, abs=1e-9)
    assert test.p_value < 0.05 and test.interval[0] > 0 and test.to_json()["sentence_part"] == "exact"
    with pytest.raises(UserError, match="pair them by run"):
        runs_test(base, system[:2], [REFS])


def _simulated_experiment(rng: np.random.Generator, *, runs: int, sentences: int, true_delta: float,
                          mert_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """One experiment: a fresh test set (each sentence's baseline score and its own gain) and fresh
    tunings (each run moves every sentence of its system by one MERT draw, and each sentence a little)."""
    level = rng.normal(20, 5, size=sentences)
    gain = true_delta + rng.normal(0, 2, size=sentences)
    base = level + rng.normal(0, 1, size=(runs, sentences))
    system = level + gain + rng.normal(0, mert_sd, size=(runs, 1)) + rng.normal(0, 1, size=(runs, sentences))
    return _linear_stats(base), _linear_stats(system)


def test_interval_covers_the_true_difference_95_times_in_100_and_the_pooled_bootstrap_does_not():
    """Brute force: 400 simulated experiments of 3 runs each, with MERT's variance between runs
    (SD 0.5 on every Δ_k) beside the sentences' (SD ≈ 0.15 on Δ̄). The true Δ is known (0.3). The
    new interval holds it in about 95% of experiments; the sentence-only bootstrap's ±1.96 σ (what
    the pooled test measures: with this metric, the pool's Δ is Δ̄) in far fewer."""
    rng = np.random.default_rng(2011)
    covered = pooled_covered = 0
    experiments = 400
    for _ in range(experiments):
        base, system = _simulated_experiment(rng, runs=3, sentences=200, true_delta=0.3, mert_sd=0.5)
        test = runs_test_from_statistics(base, system, samples=200, score=_mean_score)
        low, high = test.interval
        covered += low <= 0.3 <= high
        pooled_covered += abs(test.mean_delta - 0.3) <= 1.96 * test.sentence_sd
    assert 0.92 <= covered / experiments <= 0.99
    assert pooled_covered / experiments < 0.75


def test_sentence_sd_recovered_from_an_old_reports_figures_is_on_the_wide_side():
    """What committed reports kept: the pooled test's threshold, and per-run (Δ, p). The σ_sent
    recovered from each is not below the one resampled from the sentences, nor far above it."""
    base = [_noisy(REFS, 0.5, 40 + k) for k in range(3)]
    system = [_noisy(REFS, 0.47, 50 + k) for k in range(3)]
    exact = runs_test(base, system, [REFS], samples=1000).sentence_sd
    pooled = pooled_bootstrap(base, system, [REFS], samples=1000)
    from_threshold = sentence_sd_from_threshold(pooled.threshold)
    assert 0.95 * exact <= from_threshold <= 1.6 * exact
    per_run = [paired_bootstrap(("b", b), ("s", s), [REFS], samples=1000) for b, s in zip(base, system, strict=True)]
    from_p = sentence_sd_from_p_values([r.delta for r in per_run], [r.p_value for r in per_run])
    assert from_p is not None and 0.95 * exact <= from_p <= 2.0 * exact
    assert sentence_sd_from_p_values([0.01], [0.5]) is None  # p above the Δ = 0 limit says nothing
