"""The score columns ``rescore-phrase-table`` appends to each line, each one module of the
:class:`~rescorer.pipeline.columns.base.Column` protocol, and their registration: which a run has, in order.

A new column is a module here and one line in :func:`columns_of_run`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rescorer.pipeline.columns.base import Column, ScoringModel
from rescorer.pipeline.columns.flags import ProposalFlags
from rescorer.pipeline.columns.reverse import ReverseColumn
from rescorer.pipeline.columns.rnn import RNNColumn
from rescorer.pipeline.columns.unknown import UnknownWords

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreOptions


def columns_of_run(forward: ScoringModel, reverse: ScoringModel | None, options: RescoreOptions) -> list[Column]:
    """The columns of a run, in their order on a line: p(e|f), exp(-#unknown words), with a reverse
    model p(f|e), with ``options.flag_lines`` the proposal indicator last."""
    columns: list[Column] = [RNNColumn(forward), UnknownWords(options.wp_side)]
    if reverse is not None:
        columns.append(ReverseColumn(reverse))
    if options.flag_lines is not None:
        columns.append(ProposalFlags(options.flag_lines))
    return columns
