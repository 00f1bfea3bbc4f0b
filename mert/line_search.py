"""Och's exact line search for MERT, vectorised over sentences, directions and start points.

Along a line ``w + γ·d`` in weight space, hypothesis ``h`` of a sentence scores
``a_h + γ·b_h`` with ``a = X·w`` and ``b = X·d``. Which hypothesis the decoder would pick as
γ varies is given by the *upper envelope* of those lines: a sequence of hypotheses, each winning
on an interval of γ. Merging the interval boundaries of all sentences turns corpus BLEU into a
step function of γ, which can be maximised exactly (Och 2003; Moses ``mert/Optimizer.cpp``).

Moses does this sentence by sentence and hypothesis by hypothesis in C++. Here each step is a
NumPy operation over all (point, direction, sentence) *rows* at once (several start points are
optimised in lockstep, see :mod:`mert.optimizer`), and the work per row is cut down before the
envelope is built:

1. lines are ordered by slope within each row; for the unit directions the optimiser uses,
   ``b`` is a feature column that does not depend on ``w``, so that order is computed once;
2. among equal slopes only the highest line can ever win (on exact ties the lowest
   hypothesis index, the same choice as ``argmax`` when a point is scored);
3. a line can only be on the envelope if it is strictly higher than every line of smaller
   slope (it may win on the γ → −∞ side) or than every line of larger slope (γ → +∞ side);
   running maxima along the slope order find these few candidates (typically 5-20 of 100);
4. the envelope of the candidates: line i wins exactly on
   (max over smaller slopes k of x(k,i), min over larger slopes j of x(i,j)), x being the
   crossing point, so it is on the envelope iff that interval is non-empty. This is evaluated
   pairwise for all rows at once, rows grouped by candidate count rounded up to a power of two;
5. each envelope change contributes ``stats[new] - stats[old]`` at its breakpoint; sorting
   the breakpoints of a (point, direction) and taking a cumulative sum gives the BLEU
   statistics, hence the score, of every interval.

The chosen γ is the middle of the best interval. The two unbounded outer intervals have no
middle: their stand-in is the finite boundary moved outward by ``OUTER_STEP_FRACTION`` of the
spread of that direction's breakpoints, at least ``OUTER_STEP_MIN`` (Moses uses −1000 on the
left and +0.1 on the right). If the interval holding γ = 0 is among the best, γ = 0 is
returned so that the optimiser does not drift between equally good points; otherwise ties go
to the interval nearest to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mert.bleu import NUM_STATS, Smoothing, corpus_bleu

OUTER_STEP_FRACTION = 0.1
OUTER_STEP_MIN = 0.1
# Intervals narrower than this (relative to the magnitude of their boundaries) are treated as
# empty: they come from floating-point noise between breakpoints that are mathematically equal.
MIN_RELATIVE_WIDTH = 1e-12
# Upper bound on the elements of one pairwise block in :func:`_hull_pairwise` (memory cap).
_PAIRWISE_BLOCK = 1 << 22


@dataclass
class MertData:
    """An n-best set prepared for MERT: features, BLEU statistics and sentence layout.

    ``features[h]`` and ``stats[h]`` belong to hypothesis ``h``; hypotheses are grouped by
    sentence and ``offsets[s]:offsets[s+1]`` are those of sentence ``s``. A padded ``[S, M]``
    index (``M`` = the largest n-best size) lets per-sentence maxima run as array operations.
    """

    features: np.ndarray  # float64 [H, F]
    stats: np.ndarray  # int64 [H, NUM_STATS]
    offsets: np.ndarray  # int64 [S+1]
    pad_index: np.ndarray = field(init=False)  # int64 [S, M], H for padding
    valid: np.ndarray = field(init=False)  # bool [S, M]
    _layout_cache: dict[tuple[int, ...], SlopeLayout] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.features = np.ascontiguousarray(self.features, dtype=np.float64)
        self.stats = np.ascontiguousarray(self.stats, dtype=np.int64)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        num_hyps = self.features.shape[0]
        if self.features.ndim != 2 or self.stats.shape != (num_hyps, NUM_STATS):
            raise ValueError("features must be [H, F] and stats [H, 10] for the same H")
        if len(self.offsets) < 2 or self.offsets[0] != 0 or self.offsets[-1] != num_hyps:
            raise ValueError("offsets must run from 0 to H")
        if np.any(np.diff(self.offsets) <= 0):
            raise ValueError("every sentence needs at least one hypothesis")
        if not np.all(np.isfinite(self.features)):
            raise ValueError("features must be finite")
        sizes = np.diff(self.offsets)
        cols = np.arange(int(sizes.max()))
        self.valid = cols[None, :] < sizes[:, None]
        self.pad_index = np.where(self.valid, self.offsets[:-1, None] + cols[None, :], num_hyps)
        self._layout_cache = {}

    @property
    def num_sentences(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_features(self) -> int:
        return self.features.shape[1]

    def best_hypotheses(self, weights: np.ndarray) -> np.ndarray:
        """Index of each sentence's highest-scoring hypothesis (first one on ties), ``[S]``."""
        scores = np.append(self.features @ np.asarray(weights, dtype=np.float64), -np.inf)
        col = scores[self.pad_index].argmax(axis=1)
        return self.pad_index[np.arange(self.num_sentences), col]

    def score(self, weights: np.ndarray, smooth: Smoothing = "none") -> float:
        """Corpus BLEU (0..100) of the 1-best hypotheses under ``weights``."""
        return float(corpus_bleu(self.stats[self.best_hypotheses(weights)].sum(axis=0), smooth))

    def slope_layout(self, directions: np.ndarray) -> SlopeLayout:
        """The :class:`SlopeLayout` of a batch of directions ``[D, F]``.

        Batches made only of unit directions are cached: the optimiser asks for the same batch
        (all tuneable coordinates) at every iteration, and their slopes are feature columns
        that do not depend on the current weights, so the sorting is done once.
        """
        units = [_unit_index(d) for d in directions]
        key = tuple(u for u in units if u is not None)
        cacheable = len(key) == len(units)
        if cacheable and key in self._layout_cache:
            return self._layout_cache[key]
        slopes = [
            self.features[:, u] if u is not None else self.features @ d
            for u, d in zip(units, directions, strict=True)
        ]
        layout = SlopeLayout.build(self, slopes)
        if cacheable:
            self._layout_cache[key] = layout
        return layout


@dataclass
class SlopeLayout:
    """Lines of every (direction, sentence) row ordered by slope, with equal-slope runs marked.

    Arrays are position-major ``[M, D*S]``: row ``r = direction * S + sentence`` is a column,
    and going down a column goes up in slope (ties by hypothesis index), padding last
    (hypothesis index H, slope +inf). Position-major because the running maxima of
    :func:`_candidates` then work on whole contiguous rows at a time.

    ``run_start``/``run_end`` mark the first/last position of each run of equal slopes. Many
    features are integer counts or mostly 0, so such runs are common.
    """

    hyp: np.ndarray  # int64 [M, R] hypothesis index (H = padding)
    slope: np.ndarray  # float64 [M, R]
    run_start: np.ndarray  # bool [M, R]
    run_end: np.ndarray  # bool [M, R]

    @classmethod
    def build(cls, data: MertData, slopes: list[np.ndarray]) -> SlopeLayout:
        hyp_parts, slope_parts = [], []
        for b in slopes:
            padded = np.where(data.valid, np.append(b, np.inf)[data.pad_index], np.inf)
            order = np.argsort(padded, axis=1, kind="stable")
            hyp_parts.append(np.take_along_axis(data.pad_index, order, axis=1))
            slope_parts.append(np.take_along_axis(padded, order, axis=1))
        hyp = np.ascontiguousarray(np.concatenate(hyp_parts).T)
        slope = np.ascontiguousarray(np.concatenate(slope_parts).T)
        run_start = np.ones(slope.shape, dtype=bool)
        run_start[1:] = slope[1:] != slope[:-1]
        run_end = np.ones(slope.shape, dtype=bool)
        run_end[:-1] = run_start[1:]
        return cls(hyp=hyp, slope=slope, run_start=run_start, run_end=run_end)


@dataclass
class LineSearchResult:
    """Best step and score per (point, direction): arrays ``[P, D]`` (``[D]`` for one point)."""

    gammas: np.ndarray  # float64
    bleus: np.ndarray  # float64, 0..100
    num_breakpoints: np.ndarray  # int64, envelope changes merged over sentences


def _unit_index(direction: np.ndarray) -> int | None:
    nonzero = np.flatnonzero(direction)
    if len(nonzero) == 1 and direction[nonzero[0]] == 1.0:
        return int(nonzero[0])
    return None


def _candidates(a: np.ndarray, layout: SlopeLayout) -> np.ndarray:
    """Mask ``[M, P, R]`` of the lines that may be on their row's upper envelope (step 2-3).

    A line can win on an interval only if it is the highest of its equal-slope run and either
    strictly higher than every line of smaller slope or higher than every line of larger slope.
    Of tied identical lines the first passes the strict test and all pass the other; the hull
    step keeps only the first, which is argmax's lowest-index choice.

    Two passes over the ``M`` positions, each step a vectorised maximum across all rows (on
    this shape several times faster than ``np.maximum.accumulate``): running maxima of
    everything above/below each position, and of its own run above/below it.
    """
    width = a.shape[0]
    above = np.empty_like(a)  # max of the positions strictly above
    run_down = np.empty_like(a)  # max of the own run from its start down to here
    above[0] = -np.inf
    run_down[0] = a[0]
    for i in range(1, width):
        np.maximum(above[i - 1], a[i - 1], out=above[i])
        np.maximum(run_down[i - 1], a[i], out=run_down[i])
        np.copyto(run_down[i], a[i], where=layout.run_start[i])
    below = np.empty_like(a)  # max of the positions strictly below
    run_up = np.empty_like(a)  # max of the own run from its end up to here
    below[-1] = -np.inf
    run_up[-1] = a[-1]
    for i in range(width - 2, -1, -1):
        np.maximum(below[i + 1], a[i + 1], out=below[i])
        np.maximum(run_up[i + 1], a[i], out=run_up[i])
        np.copyto(run_up[i], a[i], where=layout.run_end[i])
    cand = a >= run_down
    cand &= a >= run_up
    cand &= (a > above) | (a >= below)
    cand &= a > -np.inf
    return cand


def _hull_pairwise(ca: np.ndarray, cb: np.ndarray) -> np.ndarray:
    """Which candidate lines are on their row's upper envelope (step 4); ``[K, n]`` bool.

    ``ca``/``cb`` ``[K, n]`` hold K candidates of ``n`` rows in ascending slope (rows with
    fewer candidates repeat their last one, which then counts as a duplicate). Line i wins
    exactly on (max over k<i of x(k,i), min over j>i of x(i,j)); of lines with equal slope
    (identical candidates) only the first counts.
    """
    count = ca.shape[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        d_b = cb[None, :, :] - cb[:, None, :]  # [p, q]: b_q - b_p
        cross = (ca[:, None, :] - ca[None, :, :]) / d_b  # [p, q]: x(p, q)
    before = np.tri(count, count, -1, dtype=bool).T[:, :, None]  # [p, q]: p < q
    rising = before & (d_b > 0)
    left = np.max(np.where(rising, cross, -np.inf), axis=0)  # over k < i: [i, n]
    right = np.min(np.where(rising, cross, np.inf), axis=1)  # over j > i: [i, n]
    duplicate = np.any(before & (d_b == 0), axis=0)  # an earlier line has the same slope
    return (left < right) & ~duplicate


def _envelopes(
    a: np.ndarray, layout: SlopeLayout
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Upper envelopes of all rows at once; ``a`` ``[M, P, R]`` holds each position's intercept.

    Rows of the result are numbered ``p * R + r``. Returns the hypothesis winning at γ → −∞ for
    each row ``[P*R]`` and the breakpoints as flat arrays: row, γ, hypothesis before and after.
    """
    width, num_points, num_rows = a.shape
    total_rows = num_points * num_rows
    cand = _candidates(a, layout).reshape(width, total_rows)
    # Move each row's candidates to the top, keeping their (slope) order.
    r_idx, c_idx = np.nonzero(cand.T)  # row by row, positions ascending
    counts = np.bincount(r_idx, minlength=total_rows)
    k_idx = np.arange(len(r_idx)) - (np.cumsum(counts) - counts)[r_idx]
    layout_col = r_idx % num_rows
    k_max = int(counts.max())
    # Pad every row to a power of two by repeating its last candidate (see _hull_pairwise).
    size = 1 << max(0, (k_max - 1).bit_length())
    last = np.minimum(np.arange(size)[:, None], np.maximum(counts, 1)[None, :] - 1)  # [size, rows]
    ca = np.zeros((k_max, total_rows))
    cb = np.zeros((k_max, total_rows))
    ch = np.zeros((k_max, total_rows), dtype=np.int64)
    ca[k_idx, r_idx] = a.reshape(width, total_rows)[c_idx, r_idx]
    cb[k_idx, r_idx] = layout.slope[c_idx, layout_col]
    ch[k_idx, r_idx] = layout.hyp[c_idx, layout_col]
    first_hyp = ch[0]  # the lowest-slope candidate wins as γ → −∞
    bucket = np.where(counts <= 1, 0, 1 << np.maximum(counts - 1, 1).astype(np.int64).__array__().astype(int).tolist().__len__() * 0) if False else None
    del bucket
    bucket_of = np.zeros(total_rows, dtype=np.int64)
    many = counts >= 2
    bucket_of[many] = 1 << np.ceil(np.log2(counts[many])).astype(np.int64)
    br_rows_parts: list[np.ndarray] = []
    br_prev_parts: list[np.ndarray] = []
    br_next_parts: list[np.ndarray] = []
    for k in np.unique(bucket_of[many]).tolist():
        rows_k = np.flatnonzero(bucket_of == k)
        chunk = max(1, _PAIRWISE_BLOCK // (k * k))
        for lo in range(0, len(rows_k), chunk):
            sel = rows_k[lo : lo + chunk]
            slots = np.minimum(last[:k, sel], k_max - 1)
            on = _hull_pairwise(ca[slots, sel], cb[slots, sel])  # [k, n]
            # Consecutive envelope lines: for each line on it (but the first), the previous one.
            marked = np.where(on, np.arange(k)[:, None], -1)
            prev = np.maximum.accumulate(marked, axis=0)
            prev = np.vstack([np.full((1, len(sel)), -1), prev[:-1]])
            k_on, j_on = np.nonzero(on & (prev >= 0))
            br_rows_parts.append(sel[j_on])
            br_prev_parts.append(prev[k_on, j_on])
            br_next_parts.append(k_on)
    if not br_rows_parts:
        empty_i = np.zeros(0, dtype=np.int64)
        return first_hyp, empty_i, np.zeros(0), empty_i, empty_i
    br_rows = np.concatenate(br_rows_parts)
    k_prev = np.concatenate(br_prev_parts)
    k_next = np.concatenate(br_next_parts)
    gamma = (ca[k_prev, br_rows] - ca[k_next, br_rows]) / (cb[k_next, br_rows] - cb[k_prev, br_rows])
    return first_hyp, br_rows, gamma, ch[k_prev, br_rows], ch[k_next, br_rows]


def line_search_points(
    data: MertData, points: np.ndarray, directions: np.ndarray, smooth: Smoothing = "none"
) -> LineSearchResult:
    """Exact line search from each of ``points`` ``[P, F]`` along each of ``directions`` ``[D, F]``.

    Every (point, direction) pair is an independent search; they share one vectorised
    envelope computation. Powell/Och coordinate ascent tries every direction from the current
    point (then moves along the best), and the optimiser runs its start points in lockstep,
    so one call serves a whole iteration of every run. Results are ``[P, D]``.
    """
    pts = np.atleast_2d(np.asarray(points, dtype=np.float64))
    dirs = np.atleast_2d(np.asarray(directions, dtype=np.float64))
    if pts.shape[1] != data.num_features or dirs.shape[1] != data.num_features:
        raise ValueError(f"points and directions need {data.num_features} components")
    num_points, num_dirs, num_sents = pts.shape[0], dirs.shape[0], data.num_sentences
    num_groups = num_points * num_dirs  # a group is one (point, direction) search
    layout = data.slope_layout(dirs)
    a_table = np.vstack([data.features @ pts.T, np.full((1, num_points), -np.inf)])  # [H+1, P]
    a = np.ascontiguousarray(a_table[layout.hyp].transpose(0, 2, 1))  # [M, P, D*S]
    first_hyp, br_rows, gamma, h_prev, h_next = _envelopes(a, layout)

    stats = data.stats
    init = stats[first_hyp].reshape(num_groups, num_sents, NUM_STATS).sum(axis=1)  # [G, 10]
    br_group = br_rows // num_sents
    order = np.lexsort((gamma, br_group))
    gamma, br_group = gamma[order], br_group[order]
    cum = np.cumsum(stats[h_next[order]] - stats[h_prev[order]], axis=0)
    per_group = np.bincount(br_group, minlength=num_groups)
    group_start = np.cumsum(per_group) - per_group
    cum_before = np.vstack([np.zeros((1, NUM_STATS), dtype=np.int64), cum])[group_start]
    after = init[br_group] + cum - cum_before[br_group]

    # Intervals: per group the one before its first breakpoint, then one after each.
    num_br = len(gamma)
    last_of_group = np.ones(num_br, dtype=bool)
    last_of_group[:-1] = br_group[1:] != br_group[:-1]
    right_after = np.where(last_of_group, np.inf, np.append(gamma[1:], np.inf))
    first_gamma = np.full(num_groups, np.inf)
    first_gamma[br_group[::-1]] = gamma[::-1]  # the smallest breakpoint of each group
    last_gamma = np.full(num_groups, -np.inf)
    last_gamma[br_group] = gamma
    iv_group = np.concatenate([np.arange(num_groups), br_group])
    iv_left = np.concatenate([np.full(num_groups, -np.inf), gamma])
    iv_right = np.concatenate([first_gamma, right_after])
    iv_score = np.asarray(corpus_bleu(np.vstack([init, after]), smooth), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        width = iv_right - iv_left
        scale = np.maximum(1.0, np.maximum(np.abs(iv_left), np.abs(iv_right)))
        usable = ~(width <= MIN_RELATIVE_WIDTH * scale)  # infinite widths are usable
    contains_zero = (iv_left < 0.0) & (iv_right > 0.0)
    distance = np.where(contains_zero, 0.0, np.minimum(np.abs(iv_left), np.abs(iv_right)))
    rank_score = np.where(usable, np.round(iv_score, 10), -np.inf)
    pick_order = np.lexsort((distance, -rank_score, iv_group))
    firsts = np.ones(len(pick_order), dtype=bool)
    firsts[1:] = iv_group[pick_order][1:] != iv_group[pick_order][:-1]
    best = pick_order[firsts]  # one interval per group, in group order

    left, right = iv_left[best], iv_right[best]
    spread = np.where(np.isfinite(first_gamma), last_gamma - first_gamma, 0.0)
    pad = np.maximum(OUTER_STEP_MIN, OUTER_STEP_FRACTION * spread)
    with np.errstate(invalid="ignore"):
        mid = 0.5 * (left + right)
        outer = np.where(np.isinf(left), np.where(np.isinf(right), 0.0, right - pad), left + pad)
    gammas = np.where(contains_zero[best], 0.0, np.where(np.isinf(left) | np.isinf(right), outer, mid))
    shape = (num_points, num_dirs)
    return LineSearchResult(
        gammas=gammas.reshape(shape),
        bleus=iv_score[best].reshape(shape),
        num_breakpoints=per_group.astype(np.int64).reshape(shape),
    )


def line_search_batch(
    data: MertData, weights: np.ndarray, directions: np.ndarray, smooth: Smoothing = "none"
) -> LineSearchResult:
    """Exact line search from one point along each row of ``directions``; results ``[D]``."""
    result = line_search_points(data, np.asarray(weights, dtype=np.float64)[None, :], directions, smooth)
    return LineSearchResult(result.gammas[0], result.bleus[0], result.num_breakpoints[0])


def line_search(
    data: MertData, weights: np.ndarray, direction: np.ndarray, smooth: Smoothing = "none"
) -> tuple[float, float]:
    """Best step γ along ``direction`` from ``weights`` and the corpus BLEU (0..100) there."""
    result = line_search_batch(data, weights, np.asarray(direction, dtype=np.float64)[None, :], smooth)
    return float(result.gammas[0]), float(result.bleus[0])
