"""Significance over tuning runs: agrees with sacreBLEU's own paired bootstrap on one run, resamples
sentences (not run segments) when pooling, and the detectable difference is the test's threshold."""

from __future__ import annotations

import numpy as np
import pytest

from infrastructure.errors import UserError
from mert.evaluate import paired_bootstrap
from mert.significance import detectable_delta, pooled_bootstrap

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
