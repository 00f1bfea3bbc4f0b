"""What ``rescore-phrase-table`` touches besides its named output, what a ``--resume`` may splice, and the
checks before the work: every file the command creates, truncates or removes is checked as an output
against every input (standard input's file too); a resume continues only what one uninterrupted run
would have written (the same bytes whatever ``--threads``, the same model by content, never over a
partial output without ``--resume``); limits on what cannot work are one line before any work."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from rescore_runs import SAMPLE_TABLE, assert_same_output, rescore

from infrastructure.threads import available_cpus
from moses_integration.phrase_table import MAX_PHRASE_WORDS, PhraseTableError
from neural.vocab import EOS, UNK, Vocab
from rescorer.cli import rescore_phrase_table_command, train_command
from rescorer.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline import partial_output
from rescorer.tables.chunks import LineChunk, parse_chunk
from shared_paths import shared_file

WORDS = ["la", "maison", "the", "house", "a", "b", "c"]
RESCORE = str(Path(sys.executable).parent / "rescore-phrase-table")


def checkpoint(seed: int, hidden: int = 8, init_std: float = 0.01) -> Checkpoint:
    vocab = Vocab([EOS, UNK, *WORDS])
    half = max(4, hidden // 2)
    config = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), hidden=hidden, embedding=half,
                         maxout_units=half, output_rank=half, init_std=init_std)
    torch.manual_seed(seed)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, vocab, vocab)


def save(path: Path, ck: Checkpoint) -> Path:
    save_checkpoint(path, model=ck.model, config=ck.config, src_vocab=ck.src_vocab, tgt_vocab=ck.tgt_vocab)
    return path


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return save(tmp_path / "tiny.pt", checkpoint(0))


def table_lines(n: int) -> list[bytes]:
    """``n`` sorted lines over the tiny model's words, a few targets per source."""
    return [f"{WORDS[(i // 3) % 4]} {WORDS[(i // 12) % 7]}{i // 84} ||| {WORDS[i % 3]} {WORDS[(i // 3) % 5]} ||| "
            "0.5 0.5 0.5 0.5".encode() for i in range(n)]


def write_table(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def cli(*args: str, **kw):
    """The command in this process, on CPU, quiet, without worker processes (``args`` last, so they win)."""
    return CliRunner().invoke(rescore_phrase_table_command, ["-q", "-j", "0", "--device", "cpu", *args], **kw)


def assert_refused(res, *names: str) -> None:
    """Exit 1 with one ``Error:`` line naming ``names``, and no traceback."""
    assert isinstance(res.exception, SystemExit) and res.exit_code == 1, (res.exception, res.output)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert all(name in lines[0] for name in names), res.output


@pytest.fixture
def no_work(monkeypatch) -> None:
    """Training, scoring or reading the table fails the test."""

    def started(*_a, **_k):
        raise AssertionError("work started before the refusal")

    monkeypatch.setattr("rescorer.pipeline.train_or_load.train_on_phrase_table", started)
    monkeypatch.setattr("rescorer.pipeline.train_or_load.Models.load", started)
    monkeypatch.setattr("rescorer.training.train.train_on_phrase_table", started)


def stop_after_two_chunks(monkeypatch) -> None:
    """Ctrl-C as the third chunk is being written: two chunks are durable."""
    real_write = partial_output.DurableWriter.write
    calls = []

    def stopped(self, *a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_write(self, *a)

    monkeypatch.setattr(partial_output.DurableWriter, "write", stopped)


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- files a command touches are outputs too ----------------------------------------------------

def test_standard_input_that_is_the_partial_output_is_refused_and_kept(tmp_path: Path, model_file: Path) -> None:
    """``rescore-phrase-table - out.txt < .out.txt.partial`` truncated its own input and wrote an empty table:
    the file on standard input is an input like a named one (a real process: only it has a stdin file)."""
    partial = write_table(tmp_path / ".out.txt.partial", table_lines(50))
    before = partial.read_bytes()
    with open(partial, "rb") as stdin:
        done = subprocess.run([RESCORE, "-", str(tmp_path / "out.txt"), "--model", str(model_file), "-q", "-j", "0",
                               "--device", "cpu", "--threads", "1"], stdin=stdin, capture_output=True, text=True,
                              timeout=300)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [f"Error: output {partial} (written with OUTPUT_TABLE) is the input "
                                        f"INPUT_TABLE (standard input) {partial}; write it elsewhere"]
    assert partial.read_bytes() == before and not (tmp_path / "out.txt").exists()


def test_an_input_where_the_lock_file_goes_is_refused_and_kept(tmp_path: Path, model_file: Path) -> None:
    """The run holds ``.OUT.lock`` (truncated, then removed): an input of that name was read empty, exit 0."""
    table = write_table(tmp_path / ".out.txt.lock", table_lines(50))
    before = files_of(tmp_path)
    res = cli(str(table), str(tmp_path / "out.txt"), "--model", str(model_file))
    assert_refused(res, f"output {table} (the lock file of OUTPUT_TABLE) is the input INPUT_TABLE {table}")
    assert files_of(tmp_path) == before


def test_an_input_inside_the_training_folder_is_refused_and_kept(tmp_path: Path, no_work) -> None:
    """A training fills ``MODEL.data/``: a table inside it is at risk, whichever command trains."""
    table = write_table(tmp_path / "m.pt.data" / "pt.txt", table_lines(50))
    before = files_of(tmp_path)
    res = CliRunner().invoke(train_command, [str(table), str(tmp_path / "m.pt"), "-q"])
    assert_refused(res, f"output folder {tmp_path / 'm.pt.data'}/ (written with MODEL_OUT) holds the input "
                        f"PHRASE_TABLE {table}")
    table = write_table(tmp_path / "out.txt.model.pt.data" / "pt.txt", table_lines(50))
    res = cli(str(table), str(tmp_path / "out.txt"), "--train-steps", "3")
    assert_refused(res, "(written with --save-model's default) holds the input INPUT_TABLE")
    assert set(files_of(tmp_path)) == {*before, "out.txt.model.pt.data/pt.txt"}


def test_an_input_named_as_a_temporary_file_of_an_output_is_refused(tmp_path: Path, model_file: Path) -> None:
    """The first write of an output removes its temp files that no run holds: an input of such a name too."""
    table = write_table(tmp_path / ".out.txt.abcd1234.tmp", table_lines(50))
    res = cli(str(table), str(tmp_path / "out.txt"), "--model", str(model_file))
    assert_refused(res, f"the input INPUT_TABLE {table} is named as a temporary file of the output")
    assert table.exists()


def test_the_model_trained_for_stdout_in_a_read_only_folder_is_one_line(tmp_path: Path, monkeypatch,
                                                                           no_work) -> None:
    """With the output on stdout the model goes to the working folder, which must be writable, found
    before the training (it was a traceback after it)."""
    table = write_table(tmp_path / "pt.txt", table_lines(50))
    monkeypatch.chdir("/sys")  # nobody can create a file there, root included
    res = cli(str(table), "-", "--train-steps", "3")
    assert_refused(res, "cannot write rescorer.model.pt")


# ---- --resume splices only what one uninterrupted run would write ----------------------------------

def few_sources_many_targets(sources: int, targets: int) -> list[bytes]:
    """A filtered table's shape: few sources with many targets each, so that a decoder group holds a few
    sources, and its products a few rows (where MKL cuts its sums by thread count)."""
    return [f"{WORDS[i % 4]} {WORDS[(i // 4) % 7]} ||| {WORDS[j % 7]} {WORDS[(j // 7) % 7]} {WORDS[j // 49]} ||| "
            "0.5 0.5 0.5 0.5".encode() for i in range(sources) for j in range(targets)]


@pytest.mark.slow
def test_the_output_is_the_same_bytes_whatever_the_threads(tmp_path: Path) -> None:
    """Real processes: MKL takes its mode when it starts. Without its strict mode, 6 sources (one decoder
    group of 6 rows) and a model whose scores are not all alike (std 0.2) gave other bytes on 2 threads.
    ``-j 0``: the products are the main process's whatever the readers, and reader processes beside
    two torch threads only make the run wait for the CPUs."""
    if available_cpus() < 2:
        pytest.skip("needs 2 CPUs to run 2 threads")
    model = save(tmp_path / "m.pt", checkpoint(0, hidden=32, init_std=0.2))
    table = write_table(tmp_path / "pt.txt", sorted(few_sources_many_targets(6, 343)))
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    outputs = []
    for threads in ("1", "2"):
        out = tmp_path / f"out{threads}.txt"
        subprocess.run([RESCORE, str(table), str(out), "--model", str(model), "--threads", threads, "-q",
                        "-j", "0", "--device", "cpu"], env=env, check=True, timeout=300)
        outputs.append(out.read_bytes())
    assert len(outputs[0].splitlines()) == 6 * 343 and outputs[0] == outputs[1]


def test_resume_refuses_another_model_of_the_same_size_and_time(tmp_path: Path, monkeypatch) -> None:
    """The model is known by its content: another one with the size and mtime of the first is refused."""
    table = write_table(tmp_path / "pt.txt", table_lines(400))
    model = save(tmp_path / "m.pt", checkpoint(0))
    other = save(tmp_path / "other.pt", checkpoint(1))
    assert model.stat().st_size == other.stat().st_size and model.read_bytes() != other.read_bytes()
    out = tmp_path / "out.txt"
    stop_after_two_chunks(monkeypatch)
    assert cli(str(table), str(out), "--model", str(model), "--chunk-lines", "100").exit_code != 0
    monkeypatch.undo()
    stat = model.stat()
    shutil.copyfile(other, model)
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    res = cli(str(table), str(out), "--model", str(model), "--chunk-lines", "100", "--resume")
    assert_refused(res, "cannot --resume: the model differs", "SHA-256")


def test_a_rerun_without_resume_refuses_to_start_over_a_partial_output(tmp_path: Path, model_file: Path,
                                                                       monkeypatch) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(400))
    out = tmp_path / "out.txt"
    args = [str(table), str(out), "--model", str(model_file), "--chunk-lines", "100"]
    stop_after_two_chunks(monkeypatch)
    assert cli(*args).exit_code != 0
    monkeypatch.undo()
    kept = files_of(tmp_path)
    partial = tmp_path / ".out.txt.partial"
    res = cli(*args)
    assert_refused(res, f"{partial} holds {len(kept['.out.txt.partial'])} bytes of a stopped run's output: run "
                        "again with --resume to continue it, or remove it and")
    assert files_of(tmp_path) == kept
    assert cli(*args, "--resume").exit_code == 0
    whole = tmp_path / "whole.txt"
    assert cli(str(table), str(whole), "--model", str(model_file), "--chunk-lines", "100").exit_code == 0
    assert out.read_bytes() == whole.read_bytes()


def test_a_stopped_run_that_read_stdin_keeps_nothing_and_does_not_offer_resume(tmp_path: Path, model_file: Path,
                                                                               monkeypatch) -> None:
    stop_after_two_chunks(monkeypatch)
    res = cli("-", str(tmp_path / "out.txt"), "--model", str(model_file), "--chunk-lines", "100",
              input=b"\n".join(table_lines(400)) + b"\n")
    assert res.exit_code == 130, res.output
    assert "--resume to continue)" not in res.output and "standard input, which a rerun cannot read again" in res.output
    assert files_of(tmp_path) == {"tiny.pt": model_file.read_bytes()}


def test_resume_of_a_finished_output_says_so_and_scores_nothing(tmp_path: Path, model_file: Path, monkeypatch) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(100))
    out = tmp_path / "out.txt"
    assert cli(str(table), str(out), "--model", str(model_file)).exit_code == 0
    done = out.stat().st_mtime_ns, out.read_bytes()

    def scored(*_a, **_k):
        raise AssertionError("a finished output was scored again")

    monkeypatch.setattr("rescorer.pipeline.train_or_load.Models.load", scored)
    res = cli(str(table), str(out), "--model", str(model_file), "--resume")
    assert res.exit_code == 0, res.output
    assert f"{out} is finished already" in res.output
    assert (out.stat().st_mtime_ns, out.read_bytes()) == done


# ---- checks before the work, and limits ---------------------------------------------------------------

@pytest.mark.parametrize("name", ["out put.txt", "out#1.txt"])
def test_an_output_moses_ini_cannot_name_is_refused_before_any_work(tmp_path: Path, model_file: Path, no_work,
                                                                   name: str) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    ini = tmp_path / "moses.ini"
    ini.write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 path=/x.gz "
                   "input-factor=0 output-factor=0\n\n[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    res = cli(str(table), str(tmp_path / name), "--model", str(model_file), "--moses-ini", str(ini),
              "--moses-ini-out", str(tmp_path / "new.ini"))
    assert_refused(res, "holds a blank or '#'", "--moses-ini-out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moses.ini", "pt.txt", "tiny.pt"]


def other_file_system_than(folder: Path) -> Path:
    """A folder on another file system than ``folder`` (a RAM disk), or skip."""
    for candidate in (Path("/dev/shm"), Path("/run"), Path("/tmp")):
        if candidate.is_dir() and os.access(candidate, os.W_OK) and candidate.stat().st_dev != folder.stat().st_dev:
            return candidate
    pytest.skip("no second file system to write to")


def test_an_output_symlinked_onto_another_file_system_is_written_where_it_points(tmp_path: Path, model_file: Path,
                                                                                 monkeypatch) -> None:
    """The partial file goes beside the link's target, so the final rename stays on one file system
    ("Invalid cross-device link" at the very end, before); the link stays, and --resume finds the partial."""
    table = write_table(tmp_path / "pt.txt", table_lines(400))
    elsewhere = Path(os.path.realpath(other_file_system_than(tmp_path))) / f"rescore-test-{os.getpid()}"
    elsewhere.mkdir()
    try:
        link = tmp_path / "out.txt"
        link.symlink_to(elsewhere / "real.txt")
        args = [str(table), str(link), "--model", str(model_file), "--chunk-lines", "100"]
        stop_after_two_chunks(monkeypatch)
        assert cli(*args).exit_code != 0
        monkeypatch.undo()
        assert (elsewhere / ".real.txt.partial").exists()
        res = cli(*args, "--resume")
        assert res.exit_code == 0, res.output
        assert link.is_symlink() and sorted(p.name for p in elsewhere.iterdir()) == ["real.txt"]
        whole = tmp_path / "whole.txt"
        assert cli(str(table), str(whole), "--model", str(model_file), "--chunk-lines", "100").exit_code == 0
        assert link.read_bytes() == whole.read_bytes()
    finally:
        shutil.rmtree(elsewhere)


@pytest.mark.parametrize("option, value", [
    ("--chunk-lines", str(2**64)),
    ("--token-budget", str(2**64)),
    ("-j", str(2**64)),
    ("--threads", str(2**64)),
    ("--hidden", "1000000"),
    ("--init-std", "10"),
    ("--init-std", "1e308"),
])
def test_numbers_out_of_range_are_one_line_and_leave_nothing(tmp_path: Path, no_work, option: str,
                                                             value: str) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    res = cli(str(table), str(tmp_path / "out.gz"), "--train-steps", "3", option, value)
    assert_refused(res, f"'{option}'", "is not in the range")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pt.txt"]


def test_threads_and_workers_beyond_the_cpus_are_cut_to_them_with_a_warning(tmp_path: Path, model_file: Path,
                                                                           monkeypatch) -> None:
    seen = {}

    def scored(_in, _out, _models, options):
        seen["workers"] = options.workers
        raise SystemExit(0)

    monkeypatch.setattr("rescorer.pipeline.rescore.rescore", scored)
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    cpus = available_cpus()
    res = cli(str(table), str(tmp_path / "out.gz"), "--model", str(model_file), "-j", "1000", "--threads", "999")
    torch.set_num_threads(cpus)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [
        f"warning: -j 1000 is more than the {cpus} CPUs this process may use: using {cpus}",
        f"warning: --threads 999 is more than the {cpus} CPUs this process may use: using {cpus}",
    ] or res.output.splitlines() == [
        f"warning: --threads 999 is more than the {cpus} CPUs this process may use: using {cpus}",
        f"warning: -j 1000 is more than the {cpus} CPUs this process may use: using {cpus}",
    ]
    assert seen["workers"] == cpus


def test_a_phrase_longer_than_the_limit_is_a_bad_line_with_its_number(tmp_path: Path, model_file: Path) -> None:
    long_phrase = " ".join(["a"] * (MAX_PHRASE_WORDS + 1))
    lines = [*table_lines(20), f"b ||| {long_phrase} ||| 0.5 0.5 0.5 0.5".encode(), *table_lines(20)[:5]]
    chunk = LineChunk.from_lines(1, lines)
    with pytest.raises(PhraseTableError, match=rf"^pt.txt:21: target phrase of {MAX_PHRASE_WORDS + 1} words, "
                                                rf"more than the {MAX_PHRASE_WORDS} a phrase may have$"):
        parse_chunk(chunk, "pt.txt")
    at_limit = " ".join(["a"] * MAX_PHRASE_WORDS)
    assert len(parse_chunk(LineChunk.from_lines(1, [f"{at_limit} ||| b ||| 0.5".encode()]), "pt.txt").good_rows) == 1
    table = write_table(tmp_path / "pt.txt", lines)
    res = cli(str(table), str(tmp_path / "out.txt"), "--model", str(model_file), "--skip-bad-lines")
    assert res.exit_code == 0, res.output
    assert f"pt.txt:21: target phrase of {MAX_PHRASE_WORDS + 1} words" in res.output
    assert (tmp_path / "out.txt.rejects").read_bytes() == lines[20] + b"\n"
    assert len((tmp_path / "out.txt").read_bytes().splitlines()) == len(lines) - 1


def test_a_resume_after_an_out_of_memory_error_groups_as_the_stopped_run_did(tmp_path: Path, sample_model: Path,
                                                                                 monkeypatch) -> None:
    """An out-of-memory error halves the token budget for the rest of the run, and the budget decides the
    groups, so the matmuls' shapes and the printed digits. A run stopped after such an error continues
    with the halved budget: its output is the bytes of one run with the same error, not the chunks after
    the stop grouped by the first budget (63 of the sample's 5,166 lines differ between 1024 and 2048)."""
    table = shared_file(SAMPLE_TABLE)

    def out_of_memory_once(ck: Checkpoint) -> Checkpoint:
        """The model's first decoder step fails as a GPU out of memory does; the others run."""
        real_step, calls = ck.model.decoder_step, []

        def step(*args, **kw):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return real_step(*args, **kw)

        ck.model.decoder_step = step
        return ck

    def run(out: Path, ck: Checkpoint, **kw: object) -> object:
        return rescore(table, out, ck, chunk_lines=300, token_budget=2048, **kw)

    straight = tmp_path / "straight.gz"
    run(straight, out_of_memory_once(load_checkpoint(sample_model)))
    stop_after_two_chunks(monkeypatch)
    out = tmp_path / "out.gz"
    with pytest.raises(KeyboardInterrupt, match="good bytes kept"):
        run(out, out_of_memory_once(load_checkpoint(sample_model)))
    monkeypatch.undo()
    assert json.loads((tmp_path / ".out.gz.progress.json").read_text())["chunks_done"] == 2
    run(out, load_checkpoint(sample_model), resume=True)
    assert_same_output(out, straight)
