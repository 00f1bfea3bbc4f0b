"""Driving Moses' training tools: symal's input, locating the installation, tool failures."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from infrastructure.errors import UserError
from shared_paths import moses_bin_dir
from table1.system_training import (
    MosesInstall,
    MosesToolError,
    run_logged,
    symal_input,
    symmetrize,
    train_model_command,
)


def test_symal_input_is_what_giza2bal_writes():
    # src = English (3 words), tgt = French (4 words). Forward: each French word -> <= 1 English
    # word; reverse: each English word -> <= 1 French word (0-based i-j = src-tgt pairs).
    lines = list(symal_input(["a b c"], ["w x y z"], ["0-0 1-2 2-3"], ["0-0 1-1 2-3"]))
    assert lines == [
        "1",
        "4 w x y z # 1 0 2 3",  # French word j -> 1-based English position (x unaligned)
        "3 a b c # 1 2 4",  # English word i -> 1-based French position
    ]


def test_symal_input_names_the_bad_line():
    with pytest.raises(UserError, match="forward alignment line 2: link 5-0 outside 1x1"):
        list(symal_input(["a", "a"], ["x", "x"], ["0-0", "5-0"], ["0-0", "0-0"]))
    with pytest.raises(UserError, match="reverse alignment line 1: bad alignment link"):
        list(symal_input(["a"], ["x"], ["0-0"], ["0:0"]))


def _fake_install(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    (tmp_path / "scripts" / "training").mkdir(parents=True)
    return tmp_path


def test_locate_prefers_arguments_then_environment(tmp_path, monkeypatch):
    home = _fake_install(tmp_path)
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)
    monkeypatch.delenv("MOSES_HOME", raising=False)
    with pytest.raises(MosesToolError, match="MOSES_BIN_DIR"):
        MosesInstall.locate()
    install = MosesInstall.locate(bin_dir=home / "bin")
    assert install.scripts_dir == home / "scripts"
    monkeypatch.setenv("MOSES_HOME", str(home))
    assert MosesInstall.locate() == MosesInstall(home / "bin", home / "scripts")
    with pytest.raises(MosesToolError, match="'symal' is not in"):
        install.binary("symal")
    assert not install.has_giza()


def test_train_model_command_uses_moses_defaults_and_mgiza_when_present(tmp_path):
    home = _fake_install(tmp_path)
    (home / "scripts" / "training" / "train-model.perl").write_text("")
    install = MosesInstall(home / "bin", home / "scripts")
    cmd = train_model_command(install, Path("/r"), Path("/c/train"), "en", "fr", Path("/lm.bin"), lm_order=4, jobs=2,
                              first_step=4)
    text = " ".join(cmd)
    assert "-alignment grow-diag-final-and -reordering msd-bidirectional-fe -max-phrase-length 7" in text
    assert "-lm 0:4:/lm.bin:8 -first-step 4 -last-step 9" in text
    assert "-mgiza" not in text
    (home / "bin" / "mgiza").write_text("")
    cmd = train_model_command(install, Path("/r"), Path("/c/train"), "en", "fr", Path("/lm.bin"), lm_order=4, jobs=2,
                              first_step=1)
    assert cmd[1:4] == ["-mgiza", "-mgiza-cpus", "2"]


def test_run_logged_keeps_the_command_and_reports_the_log_tail(tmp_path):
    tool = tmp_path / "tool.sh"
    tool.write_text("#!/bin/sh\necho working >&2\necho 'bad input at line 3' >&2\nexit 3\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "logs" / "step.log"
    with pytest.raises(MosesToolError, match=r"(?s)tool.sh exited with 3.*bad input at line 3"):
        run_logged([tool, "arg"], log)
    assert log.read_text().startswith(f"$ {tool} arg\n")
    out = tmp_path / "out.txt"
    ok = tmp_path / "ok.sh"
    ok.write_text("#!/bin/sh\ncat\n")
    ok.chmod(ok.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "in.txt").write_text("hello\n")
    run_logged([ok], log, stdin=tmp_path / "in.txt", stdout=out)
    assert out.read_text() == "hello\n"


@pytest.mark.moses
def test_real_symal_grows_the_intersection_as_grow_diag_final_and(tmp_path):
    """grow-diag-final-and by hand: intersection {0-0, 2-2}; the union adds 1-1 (diagonal
    neighbour, both words unaligned), and final-and adds nothing else here."""
    bins = moses_bin_dir()
    install = MosesInstall(bins, bins.parent / "scripts")
    files = {"src": "a b c", "tgt": "x y z", "fwd": "0-0 1-1 2-2", "rev": "0-0 2-2"}
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    out = tmp_path / "aligned"
    symmetrize(install, *(tmp_path / n for n in ("src", "tgt", "fwd", "rev")), out, tmp_path / "log")
    assert sorted(out.read_text().split()) == ["0-0", "1-1", "2-2"]
    assert not os.path.exists(str(out) + ".symal-in")
