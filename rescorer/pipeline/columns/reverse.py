"""The reverse model's column, p(f|e) (``--reverse-model``): its plan of a chunk, rows grouped by target."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescorer.pipeline.scoring_plan import ScoringPlan, plan_scoring
from rescorer.tables.chunks import phrases_to_ids

if TYPE_CHECKING:
    from rescorer.pipeline.chunk_prep import PrepareTask


def plan_reverse(source: pa.Array, target: pa.Array, rev_src_words: pa.Array, rev_tgt_words: pa.Array,
                 task: PrepareTask) -> ScoringPlan:
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
    return plan_scoring(rev_sources, target_of_row, rev_targets, task.token_budget,
                        share_sources=task.share_sources, sort_by_length=task.sort_by_length)
