"""A full disk is one line in every command that writes, and leaves nothing it created: in
``rescorer train`` and ``cslm train`` not a ~50-line traceback (``OSError ENOSPC``, then torch's
``RuntimeError … inline_container.cc``) and no ``MODEL.data/``. ``rescore-phrase-table``'s own
handling (what it keeps for ``--resume``) is tested in tests/rescorer/pipeline/test_partial_output.py."""

from __future__ import annotations

import gzip
from pathlib import Path

from click.testing import CliRunner

from analysis_checkpoint import EXAMPLE_TABLE
from cslm.cli import main as cslm_main
from full_disk import fill_up_on_write
from infrastructure import files
from mert.cli import main as mert_main
from neural import model_files
from rescorer.cli import main as rescorer_main

SMALL_RNN = ["--hidden", "8", "--embedding", "4", "--maxout-units", "4", "--output-rank", "4", "--shortlist", "50"]


def _one_line(output: str) -> str:
    """The error: the last line, and the only one about it (training logs its validations before)."""
    lines = output.strip().splitlines()
    assert not any(word in output for word in ("Traceback", "RuntimeError", "OSError", "Errno")), output
    assert sum(line.startswith("Error") for line in lines) == 1, output
    return lines[-1]


def test_rescorer_train_on_a_full_disk_is_one_line_and_leaves_no_data_folder(tmp_path: Path, monkeypatch) -> None:
    fill_up_on_write(monkeypatch, model_files)  # the first save of the model finds the disk full
    res = CliRunner().invoke(rescorer_main, ["train", str(EXAMPLE_TABLE), str(tmp_path / "m.pt"), "--max-steps", "2",
                                             "--device", "cpu", "-q", *SMALL_RNN])
    assert res.exit_code == 1, res.output
    assert _one_line(res.output) == "Error: the disk is full: free space and run again with --resume to continue"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no m.pt.data/, no temporary file


def test_cslm_train_on_a_full_disk_is_one_line_and_leaves_no_data_folder(tmp_path: Path, monkeypatch) -> None:
    corpus = tmp_path / "corpus.txt"
    with gzip.open(EXAMPLE_TABLE, "rt", encoding="utf-8") as table:
        corpus.write_text("".join(line.split(" ||| ")[1] + "\n" for line in table), encoding="utf-8")
    fill_up_on_write(monkeypatch, model_files)
    res = CliRunner().invoke(cslm_main, ["train", str(corpus), str(tmp_path / "lm.pt"), "--max-epochs", "1",
                                         "--order", "3", "--embedding", "4", "--hidden", "8", "--shortlist", "50",
                                         "--device", "cpu", "-q"])
    assert res.exit_code == 1, res.output
    assert _one_line(res.output) == "Error: the disk is full: free space and run again with --resume to continue"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_a_command_that_keeps_what_it_finished_says_to_resume_and_leaves_nothing_else(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """``mert evaluate --report``: what is written through the one atomic output (infrastructure.files).
    It keeps its finished decodes for ``--resume``; scoring files, it made none, and leaves nothing."""
    hyp = tmp_path / "hyp.txt"
    hyp.write_text("le chat est noir .\nun chien .\n")
    fill_up_on_write(monkeypatch, files, room=10)
    res = CliRunner().invoke(mert_main, ["evaluate", "--hyp", str(hyp), "--ref", str(hyp), "--detokenized",
                                         "--report", str(tmp_path / "out" / "report.json"), "-q"])
    assert res.exit_code == 1, res.output
    assert _one_line(res.output) == "Error: the disk is full: free space and run again with --resume to continue"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.txt"]  # out/ was made by the run: gone again


def test_a_command_without_resume_says_so_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """``cslm export-nplm``: its NPLM file is written through the one atomic output."""
    from cslm.model import CSLM, CSLMConfig
    from cslm.model_file import save_cslm
    from neural.vocab import Vocab

    vocab = Vocab.from_counts({"le": 3, "chat": 2, "noir": 1}, shortlist=10)
    model = save_cslm(tmp_path / "lm.pt", CSLM(CSLMConfig(vocab_size=len(vocab), order=3, embedding=4, hidden=[4])),
                      vocab)
    fill_up_on_write(monkeypatch, files, room=10)
    res = CliRunner().invoke(cslm_main, ["export-nplm", str(model), str(tmp_path / "out" / "lm.nplm")])
    assert res.exit_code == 1, res.output
    assert _one_line(res.output) == "Error: the disk is full: free space and run again"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lm.pt"]
