"""README's "One example per job": the block that runs on the built-in sample runs as typed.

The lines are read from README itself, so an example that stops working (a renamed option, a file
the sample lacks, such as the word tables ``rescorer propose`` reads) fails here rather than for a
first-time user. They run in a scratch folder that sees the repository's ``examples/``, so their
outputs stay out of the checkout. Each runs in this process through the installed console script's own
click command (what the shell finds on PATH), not as a process of its own: the lines test the commands'
options and files, and four fresh interpreters each importing torch cost more than the commands on the
sample. The second block needs Moses or ``../shared`` and is not run.
"""

from __future__ import annotations

import re
import shlex
from importlib.metadata import entry_points
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
OUT = "example-out"  # where the block writes


def sample_lines() -> list[str]:
    """The commands of the first code block under README's "One example per job"."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## One example per job\n", 1)[1]
    block = re.search(r"```\n(.*?)```", section, flags=re.S)
    assert block, "no code block under 'One example per job'"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def console_command(name: str) -> click.Command:
    """The click command behind the installed console script ``name``."""
    (script,) = entry_points(group="console_scripts", name=name)
    return script.load()


@pytest.mark.slow
def test_the_sample_examples_run_as_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = sample_lines()
    assert [shlex.split(line)[:2] for line in lines] == [
        ["rescorer", "train"], ["rescore-phrase-table", "examples/phrase-table.en-fr.gz"],
        ["rescorer", "propose"], ["rescorer", "report"]]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    for line in lines:
        name, *args = shlex.split(line)
        result = CliRunner().invoke(console_command(name), args, prog_name=name)
        assert result.exit_code == 0, f"{line}\n{result.output[-3000:]}\n{result.exception!r}"
    for output in ("model.pt", "phrase-table.rnn.gz", "moses.rnn.ini", "proposals.gz", "report/report.html"):
        assert (tmp_path / OUT / output).is_file(), output
    # Run from a checkout, the block wrote into one folder that git ignores, not beside the sources.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["examples", OUT])
    assert f"{OUT}/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
