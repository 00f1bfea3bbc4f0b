"""Significance over several tuning runs, and what a test setup can detect at all.

MERT is random (restarts), so one tuned run of a system says little: Clark et al. (2011) compare
several runs of each system. Two questions follow that a per-run paired bootstrap does not answer:

- **Does the row gain, over all its runs?** :func:`pooled_bootstrap` pools run *k* of a system
  with run *k* of the baseline for every *k* (corpus BLEU over all runs' segments together) and
  resamples *source sentences*: a resampled sentence brings its output from every run, so the
  runs' shared test sentences are not counted as independent evidence (a cluster bootstrap).
  One p-value per row.
- **How large a difference could this setup call significant?** :func:`detectable_delta` runs the
  same test between outputs of the *same* system (Baseline run against Baseline run): the
  (1 − level) quantile of the test's null distribution is the smallest |Δ| that would reach
  p < level. A gain below it cannot be told from noise with this test set, whatever its sign.
  A pool of all runs cannot be tested against another pool of the same system without twice the
  runs, so each pooled test reports its own threshold (:attr:`PooledTest.threshold`): the |Δ| from
  which that test's resamples would give p < 0.05.

Both use sacreBLEU's statistic exactly (``BLEU`` sufficient statistics, default 13a tokenisation,
the absolute difference centred on its resampled mean, p = (c + 1) / (n + 1)) and its seed
convention (``$SACREBLEU_SEED``, 12345 unless set), so a one-run pool gives sacreBLEU's own
paired bootstrap p-value.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU

from infrastructure.errors import UserError

DEFAULT_SAMPLES = 1000


def _seed() -> int | None:
    seed = os.environ.get("SACREBLEU_SEED", "12345")
    return None if seed.lower() == "none" else int(seed)


def _pooled_statistics(runs: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> np.ndarray:
    """``[sentences, stats]``: each test sentence's BLEU statistics summed over the runs."""
    if not runs:
        raise ValueError("no runs to pool")
    metric = BLEU()
    refs = [list(r) for r in references]
    total = None
    for hyps in runs:
        if len(hyps) != len(refs[0]):
            raise UserError(f"a run has {len(hyps)} segments but the references {len(refs[0])}")
        stats = np.asarray(metric._extract_corpus_statistics(list(hyps), refs), dtype=np.float64)
        total = stats if total is None else total + stats
    return total  # type: ignore[return-value]


def _bleu(stats: np.ndarray) -> float:
    return float(BLEU()._compute_score_from_stats(stats.tolist()).score)


def _resampled_differences(a: np.ndarray, b: np.ndarray, samples: int) -> np.ndarray:
    """|BLEU(b) − BLEU(a)| on each resample of the sentences (the same resamples for both)."""
    idx = np.random.default_rng(_seed()).choice(len(a), size=(samples, len(a)), replace=True)
    return np.array([abs(_bleu(b[i].sum(0)) - _bleu(a[i].sum(0))) for i in idx])


@dataclass(frozen=True)
class PooledTest:
    """One row against the baseline over all its runs."""

    runs: int
    baseline_bleu: float  # corpus sacreBLEU over all runs' outputs together
    system_bleu: float
    p_value: float
    samples: int
    threshold: float  # |Δ| from which this test gives p < 0.05 (the centred resamples' 95th percentile)

    @property
    def delta(self) -> float:
        return self.system_bleu - self.baseline_bleu


def pooled_bootstrap(
    baseline_runs: Sequence[Sequence[str]],
    system_runs: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    samples: int = DEFAULT_SAMPLES,
) -> PooledTest:
    """Paired bootstrap of all runs of a system against the same-numbered runs of the baseline."""
    if len(baseline_runs) != len(system_runs):
        raise UserError(f"{len(system_runs)} system runs but {len(baseline_runs)} baseline runs: pair them by run")
    if samples < 1:
        raise ValueError("bootstrap needs at least one sample")
    base, system = _pooled_statistics(baseline_runs, references), _pooled_statistics(system_runs, references)
    base_bleu, system_bleu = _bleu(base.sum(0)), _bleu(system.sum(0))
    if np.array_equal(base, system):
        return PooledTest(len(system_runs), base_bleu, system_bleu, 1.0, samples, 0.0)  # identical: nothing to test
    diffs = _resampled_differences(base, system, samples)
    centred = diffs - diffs.mean()
    p = (int(np.sum(centred > abs(system_bleu - base_bleu))) + 1) / (samples + 1)
    return PooledTest(len(system_runs), base_bleu, system_bleu, p, samples, float(np.quantile(centred, 0.95)))


def detectable_delta(
    runs_a: Sequence[Sequence[str]],
    runs_b: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    samples: int = DEFAULT_SAMPLES,
    level: float = 0.05,
) -> float:
    """The smallest |Δ| the paired bootstrap would call significant, from two sets of runs of one system.

    ``runs_a`` and ``runs_b`` are outputs of the same system (e.g. Baseline runs 1, 2, 3 and runs
    2, 3, 1): the resampled differences between them are the test's null distribution, and a
    difference is significant at ``level`` once it exceeds their centred (1 − level) quantile.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    a, b = _pooled_statistics(runs_a, references), _pooled_statistics(runs_b, references)
    diffs = _resampled_differences(a, b, samples)
    return float(np.quantile(diffs - diffs.mean(), 1 - level))
