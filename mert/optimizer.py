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
  feature is tuneable, as Moses' ``mert`` does. Features held at weight 0 count as absent: the
  weights are normalised as Moses normalises a system without them (a weight of 0 stays 0). The
  scale is invisible to BLEU but not to the decoder: Moses' beam threshold is a fixed ratio to the
  best hypothesis, so weights with an L1 norm of 25 prune 25 times harder (docs/table1.md).
  Features held at another value keep the weights unnormalised, as Moses does, so that the held
  values keep their meaning.

All directions of an iteration go through one vectorised line-search call
(:func:`mert.line_search.line_search_points`), which is where the speed comes from. With
``threads`` > 1 the start points are shared out among that many threads (:func:`parallel_powell_runs`):
each run is independent, so the result is the same to the bit, and NumPy releases the GIL in its
array loops, so the threads run at once (as Moses' ``mert --threads``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from mert.bleu import Smoothing
from mert.line_search import MertData, line_search_points

DEFAULT_RESTARTS = 20
DEFAULT_EPSILON = 0.01  # BLEU points: Moses' kEPS = 1e-4 on the 0..1 scale
DEFAULT_MAX_ITERATIONS = 1000
# Runs advanced together per line-search call (see powell_runs). On the fixture one point per
# call was fastest: the work is dominated by per-element array operations, whose cost per point
# grew with larger batches (more memory traffic), while the Python overhead saved was small.
DEFAULT_POINTS_PER_CALL = 1


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


class Stopped(Exception):
    """The runs were told to stop (:func:`powell_runs`' ``stop``); the caller, which stopped them, goes on."""


def powell_runs(
    data: MertData,
    starts: np.ndarray,
    *,
    tuneable: np.ndarray,
    epsilon: float = DEFAULT_EPSILON,
    random_directions: int = 0,
    rng: np.random.Generator | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    smooth: Smoothing = "none",
    points_per_call: int = DEFAULT_POINTS_PER_CALL,
    stop: threading.Event | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coordinate ascent from each row of ``starts``; returns (weights, BLEU, iterations).

    Each run is Moses' ``SimpleOptimizer::TrueRun``: all directions are searched from the
    current point, only the best move is taken (the first direction on ties), and the run
    stops when an iteration gains at most ``epsilon``; fixed coordinates never move. Runs
    are independent but advance in lockstep, ``points_per_call`` of them per line-search call,
    which shares the per-call work between them. Random directions, when asked for, are drawn
    afresh every iteration (Gaussian on the tuneable coordinates) and shared by the runs of
    that call. ``stop`` (set by another thread) ends the runs before the next line search, with
    :class:`Stopped`.
    """
    points = np.array(starts, dtype=np.float64, ndmin=2)
    num_runs = points.shape[0]
    dims = np.flatnonzero(tuneable)
    units = np.eye(data.num_features)[dims]
    best = np.array([data.score(p, smooth) for p in points])
    iterations = np.zeros(num_runs, dtype=np.int64)
    active = np.arange(num_runs)
    if random_directions > 0 and rng is None:
        raise ValueError("random directions need an rng")
    while active.size:
        prev = best[active].copy()
        for lo in range(0, active.size, points_per_call):
            runs = active[lo : lo + points_per_call]
            directions = units
            if random_directions > 0:
                assert rng is not None
                extra = np.zeros((random_directions, data.num_features))
                extra[:, dims] = rng.standard_normal((random_directions, len(dims)))
                directions = np.vstack([units, extra])
            if len(directions) == 0:
                continue
            if stop is not None and stop.is_set():
                raise Stopped
            result = line_search_points(data, points[runs], directions, smooth)
            j = np.argmax(result.bleus, axis=1)
            gained = result.bleus[np.arange(len(runs)), j]
            better = gained > best[runs]
            moved = runs[better]
            points[moved] += result.gammas[better, j[better], None] * directions[j[better]]
            best[moved] = gained[better]
        iterations[active] += 1
        done = (best[active] - prev <= epsilon) | (iterations[active] >= max_iterations)
        active = active[~done]
    return points, best, iterations


def parallel_powell_runs(
    data: MertData, starts: np.ndarray, *, tuneable: np.ndarray, threads: int, **options: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`powell_runs` with the start points dealt round-robin to ``threads`` threads; the same
    result as one call, row for row.

    Runs are independent except through shared random directions, which are drawn from one
    generator in the runs' lockstep order: with those (or one thread, or one start point) this is
    one call. The data's lazily built caches (the transposed statistics, the unit directions' slope
    order) are built first, once, rather than by every thread at the same time. A Ctrl-C or
    SIGTERM, which reaches the calling thread, stops the threads too, each before its next line
    search: waiting for them to finish every start point took 22.9 s with 300 restarts.
    Measured on the 2-core development machine (medium's pool of 188,363 hypotheses, 8 start
    points): 6.5 s on one thread, 5.1 s on two; the cores share their memory bandwidth.
    """
    points = np.array(starts, dtype=np.float64, ndmin=2)
    workers = min(threads, len(points))
    if workers <= 1 or options.get("random_directions"):
        return powell_runs(data, points, tuneable=tuneable, **options)  # type: ignore[arg-type]
    dims = np.flatnonzero(tuneable)
    data.stats_t32  # noqa: B018 - built once, before the threads read it
    if len(dims):
        data.slope_layout(np.eye(data.num_features)[dims])
    shares = [np.arange(k, len(points), workers) for k in range(workers)]
    stop = threading.Event()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="mert")
    try:
        parts = list(pool.map(lambda rows: powell_runs(data, points[rows], tuneable=tuneable, stop=stop, **options),
                              shares))
    finally:
        stop.set()  # all done, or the caller stops: the threads must not go on
        pool.shutdown(cancel_futures=True)
    weights, bleus = np.empty_like(points), np.empty(len(points))
    iterations = np.empty(len(points), dtype=np.int64)
    for rows, (w, b, i) in zip(shares, parts, strict=True):
        weights[rows], bleus[rows], iterations[rows] = w, b, i
    return weights, bleus, iterations


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
    points_per_call: int = DEFAULT_POINTS_PER_CALL,
    threads: int = 1,
) -> OptimizeResult:
    """Optimise from every start point and from ``restarts`` random points; keep the best.

    ``starts`` is one weight vector or several (e.g. the decoder's start weights and the
    previous tuning iteration's result); the first provides the values of ``fixed`` features
    for every run (Moses keeps fixed weights at the first start point's values).
    ``ranges`` = (min, max), scalars or per-feature vectors. ``threads``: the start points are
    optimised that many at a time (:func:`parallel_powell_runs`; the same result).
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
    all_starts = np.vstack([start_arr, randoms])
    all_starts[:, fixed_mask] = start_arr[0, fixed_mask]  # as Moses: fixed values come from the first
    weights_all, bleus, iterations = parallel_powell_runs(
        data,
        all_starts,
        threads=threads,
        tuneable=tuneable,
        epsilon=epsilon,
        random_directions=random_directions,
        rng=rng,
        max_iterations=max_iterations,
        smooth=smooth,
        points_per_call=points_per_call,
    )
    runs = [
        RunResult(
            start=all_starts[i],
            weights=weights_all[i],
            bleu=float(bleus[i]),
            start_bleu=data.score(all_starts[i], smooth),
            iterations=int(iterations[i]),
            random_start=i >= len(start_arr),
        )
        for i in range(len(all_starts))
    ]
    best = max(range(len(runs)), key=lambda i: (runs[i].bleu, -i))
    weights = runs[best].weights.copy()
    if normalize:
        weights = l1_normalised(weights, fixed_mask)
    return OptimizeResult(weights=weights, bleu=runs[best].bleu, runs=runs)


def l1_normalised(weights: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """``weights`` divided by their L1 norm, unless a ``fixed`` feature is held at a non-zero value.

    Moses' rule (module docstring): a held value must keep its meaning, so such weights stay as they
    are; a feature held at 0 counts as absent. All-zero weights are returned unchanged.
    """
    if np.any(weights[fixed] != 0):
        return weights
    norm = float(np.abs(weights).sum())
    return weights / norm if norm > 0 else weights
