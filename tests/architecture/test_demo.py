"""``make demo`` as README describes it: the Makefile's own command line, run on the sample.

The command is read from the Makefile's ``demo`` recipe rather than copied here, so a change to the
demo is what gets tested; its outputs go to a temporary folder instead of ``demo-out/``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def demo_command(out: Path) -> list[str]:
    """The demo recipe's ``rescore-phrase-table`` call, with ``demo-out/`` moved to ``out``."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe, "no demo target in the Makefile"
    lines = recipe.group(1).replace("\\\n", " ").splitlines()
    (call,) = [line for line in lines if "rescore-phrase-table" in line]
    words = shlex.split(call)
    assert words[0] == "$(BIN)/rescore-phrase-table"
    words[0] = str(Path(sys.executable).parent / "rescore-phrase-table")
    return [str(out / w.removeprefix("demo-out/")) if w.startswith("demo-out/") else w for w in words]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, str]:
    """One run of the demo, stderr to a file as in ``make demo > log 2>&1``: (result, stderr)."""
    out = tmp_path_factory.mktemp("demo-out")
    log = out / "stderr.log"
    with open(log, "w") as err:
        result = subprocess.run(demo_command(out), cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    assert result.returncode == 0, log.read_text()[-3000:]
    assert (out / "phrase-table.rnn.gz").is_file() and (out / "moses.ini").is_file()
    with open(log, encoding="utf-8", newline="") as fh:  # keep each redraw's \r as it was written
        return result, fh.read()


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
