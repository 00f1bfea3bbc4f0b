"""The RNN's column, p(e|f) of the forward model (``--model``): its plan, its scores and their text.

The forward plan is also what the unknown-word column counts (:mod:`rescorer.pipeline.columns.unknown`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from infrastructure.resume_record import content_identity
from moses_integration.phrase_table import LOG_FLOOR, format_log_probability
from rescorer.pipeline.columns.base import (
    ChunkPhrases,
    ChunkRows,
    PlanSettings,
    ScoringModel,
    StartWeight,
    scorer_identity,
)
from rescorer.pipeline.scoring_plan import ScoringPlan, plan_scoring
from rescorer.tables.chunks import phrases_to_ids

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreSummary

LOW_OVERLAP_PERCENT = 50.0
#: The forward model's plan in a prepared chunk (:attr:`rescorer.pipeline.chunk_prep.PreparedChunk.plans`).
FORWARD = "forward"


def probability_column(log_probs: np.ndarray) -> pa.Array:
    """exp(log p) floored at exp(-100) per line, as Moses reads it back (the same text as
    :func:`format_log_probability`: same ``math.exp``, same ``.6g``)."""
    bad = np.isnan(log_probs) | (log_probs == math.inf)
    if bad.any():
        format_log_probability(float(log_probs[np.flatnonzero(bad)[0]]))  # raises, naming the value
    exp = math.exp
    return pa.array([f"{exp(x):.6g}" for x in np.maximum(log_probs, LOG_FLOOR).tolist()], pa.string())


def warn_low_overlap(plan: ScoringPlan, which: str = "") -> None:
    """Warn when the first chunk's words are mostly outside a model's shortlists (``which``: "reverse "
    for the reverse model, whose sources are the table's targets: the message names the table's sides)."""
    src_known = 100.0 * (1 - plan.sources.n_unk.sum() / max(1, len(plan.sources.ids)))
    tgt_known = 100.0 * (1 - plan.targets.n_unk.sum() / max(1, len(plan.targets.ids)))
    if which:
        src_known, tgt_known = tgt_known, src_known
    if min(src_known, tgt_known) < LOW_OVERLAP_PERCENT:
        warnings.warn(
            f"only {src_known:.1f}% of source words and {tgt_known:.1f}% of target words in the first chunk "
            f"are in the {which}model's shortlists; is this model trained for this table's languages and "
            "tokenisation?",
            stacklevel=2,
        )


@dataclass
class ForwardPlanner:
    """The forward model's plan of a chunk: each distinct source encoded once, its targets decoded as
    prefix trees (:func:`rescorer.pipeline.scoring_plan.plan_scoring`); the model's shortlists as Arrow."""

    src_words: pa.Array
    tgt_words: pa.Array
    name: str = FORWARD

    @classmethod
    def of_words(cls, src_words: list[str], tgt_words: list[str]) -> ForwardPlanner:
        return cls(pa.array(src_words, pa.string()), pa.array(tgt_words, pa.string()))

    def plan(self, phrases: ChunkPhrases, settings: PlanSettings) -> ScoringPlan:
        sources = phrases_to_ids(phrases.source_dictionary, self.src_words)
        targets = phrases_to_ids(phrases.target, self.tgt_words)
        return plan_scoring(sources, phrases.source_of_row, targets, settings.token_budget,
                            share_sources=settings.share_sources, sort_by_length=settings.sort_by_length)


class RNNColumn:
    """p(e|f), exp(log p) floored at exp(-100): the column of the paper (SPEC §3)."""

    parquet = ("log_p", pa.float64())
    format = staticmethod(probability_column)
    start_weight = StartWeight("rnn-weight", "the RNN column")

    def __init__(self, model: ScoringModel) -> None:
        self.model = model
        self.planner = ForwardPlanner.of_words(model.src_words, model.tgt_words)

    def score(self, rows: ChunkRows) -> np.ndarray:
        return rows.written(self.model.scorer.score_plan(rows.plan(FORWARD)))

    def summarise(self, values: np.ndarray, rows: ChunkRows, summary: RescoreSummary) -> None:
        summary.sum_log_prob += float(values.sum())

    def record_identity(self, record: dict) -> None:
        record["model"] = content_identity(self.model.path)
        record["options"].update(scorer_identity(self.model.scorer))

    def first_chunk(self, rows: ChunkRows) -> None:
        warn_low_overlap(rows.plan(FORWARD))
