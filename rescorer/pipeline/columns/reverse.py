"""The reverse model's column, p(f|e) (``--reverse-model``, a model of ``rescorer train --reverse``).

Computed in the same run from the same chunks: each chunk gets a second plan with its rows grouped by
target phrase (:func:`plan_reverse`), scored by the reverse model's scorer; written as the RNN's column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infrastructure.resume_record import content_identity
from rescorer.pipeline.columns.base import (
    ChunkPhrases,
    ChunkRows,
    PlanSettings,
    ScoringModel,
    StartWeight,
    scorer_identity,
)
from rescorer.pipeline.columns.rnn import probability_column, warn_low_overlap
from rescorer.pipeline.scoring_plan import ScoringPlan, plan_scoring
from rescorer.tables.chunks import phrases_to_ids

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreSummary

#: The reverse model's plan in a prepared chunk.
REVERSE = "reverse"


def plan_reverse(source: pa.Array, target: pa.Array, rev_src_words: pa.Array, rev_tgt_words: pa.Array,
                 settings: PlanSettings) -> ScoringPlan:
    """The reverse model's plan of a chunk: its rows grouped by target phrase, roles swapped.

    The table is sorted by source, so a target recurs across the chunk ("de" under hundreds of
    sources). Its distinct targets are the reverse model's sources, each encoded once; sorted by
    their bytes, a phrase and its extensions fall in the same encoder group, as sources do in the
    table. Each row's source phrase is the reverse model's target, decoded in the trees of
    :func:`rescorer.pipeline.scoring_plan.plan_scoring`, whose rows are the chunk's rows: the
    scores come back in line order.
    """
    encoded = pc.dictionary_encode(target)
    order = pc.array_sort_indices(encoded.dictionary).to_numpy(zero_copy_only=False)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    rev_sources = phrases_to_ids(encoded.dictionary.take(pa.array(order)), rev_src_words)
    target_of_row = rank[encoded.indices.to_numpy(zero_copy_only=False)]
    rev_targets = phrases_to_ids(source, rev_tgt_words)
    return plan_scoring(rev_sources, target_of_row, rev_targets, settings.token_budget,
                        share_sources=settings.share_sources, sort_by_length=settings.sort_by_length)


@dataclass
class ReversePlanner:
    """The reverse model's plan of a chunk (:func:`plan_reverse`); its shortlists, whose sources are
    the table's target language, as Arrow."""

    src_words: pa.Array
    tgt_words: pa.Array
    name: str = REVERSE

    @classmethod
    def of_words(cls, src_words: list[str], tgt_words: list[str]) -> ReversePlanner:
        return cls(pa.array(src_words, pa.string()), pa.array(tgt_words, pa.string()))

    def plan(self, phrases: ChunkPhrases, settings: PlanSettings) -> ScoringPlan:
        return plan_reverse(phrases.source, phrases.target, self.src_words, self.tgt_words, settings)


class ReverseColumn:
    """p(f|e) of the reverse model, exp(log p) floored at exp(-100), as the RNN's column."""

    parquet = ("reverse_log_p", pa.float64())
    format = staticmethod(probability_column)
    start_weight = StartWeight("reverse-weight", "the --reverse-model column, p_RNN(source|target)")

    def __init__(self, model: ScoringModel) -> None:
        self.model = model
        self.planner = ReversePlanner.of_words(model.src_words, model.tgt_words)

    def score(self, rows: ChunkRows) -> np.ndarray:
        return rows.written(self.model.scorer.score_plan(rows.plan(REVERSE)))

    def summarise(self, values: np.ndarray, rows: ChunkRows, summary: RescoreSummary) -> None:
        summary.sum_reverse_log_prob = (summary.sum_reverse_log_prob or 0.0) + float(values.sum())

    def record_identity(self, record: dict) -> None:
        """The model and its scorer's settings, under names of their own: a record of a run without a
        reverse model has none of them."""
        record["options"]["reverse_model"] = content_identity(self.model.path)
        record["options"]["reverse_scorer"] = scorer_identity(self.model.scorer)

    def first_chunk(self, rows: ChunkRows) -> None:
        warn_low_overlap(rows.plan(REVERSE), "reverse ")
