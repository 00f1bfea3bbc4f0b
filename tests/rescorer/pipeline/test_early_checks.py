"""What a run refuses before the long work, in one line, and what it leaves then: nothing it made, no input
touched (tables, moses.ini, options, paths, model files; no file written beside the output may be an input)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from rescore_runs import assert_same_output
from tiny_rescore import (
    added_columns,
    assert_refused,
    cli,
    cli_last,
    ini_text,
    listing,
    run,
    table_lines,
    write_table,
)

from moses_integration.phrase_table import PhraseTableError
from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import load_checkpoint
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.train_or_load import Models


def test_stale_num_features_fails_before_training(tmp_path: Path) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(50))
    ini = tmp_path / "moses.ini"
    ini.write_text(ini_text([("TranslationModel0", 5, "PhraseDictionaryMemory")]))  # 5 weights too, 4 scores
    res = cli(str(table), str(tmp_path / "out.gz"), "--moses-ini", str(ini), "--moses-ini-out",
              str(tmp_path / "new.ini"), "--train-steps", "5")
    assert res.exit_code == 1
    assert "num-features=5" in res.output and "pt.txt:1 has 4 scores" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moses.ini", "pt.txt"]  # no model, no output


def test_several_phrase_tables_need_table_name(tmp_path: Path, model_file: Path) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    ini = tmp_path / "moses.ini"
    ini.write_text(ini_text([("TranslationModel0", 4, "PhraseDictionaryMemory"),
                             ("TranslationModel1", 3, "PhraseDictionaryMemory")]))
    out, new_ini = tmp_path / "out.txt", tmp_path / "new.ini"
    common = [str(table), str(out), "--model", str(model_file), "--moses-ini", str(ini), "--moses-ini-out",
              str(new_ini)]
    res = cli(*common)
    assert res.exit_code == 1 and "TranslationModel0, TranslationModel1" in res.output and "--table" in res.output
    assert not out.exists()
    res = cli(*common, "--table", "TranslationModel1")  # 3 features, but the table has 4 columns
    assert res.exit_code == 1 and "TranslationModel1 has num-features=3" in res.output
    res = cli(*common, "--table", "TranslationModel0")
    assert res.exit_code == 0, res.output
    text = new_ini.read_text()
    assert f"name=TranslationModel0 num-features=6 path={out}" in text
    assert "name=TranslationModel1 num-features=3 path=/nowhere/TranslationModel1.gz" in text
    assert "TranslationModel0= 0.2 0.2 0.2 0.2 0 0" in text  # new columns start at weight 0


def test_compact_table_fails_before_training(tmp_path: Path) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    ini = tmp_path / "moses.ini"
    ini.write_text(ini_text([("TranslationModel0", 4, "PhraseDictionaryCompact")]))
    res = cli(str(table), str(tmp_path / "out.gz"), "--moses-ini", str(ini), "--moses-ini-out",
              str(tmp_path / "new.ini"), "--train-steps", "5")
    assert res.exit_code == 1 and "processPhraseTableMin" in res.output and "-nscores 6" in res.output
    assert not (tmp_path / "out.gz.model.pt").exists()


def test_column_count_change_in_a_later_chunk_names_the_line(tmp_path: Path, tiny_checkpoint) -> None:
    lines = table_lines(120)
    lines[95] = lines[95] + b" 0.5"  # 5 scores on line 96, in the second chunk
    table = write_table(tmp_path / "pt.txt", lines)
    with pytest.raises(PhraseTableError, match=r"pt.txt:96: expected 4 scores, found 5"):
        run(table, tmp_path / "out.txt", tiny_checkpoint, chunk_lines=50)


def test_nothing_good_written_leaves_no_partial(tmp_path: Path, tiny_checkpoint) -> None:
    lines = table_lines(20)
    lines[3] = b"a ||| b ||| 0.5 oops 0.5 0.5"
    table = write_table(tmp_path / "pt.txt", lines)
    with pytest.raises(PhraseTableError, match=r"pt.txt:4: score 'oops' is not a number"):
        run(table, tmp_path / "out.txt", tiny_checkpoint)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pt.txt"]


def test_malformed_line_later_continues_with_skip_bad_lines_resume(tmp_path: Path, model_file: Path, capfd) -> None:
    lines = table_lines(300)
    lines[250] = b"a ||| b ||| 0.5 oops 0.5 0.5"
    table = write_table(tmp_path / "pt.txt", lines)
    ck = load_checkpoint(model_file)
    with pytest.raises(PhraseTableError, match=r"pt.txt:251:"):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100)
    err = capfd.readouterr().err
    assert "--skip-bad-lines --resume" in err and (tmp_path / ".out.gz.partial").exists()
    run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True)
    run(table, tmp_path / "straight.gz", ck, chunk_lines=100, skip_bad_lines=True)
    assert_same_output(tmp_path / "out.gz", tmp_path / "straight.gz")
    assert (tmp_path / "out.gz.rejects").read_bytes() == lines[250] + b"\n"


def test_training_without_model_refuses_stdin_before_any_work(tmp_path: Path, no_work) -> None:
    res = CliRunner().invoke(rescore_phrase_table_command, ["-", str(tmp_path / "out.gz"), "--train-steps", "5"],
                             input="a ||| b ||| 0.5\n")
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "training without --model needs INPUT_TABLE as a file, not stdin" in res.output
    assert not (tmp_path / "out.gz").exists()


def test_impossible_output_fails_before_training(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # where a model trained for stdout output would go
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    res = cli(str(table), str(table / "out.gz"), "--train-steps", "5")
    assert res.exit_code == 1 and "is a file, not a folder" in res.output
    res = cli(str(table), "-", "--train-steps", "5", "--skip-bad-lines")
    assert res.exit_code == 1 and "not stdout" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pt.txt"]  # no model was trained


def test_an_output_in_folders_not_made_yet_is_written_there(tmp_path: Path, model_file: Path) -> None:
    """As every output of every command: the missing folders are made (and removed again if the run fails)."""
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    res = cli(str(table), str(tmp_path / "new" / "deeper" / "out.gz"), "--model", str(model_file))
    assert res.exit_code == 0, res.output
    assert listing(tmp_path / "new") == ["deeper", "deeper/out.gz"]


@pytest.mark.parametrize("output", ["OUTPUT_TABLE", "--moses-ini-out", "--scores-parquet", "--save-model"])
def test_an_output_that_cannot_be_written_is_refused_before_training(tmp_path: Path, unwritable_folder: Path,
                                                                     no_work, output: str) -> None:
    """One line before any model is loaded, not a 37-line traceback after it (or, for the ini, after all the
    scoring)."""
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    ini = tmp_path / "moses.ini"
    ini.write_text(ini_text([("TranslationModel0", 4, "PhraseDictionaryMemory")]))
    bad = unwritable_folder / "out.gz"
    args = [str(table), str(bad if output == "OUTPUT_TABLE" else tmp_path / "out.gz"), "--train-steps", "5",
            "--moses-ini", str(ini), "--moses-ini-out", str(tmp_path / "moses.rnn.ini")]
    if output != "OUTPUT_TABLE":
        args += [output, str(bad)]
    before = listing(tmp_path)
    assert_refused(cli_last(*args), output, str(bad))
    assert listing(tmp_path) == before


def test_a_model_file_of_random_bytes_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    model = tmp_path / "model.pt"
    model.write_bytes(random.Random(0).randbytes(4000))
    before = listing(tmp_path)
    res = cli(str(table), str(tmp_path / "new" / "out.gz"), "--model", str(model))
    assert_refused(res, str(model), "not a rescorer checkpoint of this tool")
    assert "weights_only" not in res.output
    assert listing(tmp_path) == before  # not even the folder new/ made for the output


@pytest.mark.parametrize("option, value", [
    ("--chunk-lines", "0"),  # would read the whole table into one chunk that never fills: 24 GB
    ("--chunk-lines", "-3"),
    ("--token-budget", "0"),
    ("-j", "-1"),
    ("--workers", "-2"),
    ("--threads", "0"),
    ("--train-steps", "0"),
    ("--train-time", "0"),
    ("--train-time", "-5"),
    ("--train-time", "nan"),
    ("--train-time", "inf"),
    ("--rnn-weight", "nan"),
    ("--rnn-weight", "inf"),
    ("--wp-weight", "-inf"),
    ("--wp-weight", "nan"),
    ("--cslm-weight", "nan"),
    ("--init-std", "0"),
    ("--init-std", "nan"),
    ("--shortlist", "0"),
    ("--hidden", "0"),
    ("--embedding", "0"),
    ("--maxout-units", "0"),
    ("--output-rank", "-1"),
    ("--chunk-lines", "many"),
])
def test_bad_numbers_are_refused_while_parsing(tmp_path: Path, model_file: Path, no_work, option: str,
                                               value: str) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    before = listing(tmp_path)
    res = cli_last(str(table), str(tmp_path / "out.gz"), "--model", str(model_file), option, value)
    assert_refused(res, f"'{option}'", value)
    assert listing(tmp_path) == before


@pytest.mark.parametrize("with_model", [True, False])
def test_folder_as_input_is_refused_before_any_work(tmp_path: Path, model_file: Path, with_model: bool) -> None:
    (tmp_path / "pt").mkdir()
    before = listing(tmp_path)
    model = ["--model", str(model_file)] if with_model else [
        "--train-steps", "1", "--hidden", "8", "--embedding", "4", "--maxout-units", "4", "--output-rank", "4"]
    res = cli(str(tmp_path / "pt"), str(tmp_path / "out.gz"), *model)
    assert_refused(res, "INPUT_TABLE", str(tmp_path / "pt"), "is a directory")
    assert listing(tmp_path) == before  # no .out.gz.partial, .out.gz.rejects.partial, out.gz.model.pt.data/


@pytest.mark.parametrize("with_model", [True, False])
def test_folder_as_output_is_refused_before_any_work(tmp_path: Path, model_file: Path, with_model: bool) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    (tmp_path / "out.gz").mkdir()
    (tmp_path / "out.gz" / "kept.txt").write_text("mine")
    before = listing(tmp_path)
    model = ["--model", str(model_file)] if with_model else [
        "--train-steps", "1", "--hidden", "8", "--embedding", "4", "--maxout-units", "4", "--output-rank", "4"]
    res = cli(str(table), str(tmp_path / "out.gz"), *model)
    assert_refused(res, "OUTPUT_TABLE", str(tmp_path / "out.gz"), "is a directory")
    assert "--resume" not in res.output and "space" not in res.output
    assert listing(tmp_path) == before and (tmp_path / "out.gz" / "kept.txt").read_text() == "mine"


@pytest.mark.parametrize("case", ["chunk_lines", "workers", "input folder", "output folder"])
def test_library_refuses_what_cannot_work_before_reading(tmp_path: Path, tiny_checkpoint, monkeypatch,
                                                         case: str) -> None:
    """The same checks for callers of :func:`rescore` (no hang, nothing written)."""
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    out = tmp_path / "out.txt"
    kw: dict = {}
    if case == "chunk_lines":
        kw["chunk_lines"] = 0
    elif case == "input folder":
        table = tmp_path / "folder"
        table.mkdir()
    elif case == "output folder":
        out.mkdir()
    before = listing(tmp_path)

    def started(*_a, **_k):
        raise AssertionError("the table was read before the settings were checked")

    monkeypatch.setattr("rescorer.pipeline.reader.iter_line_chunks", started)
    workers = -1 if case == "workers" else 0
    opts = RescoreOptions(progress=False, device="cpu", workers=workers, **kw)
    word = {"chunk_lines": "--chunk-lines", "workers": "--workers", "input folder": "is a folder",
            "output folder": "is a folder"}[case]
    with pytest.raises(RescoreError, match=word):
        rescore(str(table), str(out), Models(tiny_checkpoint), opts)
    assert listing(tmp_path) == before


def test_an_empty_table_is_said_plainly(tmp_path: Path, model_file: Path) -> None:
    """Scoring an empty table is not an error, but the user is told; training on one names the table
    (not an internal file) and leaves no data folder behind."""
    table = tmp_path / "pt.txt"
    table.write_bytes(b"")
    res = cli(str(table), str(tmp_path / "out.gz"), "--model", str(model_file))
    assert res.exit_code == 0, res.output
    assert "mean log p n/a (no lines)" in res.stderr and "nan" not in res.stderr
    assert f"warning: {table} holds no phrase-table lines" in res.stderr
    res = cli(str(table), str(tmp_path / "trained.gz"), "--train-steps", "5", "--hidden", "8", "--embedding", "4",
              "--maxout-units", "4", "--output-rank", "4")
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    last = res.output.strip().splitlines()[-1]
    assert last == f"Error: {table}: need at least 2 unique phrase pairs to train, found 0"
    assert listing(tmp_path) == ["out.gz", "pt.txt"]


# ---- no file written beside the output is one of the inputs ------------------------------------


@pytest.mark.parametrize("skip_bad_lines", [True, False])
def test_an_input_where_the_rejects_go_is_refused_and_kept(tmp_path: Path, model_file: Path,
                                                            skip_bad_lines: bool) -> None:
    """OUTPUT_TABLE.rejects is replaced by a run that rejects lines and removed by one that rejects none
    (an earlier run's would mislead), with or without --skip-bad-lines: an input of that name was lost."""
    table = write_table(tmp_path / "out.txt.rejects", table_lines(30))
    before = table.read_bytes()
    res = cli(str(table), str(tmp_path / "out.txt"), "--model", str(model_file),
              *(["--skip-bad-lines"] if skip_bad_lines else []))
    assert res.exit_code == 1, res.output
    assert res.output.splitlines() == [f"Error: output {tmp_path.resolve() / 'out.txt.rejects'} (written with "
                                       f"OUTPUT_TABLE) is the input INPUT_TABLE {table}; write it elsewhere"]
    assert table.read_bytes() == before
    assert listing(tmp_path) == ["out.txt.rejects"]


@pytest.mark.parametrize(("option", "name"), [
    ("INPUT_TABLE", "out.gz.model.pt"),
    ("--moses-ini", "out.gz.model.pt"),
    ("--reverse-model", "out.gz.model.pt"),
    ("--moses-ini", "out.gz.model.pt.last"),  # the training state saved beside the model
])
def test_an_input_where_the_model_trained_without_model_goes_is_refused_and_kept(tmp_path: Path, no_work,
                                                                                 option: str, name: str) -> None:
    """Without --model (and --save-model) the model is trained into OUTPUT_TABLE.model.pt: an input there
    is refused before any work, as every output that is an input, naming --save-model's default."""
    given = tmp_path / name
    given.write_bytes(ini_text([("TranslationModel0", 4, "PhraseDictionaryMemory")]).encode()
                      if option == "--moses-ini" else b"\n".join(table_lines(30)) + b"\n")
    before = given.read_bytes()
    table = given if option == "INPUT_TABLE" else write_table(tmp_path / "pt.txt", table_lines(30))
    out = tmp_path / "out.gz"
    args = [str(table), str(out), "--train-steps", "5"]
    if option != "INPUT_TABLE":
        args += [option, str(given)]
    if option == "--moses-ini":
        args += ["--moses-ini-out", str(tmp_path / "new.ini")]
    res = cli(*args)
    assert res.exit_code == 1, res.output
    what = "--save-model's default" if name.endswith(".pt") else "written with --save-model's default"
    assert res.output.splitlines() == [f"Error: output {given} ({what}) is the input {option} {given}; "
                                       "write it elsewhere"]
    assert given.read_bytes() == before
    assert listing(tmp_path) == sorted({name, table.name})


def test_the_model_a_run_trained_may_be_the_next_runs_model(tmp_path: Path, model_file: Path) -> None:
    """OUTPUT_TABLE.model.pt is an output only without --model: the rerun given it scores with it."""
    table = write_table(tmp_path / "pt.txt", table_lines(30))
    model = tmp_path / "out.gz.model.pt"
    model.write_bytes(model_file.read_bytes())
    res = cli(str(table), str(tmp_path / "out.gz"), "--model", str(model))
    assert res.exit_code == 0, res.output
    assert model.read_bytes() == model_file.read_bytes()
    assert len(added_columns(tmp_path / "out.gz")) == 30


def test_an_output_that_is_a_pipe_is_written_as_stdout_is(tmp_path: Path, model_file: Path) -> None:
    """OUTPUT_TABLE a FIFO (or ``/dev/null``): the table goes through it, as to ``-``, and it stays a FIFO;
    the rename at the end put a regular file in its place (as root, over ``/dev/null`` itself), and the
    reader got nothing. What needs a file beside the output (``--resume``) is refused in one line."""
    import stat
    import threading

    table = write_table(tmp_path / "pt.txt", table_lines(300))
    assert cli(str(table), str(tmp_path / "file.txt"), "--model", str(model_file)).exit_code == 0
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)  # hangs if replaced
    reader.start()
    res = cli(str(table), str(fifo), "--model", str(model_file))
    reader.join(30)
    assert res.exit_code == 0, res.output
    assert received == [(tmp_path / "file.txt").read_bytes()] and stat.S_ISFIFO(fifo.stat().st_mode)
    res = cli(str(table), str(fifo), "--model", str(model_file), "--resume")
    assert res.exit_code == 1 and res.output.count("\n") == 1
    assert f"--resume needs a file as output, not {fifo}, a device or a pipe" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "file.txt", "pt.txt"]
