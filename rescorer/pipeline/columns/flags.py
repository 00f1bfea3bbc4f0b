"""The proposal indicator column of ``rescorer propose``: exp(1) on the lines it proposed, 1 on the others.

Moses reads it back as 1 and 0, so the feature counts the proposed phrase pairs a translation uses
and MERT decides what they are worth. The lines are the merged table's 1-based line numbers.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moses_integration.phrase_table import format_log_probability
from rescorer.pipeline.columns.base import ChunkRows, StartWeight

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreSummary


def flag_column(flags: np.ndarray) -> pa.Array:
    """exp(1) for a flagged line, exp(0) = 1 for the others."""
    values = pa.array([format_log_probability(0.0), format_log_probability(1.0)], pa.string())
    return pc.take(values, pa.array(flags.astype(np.int8)))


class ProposalFlags:
    """Whether each line is one of ``lines`` (sorted 1-based input line numbers)."""

    parquet = None
    format = staticmethod(flag_column)
    start_weight = StartWeight("proposed-weight", "the indicator column (Moses reads 1 per proposed pair used)")
    planner = None
    model = None

    def __init__(self, lines: np.ndarray) -> None:
        self.lines = lines

    def score(self, rows: ChunkRows) -> np.ndarray:
        wanted, line_nos = self.lines, rows.line_numbers
        if not len(wanted):
            return np.zeros(len(line_nos), dtype=bool)
        at = np.minimum(np.searchsorted(wanted, line_nos), len(wanted) - 1)
        return wanted[at] == line_nos

    def summarise(self, values: np.ndarray, rows: ChunkRows, summary: RescoreSummary) -> None:
        """Nothing: the proposals' own summary counts them."""

    def record_identity(self, record: dict) -> None:
        """The lines, by their digest: a resume must flag the same ones."""
        record["options"]["flag_lines"] = hashlib.sha1(
            np.ascontiguousarray(self.lines, dtype=np.int64).tobytes()).hexdigest()

    def first_chunk(self, rows: ChunkRows) -> None:
        """Nothing to check."""
