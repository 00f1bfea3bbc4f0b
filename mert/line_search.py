"""Och's exact line search for MERT, vectorised over sentences and directions.

Along a line ``w + γ·d`` in weight space, hypothesis ``h`` of a sentence scores
``a_h + γ·b_h`` with ``a = X·w`` and ``b = X·d``. Which hypothesis the decoder would pick as
γ varies is given by the *upper envelope* of those lines: a sequence of hypotheses, each winning
on an interval of γ. Merging the interval boundaries of all sentences turns corpus BLEU into a
step function of γ, which can be maximised exactly (Och 2003; Moses ``mert/Optimizer.cpp``).

Moses does this sentence by sentence and hypothesis by hypothesis in C++. Here every step is a
NumPy operation over all (direction, sentence) rows at once, and the work per row is cut down
before the envelope is built:

1. lines are ordered by slope within each row (cached for the unit directions the optimiser
   uses most, since ``b`` is then a feature column and does not depend on ``w``);
2. among equal slopes only the highest line can ever win (ties: lowest hypothesis index, the
   same choice as ``argmax`` when scoring a point);
3. a line can only be on the envelope if no line with a smaller slope is at least as high
   (it must win as γ → −∞ side) or no line with a larger slope is at least as high (γ → +∞
   side); prefix/suffix maxima along the slope order find these few candidates;
4. the envelope of the candidates comes from a monotone-chain (convex hull) sweep whose steps
   run over candidate positions, vectorised across all rows;
5. each envelope change contributes ``stats[new] - stats[old]`` at its breakpoint; sorting the
   breakpoints of a direction and taking a cumulative sum gives the BLEU statistics, hence the
   score, of every interval.

The chosen γ is the middle of the best interval. The two unbounded outer intervals have no
middle: their stand-in is the finite boundary moved outward by ``OUTER_STEP_FRACTION`` of the
spread of all breakpoints of that direction, and at least ``OUTER_STEP_MIN`` (Moses uses −1000 on
the left and +0.1 on the right, which is scale-blind). If the interval holding γ = 0 is among the
best, γ = 0 is returned so that the optimiser does not drift between equally good points.
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
    _layout_cache: dict[tuple[int | None, ...], SlopeLayout] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.features = np.ascontiguousarray(self.features, dtype=np.float64)
        self.stats = np.ascontiguousarray(self.stats, dtype=np.int64)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        num_hyps = self.features.shape[0]
        if self.features.ndim != 2 or self.stats.shape != (num_hyps, NUM_STATS):
            raise ValueError("features must be [H, F] and stats [H, 10] for the same H")
        if self.offsets[0] != 0 or self.offsets[-1] != num_hyps or np.any(np.diff(self.offsets) <= 0):
            raise ValueError("offsets must rise strictly from 0 to H: every sentence needs a hypothesis")
        if not np.all(np.isfinite(self.features)):
            raise ValueError("features must be finite")
        sizes = np.diff(self.offsets)
        width = int(sizes.max())
        cols = np.arange(width)
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

        Layouts of batches made only of unit directions are cached: the optimiser asks for the
        same batch (all tuneable coordinates) at every iteration, and their slopes are feature
        columns that do not depend on the current weights, so the sorting is done once.
        """
        units = [_unit_index(d) for d in directions]
        key = tuple(units) if all(u is not None for u in units) else None
        if key is not None and key in self._layout_cache:
            return self._layout_cache[key]
        slopes = [self.features[:, u] if u is not None else self.features @ d for u, d in zip(units, directions)]
        layout = SlopeLayout.build(self, slopes)
        if key is not None:
            self._layout_cache[key] = layout
        return layout


@dataclass
class SlopeLayout:
    """Lines of every (direction, sentence) row ordered by slope, with equal-slope runs marked.

    Arrays are position-major ``[M, R+1]``: row ``r = direction * S + sentence`` is a column,
    and going down a column goes up in slope (ties by hypothesis index), padding last
    (hypothesis index H, slope +inf). Position-major because NumPy's running maxima along
    axis 0 work on whole contiguous rows at a time, several times faster than along axis 1.
    The extra last column is all padding: its intercepts are −inf, so its flat index ``R``
    serves as "no such position" in the gathers below.

    The run arrays give, for each flat position, the positions just before and just after its
    run of equal slopes (``after`` indexes the bottom-up running maximum), and the positions of
    runs longer than one, so that the per-call work is a handful of gathers.
    """

    hyp: np.ndarray  # int64 [M, R+1] hypothesis index (H = padding)
    slope: np.ndarray  # float64 [M, R+1]
    before: np.ndarray  # int64 [M*(R+1)] flat position before the run (top-down), or R
    after: np.ndarray  # int64 [M*(R+1)] flat position after the run (bottom-up), or R
    multi_pos: np.ndarray  # int64 flat positions of runs longer than one, run by run
    multi_starts: np.ndarray  # int64 start of each such run within multi_pos
    multi_len: np.ndarray  # int64 length of each such run

    @property
    def num_rows(self) -> int:
        return self.hyp.shape[1] - 1

    @classmethod
    def build(cls, data: MertData, slopes: list[np.ndarray]) -> SlopeLayout:
        hyp_parts, slope_parts = [], []
        for b in slopes:
            padded = np.where(data.valid, np.append(b, np.inf)[data.pad_index], np.inf)
            order = np.argsort(padded, axis=1, kind="stable")
            hyp_parts.append(np.take_along_axis(data.pad_index, order, axis=1))
            slope_parts.append(np.take_along_axis(padded, order, axis=1))
        num_hyps = data.features.shape[0]
        width = data.pad_index.shape[1]
        hyp_parts.append(np.full((1, width), num_hyps, dtype=np.int64))
        slope_parts.append(np.full((1, width), np.inf))
        hyp = np.ascontiguousarray(np.concatenate(hyp_parts).T)
        slope = np.ascontiguousarray(np.concatenate(slope_parts).T)
        rows1 = hyp.shape[1]
        # Runs of equal slope, computed row-major (runs are contiguous there).
        slope_rm = slope.T
        new_run = np.ones((rows1, width), dtype=bool)
        new_run[:, 1:] = slope_rm[:, 1:] != slope_rm[:, :-1]
        flat_new = new_run.ravel()
        starts = np.flatnonzero(flat_new)
        run_of = np.cumsum(flat_new) - 1
        ends = np.append(starts[1:], flat_new.size) - 1
        row = np.repeat(np.arange(rows1), width)
        start_col = starts[run_of] - row * width
        end_col = ends[run_of] - row * width
        sentinel = rows1 - 1  # flat index of (position 0, padding column)
        before_rm = np.where(start_col > 0, (start_col - 1) * rows1 + row, sentinel)
        after_rm = np.where(end_col < width - 1, (width - 1 - (end_col + 1)) * rows1 + row, sentinel)
        # Reorder the per-position arrays from row-major to position-major flat order.
        to_pm = np.arange(flat_new.size).reshape(rows1, width).T.ravel()
        run_len = ends - starts + 1
        long_runs = np.flatnonzero(run_len > 1)
        long_runs = long_runs[row[starts[long_runs]] != sentinel]  # the padding column never matters
        lens = run_len[long_runs]
        member_rm = np.repeat(starts[long_runs], lens) + (
            np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        )
        member_row = member_rm // width
        member_col = member_rm % width
        return cls(
            hyp=hyp,
            slope=slope,
            before=before_rm[to_pm],
            after=after_rm[to_pm],
            multi_pos=member_col * rows1 + member_row,
            multi_starts=(np.cumsum(lens) - lens).astype(np.int64),
            multi_len=lens.astype(np.int64),
        )


@dataclass
class LineSearchResult:
    """Best step and score for each searched direction (arrays of length ``D``)."""

    gammas: np.ndarray  # float64 [D]
    bleus: np.ndarray  # float64 [D], 0..100
    num_breakpoints: np.ndarray  # int64 [D], envelope changes merged over sentences


def _unit_index(direction: np.ndarray) -> int | None:
    nonzero = np.flatnonzero(direction)
    if len(nonzero) == 1 and direction[nonzero[0]] == 1.0:
        return int(nonzero[0])
    return None


def _envelopes(
    a_flat: np.ndarray, layout: SlopeLayout
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Upper envelopes of all rows of a layout at once, given each position's intercept.

    ``a_flat`` is position-major like the layout. Returns the hypothesis winning at γ → −∞ for
    each row ``[R]`` and the breakpoints as flat arrays: row, γ, the hypothesis before and after.
    """
    width, rows1 = layout.hyp.shape
    rows = rows1 - 1
    a = a_flat.reshape(width, rows1)
    # (2)+(3) Candidates: the highest of their equal-slope run (all of them on exact ties), and
    # strictly higher than every line of smaller slope (it may win on the γ → −∞ side) or than
    # every line of larger slope (γ → +∞ side). No other line can ever be on the envelope.
    run_max = a_flat
    if layout.multi_pos.size:
        run_max = a_flat.copy()
        run_max[layout.multi_pos] = np.repeat(
            np.maximum.reduceat(a_flat[layout.multi_pos], layout.multi_starts), layout.multi_len
        )
    down = np.maximum.accumulate(a, axis=0).ravel()
    up = np.maximum.accumulate(a[::-1], axis=0).ravel()
    cand = (a_flat == run_max) & ((a_flat > down[layout.before]) | (a_flat > up[layout.after]))
    cand &= a_flat > -np.inf
    cand = cand.reshape(width, rows1)
    counts = cand.sum(axis=0)[:rows]
    k_max = int(counts.max())
    slot = np.cumsum(cand, axis=0) - 1
    c_idx, r_idx = np.nonzero(cand)
    k_idx = slot[c_idx, r_idx]
    ca = np.full((k_max, rows), np.nan)
    cb = np.full((k_max, rows), np.nan)
    ch = np.full((k_max, rows), -1, dtype=np.int64)
    ca[k_idx, r_idx] = a[c_idx, r_idx]
    cb[k_idx, r_idx] = layout.slope[c_idx, r_idx]
    ch[k_idx, r_idx] = layout.hyp[c_idx, r_idx]
    # (4) Monotone chain over candidate slots, all rows at once: stack[:top[r], r] holds the
    # candidate slots currently on row r's envelope, in increasing slope.
    stack = np.zeros((k_max, rows), dtype=np.int64)
    top = np.zeros(rows, dtype=np.int64)
    for k in range(k_max):
        active = np.flatnonzero(counts > k)
        if k >= 1:
            # Same slope as the line on top: only the higher one can win; on a tie the
            # earlier one (lowest hypothesis index) stays, as argmax would choose.
            t = stack[top[active] - 1, active]
            same = cb[t, active] == cb[k, active]
            if same.any():
                rows_same = active[same]
                higher = ca[k, rows_same] > ca[t[same], rows_same]
                top[rows_same[higher]] -= 1
                active = np.concatenate([active[~same], rows_same[higher]])
            check = active
            while check.size:
                check = check[top[check] >= 2]
                if not check.size:
                    break
                t = stack[top[check] - 1, check]
                s = stack[top[check] - 2, check]
                a_s, b_s = ca[s, check], cb[s, check]
                a_t, b_t = ca[t, check], cb[t, check]
                a_n, b_n = ca[k, check], cb[k, check]
                # t is useless when the new line overtakes s no later than t does:
                # x(s,n) <= x(s,t), i.e. (a_s-a_n)/(b_n-b_s) <= (a_s-a_t)/(b_t-b_s).
                pop = (a_s - a_n) * (b_t - b_s) <= (a_s - a_t) * (b_n - b_s)
                check = check[pop]
                top[check] -= 1
        stack[top[active], active] = k
        top[active] += 1
    # (5) Breakpoints between consecutive envelope lines.
    all_rows = np.arange(rows)
    first_hyp = ch[stack[0], all_rows]
    if k_max < 2:
        empty_i = np.zeros(0, dtype=np.int64)
        return first_hyp, empty_i, np.zeros(0), empty_i, empty_i
    has = np.arange(1, k_max)[:, None] < top[None, :]
    step_idx, br_rows = np.nonzero(has)
    prev_slot = stack[step_idx, br_rows]
    next_slot = stack[step_idx + 1, br_rows]
    a_p, b_p = ca[prev_slot, br_rows], cb[prev_slot, br_rows]
    a_q, b_q = ca[next_slot, br_rows], cb[next_slot, br_rows]
    gamma = (a_p - a_q) / (b_q - b_p)
    return first_hyp, br_rows, gamma, ch[prev_slot, br_rows], ch[next_slot, br_rows]


def line_search_batch(
    data: MertData, weights: np.ndarray, directions: np.ndarray, smooth: Smoothing = "none"
) -> LineSearchResult:
    """Exact line search from ``weights`` along each row of ``directions`` ``[D, F]``.

    All directions start from the same point, which is how Powell/Och coordinate ascent uses
    them (Moses tries every direction from the current point, then moves along the best), so
    they share one vectorised envelope computation.
    """
    w = np.asarray(weights, dtype=np.float64)
    dirs = np.atleast_2d(np.asarray(directions, dtype=np.float64))
    if w.shape != (data.num_features,) or dirs.shape[1] != data.num_features:
        raise ValueError(f"weights and directions need {data.num_features} components")
    num_dirs, num_sents = dirs.shape[0], data.num_sentences
    layout = data.slope_layout(dirs)
    a_flat = np.append(data.features @ w, -np.inf)[layout.hyp.ravel()]
    first_hyp, br_rows, gamma, h_prev, h_next = _envelopes(a_flat, layout)

    stats = data.stats
    init = stats[first_hyp].reshape(num_dirs, num_sents, NUM_STATS).sum(axis=1)  # [D, 10]
    br_dir = br_rows // num_sents
    order = np.lexsort((gamma, br_dir))
    gamma, br_dir = gamma[order], br_dir[order]
    cum = np.cumsum(stats[h_next[order]] - stats[h_prev[order]], axis=0)
    per_dir = np.bincount(br_dir, minlength=num_dirs)
    group_start = np.concatenate([[0], np.cumsum(per_dir)[:-1]])
    cum_before = np.vstack([np.zeros((1, NUM_STATS), dtype=np.int64), cum])[group_start]
    after = init[br_dir] + cum - cum_before[br_dir]

    # Intervals: per direction the one before its first breakpoint, then one after each.
    num_br = len(gamma)
    last_of_dir = np.ones(num_br, dtype=bool)
    last_of_dir[:-1] = br_dir[1:] != br_dir[:-1]
    right_after = np.where(last_of_dir, np.inf, np.append(gamma[1:], np.inf))
    first_gamma = np.full(num_dirs, np.inf)
    first_gamma[br_dir[::-1]] = gamma[::-1]  # the smallest breakpoint of each direction
    last_gamma = np.full(num_dirs, -np.inf)
    last_gamma[br_dir] = gamma
    iv_dir = np.concatenate([np.arange(num_dirs), br_dir])
    iv_left = np.concatenate([np.full(num_dirs, -np.inf), gamma])
    iv_right = np.concatenate([first_gamma, right_after])
    iv_score = np.asarray(corpus_bleu(np.vstack([init, after]), smooth), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        width = iv_right - iv_left
        scale = np.maximum(1.0, np.maximum(np.abs(iv_left), np.abs(iv_right)))
        usable = ~(width <= MIN_RELATIVE_WIDTH * scale)  # inf widths are usable; NaN never occurs
    contains_zero = (iv_left < 0.0) & (iv_right > 0.0)
    distance = np.where(contains_zero, 0.0, np.minimum(np.abs(iv_left), np.abs(iv_right)))
    rank_score = np.where(usable, np.round(iv_score, 10), -np.inf)
    pick_order = np.lexsort((distance, -rank_score, iv_dir))
    firsts = np.ones(len(pick_order), dtype=bool)
    firsts[1:] = iv_dir[pick_order][1:] != iv_dir[pick_order][:-1]
    best = pick_order[firsts]  # one interval per direction, in direction order

    left, right = iv_left[best], iv_right[best]
    spread = np.where(np.isfinite(first_gamma), last_gamma - first_gamma, 0.0)
    pad = np.maximum(OUTER_STEP_MIN, OUTER_STEP_FRACTION * spread)
    with np.errstate(invalid="ignore"):
        mid = 0.5 * (left + right)
    gammas = np.where(
        contains_zero[best],
        0.0,
        np.where(np.isinf(left), np.where(np.isinf(right), 0.0, right - pad), np.where(np.isinf(right), left + pad, mid)),
    )
    return LineSearchResult(gammas=gammas, bleus=iv_score[best], num_breakpoints=per_dir.astype(np.int64))


def line_search(
    data: MertData, weights: np.ndarray, direction: np.ndarray, smooth: Smoothing = "none"
) -> tuple[float, float]:
    """Best step γ along ``direction`` from ``weights`` and the corpus BLEU (0..100) there."""
    result = line_search_batch(data, weights, np.asarray(direction, dtype=np.float64)[None, :], smooth)
    return float(result.gammas[0]), float(result.bleus[0])
