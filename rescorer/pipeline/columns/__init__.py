"""The score columns ``rescore-phrase-table`` appends to each line, each one module of the
:class:`~rescorer.pipeline.columns.base.Column` protocol, and their registration: which a run has, in order.

A new column is a module here, its place in :data:`COLUMNS` and how :func:`columns_of_run` makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rescorer.pipeline.columns.base import Column, ScoringModel
from rescorer.pipeline.columns.flags import ProposalFlags
from rescorer.pipeline.columns.reverse import ReverseColumn
from rescorer.pipeline.columns.rnn import RNNColumn
from rescorer.pipeline.columns.unknown import UnknownWords

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreOptions


#: Every column, in its order on a line.
COLUMNS: tuple[type[Column], ...] = (RNNColumn, UnknownWords, ReverseColumn, ProposalFlags)


def column_kinds(*, reverse: bool, flags: bool) -> list[type[Column]]:
    """The columns a run appends, in order: p(e|f) and exp(-#unknown words) always, p(f|e) with a reverse
    model, the proposal indicator with ``flags`` (propose's). Known before any model loads: a command
    counts the columns for the moses.ini it checks, and takes their start weights, from these."""
    optional = {ReverseColumn: reverse, ProposalFlags: flags}
    return [kind for kind in COLUMNS if optional.get(kind, True)]


def columns_of_run(forward: ScoringModel, reverse: ScoringModel | None, options: RescoreOptions) -> list[Column]:
    """The columns of a run (:func:`column_kinds`), each made with what it scores."""
    made: dict[type[Column], Callable[[], Column]] = {
        RNNColumn: lambda: RNNColumn(forward),
        UnknownWords: lambda: UnknownWords(options.wp_side),
        ReverseColumn: lambda: ReverseColumn(reverse),
        ProposalFlags: lambda: ProposalFlags(options.flag_lines),
    }
    return [made[kind]() for kind in column_kinds(reverse=reverse is not None, flags=options.flag_lines is not None)]
