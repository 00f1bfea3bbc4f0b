"""The unknown-word column: exp(-n) for the n words of a pair outside the forward model's shortlists.

Moses reads it back as -n, so its weight is a penalty per unknown word (the paper's word penalty for
words the RNN cannot see). ``--wp-side`` says which side's words count. It counts in the forward
model's plan (:mod:`rescorer.pipeline.columns.rnn`), which has mapped every word already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moses_integration.phrase_table import format_log_probability
from rescorer.pipeline.columns.base import ChunkRows, StartWeight
from rescorer.pipeline.columns.rnn import FORWARD

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreSummary

def unknown_column(n_unknown: np.ndarray) -> pa.Array:
    """exp(-n) per line, as Moses reads it back; the column takes few values, so each is formatted once."""
    n = n_unknown.astype(np.int64)
    known = pa.array([format_log_probability(-float(k)) for k in range(int(n.max(initial=0)) + 1)], pa.string())
    return pc.take(known, pa.array(n))


class UnknownWords:
    """The count of a pair's words outside the forward model's shortlists, on ``side``'s phrases."""

    parquet = ("n_unk", pa.int32())
    format = staticmethod(unknown_column)
    start_weight = StartWeight("wp-weight", "the unknown-word column")
    planner = None  # the forward model's plan holds the counts
    model = None

    def __init__(self, side: str) -> None:
        self.side = side

    def score(self, rows: ChunkRows) -> np.ndarray:
        plan = rows.plan(FORWARD)
        src_unk = plan.sources.n_unk[plan.source_of_row]
        tgt_unk = plan.targets.n_unk
        n_unk = {"target": tgt_unk, "source": src_unk, "both": src_unk + tgt_unk}[self.side]
        return rows.written(n_unk.astype(np.int64))

    def summarise(self, values: np.ndarray, rows: ChunkRows, summary: RescoreSummary) -> None:
        """The target words, and those outside the shortlist (whatever ``side`` counts)."""
        targets = rows.plan(FORWARD).targets
        summary.target_tokens += int(rows.written(targets.lengths).sum())
        summary.target_unknown += int(rows.written(targets.n_unk).sum())

    def record_identity(self, record: dict) -> None:
        """Nothing beyond the options (``wp_side`` is one)."""

    def first_chunk(self, rows: ChunkRows) -> None:
        """The forward model's column warns for both."""
