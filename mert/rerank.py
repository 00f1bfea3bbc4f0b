"""Reranking fixed n-best lists: new feature columns, weights tuned on dev's lists, the best of each list.

The cheap way to ask what a model adds to a tuned Moses system (Och et al. 2004; Sutskever et al.
2014 on this very task): decode dev and test once with the system's weights into large n-best lists,
append the model's score to every hypothesis, tune all weights on the fixed dev lists by MERT and
take the best hypothesis of each test list under them. No decoding is repeated, so many models and
sets of them can be compared on the same lists; the comparison must be against the same lists
reranked *without* the new columns (tuned the same way), since tuning on fixed lists itself moves BLEU.

The lists' oracle BLEU bounds what any reranking could reach: :func:`oracle_rows` picks, sentence by
sentence, the hypothesis that raises corpus BLEU most given the others' picks (coordinate ascent
from the 1-best, as n-best oracles are usually computed: the exact corpus oracle is NP-hard).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from infrastructure.errors import UserError
from mert.bleu import NUM_STATS, References, bleu_stats_batch, corpus_bleu
from mert.line_search import MertData
from mert.optimizer import OptimizeResult, optimize_runs
from moses_integration.nbest import NBestArrays, column_names
from moses_integration.tokens import split_tokens


class RerankError(UserError):
    """Lists and columns (or weights) that do not fit together."""


def with_columns(arrays: NBestArrays, extra: Sequence[tuple[str, np.ndarray]]) -> NBestArrays:
    """``arrays`` with each ``(name, values [H, k])`` appended as a feature of k columns, in order."""
    names, blocks = list(arrays.feature_names), [arrays.features]
    for name, values in extra:
        values = np.asarray(values, dtype=np.float64)
        values = values[:, None] if values.ndim == 1 else values
        if values.shape[0] != len(arrays.hypotheses):
            raise RerankError(f"feature {name} has {values.shape[0]} values for the {len(arrays.hypotheses)} "
                              f"hypotheses of {arrays.path}")
        if any(name == n for n, _ in names):
            raise RerankError(f"feature {name} is in {arrays.path} already")
        names.append((name, values.shape[1]))
        blocks.append(values)
    return replace(arrays, features=np.hstack(blocks), feature_names=names)


def best_rows(scores: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The row of each sentence's highest score (its first on ties: Moses' order, best first)."""
    return np.asarray([offsets[s] + int(np.argmax(scores[offsets[s]:offsets[s + 1]]))
                       for s in range(len(offsets) - 1)], dtype=np.int64)


def one_best(arrays: NBestArrays, weights: np.ndarray) -> list[str]:
    """Each sentence's best hypothesis under ``weights`` (one per column of ``arrays``)."""
    if weights.shape != (arrays.features.shape[1],):
        raise RerankError(f"{weights.shape[0]} weights for the {arrays.features.shape[1]} columns of {arrays.path}")
    return [arrays.hypotheses[i] for i in best_rows(arrays.features @ weights, arrays.offsets)]


#: Hypotheses whose words are split at once when their BLEU statistics are counted: a 1000-best list of
#: 3,003 sentences split whole holds 90M word objects (several GB); in blocks, a few hundred MB.
STATS_BLOCK_HYPOTHESES = 200_000


def bleu_statistics(arrays: NBestArrays, references: References, *, block: int = STATS_BLOCK_HYPOTHESES
                    ) -> np.ndarray:
    """``[H, 10]`` BLEU statistics of every hypothesis against its sentence's references, counted
    whole sentences at a time, about ``block`` hypotheses each (the same figures as all at once)."""
    if len(references) != arrays.num_sentences:
        raise RerankError(f"{len(references)} references for the {arrays.num_sentences} sentences of {arrays.path}")
    offsets, parts, first = arrays.offsets, [], 0
    while first < arrays.num_sentences:
        last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + block, side="right")) - 1)
        rows = slice(int(offsets[first]), int(offsets[last]))
        parts.append(bleu_stats_batch([split_tokens(h) for h in arrays.hypotheses[rows]],
                                      arrays.sent_ids[rows] - first, References(references.tokens[first:last])))
        first = last
    return np.concatenate(parts) if parts else np.zeros((0, NUM_STATS), dtype=np.int64)


@dataclass(frozen=True)
class TunedOnLists:
    """Weights tuned on fixed lists, by column, and the dev BLEU they reach there (tokenised, MERT's)."""

    weights: np.ndarray
    columns: tuple[str, ...]
    dev_bleu: float
    start_bleu: float  # the start weights' dev BLEU on the same lists

    def named(self) -> dict[str, float]:
        return {c: round(float(w), 6) for c, w in zip(self.columns, self.weights, strict=True)}


def tune_on_lists(
    arrays: NBestArrays, stats: np.ndarray, start: np.ndarray, *, fixed: np.ndarray, restarts: int, seed: int,
    threads: int = 1,
) -> TunedOnLists:
    """MERT (:func:`mert.optimizer.optimize_runs`: the start point, ``restarts`` random ones, Moses' rules for
    fixed columns and normalisation) on one fixed set of lists, ``stats`` from :func:`bleu_statistics`."""
    if stats.shape != (len(arrays.hypotheses), NUM_STATS):
        raise RerankError(f"BLEU statistics of shape {stats.shape} for {len(arrays.hypotheses)} hypotheses")
    data = MertData(arrays.features, stats, arrays.offsets)
    result: OptimizeResult = optimize_runs(data, start, restarts=restarts, fixed=fixed, seed=seed, threads=threads)
    return TunedOnLists(result.weights, tuple(column_names(arrays.feature_names)), result.bleu,
                        float(data.score(np.asarray(start, dtype=np.float64))))


def prefix_rows(offsets: np.ndarray, size: int) -> np.ndarray:
    """The rows of each sentence's first ``size`` hypotheses (all of a shorter list)."""
    return np.concatenate([np.arange(offsets[s], min(offsets[s + 1], offsets[s] + size))
                           for s in range(len(offsets) - 1)]).astype(np.int64)


def oracle_rows(stats: np.ndarray, offsets: np.ndarray, passes: int = 3) -> np.ndarray:
    """Each sentence's hypothesis in a high-BLEU choice: from the 1-best, every sentence in turn takes
    the hypothesis that gives the best corpus BLEU (sacreBLEU's ``exp`` smoothing) with the others as
    they are, for ``passes`` passes or until none changes. A lower bound on the true oracle, exact on
    lists where one choice is best whatever the others are."""
    choice = offsets[:-1].astype(np.int64).copy()
    total = stats[choice].sum(axis=0)
    for _ in range(passes):
        changed = False
        for s in range(len(offsets) - 1):
            lo, hi = int(offsets[s]), int(offsets[s + 1])
            scores = corpus_bleu(total - stats[choice[s]] + stats[lo:hi], smooth="exp")
            j = lo + int(np.argmax(scores))
            if scores[j - lo] > scores[choice[s] - lo]:
                total += stats[j] - stats[choice[s]]
                choice[s], changed = j, True
        if not changed:
            break
    return choice


def oracle_bleu(stats: np.ndarray, offsets: np.ndarray, size: int | None = None) -> float:
    """The oracle BLEU (:func:`oracle_rows`) of each sentence's first ``size`` hypotheses (all: None)."""
    if size is not None:
        rows = prefix_rows(offsets, size)
        counts = np.minimum(np.diff(offsets), size)
        stats, offsets = stats[rows], np.concatenate([[0], np.cumsum(counts)])
    return float(corpus_bleu(stats[oracle_rows(stats, offsets)].sum(axis=0), smooth="exp"))
