"""Cases a Moses user hits in the first week: tokenisation, early checks, loadable output.

Each test here is a case met by trying the tool on real tables, run with a tiny hand-built model, so
the checks run in seconds.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from rescore_runs import assert_same_output

from full_disk import FullDisk
from held_output import held_by_another_process
from moses_integration.phrase_table import PhraseTableError
from neural.vocab import EOS, UNK, Vocab
from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline import partial_output, train_or_load
from rescorer.pipeline import rescore as rescore_module
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.partial_output import ChunkProgress
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.resume import PROGRESS_VERSION
from rescorer.pipeline.scoring import ScoringOptions
from rescorer.pipeline.train_or_load import Models

NBSP = "\u00a0"
WORDS = ["la", "maison", "the", "house", "a", "b", "c"]


@pytest.fixture(scope="module")
def tiny_checkpoint() -> Checkpoint:
    vocab = Vocab([EOS, UNK, *WORDS])
    config = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), hidden=8, embedding=4,
                         maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, vocab, vocab)


def run(inp: Path, out: Path, ck: Checkpoint, **kw):
    kw.setdefault("scoring", ScoringOptions(token_budget=512))
    kw.setdefault("workers", 0)
    opts = RescoreOptions(progress=False, device="cpu", **kw)
    return rescore(str(inp), str(out), Models(ck), opts)


def added_columns(path: Path) -> list[list[float]]:
    lines = gzip.decompress(path.read_bytes()).decode().splitlines() if path.suffix == ".gz" else \
        path.read_text(encoding="utf-8").splitlines()
    return [[float(x) for x in line.split(" ||| ")[2].split(" ")[-2:]] for line in lines]


def test_no_break_space_makes_one_unknown_token_in_the_penalty(tmp_path: Path, tiny_checkpoint) -> None:
    table = tmp_path / "pt.txt"
    table.write_text(
        f"the house ||| la{NBSP}maison ||| 0.5 0.5 0.5 0.5\n"  # one token, unknown to the model
        "the house ||| la maison ||| 0.5 0.5 0.5 0.5\n"  # two known tokens
        "the\thouse ||| la\t\tmaison  ||| 0.5 0.5 0.5 0.5\n",  # tab and repeated spaces separate
        encoding="utf-8",
    )
    out = tmp_path / "out.txt"
    run(table, out, tiny_checkpoint)
    penalty = [cols[1] for cols in added_columns(out)]
    assert penalty[0] == pytest.approx(math.exp(-1), rel=1e-5)
    assert penalty[1] == 1.0 and penalty[2] == 1.0


# ---- tables for the checks below --------------------------------------------------------------

def table_lines(n: int, scores: str = "0.5 0.5 0.5 0.5") -> list[bytes]:
    """``n`` sorted lines over the tiny model's words, a few targets per source."""
    lines = []
    for i in range(n):
        src = f"{WORDS[(i // 3) % 4]} {WORDS[(i // 12) % 7]}{i // 84}"
        lines.append(f"{src} ||| {WORDS[i % 3]} {WORDS[(i // 3) % 5]} ||| {scores}".encode())
    return lines


def write_table(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture
def model_file(tmp_path_factory, tiny_checkpoint) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.pt"
    ck = tiny_checkpoint
    save_checkpoint(path, model=ck.model, config=ck.config, src_vocab=ck.src_vocab, tgt_vocab=ck.tgt_vocab)
    return path


def cli(*args: str):
    return CliRunner().invoke(rescore_phrase_table_command, [*args, "-q", "-j", "0", "--device", "cpu"])


def ini_text(tables: list[tuple[str, int, str]], weights: dict[str, int] | None = None) -> str:
    """A moses.ini with the given (name, num-features, type) phrase tables and matching weights."""
    features = "\n".join(f"{kind} name={name} num-features={n} path=/nowhere/{name}.gz input-factor=0 output-factor=0"
                         for name, n, kind in tables)
    counts = weights or {name: n for name, n, _ in tables}
    weight_lines = "\n".join(f"{name}= " + " ".join(["0.2"] * counts[name]) for name, _, _ in tables)
    return f"[feature]\nWordPenalty\n{features}\n\n[weight]\nWordPenalty0= -1\n{weight_lines}\n"


# ---- 2. checks before the long work -----------------------------------------------------------

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


# ---- 3. output Moses can always load ----------------------------------------------------------

def test_rejected_lines_go_to_rejects_and_every_input_line_is_accounted_for(tmp_path: Path, tiny_checkpoint,
                                                                            capfd) -> None:
    lines = table_lines(2000)
    lines[1234] = lines[1234].replace(b"0.5 0.5 0.5 0.5", b"0.5 x 0.5 0.5")  # one non-numeric score
    lines[1500] = b"no separators here"
    table = write_table(tmp_path / "pt.gz", [])
    table.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    summary = run(table, tmp_path / "out.gz", tiny_checkpoint, chunk_lines=300, skip_bad_lines=True)
    out = gzip.decompress((tmp_path / "out.gz").read_bytes()).splitlines()
    rejects = (tmp_path / "out.gz.rejects").read_bytes().splitlines()
    assert len(out) + len(rejects) == len(lines) == 2000
    assert rejects == [lines[1234], lines[1500]]  # byte for byte, in input order
    assert summary.rejected == 2 and summary.lines == 1998
    assert {len(line.split(b" ||| ")[2].split()) for line in out} == {6}  # one column count: Moses loads it
    err = capfd.readouterr().err
    assert "pt.gz:1235: score 'x' is not a number" in err and "pt.gz:1501:" in err


def test_disk_full_keeps_the_good_bytes_and_resume_completes(tmp_path: Path, model_file: Path, monkeypatch) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(600))
    ck = load_checkpoint(model_file)
    run(table, tmp_path / "straight.gz", ck, chunk_lines=100)
    straight = (tmp_path / "straight.gz").read_bytes()
    real_open = partial_output._open_at
    partial = tmp_path / ".out.gz.partial"

    def small_disk(path, size, resuming):  # room for about half the output
        stream = real_open(path, size, resuming)
        return FullDisk(stream, len(straight) // 2) if path == partial else stream

    monkeypatch.setattr(partial_output, "_open_at", small_disk)
    with pytest.raises(RescoreError, match=r"disk is full: (\d+) good bytes of output kept in .*--resume") as err:
        run(table, tmp_path / "out.gz", ck, chunk_lines=100)
    kept = int(str(err.value).split(": ")[1].split()[0])
    progress = json.loads((tmp_path / ".out.gz.progress.json").read_text())
    assert 0 < kept == progress["output_bytes"] == partial.stat().st_size  # cut back to the good bytes
    assert_same_output(partial, straight[:kept])
    monkeypatch.undo()
    run(table, tmp_path / "out.gz", ck, chunk_lines=100, resume=True)
    assert_same_output(tmp_path / "out.gz", straight)


def test_disk_full_before_any_chunk_leaves_nothing(tmp_path: Path, tiny_checkpoint, monkeypatch) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(50))
    real_open = partial_output._open_at
    monkeypatch.setattr(partial_output, "_open_at",
                        lambda path, size, resuming: FullDisk(real_open(path, size, resuming), 10))
    with pytest.raises(RescoreError, match="disk is full: nothing of .*out.txt could be written"):
        run(table, tmp_path / "out.txt", tiny_checkpoint)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pt.txt"]


def kill_after_two_chunks(monkeypatch) -> None:
    """Ctrl-C as the third chunk is being written: two chunks are durable, the rest is not."""
    real_write = partial_output.DurableWriter.write
    calls = []

    def killed_after_two_chunks(self, *a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_write(self, *a)

    monkeypatch.setattr(partial_output.DurableWriter, "write", killed_after_two_chunks)


def test_resume_without_model_reuses_the_trained_model(tmp_path: Path, monkeypatch) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(400))
    out = tmp_path / "out.txt"
    args = [str(table), str(out), "--train-time", "1", "--hidden", "8", "--embedding", "4", "--maxout-units", "4",
            "--output-rank", "4", "--shortlist", "20", "--chunk-lines", "100"]
    kill_after_two_chunks(monkeypatch)
    res = cli(*args)
    assert res.exit_code != 0 and (tmp_path / ".out.txt.partial").exists()
    model = tmp_path / "out.txt.model.pt"
    trained = {p.name: p.read_bytes() for p in (model, tmp_path / "out.txt.model.pt.last")}
    monkeypatch.undo()
    checks = counted(monkeypatch, rescore_module, "check_options")
    lookups = counted(monkeypatch, train_or_load, "finished_training_of")
    res = cli(*args, "--resume")
    assert res.exit_code == 0, res.output
    assert "reused as it is" in res.output
    assert {p.name: p.read_bytes() for p in (model, tmp_path / "out.txt.model.pt.last")} == trained
    assert len(out.read_bytes().splitlines()) == 400
    assert (len(checks), len(lookups)) == (1, 1), "each option is checked once, the trained model looked up once"


def counted(monkeypatch, module, name: str) -> list[tuple]:
    """The calls to ``module``'s function ``name``."""
    calls: list[tuple] = []
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_training_without_model_refuses_stdin_before_any_work(tmp_path: Path, no_work) -> None:
    res = CliRunner().invoke(rescore_phrase_table_command, ["-", str(tmp_path / "out.gz"), "--train-steps", "5"],
                             input="a ||| b ||| 0.5\n")
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "training without --model needs INPUT_TABLE as a file, not stdin" in res.output
    assert not (tmp_path / "out.gz").exists()


@pytest.mark.parametrize("name", ["pt.txt", "pt.gz"])
def test_shards_partition_the_table_at_source_boundaries(tmp_path: Path, tiny_checkpoint, name: str) -> None:
    table = write_table(tmp_path / name, table_lines(12_000))
    if name.endswith(".gz"):
        table.write_bytes(gzip.compress(table.read_bytes()))
    summary = run(table, tmp_path / "whole.txt", tiny_checkpoint, chunk_lines=700)
    whole = (tmp_path / "whole.txt").read_bytes().splitlines()
    parts, sources = [], 0
    for k in range(1, 5):
        part = run(table, tmp_path / f"part{k}.txt", tiny_checkpoint, chunk_lines=700, shard=(k, 4))
        sources += part.distinct_sources
        parts.append((tmp_path / f"part{k}.txt").read_bytes().splitlines())
    assert sources == summary.distinct_sources  # a source block split by a chunk cut is counted once
    assert all(parts) and sum(len(p) for p in parts) == len(whole)
    joined = [line for part in parts for line in part]
    assert joined == whole  # byte for byte: the shards cut their chunks where the whole run does
    for before, after in zip(parts, parts[1:], strict=False):  # no source block is split between two shards
        assert before[-1].split(b" ||| ")[0] != after[0].split(b" ||| ")[0]


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


def interrupted_run(tmp_path: Path, model_file: Path, **kw) -> tuple[Path, Checkpoint]:
    """A run stopped by a malformed line 251 of 300 after its first chunks (100 lines each)."""
    lines = table_lines(300)
    lines[250] = b"a ||| b ||| 0.5 oops 0.5 0.5"
    table = write_table(tmp_path / "pt.txt", lines)
    ck = load_checkpoint(model_file)
    with pytest.raises(PhraseTableError):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100, **kw)
    return table, ck


@pytest.mark.parametrize("changed", [{"precision": "bf16"}, {"scoring": ScoringOptions(token_budget=64)}])
def test_resume_refuses_another_precision_or_token_budget(tmp_path: Path, model_file: Path, changed) -> None:
    """They decide the scores' last bits (bf16 far more): a resume must compute as the run it continues."""
    table, ck = interrupted_run(tmp_path, model_file)
    record = json.loads((tmp_path / ".out.gz.progress.json").read_text())
    assert {k: record["options"][k] for k in ("device", "precision")} == {"device": "cpu", "precision": "fp32"}
    named = "--precision fp32, now bf16" if "precision" in changed else "--token-budget 512, now 64"
    with pytest.raises(RescoreError, match=f"cannot --resume: .*progress.json was made with {named}; resume with "
                                           f"the same options, or remove .*partial and .*progress.json to start over"):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True, **changed)


def test_a_progress_record_of_an_earlier_version_is_refused_in_one_line(tmp_path: Path, model_file: Path) -> None:
    """Version 7 recorded fewer options: it cannot tell whether the run was made as this one would be."""
    table, ck = interrupted_run(tmp_path, model_file)
    progress = tmp_path / ".out.gz.progress.json"
    record = json.loads(progress.read_text())
    record["version"] = 7
    progress.write_text(json.dumps(record))
    with pytest.raises(RescoreError, match=rf"^cannot --resume: {progress} was written by another version of this "
                                           rf"program \(progress record version 7, this one writes "
                                           rf"{PROGRESS_VERSION}\); remove "):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True)


@dataclass
class WithANewOption(RescoreOptions):
    """The options with one more, as a new feature adds one: listed nowhere else."""

    new_knob: int = 0


def test_a_new_option_is_in_the_resume_record_unless_listed_as_one_that_may_differ(tmp_path: Path, model_file: Path,
                                                                                   monkeypatch) -> None:
    """An option that changes the bytes once had to be added to the record by hand; forgotten, a ``--resume``
    spliced outputs made with two settings. Now every option is recorded unless it is said to be free."""
    lines = table_lines(300)
    lines[250] = b"a ||| b ||| 0.5 oops 0.5 0.5"
    table, out, ck = write_table(tmp_path / "pt.txt", lines), tmp_path / "out.gz", load_checkpoint(model_file)

    def options(**kw) -> WithANewOption:
        return WithANewOption(progress=False, device="cpu", workers=0, chunk_lines=100,
                              scoring=ScoringOptions(token_budget=512), **kw)

    with pytest.raises(PhraseTableError):
        rescore(str(table), str(out), Models(ck), options(new_knob=1))
    assert json.loads((tmp_path / ".out.gz.progress.json").read_text())["options"]["new_knob"] == 1
    with pytest.raises(RescoreError, match="out.gz.progress.json was made with --new-knob 1, now 2; resume with"):
        rescore(str(table), str(out), Models(ck), options(new_knob=2, resume=True, skip_bad_lines=True))
    summary = rescore(str(table), str(out), Models(ck), options(new_knob=1, resume=True, skip_bad_lines=True))
    assert summary.resumed_lines > 0 and summary.lines == 299  # went on from the recorded chunks
    monkeypatch.setattr(WithANewOption, "MAY_DIFFER", RescoreOptions.MAY_DIFFER | {"new_knob"})
    assert "new_knob" not in options().identity()
    assert options(new_knob=1).identity() == options(new_knob=2).identity() == options().identity()


def test_resume_keeps_the_recorded_automatic_token_budget(tmp_path: Path, model_file: Path, monkeypatch) -> None:
    """On a GPU the automatic budget follows free memory; a resumed run takes the interrupted run's."""
    table, ck = interrupted_run(tmp_path, model_file, scoring=ScoringOptions())
    budgets = []
    monkeypatch.setattr("rescorer.pipeline.scoring.auto_token_budget", lambda device, config: budgets.append(1) or 123)
    run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True, scoring=ScoringOptions())
    assert budgets == []  # the recorded budget was used, not a new automatic one
    monkeypatch.undo()
    run(table, tmp_path / "straight.gz", ck, chunk_lines=100, skip_bad_lines=True, scoring=ScoringOptions())
    assert_same_output(tmp_path / "out.gz", tmp_path / "straight.gz")


# ---- 4. bad values and paths: one line, exit 1, before any work, nothing left behind ----------

def listing(folder: Path) -> list[str]:
    """Every file and folder under ``folder``, hidden ones included."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def cli_last(*args: str):
    """The CLI with ``args`` last, so that they win over the test defaults (``-j 0``)."""
    return CliRunner().invoke(rescore_phrase_table_command, ["-q", "-j", "0", "--device", "cpu", *args])


def assert_refused(res, *names: str) -> None:
    """Exit 1 with one ``Error:`` line naming ``names``, and no exception escaped (no traceback)."""
    assert isinstance(res.exception, SystemExit) and res.exit_code == 1, (res.exception, res.output)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert all(name in lines[0] for name in names), res.output
    assert "Traceback" not in res.output


@pytest.fixture
def no_work(monkeypatch) -> None:
    """Training, scoring or reading the table fails the test (and cannot hang on a bad value)."""

    def started(*_a, **_k):
        raise AssertionError("work started before the bad value was refused")

    monkeypatch.setattr("rescorer.pipeline.train_or_load.train_on_phrase_table", started)
    monkeypatch.setattr("rescorer.pipeline.train_or_load.Models.load", started)
    monkeypatch.setattr("rescorer.pipeline.reader.iter_line_chunks", started)


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


def test_a_run_without_rejected_lines_never_creates_a_rejects_file(tmp_path: Path, tiny_checkpoint,
                                                                    monkeypatch) -> None:
    table = write_table(tmp_path / "pt.txt", table_lines(300))
    real_write = partial_output.DurableWriter.write
    seen = []

    def write(self, *a):
        real_write(self, *a)
        seen.append(self.files.rejects_partial.exists())

    monkeypatch.setattr(partial_output.DurableWriter, "write", write)
    run(table, tmp_path / "out.gz", tiny_checkpoint, chunk_lines=100, skip_bad_lines=True)
    assert seen and not any(seen)  # one write per chunk, and never a rejects file
    assert listing(tmp_path) == ["out.gz", "pt.txt"]


def test_a_stopped_run_leaves_no_empty_rejects_file(tmp_path: Path, model_file: Path) -> None:
    interrupted_run(tmp_path, model_file)  # malformed line 251: the first two chunks are kept
    assert (tmp_path / ".out.gz.partial").stat().st_size > 0
    assert listing(tmp_path) == [".out.gz.partial", ".out.gz.progress.json", "pt.txt"]


def test_rejected_lines_before_a_kill_are_kept_for_resume(tmp_path: Path, model_file: Path, monkeypatch) -> None:
    lines = table_lines(400)
    lines[50] = b"a ||| b ||| 0.5 oops 0.5 0.5"
    table = write_table(tmp_path / "pt.txt", lines)
    ck = load_checkpoint(model_file)
    run(table, tmp_path / "straight.gz", ck, chunk_lines=100, skip_bad_lines=True)
    kill_after_two_chunks(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True)
    assert (tmp_path / ".out.gz.rejects.partial").read_bytes() == lines[50] + b"\n"
    monkeypatch.undo()
    run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True)
    assert_same_output(tmp_path / "out.gz", tmp_path / "straight.gz")
    assert (tmp_path / "out.gz.rejects").read_bytes() == lines[50] + b"\n"
    assert listing(tmp_path) == ["out.gz", "out.gz.rejects", "pt.txt", "straight.gz", "straight.gz.rejects"]


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


def test_a_second_run_into_a_held_output_keeps_its_partial_output(tmp_path: Path, model_file: Path) -> None:
    """``--resume`` while the first run still writes: refused before touching its partial files."""
    table, _ = interrupted_run(tmp_path, model_file)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with held_by_another_process(tmp_path / "out.gz") as holder:
        res = cli(str(table), str(tmp_path / "out.gz"), "--model", str(model_file), "--resume")
    assert res.exit_code == 1 and f"Error: {tmp_path / 'out.gz'} is in use by pid {holder.pid} " in res.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_shards_hold_equal_shares_at_the_default_chunk_lines(tmp_path: Path, tiny_checkpoint) -> None:
    """Where a shard may start does not depend on --chunk-lines: at the default (100,000 lines, so
    one chunk here) 4 shards of a 60,000-line table each hold a quarter of it, within 15%, and
    still concatenate to the whole run's bytes (not all lines in shard 1)."""
    table = tmp_path / "pt.gz"
    table.write_bytes(gzip.compress(b"\n".join(table_lines(60_000)) + b"\n"))
    whole = run(table, tmp_path / "whole.gz", tiny_checkpoint)
    parts, sources = [], 0
    for k in range(1, 5):  # shard 2 (a start and an end inside the table) through the reader process and
        # workers (-j 2), the others and the whole run in this process: both ways cut at the same lines
        workers = 2 if k == 2 else 0
        sources += run(table, tmp_path / f"part{k}.gz", tiny_checkpoint, shard=(k, 4), workers=workers).distinct_sources
        parts.append((tmp_path / f"part{k}.gz").read_bytes())
    assert sources == whole.distinct_sources  # each shard counts its own lines only
    sizes = [len(gzip.decompress(p).splitlines()) for p in parts]
    assert all(abs(size / 15_000 - 1) <= 0.15 for size in sizes), sizes
    assert_same_output(b"".join(parts), tmp_path / "whole.gz")
    texts = [gzip.decompress(p).splitlines() for p in parts]
    for before, after in zip(texts, texts[1:], strict=False):  # no source block is split between two shards
        assert before[-1].split(b" ||| ")[0] != after[0].split(b" ||| ")[0]


def test_an_empty_shard_writes_no_byte(tmp_path: Path, tiny_checkpoint) -> None:
    """Two source blocks in 4 shards: the shards without one write empty files, not an empty gzip
    member each, so that `cat` of the shards is still the whole run's output."""
    table = tmp_path / "pt.gz"
    table.write_bytes(gzip.compress(b"\n".join(table_lines(6)) + b"\n"))
    run(table, tmp_path / "whole.gz", tiny_checkpoint)
    parts = []
    for k in range(1, 5):
        run(table, tmp_path / f"part{k}.gz", tiny_checkpoint, shard=(k, 4))
        parts.append((tmp_path / f"part{k}.gz").read_bytes())
    assert sum(1 for p in parts if not p) >= 2
    assert_same_output(b"".join(parts), tmp_path / "whole.gz")


def test_ctrl_c_just_after_a_progress_record_is_renamed_still_resumes(tmp_path: Path, model_file: Path,
                                                                      monkeypatch) -> None:
    """Ctrl-C or SIGTERM after the record of chunk 2 is in place but before the run counted those bytes
    (the folder's fsync takes milliseconds): the partial output must not be cut shorter than the
    record, or --resume refuses it."""
    table = write_table(tmp_path / "pt.txt", table_lines(400))
    ck = load_checkpoint(model_file)
    run(table, tmp_path / "straight.gz", ck, chunk_lines=100)
    real_save, saved = partial_output.save_progress, []

    def interrupted_after_the_second_record(path, record) -> None:
        real_save(path, record)
        saved.append(record)
        if len(saved) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(partial_output, "save_progress", interrupted_after_the_second_record)
    with pytest.raises(KeyboardInterrupt, match="good bytes kept"):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100)
    monkeypatch.undo()
    assert (tmp_path / ".out.gz.partial").stat().st_size == saved[1]["output_bytes"]
    # The record holds the run's identity and exactly the fields of the one typed progress record.
    assert set(saved[1]) - {"version", "input", "model", "options"} == {f.name for f in fields(ChunkProgress)}
    assert ChunkProgress.from_record(saved[1]).chunks_done == 2
    run(table, tmp_path / "out.gz", ck, chunk_lines=100, resume=True)
    assert_same_output(tmp_path / "out.gz", tmp_path / "straight.gz")


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
