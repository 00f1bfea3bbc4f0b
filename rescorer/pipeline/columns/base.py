"""What a score column is: the :class:`Column` protocol the pipeline runs, and what it hands a column.

A column is one more score field appended to every line. The pipeline runs each column's parts where
they belong: its :class:`Planner` (if any) in the worker processes that parse a chunk, its
:meth:`Column.score` and :meth:`Column.summarise` in the main process, in table order, its
:meth:`Column.format` back in a worker, which turns the values into the text Moses reads. So the
planners and the formatters travel to worker processes (by pickling): this module, and every column
module, imports no torch; a model's scorer is built by the caller (:mod:`rescorer.pipeline.rescore`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np
import pyarrow as pa

from rescorer.pipeline.scoring_plan import ScoringPlan

if TYPE_CHECKING:
    from rescorer.pipeline.chunk_prep import PreparedChunk
    from rescorer.pipeline.rescore import RescoreSummary
    from rescorer.pipeline.scoring import ScoringOptions


class ChunkScorer(Protocol):
    """What a model column needs of a scorer: :class:`rescorer.pipeline.scoring.PairScorer`, or a stand-in
    (``benchmarks/pipeline_speed.py`` measures the pipeline with a constant one)."""

    token_budget: int  # tokens per tree group, read when a chunk's trees are planned
    options: ScoringOptions

    def score_plan(self, plan: ScoringPlan) -> np.ndarray: ...


@dataclass
class ScoringModel:
    """A model as a run scores with it: its scorer, its shortlists, and its file (which identifies it
    for ``--resume``; None: none to check)."""

    scorer: ChunkScorer
    src_words: list[str]
    tgt_words: list[str]
    path: str | os.PathLike | None


@dataclass(frozen=True)
class StartWeight:
    """A column's feature weight in the moses.ini a command writes: the option that sets it (``rnn-weight``:
    ``--rnn-weight``) and what it weighs, for the option's help. Every start weight is 0 by default:
    the untuned system then decodes exactly as before (a weight of 0.2 on log p_RNN, about ten times the
    table's log-probabilities in size, dropped the fixture's dev BLEU from 24.05 to 19.44), and MERT's
    random restarts explore the new columns from there."""

    option: str
    weighs: str

    @property
    def parameter(self) -> str:
        """The option's name as click hands it to the command: ``rnn_weight``."""
        return self.option.replace("-", "_")


@dataclass
class ChunkPhrases:
    """A parsed chunk's good rows as a planner sees them, in a worker: the phrases, and the distinct
    sources (``source_dictionary``, in order of first appearance) with each row's index into them."""

    source: pa.Array
    target: pa.Array
    source_dictionary: pa.Array
    source_of_row: np.ndarray


@dataclass(frozen=True)
class PlanSettings:
    """How a chunk's trees are grouped: the scorer's token budget and options when the chunk is sent."""

    token_budget: int
    share_sources: bool = True
    sort_by_length: bool = True


class Planner(Protocol):
    """A column's work on a chunk before the model, in a worker process (torch-free, pickled to each
    worker once): its :class:`ScoringPlan`, kept in the prepared chunk under :attr:`name`."""

    name: str

    def plan(self, phrases: ChunkPhrases, settings: PlanSettings) -> ScoringPlan: ...


@dataclass
class ChunkRows:
    """A prepared chunk as the columns see it in the main process: its plans, which of its scored rows
    are written (``kept``, a mask; None: all; a shard's end scores a chunk whole and writes its rows
    only) and the 1-based input line numbers of the rows written."""

    prep: PreparedChunk
    kept: np.ndarray | None
    line_numbers: np.ndarray

    def written(self, values: np.ndarray) -> np.ndarray:
        """``values`` of every scored row, cut to the rows written."""
        return values if self.kept is None else values[self.kept]

    def plan(self, name: str) -> ScoringPlan:
        return self.prep.plans[name]


class Column(Protocol):
    """One score column: how it is planned, scored, written, summed up and identified for ``--resume``.

    A new column is one module with a class of this shape, and its place in
    :data:`rescorer.pipeline.columns.COLUMNS`, which sets the order of the columns on a line (and
    :func:`rescorer.pipeline.columns.columns_of_run` makes it for a run); the commands that write a
    moses.ini take its start weight's option from it.
    """

    #: Its prepared chunk's plan is made by this, in the workers (None: it needs no plan of its own).
    planner: Planner | None
    #: The model it scores with (None: none). The run keeps each model's token budget in its progress
    #: record, as an out-of-memory halving left it, so that a resume groups the chunks as before.
    model: ScoringModel | None
    #: Its field in ``--scores-parquet`` and that field's type (None: not written there).
    parquet: ClassVar[tuple[str, pa.DataType] | None]
    #: Its weight in a written moses.ini, and the option that sets it.
    start_weight: ClassVar[StartWeight]

    def score(self, rows: ChunkRows) -> np.ndarray:
        """The column's values of the rows written, in line order (the main process, in table order)."""
        ...

    format: ClassVar[Callable[[np.ndarray], pa.Array]]
    """The text of each value, as Moses reads it back: a plain function, run in a worker process."""

    def summarise(self, values: np.ndarray, rows: ChunkRows, summary: RescoreSummary) -> None:
        """Add the chunk's figures to the run's summary (the figures ``--resume`` carries on from)."""
        ...

    def record_identity(self, record: dict) -> None:
        """Add what decides this column's bytes to the run's progress record (``--resume`` must match it)."""
        ...

    def first_chunk(self, rows: ChunkRows) -> None:
        """A look at the run's first chunk with lines: a warning when the input does not suit the column."""
        ...


def scorer_identity(scorer: ChunkScorer) -> dict:
    """What decides a model's scores beyond the options: device type, precision and token budget.

    The budget decides the groups and so the shapes of every matmul, whose kernels may round
    differently; a resume with any of these changed would splice two different computations.
    """
    device = getattr(scorer, "device", None)
    return {"device": device.type if device is not None else None, "precision": getattr(scorer, "precision", None),
            "token_budget": scorer.token_budget}
