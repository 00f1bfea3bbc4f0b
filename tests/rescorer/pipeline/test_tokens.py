"""The unknown-word column counts tokens as Moses splits them: a no-break space joins two words into one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tiny_rescore import (
    added_columns,
    run,
)

NBSP = "\u00a0"


def test_no_break_space_makes_one_unknown_token_in_the_penalty(tmp_path: Path, tiny_checkpoint) -> None:
    table = tmp_path / "pt.txt"
    table.write_text(
        f"the house ||| la{NBSP}maison ||| 0.5 0.5 0.5 0.5\n"  # one token, unknown to the model
        "the house ||| la maison ||| 0.5 0.5 0.5 0.5\n"  # two known tokens
        "the\thouse ||| la\t\tmaison  ||| 0.5 0.5 0.5 0.5\n",  # tab and repeated spaces separate
        encoding="utf-8",
    )
    out = tmp_path / "out.txt"
    run(table, out, tiny_checkpoint)
    penalty = [cols[1] for cols in added_columns(out)]
    assert penalty[0] == pytest.approx(math.exp(-1), rel=1e-5)
    assert penalty[1] == 1.0 and penalty[2] == 1.0
