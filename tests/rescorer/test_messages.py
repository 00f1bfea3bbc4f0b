"""Messages that point the right way.

A truncated gzip table is named at one true position by every command that reads it: the number of
complete lines in all that decompresses, + 1. Each reader's buffers hold back a different number of lines
when the decompressor fails, so each must count from what decompressed, not from what it read. A warning is one
``warning: …`` line, not Python's ``path/to/module.py:672: UserWarning: …`` and the source line."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from analysis_checkpoint import EXAMPLE_TABLE, write_random_checkpoint
from rescorer.cli import main, rescore_phrase_table_command


@pytest.fixture(scope="module")
def cut_table(tmp_path_factory) -> tuple[Path, int]:
    """The example table cut at 60% of its bytes, and the line the cut makes unreadable."""
    folder = tmp_path_factory.mktemp("cut")
    data = EXAMPLE_TABLE.read_bytes()
    cut = folder / "cut.gz"
    cut.write_bytes(data[: len(data) * 3 // 5])
    complete = zlib.decompressobj(wbits=31).decompress(cut.read_bytes()).count(b"\n")
    return cut, complete + 1


def test_rescore_train_and_report_name_the_same_true_line(cut_table, tmp_path: Path) -> None:
    cut, line = cut_table
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    runs = {
        "rescore-phrase-table": (rescore_phrase_table_command,
                                 [str(cut), str(tmp_path / "out.gz"), "--model", str(model), "-q", "-j", "1"]),
        "rescore-phrase-table -j 2": (rescore_phrase_table_command,
                                      [str(cut), str(tmp_path / "out2.gz"), "--model", str(model), "-q", "-j", "2",
                                       "--chunk-lines", "1000"]),
        "rescorer train": (main, ["train", str(cut), str(tmp_path / "m.pt"), "--max-steps", "1", "-q"]),
        "rescorer report": (main, ["report", str(model), str(cut), str(tmp_path / "rep"), "-q"]),
    }
    for name, (command, args) in runs.items():
        res = CliRunner().invoke(command, args)
        assert res.exit_code == 1, (name, res.output)
        assert f"Error: {cut}:{line}: truncated or corrupt gzip input (" in res.output, (name, res.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_a_model_for_other_languages_is_a_one_line_warning(tmp_path: Path) -> None:
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    other = tmp_path / "de.txt"
    other.write_bytes(b"".join(b"wort%d ||| mot%d ||| 0.5 0.5 0.5 0.5\n" % (i, i) for i in range(50)))
    res = CliRunner().invoke(rescore_phrase_table_command, [str(other), str(tmp_path / "out.txt"), "--model",
                                                            str(model), "-q", "-j", "1"])
    assert res.exit_code == 0, res.output
    warning = [line for line in res.output.splitlines() if "shortlists" in line]
    assert warning == ["warning: only 0.0% of source words and 0.0% of target words in the first chunk are in the "
                       "model's shortlists; is this model trained for this table's languages and tokenisation?"]
    assert "UserWarning" not in res.output and ".py:" not in res.output, res.output
