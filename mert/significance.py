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

Neither counts MERT's variance between tunings: a pool of three runs is one sample of the optimiser,
and one lucky run can make it significant (SPEC §4). The reports' main test is therefore
:func:`runs_test` (:data:`RUNS_METHOD`), which counts both sources of variance:

- Δ_k, run *k* of the system against run *k* of the baseline (corpus sacreBLEU), and their mean Δ̄;
- Var(Δ̄) = s²_runs / R + σ²_sent: s²_runs, the sample variance of the Δ_k, is MERT's variance
  given the test set; σ²_sent, the paired bootstrap variance of Δ̄ (the same resampled sentences in
  every run of both systems), is the test set's sampling. The sentence noise particular to each run
  is in both terms, so the sum errs on the wide side;
- a 95% interval and a two-sided p from Student's t with Welch–Satterthwaite degrees of freedom,
  (s²_runs/R + σ²_sent)² / ((s²_runs/R)² / (R − 1)): R − 1 when MERT's variance dominates, many
  when the sentences' does (the bootstrap's own variance estimate counts as exact).

This is the variance decomposition of Clark et al. (2011), with a t interval instead of their
approximate randomisation so that it also comes with an interval. Simulated with 3 runs (1,500
experiments each, tests/mert/test_significance.py's model), the interval holds the true Δ in 97% of
experiments without MERT variance, 96% with it as large as the sentences', and 92% where it is 3–7
times larger: with three runs s²_runs is itself noisy, and a small draw both narrows the interval
and raises the degrees of freedom. The pooled bootstrap's ±1.96 σ holds it in 94%, 90%, 63%, 36%.

Reports written before it kept no per-sentence statistics; :func:`sentence_sd_from_threshold`
and :func:`sentence_sd_from_p_values` recover σ_sent from what they kept, on the wide side.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sacrebleu.metrics import BLEU
from scipy import optimize, stats

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


#: How :func:`runs_test` combines the runs: the name every report prints beside its figures.
RUNS_METHOD = ("t test over tuning runs (Clark et al. 2011): Var(mean Δ) = s²_runs/R + σ²_sent, s²_runs the "
               "sample variance of the per-run Δ (MERT), σ²_sent the paired bootstrap variance of the mean Δ "
               "(test sentences, resampled alike in every run); 95% interval and two-sided p from Student's t "
               "with Welch–Satterthwaite degrees of freedom")

#: ``RunsTest.sentence_part`` when σ_sent was resampled from the runs' per-sentence statistics.
EXACT = "exact"


def bleu_from_statistics(sums: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU (exp smoothing, 4-grams) of each row of summed statistics ``[..., 10]``.

    The same arithmetic as ``BLEU._compute_score_from_stats``, on arrays, so that thousands of
    resamples cost one pass: an order without n-grams scores 0, an order without a correct n-gram
    gets 100 / (2^k · total) for its k-th such order, the brevity penalty exp(1 − r/c) for c < r.
    """
    sums = np.asarray(sums, dtype=np.float64)
    sys_len, ref_len = sums[..., 0], sums[..., 1]
    correct, total = sums[..., 2:6], sums[..., 6:10]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        halvings = np.cumsum(correct == 0, axis=-1)
        precision = np.where(correct > 0, 100.0 * correct / total, 100.0 / (2.0**halvings * total))
        precision = np.where(total > 0, precision, 0.0)
        log_mean = np.where((precision > 0).all(axis=-1),
                            np.log(np.where(precision > 0, precision, 1.0)).mean(axis=-1), -np.inf)
    score = bp * np.exp(log_mean)
    return np.where((correct > 0).any(axis=-1), score, 0.0)


def _run_statistics(runs: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> np.ndarray:
    """``[runs, sentences, stats]``: each run's BLEU statistics per test sentence."""
    metric, refs = BLEU(), [list(r) for r in references]
    out = []
    for hyps in runs:
        if len(hyps) != len(refs[0]):
            raise UserError(f"a run has {len(hyps)} segments but the references {len(refs[0])}")
        out.append(np.asarray(metric._extract_corpus_statistics(list(hyps), refs), dtype=np.float64))
    return np.stack(out)


@dataclass(frozen=True)
class RunsTest:
    """A system against a baseline over R tuning runs each, counting MERT's variance and the test set's."""

    deltas: tuple[float, ...]  # Δ_k: run k of the system minus run k of the baseline (corpus sacreBLEU)
    sentence_sd: float  # σ_sent: the test set's sampling SD of the mean Δ
    sentence_part: str = EXACT  # EXACT, or how σ_sent was recovered from an older report

    @property
    def runs(self) -> int:
        return len(self.deltas)

    @property
    def mean_delta(self) -> float:
        return float(np.mean(self.deltas))

    @property
    def run_sd(self) -> float | None:
        """s_runs, the sample SD of the Δ_k (None for one run: MERT's variance is not measured)."""
        return float(np.std(self.deltas, ddof=1)) if self.runs > 1 else None

    @property
    def standard_error(self) -> float | None:
        return None if self.run_sd is None else math.sqrt(self.run_sd**2 / self.runs + self.sentence_sd**2)

    @property
    def degrees_of_freedom(self) -> float | None:
        """Welch–Satterthwaite: R − 1 when the runs' variance dominates, ∞ when it is 0."""
        if self.run_sd is None:
            return None
        between = self.run_sd**2 / self.runs
        if between == 0:
            return math.inf
        return (between + self.sentence_sd**2) ** 2 / (between**2 / (self.runs - 1))

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95% interval of the mean Δ."""
        se, df = self.standard_error, self.degrees_of_freedom
        if se is None or df is None:
            return None
        half = float(stats.t.ppf(0.975, df)) * se
        return self.mean_delta - half, self.mean_delta + half

    @property
    def p_value(self) -> float | None:
        """Two-sided: how often a mean Δ this far from 0 arises when the systems are alike."""
        se, df = self.standard_error, self.degrees_of_freedom
        if se is None or df is None:
            return None
        if se == 0:
            return 1.0 if self.mean_delta == 0 else 0.0
        return float(2 * stats.t.sf(abs(self.mean_delta) / se, df))

    def to_json(self) -> dict[str, object]:
        interval = self.interval
        return {
            "runs": self.runs, "deltas": [round(d, 4) for d in self.deltas],
            "mean_delta": round(self.mean_delta, 4),
            "run_sd": None if self.run_sd is None else round(self.run_sd, 4),
            "sentence_sd": round(self.sentence_sd, 4), "sentence_part": self.sentence_part,
            "df": None if self.degrees_of_freedom is None else round(self.degrees_of_freedom, 2),
            "ci95": None if interval is None else [round(interval[0], 4), round(interval[1], 4)],
            "p_value": None if self.p_value is None else round(self.p_value, 6),
        }


def sentence_sd(
    baseline: np.ndarray, system: np.ndarray, *, samples: int = DEFAULT_SAMPLES,
    score: Callable[[np.ndarray], np.ndarray] = bleu_from_statistics,
) -> float:
    """σ_sent: the bootstrap SD of the mean over runs of score(system run k) − score(baseline run k).

    ``baseline`` and ``system`` are ``[runs, sentences, stats]``. Each resample draws the test
    sentences once and takes them in every run of both systems (the runs share their test set, so
    resampling them apart would count it R times as evidence). ``score`` turns summed statistics
    into the metric, BLEU unless a caller (a test) brings another.
    """
    if baseline.shape != system.shape:
        raise ValueError(f"baseline {baseline.shape} and system {system.shape} statistics differ in shape")
    if samples < 2:
        raise ValueError("a bootstrap variance needs at least two samples")
    runs, sentences, width = baseline.shape
    idx = np.random.default_rng(_seed()).choice(sentences, size=(samples, sentences), replace=True)
    offsets = (idx + sentences * np.arange(samples)[:, None]).ravel()
    counts = np.bincount(offsets, minlength=samples * sentences).reshape(samples, sentences).astype(np.float64)
    both = np.concatenate([baseline, system]).transpose(1, 0, 2).reshape(sentences, 2 * runs * width)
    sums = (counts @ both).reshape(samples, 2, runs, width)
    scores = score(sums)
    return float(np.std((scores[:, 1] - scores[:, 0]).mean(axis=1), ddof=1))


def runs_test_from_statistics(
    baseline: np.ndarray, system: np.ndarray, *, samples: int = DEFAULT_SAMPLES,
    score: Callable[[np.ndarray], np.ndarray] = bleu_from_statistics,
) -> RunsTest:
    """:class:`RunsTest` from each run's per-sentence statistics ``[runs, sentences, stats]``."""
    deltas = score(system.sum(axis=1)) - score(baseline.sum(axis=1))
    return RunsTest(tuple(float(d) for d in deltas), sentence_sd(baseline, system, samples=samples, score=score))


def runs_test(
    baseline_runs: Sequence[Sequence[str]],
    system_runs: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    samples: int = DEFAULT_SAMPLES,
) -> RunsTest:
    """Run k of a system against run k of the baseline for every k, over runs and test sentences."""
    if len(baseline_runs) != len(system_runs):
        raise UserError(f"{len(system_runs)} system runs but {len(baseline_runs)} baseline runs: pair them by run")
    if not system_runs:
        raise ValueError("no runs to compare")
    return runs_test_from_statistics(_run_statistics(baseline_runs, references),
                                     _run_statistics(system_runs, references), samples=samples)


def _folded_mean(r: float) -> float:
    """E|r + Z|, Z standard normal."""
    return r * (1 - 2 * stats.norm.cdf(-r)) + 2 * stats.norm.pdf(r)


#: The 95th percentile of |Z| − E|Z|: the threshold of the centred absolute bootstrap in units of σ
#: when Δ = 0, the smallest ratio it takes (1.645 when |Δ| ≫ σ).
FOLDED_THRESHOLD_RATIO = float(stats.norm.ppf(0.975) - math.sqrt(2 / math.pi))


def sentence_sd_from_threshold(threshold: float) -> float:
    """σ_sent from a pooled test's stored ``significant_from``, on the wide side.

    That threshold is the 95th percentile of the centred |Δ*| of the pooled resamples. With Δ*
    normal, SD σ, it is between 1.162 σ (Δ = 0) and 1.645 σ (|Δ| ≫ σ); dividing by 1.162 gives the
    largest σ it allows, so the interval built on it is never narrower than the data warrant.
    """
    return threshold / FOLDED_THRESHOLD_RATIO


def _p_of_ratio(r: float) -> float:
    """sacreBLEU's paired bootstrap p for Δ = r σ with normal resamples: P(|Δ*| − E|Δ*| > |Δ|)."""
    m = _folded_mean(r)
    return float(stats.norm.cdf(-m) + stats.norm.cdf(-2 * r - m))


def sentence_sd_from_p_values(deltas: Sequence[float], p_values: Sequence[float], *,
                              samples: int = DEFAULT_SAMPLES) -> float | None:
    """σ_sent from the per-run paired bootstraps' (Δ_k, p_k), for reports that kept no pooled test.

    Each run's σ_k is the SD at which normal resamples give p_k for Δ_k (a p at the floor,
    1/(samples + 1), gives the largest σ_k that floor allows). The SD of a mean of the runs' Δ*
    is at most the mean of their SDs, whatever their correlation, so that mean is σ_sent, on the
    wide side. A run whose p is not below the Δ = 0 limit (0.425) says nothing about σ and is left
    out; None if no run says anything.
    """
    limit = _p_of_ratio(0.0)
    sds = []
    for delta, p in zip(deltas, p_values, strict=True):
        p = max(p, 1 / (samples + 1))
        if delta == 0 or p >= limit:
            continue
        ratio = optimize.brentq(lambda r, p=p: _p_of_ratio(r) - p, 1e-12, 50.0)
        sds.append(abs(delta) / ratio)
    return float(np.mean(sds)) if sds else None
