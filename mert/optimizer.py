"""Moses-style MERT optimisation: Powell/Och coordinate ascent with random restarts.

This mirrors Moses' ``mert`` (``SimpleOptimizer`` in ``mert/Optimizer.cpp`` and the start points
of ``mert/mert.cpp``), because users compare against it and the paper's numbers come from it:

* every start point (the given ones, e.g. the decoder's weights and the previous iteration's,
  then ``restarts`` random points drawn uniformly from per-feature ``[min, max]``, Moses'
  default ``[0, 1]``) is optimised on its own;
* one optimisation repeats: from the current point, run the exact line search along every
  tuneable unit direction (plus optional random directions), move to the best point found
  on any of them, and stop when the BLEU gain of an iteration is at most ``epsilon``
  (Moses' ``kEPS`` = 1e-4 on its 0..1 scale, i.e. 0.01 BLEU points here);
* the best point over all starts wins (the earliest on ties) and is L1-normalised when every
  feature is tuneable. With fixed features the weights are returned unnormalised, as Moses
  does, so that fixed values stay what the user gave.

All directions of an iteration go through one vectorised line-search call
(:func:`mert.line_search.line_search_batch`), which is where the speed comes from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mert.bleu import Smoothing
from mert.line_search import MertData, line_search_batch

DEFAULT_RESTARTS = 20
DEFAULT_EPSILON = 0.01  # BLEU points: Moses' kEPS = 1e-4 on the 0..1 scale
DEFAULT_MAX_ITERATIONS = 1000


@dataclass
class RunResult:
    """One optimisation from one start point."""

    start: np.ndarray
    weights: np.ndarray
    bleu: float
    start_bleu: float
    iterations: int
    random_start: bool


@dataclass
class OptimizeResult:
    """The winning weights and BLEU (0..100), and every run for diagnostics."""

    weights: np.ndarray
    bleu: float
    runs: list[RunResult]

    @property
    def best_run(self) -> RunResult:
        return max(self.runs, key=lambda r: r.bleu)


def _as_bounds(
    ranges: tuple[Sequence[float] | np.ndarray | float, Sequence[float] | np.ndarray | float] | None,
    num_features: int,
) -> tuple[np.ndarray, np.ndarray]:
    if ranges is None:
        return np.zeros(num_features), np.ones(num_features)
    low = np.broadcast_to(np.asarray(ranges[0], dtype=np.float64), (num_features,)).copy()
    high = np.broadcast_to(np.asarray(ranges[1], dtype=np.float64), (num_features,)).copy()
    if np.any(low > high):
        raise ValueError("every random-restart range needs min <= max")
    return low, high


def powell_run(
    data: MertData,
    start: np.ndarray,
    *,
    tuneable: np.ndarray,
    epsilon: float = DEFAULT_EPSILON,
    random_directions: int = 0,
    rng: np.random.Generator | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    smooth: Smoothing = "none",
) -> tuple[np.ndarray, float, int]:
    """Coordinate ascent from ``start``; returns (weights, BLEU, iterations).

    Like Moses' ``SimpleOptimizer::TrueRun``: all directions are searched from the same point
    and only the best move is taken; fixed (non-tuneable) coordinates never move.
    """
    point = np.asarray(start, dtype=np.float64).copy()
    dims = np.flatnonzero(tuneable)
    units = np.eye(data.num_features)[dims]
    best_score = data.score(point, smooth)
    iterations = 0
    while iterations < max_iterations:
        iterations += 1
        prev_score = best_score
        directions = units
        if random_directions > 0:
            if rng is None:
                raise ValueError("random directions need an rng")
            extra = np.zeros((random_directions, data.num_features))
            extra[:, dims] = rng.standard_normal((random_directions, len(dims)))
            directions = np.vstack([units, extra])
        if len(directions) == 0:
            break
        result = line_search_batch(data, point, directions, smooth)
        j = int(np.argmax(result.bleus))
        if result.bleus[j] > best_score:
            best_score = float(result.bleus[j])
            point = point + result.gammas[j] * directions[j]
        if best_score - prev_score <= epsilon:
            break
    return point, best_score, iterations


def random_start_points(
    base: np.ndarray, count: int, low: np.ndarray, high: np.ndarray, tuneable: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """``count`` points uniform in ``[low, high]`` on tuneable coordinates, ``base`` elsewhere."""
    points = np.repeat(np.asarray(base, dtype=np.float64)[None, :], count, axis=0)
    draws = rng.uniform(low, high, size=(count, len(base)))
    points[:, tuneable] = draws[:, tuneable]
    return points


def optimize_runs(
    data: MertData,
    starts: np.ndarray | Sequence[np.ndarray],
    *,
    restarts: int = DEFAULT_RESTARTS,
    ranges: tuple[Sequence[float] | np.ndarray | float, Sequence[float] | np.ndarray | float] | None = None,
    fixed: Sequence[bool] | np.ndarray | None = None,
    seed: int | None = None,
    epsilon: float = DEFAULT_EPSILON,
    random_directions: int = 0,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    smooth: Smoothing = "none",
    normalize: bool = True,
) -> OptimizeResult:
    """Optimise from every start point and from ``restarts`` random points; keep the best.

    ``starts`` is one weight vector or several (e.g. the decoder's start weights and the
    previous tuning iteration's result); the first also provides the values of ``fixed``
    features in random starts. ``ranges`` = (min, max), scalars or per-feature vectors.
    """
    start_arr = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    num_features = data.num_features
    if start_arr.shape[1] != num_features:
        raise ValueError(f"start weights have {start_arr.shape[1]} values, the n-best lists {num_features} features")
    fixed_mask = np.zeros(num_features, dtype=bool) if fixed is None else np.asarray(fixed, dtype=bool)
    if fixed_mask.shape != (num_features,):
        raise ValueError("fixed must have one flag per feature")
    tuneable = ~fixed_mask
    low, high = _as_bounds(ranges, num_features)
    rng = np.random.default_rng(seed)
    randoms = random_start_points(start_arr[0], restarts, low, high, tuneable, rng)
    runs: list[RunResult] = []
    for i, start in enumerate(np.vstack([start_arr, randoms])):
        weights, bleu, iterations = powell_run(
            data,
            start,
            tuneable=tuneable,
            epsilon=epsilon,
            random_directions=random_directions,
            rng=rng,
            max_iterations=max_iterations,
            smooth=smooth,
        )
        runs.append(
            RunResult(
                start=start,
                weights=weights,
                bleu=bleu,
                start_bleu=data.score(start, smooth),
                iterations=iterations,
                random_start=i >= len(start_arr),
            )
        )
    best = max(range(len(runs)), key=lambda i: (runs[i].bleu, -i))
    weights = runs[best].weights.copy()
    if normalize and not fixed_mask.any():
        norm = float(np.abs(weights).sum())
        if norm > 0:
            weights = weights / norm
    return OptimizeResult(weights=weights, bleu=runs[best].bleu, runs=runs)


def optimize(
    data: MertData,
    starts: np.ndarray | Sequence[np.ndarray],
    *,
    restarts: int = DEFAULT_RESTARTS,
    ranges: tuple[Sequence[float] | np.ndarray | float, Sequence[float] | np.ndarray | float] | None = None,
    fixed: Sequence[bool] | np.ndarray | None = None,
    seed: int | None = None,
    epsilon: float = DEFAULT_EPSILON,
    random_directions: int = 0,
    smooth: Smoothing = "none",
) -> tuple[np.ndarray, float]:
    """MERT as Moses' ``mert`` does it: (best weights, L1-normalised, and their BLEU 0..100)."""
    result = optimize_runs(
        data,
        starts,
        restarts=restarts,
        ranges=ranges,
        fixed=fixed,
        seed=seed,
        epsilon=epsilon,
        random_directions=random_directions,
        smooth=smooth,
    )
    return result.weights, result.bleu
