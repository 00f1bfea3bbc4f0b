"""The value rules of ``rescore-phrase-table``'s numbers and ``--wp-side``, stated once (torch-free).

:meth:`rescorer.pipeline.rescore.RescoreOptions.check` applies them to a library caller's options,
and ``rescorer/cli.py`` builds each option's click type from the same rule, so the command line
refuses a bad value while parsing (before ``-j`` is cut to the CPUs) with the same line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infrastructure.cli_options import MAX_THREADS
from infrastructure.files import MEMBER_LEVELS

#: The most lines a chunk holds: a chunk is in memory several times over (its lines, ids, trees, scores),
#: and 10M lines of a real table are some GB.
MAX_CHUNK_LINES = 10_000_000
#: The most padded tokens a batch holds: 16 times what a GPU's automatic budget reaches (rescorer.pipeline.scoring).
MAX_TOKEN_BUDGET = 1 << 24


@dataclass(frozen=True)
class WholeNumber:
    """A whole number from ``minimum`` to ``maximum``; ``flags``: the option's names on the command line."""

    flags: tuple[str, ...]
    minimum: int
    maximum: int

    @property
    def hint(self) -> str:
        """The option as click names it in an error (``'-j' / '--workers'``), so both say the same line."""
        return " / ".join(f"'{flag}'" for flag in self.flags)

    def problem(self, value: object) -> str | None:
        """What is wrong with ``value``, in click's words for a range; None when it is allowed."""
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            return f"{value!r} is not a whole number."
        if not self.minimum <= value <= self.maximum:
            return f"{value} is not in the range {self.minimum}<=x<={self.maximum}."
        return None


#: Whose words outside the shortlist ``--wp-side`` counts (:mod:`rescorer.pipeline.columns.unknown`).
WP_SIDES = ("target", "source", "both")


def wp_side_problem(value: object) -> str | None:
    """What is wrong with a ``--wp-side`` value, in click's words for a choice; None when it is one."""
    return None if value in WP_SIDES else f"{value!r} is not one of {', '.join(map(repr, WP_SIDES))}."


#: ``RescoreOptions`` field (``token_budget``: of its ``scoring``) -> its rule. A chunk of 0 lines never
#: fills: the reader would take the whole table into memory.
WHOLE_NUMBERS = {
    "chunk_lines": WholeNumber(("--chunk-lines",), 1, MAX_CHUNK_LINES),
    "workers": WholeNumber(("-j", "--workers"), 0, MAX_THREADS),
    "compress_level": WholeNumber(("--compress-level",), MEMBER_LEVELS[0], MEMBER_LEVELS[-1]),
    "token_budget": WholeNumber(("--token-budget",), 1, MAX_TOKEN_BUDGET),
}
