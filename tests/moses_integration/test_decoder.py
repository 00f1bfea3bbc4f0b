"""Running Moses: found through MOSES_BIN_DIR, failures carry the decoder's own words."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from moses_integration.decoder import DecoderError, decode, find_moses_bin_dir, format_weight_overwrite
from moses_integration.nbest import read_nbest
from shared_paths import moses_bin_dir, shared_file


def fake_moses(folder: Path, body: str) -> Path:
    """A stand-in 'moses' script, to test process handling without a Moses build."""
    script = folder / "moses"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def test_missing_binary_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)
    with pytest.raises(DecoderError, match="MOSES_BIN_DIR"):
        find_moses_bin_dir()
    with pytest.raises(DecoderError, match="no 'moses' binary") as err:
        find_moses_bin_dir(tmp_path)
    # ... and says where to get Moses, in pages this clone has
    root = Path(__file__).resolve().parents[2]
    pointers = re.findall(r"\b[\w/-]+\.md\b", str(err.value))
    assert pointers == ["docs/moses-nplm.md", "docker/README.md"]
    assert all((root / page).is_file() for page in pointers)


def test_failed_decode_reports_stderr_tail_and_leaves_no_output(tmp_path):
    bindir = fake_moses(tmp_path, 'for i in $(seq 1 40); do echo "loading line $i" >&2; done\n'
                                  'echo "Exception: Mismatch in number of features and number of weights" >&2\n'
                                  'exit 1\n')
    (tmp_path / "in.txt").write_text("a b\n")
    (tmp_path / "moses.ini").write_text("[feature]\n")
    with pytest.raises(DecoderError) as err:
        decode(bindir, tmp_path / "moses.ini", tmp_path / "in.txt", tmp_path / "out.txt")
    assert "Mismatch in number of features" in str(err.value)
    assert "loading line 40" in str(err.value) and "loading line 2\n" not in str(err.value)
    assert not (tmp_path / "out.txt").exists()


def test_a_decoder_ends_with_a_run_killed_by_sigkill(tmp_path):
    """``mert evaluate`` killed by SIGKILL left its moses decoding on, for half an hour, into a temp file
    nobody would read: the decoder now ends with the process that started it."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "moses.pid"
    bindir = fake_moses(tmp_path, f"echo $$ > {pid_file}\nexec sleep 60\n")
    (tmp_path / "in.txt").write_text("a b\n")
    (tmp_path / "moses.ini").write_text("[feature]\n")
    code = ("import sys\nfrom moses_integration.decoder import decode\n"
            "decode(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])\n")
    run = subprocess.Popen([sys.executable, "-c", code, str(bindir), str(tmp_path / "moses.ini"),
                            str(tmp_path / "in.txt"), str(tmp_path / "out.txt")],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    decoder = int(pid_file.read_text())
    run.send_signal(signal.SIGKILL)
    run.wait()
    for _ in range(100):
        try:
            os.kill(decoder, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{decoder}/stat").read_text().split(") ")[1].startswith("Z"):  # ended, not yet reaped
            break
        time.sleep(0.05)
    else:
        os.kill(decoder, signal.SIGKILL)
        pytest.fail("the decoder outlived the run that started it")


def test_decode_runs_in_the_ini_folder_with_weight_overrides(tmp_path):
    system = tmp_path / "system"
    system.mkdir()
    bindir = fake_moses(tmp_path, 'pwd > "$PWD/cwd.txt"; echo "$@" > args.txt; cat\n')
    (tmp_path / "in.txt").write_text("hello\n")
    (system / "moses.ini").write_text("[feature]\n")
    result = decode(bindir, system / "moses.ini", tmp_path / "in.txt", tmp_path / "out.txt",
                    weights={"LM0": [0.5], "TranslationModel0": [0.1, 0.2]})
    assert result.output.read_text() == "hello\n"
    assert (system / "cwd.txt").read_text().strip() == str(system.resolve())
    assert "-weight-overwrite LM0= 0.5 TranslationModel0= 0.1 0.2" in (system / "args.txt").read_text()
    assert format_weight_overwrite({"A": [1.0]}) == "A= 1"


def test_a_relative_bin_dir_is_the_callers_not_the_ini_folders(tmp_path, monkeypatch):
    """``mert tune --moses-bin-dir bin`` said "cannot run bin/moses: No such file" (it was looked for in the
    ini's folder, where moses runs): the bin dir is the caller's, like every other path."""
    system = tmp_path / "system"
    system.mkdir()
    fake_moses(tmp_path, "cat\n")
    (tmp_path / "in.txt").write_text("hello\n")
    (system / "moses.ini").write_text("[feature]\n")
    monkeypatch.chdir(tmp_path.parent)
    result = decode(tmp_path.name, system / "moses.ini", tmp_path / "in.txt", tmp_path / "out.txt")
    assert result.output.read_text() == "hello\n"


def test_translation_details_are_written_under_a_temp_name_and_kept_only_on_success(tmp_path):
    """Moses gets -translation-details with a temp name; a failed decode leaves no details file."""
    body = ('while [ $# -gt 0 ]; do [ "$1" = -translation-details ] && echo "$2" > "$2"; shift; done\n'
            'cat\n[ -e fail ] && exit 3\nexit 0\n')
    bindir = fake_moses(tmp_path, body)
    (tmp_path / "in.txt").write_text("hello\n")
    (tmp_path / "moses.ini").write_text("[feature]\n")
    result = decode(bindir, tmp_path / "moses.ini", tmp_path / "in.txt", tmp_path / "out.txt",
                    details_path=tmp_path / "out.details")
    assert result.details == tmp_path / "out.details"
    written_as = Path(result.details.read_text().strip())
    assert written_as.parent == tmp_path and written_as.name.startswith(".out.details.") and not written_as.exists()
    result.details.unlink()
    (tmp_path / "fail").write_text("")
    with pytest.raises(DecoderError, match="exit 3"):
        decode(bindir, tmp_path / "moses.ini", tmp_path / "in.txt", tmp_path / "out.txt",
               details_path=tmp_path / "out.details")
    assert not (tmp_path / "out.details").exists() and not list(tmp_path.glob(".out.details.*"))


@pytest.mark.slow
@pytest.mark.moses
def test_real_moses_reproduces_the_fixture_1best(tmp_path):
    bindir = moses_bin_dir()
    fixture = shared_file("fixtures/hansard-enfr")
    source = tmp_path / "dev3.en"
    source.write_text("".join((fixture / "data/dev.tok.tc.en").read_text().splitlines(keepends=True)[:3]))
    result = decode(bindir, fixture / "filtered/moses.ini", source, tmp_path / "dev3.1best",
                    nbest_path=tmp_path / "dev3.nbest", nbest_size=10, threads=min(2, os.cpu_count() or 1))
    expected = (fixture / "nbest/dev.1best").read_text().splitlines()[:3]
    assert result.output.read_text().splitlines() == expected
    ids = {entry.sent_id for entry in read_nbest(tmp_path / "dev3.nbest")}
    assert ids == {0, 1, 2}
