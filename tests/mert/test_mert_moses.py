"""``mert tune --engine moses``: the mert-moses.pl command line, its errors, and a stand-in script."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fake_moses import fake_dev, quiet, tune_options
from mert.mert_moses import MERT_MOSES_TOOLS, find_moses_scripts_dir, mert_moses_command, tune_with_mert_moses
from mert.tune import TuneError
from moses_integration.moses_ini import MosesIni


@pytest.fixture
def dev(tmp_path: Path) -> dict[str, Path]:
    """A small dev set and a fake moses bin dir (:func:`fake_moses.fake_dev`)."""
    return fake_dev(tmp_path)


def test_engine_moses_command_and_errors(dev: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cmd = mert_moses_command(
        tmp_path / "scripts", tmp_path / "bin", Path("a.ini"), Path("dev.en"), Path("dev.fr"), tmp_path / "mm",
        threads=2, max_iterations=10,
    )
    assert cmd[0] == "perl" and cmd[1].endswith("training/mert-moses.pl")
    assert all(os.path.isabs(c) for c in cmd[1:6])
    assert "--decoder-flags=-threads 2" in cmd and "--maximum-iterations=10" in cmd
    assert "--predictable-seeds" in cmd and "--no-filter-phrase-table" in cmd and "--nbest=100" in cmd
    assert "--random-restarts=20" in cmd
    # --decoder-flags and --restarts reached mert-moses.pl: they were dropped, and it tuned without them
    cmd = mert_moses_command(
        tmp_path / "scripts", tmp_path / "bin", Path("a.ini"), Path("dev.en"), Path("dev.fr"), tmp_path / "mm",
        threads=2, restarts=5, decoder_flags=["-distortion-limit", "6", "-feature-overwrite", "LM0 path=/a b"],
    )
    assert "--decoder-flags=-threads 2 -distortion-limit 6 -feature-overwrite 'LM0 path=/a b'" in cmd
    assert "--random-restarts=5" in cmd
    monkeypatch.delenv("MOSES_SCRIPTS_DIR", raising=False)
    with pytest.raises(TuneError, match="--moses-scripts-dir or set MOSES_SCRIPTS_DIR"):
        find_moses_scripts_dir(None, tmp_path / "nowhere/bin")
    opts = tune_options(dev, tmp_path / "w", feature_specs=["WordCount"])
    with pytest.raises(TuneError, match="does not support --feature"):
        tune_with_mert_moses(opts)


@pytest.mark.skipif(shutil.which("perl") is None, reason="needs perl for the stand-in mert-moses.pl")
def test_engine_moses_runs_the_script_and_copies_its_ini(
    dev: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = tmp_path / "scripts"
    (scripts / "training").mkdir(parents=True)
    (scripts / "training/mert-moses.pl").write_text(
        'my ($wd) = map { /^--working-dir=(.*)/ ? $1 : () } @ARGV; mkdir $wd;\n'
        'open(IN, $ARGV[3]) or die; open(OUT, ">$wd/moses.ini") or die;\n'
        'print OUT "# stand-in tuned\\n"; print OUT while <IN>; close OUT;\n'
    )
    opts = tune_options(dev, tmp_path / "work", output_ini=tmp_path / "t.ini")
    monkeypatch.setenv("MOSES_SCRIPTS_DIR", str(scripts))
    with pytest.raises(TuneError, match="needs extractor, mert, pro, kbmira, evaluator"):
        tune_with_mert_moses(opts, log=quiet)
    for tool in MERT_MOSES_TOOLS:
        (dev["bin"] / tool).write_text("")
        (dev["bin"] / tool).chmod(0o755)
    final = tune_with_mert_moses(opts, log=quiet)
    text = final.read_text()
    assert text.startswith("# stand-in tuned") and (tmp_path / "t.ini").read_text() == text
    # mert-moses.pl runs moses from its own working dir: it got absolute model paths.
    assert all(os.path.isabs(f.path) for f in MosesIni.read(final).feature_lines() if f.path)


@pytest.mark.parametrize("given", [["--seed", "7"], ["--min-weight-change", "0.001"],
                                   ["--seed", "7", "--min-weight-change", "0.001"]])
def test_engine_moses_refuses_the_options_mert_moses_has_no_counterpart_for(
        dev: dict[str, Path], tmp_path: Path, given: list[str]) -> None:
    """They were dropped in silence: mert-moses.pl seeds iteration n with 1000 n and stops at its own 1e-5."""
    from click.testing import CliRunner

    from mert.cli import main

    args = ["tune", "--moses-ini", str(dev["ini"]), "--src", str(dev["src"]), "--ref", str(dev["ref"]),
            "--work-dir", str(tmp_path / "w"), "--moses-bin-dir", str(tmp_path / "bin"), "--engine", "moses", *given]
    result = CliRunner().invoke(main, args)
    names = " and ".join(a for a in given if a.startswith("--"))
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: --engine moses has no counterpart for {names} (mert-moses.pl seeds ")
    assert not (tmp_path / "w").exists()
