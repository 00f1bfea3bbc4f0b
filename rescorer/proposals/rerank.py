"""Proposals chosen by both directions: the beam's candidates reranked by p(e|f), p(f|e) and length.

Proposals that are the likeliest targets under p(e|f) alone, like any such search's, come out
short and generic ("jump over" -> "de"). The known remedy (maximum mutual information,
Li et al. 2016, "A Diversity-Promoting Objective Function for Neural Conversation Models") is to
rerank a wider beam's candidates by how well each explains its source too. For a source f of n
words and a candidate e of m words:

    score(e) = log p(e|f) + λ · log p(f|e) + μ · log P(m | n)

The candidates come from a wider, *collecting* beam under p(e|f) (``beam_search_batch(collect=True)``):
width W live hypotheses up to the longest target, every finished one kept, so that targets of every
length are there to choose from; the W best by log p(e|f) + μ log P(m | n) (:func:`preselect`) are
scored by the reverse model and reranked by the whole score.

* log p(e|f): the forward model's score, the beam's own (float64 sum of its steps);
* log p(f|e): a *reverse* model's score of the source given the candidate: a checkpoint of this
  project's RNN Encoder–Decoder whose source side is the table's target language, scored with
  the rescoring pipeline's own :class:`~rescorer.pipeline.scoring.PairScorer`;
* log P(m | n): the table's own length distribution (:class:`LengthPrior`), which pulls a
  candidate towards the lengths the table's pairs of an n-word source have.

λ and μ (:data:`DEFAULT_WEIGHTS`) were chosen on dev text only (``rescorer rerank-weights``,
:mod:`rescorer.proposals.weights`; docs/proposals.md says how): a system's own dev set may choose
others. Ties go to the smaller target in byte order, so the choice does not depend on the beam's
order.

The proposed lines' two phrase-probability columns come from the same scores (:func:`forward_shares`,
:func:`proposed_phrase_probabilities`): p(e|f) is the forward probability of the candidate
normalised over the beam's finished candidates of its source, p(f|e) the reverse model's
probability itself (docs/proposals.md, "Filling a proposed line's Moses columns").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from moses_integration.tokens import split_tokens
from neural.vocab import UNK_ID, Vocab
from rescorer.model.checkpoint import Checkpoint
from rescorer.pipeline.scoring import PairScorer
from rescorer.tables.chunks import TokenIds

# The beam width when reranking (--beam's default with --reverse-model): the live hypotheses of the
# collecting search, and how many of its finished targets the reverse model scores (preselect).
RERANK_BEAM = 40
LOG_FLOOR = -100.0  # Moses' floor for ln of a column (SPEC §3): what exp(LOG_FLOOR) is read back as


@dataclass(frozen=True)
class RerankWeights:
    """λ (the reverse model's log-probability) and μ (the length prior), log p(e|f) weighing 1."""

    reverse: float
    length: float

    def describe(self) -> str:
        return f"log p(e|f) + {self.reverse:g} log p(f|e) + {self.length:g} log P(target length | source length)"


# Chosen on dev text (newstest2012's first 10 sentences) with Table 1's small-news forward RNN and a
# reverse one trained 50 minutes (the same choice after 30):
# rescorer rerank-weights, docs/proposals.md ("The weights").
DEFAULT_WEIGHTS = RerankWeights(reverse=0.5, length=0.0)


class LengthPrior:
    """log P(m | n): a target's word count m given its source's n, from a table's pairs, add-one smoothed.

    ``counts[n, m]`` is how many of the table's lines have an n-word source and an m-word target
    (each line once, as the RNN is trained: unique pairs, frequencies ignored). P(m | n) =
    (counts[n, m] + 1) / (counts[n, ·] + M) for m in 1..M, M the longest target the prior covers;
    a source length the table never has gets the uniform 1/M.
    """

    def __init__(self, counts: np.ndarray, max_target_words: int) -> None:
        if max_target_words < 1:
            raise ValueError(f"the prior needs targets of at least 1 word, got {max_target_words}")
        rows = max(counts.shape[0], 1)
        table = np.zeros((rows, max_target_words + 1), dtype=np.float64)
        width = min(counts.shape[1], max_target_words + 1) if counts.ndim == 2 else 0
        if width:
            table[: counts.shape[0], :width] = counts[:, :width]
        table[:, 0] = 0.0  # no empty targets: m starts at 1
        totals = table[:, 1:].sum(axis=1, keepdims=True)
        self.log_p = np.log((table + 1.0) / (totals + max_target_words))
        self.log_p[:, 0] = -math.inf
        self.max_target_words = max_target_words

    def __call__(self, source_words: int, target_words: int) -> float:
        if not 1 <= target_words <= self.max_target_words:
            return -math.inf
        if source_words >= self.log_p.shape[0]:
            return -math.log(self.max_target_words)
        return float(self.log_p[source_words, target_words])


@dataclass(frozen=True)
class Candidate:
    """A target the beam found for a source that may be proposed, with both directions' scores."""

    target: str
    log_p: float  # log p(e|f), the forward model's
    log_p_reverse: float  # log p(f|e), the reverse model's
    log_share: float  # ln of the p(e|f) column: log p(e|f) normalised over the beam's finished candidates


def rerank_score(candidate: Candidate, source_words: int, prior: LengthPrior, weights: RerankWeights) -> float:
    """The module doc's score(e)."""
    length = len(split_tokens(candidate.target))
    return candidate.log_p + weights.reverse * candidate.log_p_reverse + weights.length * prior(source_words, length)


def preselect(candidates: Sequence[Candidate], source_words: int, prior: LengthPrior, weights: RerankWeights,
              k: int) -> list[Candidate]:
    """The ``k`` best candidates by log p(e|f) + μ log P(m | n): those the reverse model scores.

    The collecting search (:func:`rescorer.proposals.beam.beam_search_batch`) finds up to
    width × (max words + 1) finished targets per source; scoring all of them in reverse would
    cost several times the search, and a candidate far down both the forward score and the
    length prior is not one the reverse model can lift to the top.
    """
    def key(c: Candidate) -> tuple[float, bytes]:
        return -(c.log_p + weights.length * prior(source_words, len(split_tokens(c.target)))), c.target.encode()

    return sorted(candidates, key=key)[:k]


def best_candidates(candidates: Sequence[Candidate], source_words: int, prior: LengthPrior, weights: RerankWeights,
                    k: int) -> list[Candidate]:
    """The ``k`` best candidates by :func:`rerank_score`, best first (ties: the target's bytes)."""
    scored = sorted(candidates, key=lambda c: (-rerank_score(c, source_words, prior, weights), c.target.encode()))
    return scored[:k]


def forward_shares(log_ps: Sequence[float]) -> list[float]:
    """ln of each finished candidate's share of the beam's probability mass: log p − logsumexp(log p's).

    The p(e|f) column of a proposed line: like the table's relative frequency c(f, e) / c(f), a
    distribution over the targets of one source, here the targets the search found for it.
    """
    if not log_ps:
        return []
    top = max(log_ps)
    total = top + math.log(sum(math.exp(v - top) for v in log_ps))
    return [v - total for v in log_ps]


def proposed_phrase_probabilities(candidate: Candidate) -> tuple[float, float]:
    """The proposed line's (p(f|e), p(e|f)) columns: exp of the reverse score and of the share,
    floored at exp(−100) as the RNN column is (Moses reads a value below it as −100 anyway)."""
    return math.exp(max(candidate.log_p_reverse, LOG_FLOOR)), math.exp(max(candidate.log_share, LOG_FLOOR))


def _token_ids(phrases: Sequence[str], vocab: Vocab) -> TokenIds:
    """Ragged ids (no ``</s>``: the scorer adds it) of phrases, unknown words as ``[UNK]``."""
    encoded = [vocab.encode(split_tokens(p)) for p in phrases]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(ids) for ids in encoded])
    flat = np.fromiter((i for ids in encoded for i in ids), dtype=np.int32, count=int(offsets[-1]))
    n_unk = np.array([ids.count(UNK_ID) for ids in encoded], dtype=np.int32)
    return TokenIds(offsets, flat, n_unk)


def reverse_log_probs(scorer: PairScorer, reverse: Checkpoint, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """log p(f|e) of each (f, e) pair by the reverse model: e is its source, f its target.

    The pipeline's scorer encodes each distinct e once and decodes shared prefixes of f once, as
    it scores a table; the score is the model's exact log p, [UNK] for a word outside its shortlists.
    """
    if not pairs:
        return np.empty(0, dtype=np.float64)
    index: dict[str, int] = {}
    rows = np.array([index.setdefault(e, len(index)) for _, e in pairs], dtype=np.int64)
    sources = _token_ids(list(index), reverse.src_vocab)
    targets = _token_ids([f for f, _ in pairs], reverse.tgt_vocab)
    return scorer.score(sources, rows, targets)


def reverse_scorer(reverse: Checkpoint, device: torch.device, amp_dtype: torch.dtype | None,
                   precision: str) -> PairScorer:
    """The scorer of the reverse model on the search's device, in the run's precision."""
    return PairScorer(reverse.model, device, amp_dtype, precision=precision)
