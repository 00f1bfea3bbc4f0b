"""Och's exact line search for MERT, vectorised over sentences, directions and start points.

Along a line ``w + γ·d`` in weight space, hypothesis ``h`` of a sentence scores
``a_h + γ·b_h`` with ``a = X·w`` and ``b = X·d``. Which hypothesis the decoder would pick as
γ varies is given by the *upper envelope* of those lines: a sequence of hypotheses, each winning
on an interval of γ. Merging the interval boundaries of all sentences turns corpus BLEU into a
step function of γ, which can be maximised exactly (Och 2003; Moses ``mert/Optimizer.cpp``).

Moses does this sentence by sentence and hypothesis by hypothesis in C++. Here each step is a
NumPy operation over all (point, direction, sentence) *rows* at once (all the directions of a
coordinate-ascent iteration, optionally several start points), and the work per row is cut
down before the envelope is built:

1. lines are ordered by slope within each row; for the unit directions the optimiser uses,
   ``b`` is a feature column that does not depend on ``w``, so that order is computed once;
2. among equal slopes only the highest line can ever win (on exact ties the lowest
   hypothesis index, the same choice as ``argmax`` when a point is scored);
3. a line can only be on the envelope if it is strictly higher than every line of smaller
   slope (it may win on the γ → −∞ side) or than every line of larger slope (γ → +∞ side);
   running maxima along the slope order find these few candidates (typically 5-20 of 100);
4. the envelope of the candidates comes from a monotone-chain (convex hull) sweep over the
   candidate slots, each step vectorised across all rows that still have candidates (rows
   are sorted by candidate count, so those are a prefix);
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

from mert.bleu import HYP_LEN, NGRAM_ORDER, NUM_STATS, REF_LEN, Smoothing, corpus_bleu

OUTER_STEP_FRACTION = 0.1
OUTER_STEP_MIN = 0.1
# Intervals narrower than this (relative to the magnitude of their boundaries) are treated as
# empty: they come from floating-point noise between breakpoints that are mathematically equal.
MIN_RELATIVE_WIDTH = 1e-12


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
    _stats_t32: np.ndarray | None = field(init=False, default=None)

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
        if self.stats.size and self.stats.max() >= 1 << 28:
            raise ValueError("BLEU statistics too large for int32 accumulation")

    @property
    def num_sentences(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_features(self) -> int:
        return self.features.shape[1]

    @property
    def stats_t32(self) -> np.ndarray:
        """``stats`` transposed to ``[10, H]`` int32, the line search's working layout.

        Half the memory traffic of int64, and per-statistic rows make the running sums over
        thousands of breakpoints run along contiguous memory (several times faster).
        """
        if self._stats_t32 is None:
            self._stats_t32 = np.ascontiguousarray(self.stats.T.astype(np.int32))
        return self._stats_t32

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

    ``reset_down``/``reset_up`` mark the first/last position of each run of equal slopes. Many
    features are integer counts or mostly 0, so such runs are common.
    """

    hyp: np.ndarray  # int64 [M, R] hypothesis index (H = padding)
    slope: np.ndarray  # float64 [M, R]
    reset_down: np.ndarray  # float64 [M, R]: -inf where a run starts, +inf elsewhere
    reset_up: np.ndarray  # float64 [M, R]: -inf where a run ends, +inf elsewhere

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
        return cls(
            hyp=hyp,
            slope=slope,
            reset_down=np.where(run_start, -np.inf, np.inf),
            reset_up=np.where(run_end, -np.inf, np.inf),
        )


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
    """Mask ``[M, P, R]`` of the lines that may be on their row's upper envelope (steps 2-3).

    A line can win on an interval only if it is the highest of its equal-slope run and either
    strictly higher than every line of smaller slope or higher than every line of larger slope.
    Of identical lines (a tie for the highest of a run) only the first is kept, which is
    argmax's lowest-index choice; so no two candidates of a row share a slope.

    Two passes over the ``M`` positions, each step a vectorised operation across all rows:
    running maxima of everything above/below each position and of its own run above/below
    it (``layout.reset_*`` is −inf where a run starts/ends, +inf elsewhere, so a ``minimum``
    restarts the run maximum without a masked copy). Only one row of each running maximum is
    kept and the per-position results are booleans, which keeps the memory traffic low.
    """
    width = a.shape[0]
    shape = a.shape[1:]
    left = np.empty(a.shape, dtype=bool)  # strictly higher than all smaller slopes
    first = np.empty(a.shape, dtype=bool)  # strictly higher than the earlier lines of its run
    above = np.full(shape, -np.inf)
    run = np.full(shape, -np.inf)
    for i in range(width):
        if i:
            np.maximum(above, a[i - 1], out=above)
        np.greater(a[i], above, out=left[i])
        np.minimum(run, layout.reset_down[i], out=run)
        np.greater(a[i], run, out=first[i])
        np.maximum(run, a[i], out=run)
    below = np.full(shape, -np.inf)
    run.fill(-np.inf)
    tmp = np.empty(shape, dtype=bool)
    for i in range(width - 1, -1, -1):
        if i < width - 1:
            np.maximum(below, a[i + 1], out=below)
        np.minimum(run, layout.reset_up[i], out=run)
        np.maximum(run, a[i], out=run)
        np.greater_equal(a[i], run, out=tmp)
        first[i] &= tmp
        np.greater_equal(a[i], below, out=tmp)
        left[i] |= tmp
    left &= first
    left &= a > -np.inf
    return left


def _upper_hulls(ca: np.ndarray, cb: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Monotone-chain upper envelope of the candidates of every row (step 4).

    ``ca``/``cb`` ``[K, n]`` hold each row's candidates in strictly ascending slope, rows sorted
    by decreasing candidate count, so the rows still active at step k are a prefix. Returns the
    stack ``[K, n]`` (the slots on the envelope, bottom first) and its height per row. Steps
    run over candidate slots (K is small, ~20-50), each vectorised across all active rows.
    """
    k_max, rows = ca.shape
    ca_f, cb_f = ca.ravel(), cb.ravel()
    stack = np.zeros(k_max * rows, dtype=np.int64)  # flat [K, n]
    top = np.zeros(rows, dtype=np.int64)
    all_rows = np.arange(rows)
    active_until = np.searchsorted(-counts, -np.arange(k_max), side="left")  # rows with count > k
    for k in range(k_max):
        n = int(active_until[k])
        a_n_all, b_n_all = ca[k, :n], cb[k, :n]
        check = np.flatnonzero(top[:n] >= 2)
        while check.size:
            t = stack[(top[check] - 1) * rows + check] * rows + check
            s = stack[(top[check] - 2) * rows + check] * rows + check
            a_s, b_s = ca_f[s], cb_f[s]
            a_n, b_n = a_n_all[check], b_n_all[check]
            # t is useless when the new line overtakes s no later than t does:
            # x(s,n) <= x(s,t), i.e. (a_s-a_n)/(b_n-b_s) <= (a_s-a_t)/(b_t-b_s).
            pop = (a_s - a_n) * (cb_f[t] - b_s) <= (a_s - ca_f[t]) * (b_n - b_s)
            check = check[pop]
            top[check] -= 1
            check = check[top[check] >= 2]
        stack[top[:n] * rows + all_rows[:n]] = k
        top[:n] += 1
    return stack.reshape(k_max, rows), top


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
    # Move each row's candidates to the top (slots), keeping their slope order; order the rows
    # by decreasing candidate count so that the hull steps work on prefixes.
    r_idx, c_idx = np.nonzero(cand.T)  # row by row, positions ascending
    counts = np.bincount(r_idx, minlength=total_rows)
    row_order = np.argsort(-counts, kind="stable")
    rank = np.empty(total_rows, dtype=np.int64)
    rank[row_order] = np.arange(total_rows)
    counts_sorted = counts[row_order]
    k_idx = np.arange(len(r_idx)) - (np.cumsum(counts) - counts)[r_idx]
    k_max = int(counts_sorted[0])
    dst = k_idx * total_rows + rank[r_idx]
    src_layout = c_idx * num_rows + r_idx % num_rows
    # Every row has at least one candidate (the first highest line of its lowest slope), and
    # slots past a row's count are never read, so the arrays need no initialisation.
    ca = np.empty(k_max * total_rows)
    cb = np.empty(k_max * total_rows)
    ch = np.empty(k_max * total_rows, dtype=np.int64)
    ca[dst] = a[c_idx, r_idx // num_rows, r_idx % num_rows]
    cb[dst] = layout.slope.ravel()[src_layout]
    ch[dst] = layout.hyp.ravel()[src_layout]
    ca, cb, ch = (x.reshape(k_max, total_rows) for x in (ca, cb, ch))
    stack, top = _upper_hulls(ca, cb, counts_sorted)
    first_hyp = ch[0][rank]  # the lowest-slope candidate wins as γ → −∞
    # (5) Breakpoints between consecutive envelope lines.
    has = np.arange(1, k_max)[:, None] < top[None, :]
    step_idx, rows_sorted = np.nonzero(has)
    prev_flat = stack[step_idx, rows_sorted] * total_rows + rows_sorted
    next_flat = stack[step_idx + 1, rows_sorted] * total_rows + rows_sorted
    ca_f, cb_f, ch_f = ca.ravel(), cb.ravel(), ch.ravel()
    gamma = (ca_f[prev_flat] - ca_f[next_flat]) / (cb_f[next_flat] - cb_f[prev_flat])
    return first_hyp, row_order[rows_sorted], gamma, ch_f[prev_flat], ch_f[next_flat]


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
    num_points, num_dirs = pts.shape[0], dirs.shape[0]
    num_groups = num_points * num_dirs  # a group is one (point, direction) search
    layout = data.slope_layout(dirs)
    a_table = np.hstack([pts @ data.features.T, np.full((num_points, 1), -np.inf)])  # [P, H+1]
    a = np.empty((layout.hyp.shape[0], num_points, layout.hyp.shape[1]))  # [M, P, D*S]
    for p in range(num_points):
        np.take(a_table[p], layout.hyp, out=a[:, p, :])
    first_hyp, br_rows, gamma, h_prev, h_next = _envelopes(a, layout)

    gammas, bleus, per_group = _best_steps(data, first_hyp, br_rows, gamma, h_prev, h_next, num_groups, smooth)
    shape = (num_points, num_dirs)
    return LineSearchResult(
        gammas=gammas.reshape(shape), bleus=bleus.reshape(shape), num_breakpoints=per_group.reshape(shape)
    )


def _log_bleu_rank(stats: np.ndarray) -> np.ndarray:
    """log BLEU (unsmoothed, −inf when an order has no match) of the columns of ``[10, K]``.

    Only for ranking: it skips the exp and the 0..100 scaling of :func:`corpus_bleu`, since
    tens of thousands of intervals are ranked per call and only the winners need the score.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        score = np.log(stats[0])
        score -= np.log(stats[1])
        for n in range(1, NGRAM_ORDER):
            score += np.log(stats[2 * n])
            score -= np.log(stats[2 * n + 1])
        score /= NGRAM_ORDER
        score += np.minimum(0.0, 1.0 - stats[REF_LEN] / stats[HYP_LEN])
    score[np.isnan(score)] = -np.inf  # an order without any n-gram (0/0)
    return score


def _best_steps(
    data: MertData,
    first_hyp: np.ndarray,
    br_rows: np.ndarray,
    gamma: np.ndarray,
    h_prev: np.ndarray,
    h_next: np.ndarray,
    num_groups: int,
    smooth: Smoothing,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 5: merge the breakpoints of each group, score every interval, pick the best.

    Intervals are laid out group by group: each block is the interval before the group's
    first breakpoint followed by one interval after each breakpoint in ascending γ. A single
    cumulative sum over the statistic changes gives every interval's statistics: the first
    entry of each block holds that group's starting statistics minus the previous block's
    final ones, which restarts the sum. Statistics are kept as ``[10, K]`` so that the sums run
    along contiguous memory. Returns per group γ, BLEU (0..100) and the breakpoint count.
    """
    num_sents = data.num_sentences
    stats_t = data.stats_t32
    init = np.take(stats_t, first_hyp, axis=1).reshape(NUM_STATS, num_groups, num_sents).sum(axis=2)
    br_group = br_rows // num_sents
    if num_groups < 1 << 15:
        # Sort by γ, then stably by group: the int16 stable sort is a radix sort.
        order = np.argsort(gamma)
        order = order[np.argsort(br_group[order].astype(np.int16), kind="stable")]
    else:
        order = np.lexsort((gamma, br_group))
    gamma, br_group = gamma[order], br_group[order]
    delta = np.take(stats_t, h_next[order], axis=1) - np.take(stats_t, h_prev[order], axis=1)
    per_group = np.bincount(br_group, minlength=num_groups)
    num_br, num_iv = len(gamma), len(gamma) + num_groups
    cum = np.zeros((NUM_STATS, num_br + 1), dtype=np.int64)
    np.cumsum(delta, axis=1, out=cum[:, 1:])
    ends = np.cumsum(per_group)
    final = init + cum[:, ends] - cum[:, ends - per_group]
    block_start = ends - per_group + np.arange(num_groups)  # each group's first interval
    bp_pos = np.arange(num_br) + br_group + 1
    vals = np.empty((NUM_STATS, num_iv), dtype=np.int64)
    vals[:, bp_pos] = delta
    vals[:, block_start] = init
    vals[:, block_start[1:]] -= final[:, :-1]
    iv_stats = np.cumsum(vals, axis=1)
    iv_left = np.full(num_iv, -np.inf)
    iv_left[bp_pos] = gamma
    iv_right = np.append(iv_left[1:], np.inf)
    block_end = np.append(block_start[1:], num_iv) - 1
    iv_right[block_end] = np.inf
    iv_group = np.repeat(np.arange(num_groups), per_group + 1)

    if smooth == "none":
        score = _log_bleu_rank(iv_stats)
    else:
        with np.errstate(divide="ignore"):
            score = np.log(np.asarray(corpus_bleu(iv_stats.T, smooth)))
    finite_left = np.where(np.isfinite(iv_left), np.abs(iv_left), 0.0)
    finite_right = np.where(np.isfinite(iv_right), np.abs(iv_right), 0.0)
    scale = np.maximum(1.0, np.maximum(finite_left, finite_right))
    score[iv_right - iv_left <= MIN_RELATIVE_WIDTH * scale] = -np.inf  # empty (float noise) intervals
    # Best score per group; among equals the interval holding 0, else the one nearest to 0.
    best_score = np.maximum.reduceat(score, block_start)
    contains_zero = (iv_left < 0.0) & (iv_right > 0.0)
    distance = np.where(contains_zero, 0.0, np.minimum(np.abs(iv_left), np.abs(iv_right)))
    distance[score < best_score[iv_group]] = np.inf
    nearest = np.minimum.reduceat(distance, block_start)
    positions = np.where(distance == nearest[iv_group], np.arange(num_iv), num_iv)
    best = np.minimum.reduceat(positions, block_start)

    left, right = iv_left[best], iv_right[best]
    has_br = per_group > 0
    spread = np.zeros(num_groups)
    spread[has_br] = iv_left[block_end[has_br]] - iv_left[block_start[has_br] + 1]
    pad = np.maximum(OUTER_STEP_MIN, OUTER_STEP_FRACTION * spread)
    with np.errstate(invalid="ignore"):
        mid = 0.5 * (left + right)
        outer = np.where(np.isinf(left), np.where(np.isinf(right), 0.0, right - pad), left + pad)
    gammas = np.where(contains_zero[best], 0.0, np.where(np.isinf(left) | np.isinf(right), outer, mid))
    bleus = np.asarray(corpus_bleu(iv_stats[:, best].T, smooth), dtype=np.float64)
    return gammas, bleus, per_group.astype(np.int64)


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
