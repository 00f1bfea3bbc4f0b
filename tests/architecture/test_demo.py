"""``make demo`` as README describes it: the Makefile's own command line, run on the sample.

The command is read from the Makefile's ``demo`` recipe rather than copied here, so a change to the
demo is what gets tested; its outputs go to a temporary folder instead of ``demo-out/``. It runs in this
process through the command's click entry point, not as a process of its own: what is checked is the
command's output and what it writes to a standard error that is not a terminal (a log file's).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rescorer.cli import rescore_phrase_table_command

ROOT = Path(__file__).resolve().parents[2]


def demo_command(out: Path) -> list[str]:
    """The arguments of the demo recipe's ``rescore-phrase-table`` call, with ``demo-out/`` moved to ``out``."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe, "no demo target in the Makefile"
    lines = recipe.group(1).replace("\\\n", " ").splitlines()
    (call,) = [line for line in lines if "rescore-phrase-table" in line]
    words = shlex.split(call)
    assert words[0] == "$(BIN)/rescore-phrase-table"
    return [str(out / w.removeprefix("demo-out/")) if w.startswith("demo-out/") else w for w in words[1:]]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[Result, str]:
    """One run of the demo from the checkout, stderr not a terminal as in ``make demo > log 2>&1``:
    (result, stderr with each redraw's \\r as it was written)."""
    out = tmp_path_factory.mktemp("demo-out")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)
        result = CliRunner().invoke(rescore_phrase_table_command, demo_command(out))
    assert result.exit_code == 0, f"{result.stderr[-3000:]}\n{result.exception!r}"
    assert (out / "phrase-table.rnn.gz").is_file() and (out / "moses.ini").is_file()
    return result, result.stderr_bytes.decode("utf-8")


@pytest.mark.slow
def test_the_demo_model_uses_the_source(demo_run) -> None:
    """README says the demo's model translates: scoring a target after its own source must beat
    scoring it after another pair's source (docs/train.md, "Does the model use the source?")."""
    _result, stderr = demo_run
    gains = [float(g) for g in re.findall(r"source gain (-?[\d.]+) nats/pair", stderr)]
    assert gains and gains[-1] >= 0.5, gains


@pytest.mark.slow
def test_the_demo_logged_to_a_file_writes_few_progress_lines(demo_run) -> None:
    """``make demo > log 2>&1``: its four bars (table, pairs, training, rescoring) each write their
    first and last state, not a redraw every 0.1 s (about 90 in this run before)."""
    _result, stderr = demo_run
    assert "\r" not in stderr, stderr
    drawn = [line for line in stderr.splitlines() if re.match(r"(reading \w+|training|rescoring): ", line)]
    assert 4 <= len(drawn) <= 12, stderr
    assert any(line.startswith("training: 100%") for line in drawn)  # the end of each bar is still there
