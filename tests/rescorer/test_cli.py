"""The ``rescorer`` command line: what it refuses while it is read, before a model is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from analysis_checkpoint import EXAMPLE_TABLE, write_random_checkpoint
from rescorer.cli import main


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return write_random_checkpoint(EXAMPLE_TABLE, tmp_path_factory.mktemp("model") / "m.pt")


@pytest.mark.parametrize("command, option, value", [
    ("sample", "-n", "1000000000000"),  # asked torch for 8 TB: an allocation traceback
    ("sample", "--beam", "1000000000000"),  # 1.3 PB
    ("sample", "--max-words", "1001"),  # longer than any phrase a table may hold
    ("report", "-n", "10001"),
    ("report", "--beam", "1001"),
    ("propose", "--beam", "1000000000000"),  # 1.3 PB
    ("propose", "--max-target-words", "1001"),  # would write lines that every reader of tables rejects
    ("propose", "--max-source-words", "1001"),
    ("rerank-weights", "--beam", "1001"),
    ("rerank-weights", "--plain-beam", "1001"),
])
def test_search_sizes_beyond_their_limits_are_one_line_before_any_work(tmp_path: Path, model: Path, command: str,
                                                                       option: str, value: str) -> None:
    table, out = str(EXAMPLE_TABLE), str(tmp_path / "out")
    args = {
        "sample": [str(model), "the house"],
        "report": [str(model), table, out],
        "propose": [table, out + ".gz", "--model", str(model)],
        "rerank-weights": [table, "--model", str(model), "--reverse-model", str(model), "--text", table,
                           "--reference", table],
    }[command]
    res = CliRunner().invoke(main, [command, *args, "--threads", "1", option, value])
    assert isinstance(res.exception, SystemExit) and res.exit_code == 1, (res.exception, res.output)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and f"'{option}'" in lines[0] and "is not in the range" in lines[0], res.output
    assert list(tmp_path.iterdir()) == []
