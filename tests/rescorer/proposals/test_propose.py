"""``rescorer propose``: the completed table against the input, the model and the word tables."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gzip
import json
import math
import os
import random
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from rescore_runs import assert_same_output, lines_of
from waiting import sigkill_when

import rescorer
from analysis_checkpoint import EXAMPLE_TABLE
from moses_integration.moses_ini import MosesIni
from moses_integration.tokens import split_tokens
from neural.vocab import Vocab
from proposal_system import EXAMPLE_INI, example_system, pair_log_p, propose_options
from rescorer.cli import main
from rescorer.model.checkpoint import load_checkpoint, save_checkpoint
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.train_or_load import Models
from rescorer.proposals import propose as propose_module
from rescorer.proposals.lexical import lexical_scores, read_word_table
from rescorer.proposals.propose import ProposeOptions, propose

SEP = b" ||| "


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("system")
    example_system(folder)
    return folder


def _lines(path: Path) -> list[bytes]:
    return gzip.decompress(path.read_bytes()).splitlines()


def _split(line: bytes) -> tuple[list[bytes], list[bytes]]:
    fields = line.split(SEP)
    return fields, fields[2].split(b" ")


def _listing(path: Path) -> list[tuple[str, str, str, float]]:
    with open(path, encoding="utf-8", newline="") as fh:
        return [(k, s, t, float(p)) for k, s, t, p in csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]



def test_every_source_the_table_lines_byte_for_byte_and_the_proposals_in_sorted_order(system, tmp_path) -> None:
    table, out, listing = system / "phrase-table.gz", tmp_path / "completed.gz", tmp_path / "proposals.tsv"
    checkpoint = load_checkpoint(system / "model.pt")
    summary = propose(str(table), str(out), checkpoint, propose_options(beam=6, per_source=3, list_path=str(listing)))
    given, written = _lines(table), _lines(out)
    assert written == sorted(written), "the output is in LC_ALL=C byte order"
    assert len(written) == len(given) + summary.proposals and summary.proposals > 10

    originals, proposed = [], []
    for line in written:
        fields, scores = _split(line)
        assert len(scores) == 7 and scores[-1] in (b"1", b"2.71828")
        if scores[-1] == b"1":
            fields[2] = b" ".join(scores[:-3])
            originals.append(SEP.join(fields))
        else:
            proposed.append(line)
    assert originals == given  # every input line, unchanged but for the three new columns

    pairs = {tuple(line.split(SEP)[:2]) for line in given}
    listed = _listing(listing)
    assert [(s.encode(), t.encode()) for _, s, t, _ in listed] == [tuple(p.split(SEP)[:2]) for p in proposed]
    per_source = Counter(s for _, s, _, _ in listed)
    assert max(per_source.values()) <= 3
    f2e, e2f = read_word_table(system / "lex.f2e"), read_word_table(system / "lex.e2f")
    p_fe, p_ef = summary.phrase_probabilities
    for line, (kind, source, target, log_p) in zip(proposed, listed, strict=True):
        fields, scores = _split(line)
        assert kind == "table" and (fields[0], fields[1]) not in pairs
        assert len(fields) == 4  # source, target, scores, alignment: what Moses needs
        lex = lexical_scores(split_tokens(source), split_tokens(target), f2e, e2f)
        assert scores[:4] == [f"{v:.6g}".encode() for v in (p_fe, lex.source_given_target, p_ef,
                                                               lex.target_given_source)]
        assert fields[3] == lex.alignment_field().encode() and lex.alignment
        # The beam's log p is the model's, and the pipeline wrote the same value in the RNN column.
        assert log_p == pytest.approx(pair_log_p(checkpoint, source, target), abs=1e-4)
        assert math.log(float(scores[4])) == pytest.approx(log_p, abs=1e-4)
        assert scores[5] == b"1"  # the proposal's words are all in the shortlist
    # The phrase probabilities: geometric means over the table's pairs (the example has no singleton).
    logs = np.log([[float(x) for x in _split(line)[1][0:3:2]] for line in given])
    assert (p_fe, p_ef) == pytest.approx(tuple(np.exp(logs.mean(axis=0))))


def test_for_a_text_only_its_missing_and_thin_ngrams_whose_words_the_model_knows(system, tmp_path) -> None:
    table, out, listing = system / "phrase-table.gz", tmp_path / "completed.gz", tmp_path / "proposals.tsv"
    text = tmp_path / "dev.en"
    text.write_text("all canadians must support the budget\nthe zzyzx minister\n")
    checkpoint = load_checkpoint(system / "model.pt")
    summary = propose(str(table), str(out), checkpoint,
                      propose_options(for_text=str(text), thin_below=3, beam=6, per_source=2, list_path=str(listing)))
    targets = defaultdict(set)
    for line in _lines(table):
        fields = line.decode().split(" ||| ")
        targets[fields[0]].add(fields[1])
    longest = max(len(s.split()) for s in targets)
    ngrams = {" ".join(w[i:j]) for w in (line.split() for line in text.read_text().splitlines())
              for i in range(len(w)) for j in range(i + 1, min(len(w), i + longest) + 1)}
    expected = {g for g in ngrams if len(targets.get(g, ())) < 3 and "zzyzx" not in g}
    searched = summary.kinds["missing"].sources + summary.kinds["thin"].sources
    assert searched == len(expected) and summary.kinds["table"].sources == 0
    assert summary.choice.skipped.count == sum("zzyzx" in g and len(targets.get(g, ())) < 3 for g in ngrams)
    for kind, source, target, _ in _listing(listing):
        assert source in expected and target not in targets.get(source, ())
        assert kind == ("thin" if source in targets else "missing")
    assert summary.proposals == len(_listing(listing)) > 0
    written = _lines(out)
    assert written == sorted(written) and len(written) == len(_lines(table)) + summary.proposals


def test_the_cli_writes_a_moses_ini_with_three_more_features_at_weight_0(system, tmp_path) -> None:
    ini = tmp_path / "moses.ini"
    shutil.copy(EXAMPLE_INI, ini)
    result = CliRunner().invoke(main, [
        "propose", str(system / "phrase-table.gz"), str(tmp_path / "out.gz"), "--model", str(system / "model.pt"),
        "--beam", "4", "--per-source", "2", "--moses-ini", str(ini), "--moses-ini-out", str(tmp_path / "new.ini"),
        "--device", "cpu", "--threads", "1", "-q"])
    assert result.exit_code == 0, result.output
    assert "proposals" in result.output and "sources/s" in result.output
    new = MosesIni.read(tmp_path / "new.ini")
    (table,) = new.phrase_tables()
    assert table.num_features == 7 and table.args["path"] == str((tmp_path / "out.gz").resolve())
    assert new.weights()["TranslationModel0"] == [0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 0.0]
    assert all(len(_split(line)[1]) == 7 for line in _lines(tmp_path / "out.gz"))


def _cli(system: Path, table: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["propose", str(table), str(out), "--model", str(system / "model.pt"),
                                     "--lex-e2f", str(system / "lex.e2f"), "--lex-f2e", str(system / "lex.f2e"),
                                     "--beam", "3", "--per-source", "1", "--device", "cpu", "--threads", "1", "-q",
                                     *extra])


def _nothing_left(folder: Path, out: Path) -> bool:
    return not out.exists() and not [p for p in folder.iterdir() if p.name.startswith(f".{out.name}")]


def test_missing_or_malformed_word_tables_stop_before_the_search_with_file_and_line(system, tmp_path) -> None:
    table, out = tmp_path / "phrase-table.gz", tmp_path / "out.gz"
    shutil.copy(system / "phrase-table.gz", table)
    result = CliRunner().invoke(main, ["propose", str(table), str(out), "--model", str(system / "model.pt"), "-q"])
    assert result.exit_code == 1 and "lex.f2e: no such word translation table" in result.output
    bad = tmp_path / "lex.bad"
    bad.write_text("la the 0.5\nmaison house\n")
    result = _cli(system, table, out, "--lex-f2e", str(bad))
    assert result.exit_code == 1 and "lex.bad:2: expected 'word given probability', found 2 fields" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert _nothing_left(tmp_path, out)


@pytest.mark.parametrize(("output", "option"), [
    ("lex.e2f", ()), ("lex.f2e", ("--list",)), ("lex.e2f", ("--moses-ini", str(EXAMPLE_INI), "--moses-ini-out"))])
def test_the_word_tables_read_beside_the_table_are_inputs_no_output_replaces(system, tmp_path, output,
                                                                            option) -> None:
    """Without --lex-e2f/--lex-f2e the word tables beside INPUT_TABLE are read, so OUTPUT_TABLE, --list or
    --moses-ini-out on one of them would replace what the run reads: refused in one line, before any work,
    as a word table given by name is, and the file stays as it was."""
    for name in ("phrase-table.gz", "lex.e2f", "lex.f2e"):
        shutil.copy(system / name, tmp_path / name)
    before = (tmp_path / output).read_bytes()
    table_out = [str(tmp_path / output)] if not option else [str(tmp_path / "out.gz"), *option, str(tmp_path / output)]
    result = CliRunner().invoke(main, ["propose", str(tmp_path / "phrase-table.gz"), *table_out, "--model",
                                       str(system / "model.pt"), "--device", "cpu", "--threads", "1", "-q"])
    assert result.exit_code == 1
    label, given_as = f"--{output.replace('.', '-')}", option[-1] if option else "OUTPUT_TABLE"
    assert result.output.strip().splitlines() == [
        f"Error: output {tmp_path / output} ({given_as}) is the input {label}'s default "
        f"{(tmp_path / output).resolve()}; write it elsewhere"]
    assert (tmp_path / output).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lex.e2f", "lex.f2e", "phrase-table.gz"]


def test_readme_line_runs_on_the_shipped_sample_with_the_word_tables_beside_it(system, tmp_path) -> None:
    """README's ``rescorer propose TABLE OUT --model MODEL`` on ``examples/``: the sample ships the
    lex.e2f/lex.f2e its generator writes, so no --lex option is needed."""
    out = tmp_path / "proposals.gz"
    result = CliRunner().invoke(main, ["propose", str(EXAMPLE_TABLE), str(out), "--model", str(system / "model.pt"),
                                       "--beam", "3", "--per-source", "1", "--device", "cpu", "--threads", "1", "-q"])
    assert result.exit_code == 0, result.output
    sample, completed = _lines(EXAMPLE_TABLE), _lines(out)
    assert len(completed) > len(sample)
    assert {line.split(SEP)[0] for line in completed} == {line.split(SEP)[0] for line in sample}


def test_an_unsorted_table_is_refused_at_the_line_out_of_order(system, tmp_path) -> None:
    lines = _lines(system / "phrase-table.gz")
    lines[10], lines[40] = lines[40], lines[10]
    table, out = tmp_path / "table.gz", tmp_path / "out.gz"
    table.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    result = _cli(system, table, out)
    assert result.exit_code == 1 and "table.gz:12: the table is not sorted as `LC_ALL=C sort`" in result.output
    assert _nothing_left(tmp_path, out)


@pytest.mark.parametrize("name, content", [("empty.txt", b""), ("empty.gz", gzip.compress(b"", mtime=0))],
                         ids=["text", "gzip"])
def test_a_table_with_no_lines_is_one_line_naming_it(system, tmp_path, name, content) -> None:
    """It was a ZeroDivisionError traceback from the table's mean phrase probabilities."""
    table, out = tmp_path / name, tmp_path / "out.gz"
    table.write_bytes(content)
    result = _cli(system, table, out)
    assert result.exit_code == 1
    assert result.output == (f"Error: {table}: the table holds no phrase-table lines; there are no sources to "
                             "propose targets for\n")
    assert _nothing_left(tmp_path, out)


def test_a_model_for_another_table_is_warned_about_before_the_search_as_in_rescoring(system, tmp_path) -> None:
    """As ``rescore-phrase-table`` warns (a share below half is a sign, not a proof), with the whole table's
    figures and before the search: a model whose source shortlist holds none of the table's source words
    proposes nothing (each such source is skipped and counted), and the table is rescored as it was."""
    checkpoint = load_checkpoint(system / "model.pt")
    foreign = Vocab(["</s>", "[UNK]", *[f"w{i}" for i in range(len(checkpoint.src_vocab) - 2)]])
    model = tmp_path / "foreign.pt"
    save_checkpoint(model, model=checkpoint.model, config=checkpoint.config, src_vocab=foreign,
                    tgt_vocab=checkpoint.tgt_vocab)
    out = tmp_path / "out.gz"
    result = CliRunner().invoke(main, ["propose", str(system / "phrase-table.gz"), str(out), "--model", str(model),
                                       "--device", "cpu"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (f"warning: only 0.0% of the source words of {system / 'phrase-table.gz'} are in the source "
                        f"shortlist of {model} (model); is it trained for this table's languages and tokenisation?")
    assert any(line.startswith("search: 0 sources") for line in lines), result.output
    assert len(lines_of(out)) == len(_lines(system / "phrase-table.gz"))


def test_a_source_with_a_word_the_model_lacks_keeps_its_lines_and_gets_no_proposal(system, tmp_path) -> None:
    extra = b"qqqq ||| ququ ||| 0.5 0.5 0.5 0.5 ||| 0-0 ||| 1 1 1 ||| |||"
    lines = sorted([*_lines(system / "phrase-table.gz"), extra])
    table, out = tmp_path / "table.gz", tmp_path / "out.gz"
    table.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    result = _cli(system, table, out)
    assert result.exit_code == 0, result.output
    assert "skipped 1 sources with a word outside the model's source shortlist (e.g. 'qqqq')" in result.output
    written = [line for line in _lines(out) if line.startswith(b"qqqq ")]
    assert len(written) == 1 and written[0].startswith(b"qqqq ||| ququ ||| 0.5 0.5 0.5 0.5 ") \
        and _split(written[0])[1][-1] == b"1"


def test_the_pipeline_flags_lines_by_input_line_number_even_around_rejected_lines(system, tmp_path) -> None:
    lines = _lines(system / "phrase-table.gz")[:8]
    lines.insert(3, b"broken ||| line")  # line 4 goes to the rejects
    table, out = tmp_path / "table.gz", tmp_path / "out.gz"
    table.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    options = RescoreOptions(progress=False, device="cpu", workers=0, skip_bad_lines=True, chunk_lines=3,
                             flag_lines=np.array([2, 4, 6, 9]))
    rescore(str(table), str(out), Models(load_checkpoint(system / "model.pt")), options)
    flags = [_split(line)[1][-1] for line in _lines(out)]
    # Output rows are input lines 1-3 and 5-9; lines 2, 6 and 9 are flagged.
    assert flags == [b"1", b"2.71828", b"1", b"1", b"2.71828", b"1", b"1", b"2.71828"]


# ------------------------------------------------------------------ a stopped run and --resume


def _failing(monkeypatch, name: str, on_call: int) -> None:
    """Make ``rescorer.proposals.propose.<name>`` raise on its ``on_call``-th call (a crash, a full disk)."""
    import rescorer.proposals.propose as module

    real, calls = getattr(module, name), []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == on_call:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


def _kind_counts(summary) -> dict:
    return {kind: vars(k) for kind, k in summary.kinds.items()}


@pytest.mark.parametrize(("where", "on_call"), [("search_sources", 4), ("rescore", 1)])
def test_a_failed_run_keeps_its_work_and_resume_ends_byte_identical(system, tmp_path, monkeypatch, where,
                                                                    on_call) -> None:
    """Stopped in the 4th batch of the search, or while rescoring: --resume gives an uninterrupted run's bytes."""
    table, checkpoint = str(system / "phrase-table.gz"), load_checkpoint(system / "model.pt")
    reference = tmp_path / "reference"
    reference.mkdir()
    options = {"beam": 4, "per_source": 2, "rows_per_step": 40}  # 10 sources a batch: 15 batches
    expected = propose(table, str(reference / "out.gz"), checkpoint,
                       propose_options(list_path=str(reference / "list.tsv"), **options))
    run = tmp_path / "run"
    run.mkdir()
    out, listing, work = run / "out.gz", run / "list.tsv", run / ".out.gz.propose"
    with monkeypatch.context() as patch:
        _failing(patch, where, on_call)
        with pytest.raises(OSError, match="disk full"):
            propose(table, str(out), checkpoint, propose_options(list_path=str(listing), **options))
    assert [p.name for p in run.iterdir()] == [work.name]  # no output, no list: only the work to go on from
    record = json.loads((work / "progress.json").read_text())
    searched = (on_call - 1) * 10 if where == "search_sources" else 147
    assert record["sources_done"] == searched and record["phase"] == ("search" if searched < 147 else "merged")
    assert (work / "proposals.tsv").stat().st_size == record["listing_bytes"]
    assert record["listing_bytes"] < (reference / "list.tsv").stat().st_size or searched == 147
    with open(work / "proposals.tsv", "ab") as half_written:  # what a batch killed mid-write leaves past the record
        half_written.write(b"table\tthe house\tla mai")

    with pytest.raises(RescoreError, match=r"holds an interrupted run .* pass --resume to continue it"):
        propose(table, str(out), checkpoint, propose_options(list_path=str(listing), **options))
    summary = propose(table, str(out), checkpoint, propose_options(list_path=str(listing), resume=True, **options))
    assert_same_output(out, reference / "out.gz")
    assert_same_output(listing, reference / "list.tsv")
    assert sorted(p.name for p in run.iterdir()) == ["list.tsv", "out.gz"]  # the work folder is gone
    assert _kind_counts(summary) == _kind_counts(expected) and summary.proposals == expected.proposals > 0


def test_a_run_that_fails_before_its_first_batch_is_recorded_leaves_nothing(system, tmp_path, monkeypatch) -> None:
    _failing(monkeypatch, "search_sources", 1)
    out = tmp_path / "out.gz"
    with pytest.raises(OSError, match="disk full"):
        propose(str(system / "phrase-table.gz"), str(out), load_checkpoint(system / "model.pt"),
                propose_options(beam=3, per_source=1, list_path=str(tmp_path / "list.tsv")))
    assert list(tmp_path.iterdir()) == []  # nothing durable: nothing kept, and a plain rerun may start


def _stopped_while_rescoring(system: Path, tmp_path: Path, monkeypatch) -> Path:
    """The work folder of a run with _cli's settings that stopped after its search; returns its output path."""
    out = tmp_path / "out.gz"
    options = propose_options(beam=3, per_source=1, lex_e2f=str(system / "lex.e2f"), lex_f2e=str(system / "lex.f2e"))
    with monkeypatch.context() as patch:
        _failing(patch, "rescore", 1)
        with pytest.raises(OSError, match="disk full"):
            propose(str(system / "phrase-table.gz"), str(out), load_checkpoint(system / "model.pt"), options)
    return out


def test_without_resume_a_kept_work_folder_is_one_line_and_stays(system, tmp_path, monkeypatch) -> None:
    out = _stopped_while_rescoring(system, tmp_path, monkeypatch)
    record = (tmp_path / ".out.gz.propose" / "progress.json").read_bytes()
    result = _cli(system, system / "phrase-table.gz", out)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "out.gz.propose holds an interrupted run of" in result.output
    assert "147 sources searched" in result.output and "pass --resume to continue it" in result.output
    assert (tmp_path / ".out.gz.propose" / "progress.json").read_bytes() == record and not out.exists()
    result = _cli(system, system / "phrase-table.gz", out, "--resume")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / ".out.gz.propose").exists() and len(_lines(out)) > len(_lines(system / "phrase-table.gz"))


def test_a_ctrl_c_after_the_search_says_where_the_work_is_kept_and_how_to_go_on(system, tmp_path, monkeypatch) -> None:
    """It said only "rescorer propose: stopped by Ctrl-C", though the search's work was kept for --resume."""
    import rescorer.proposals.propose as module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    out = tmp_path / "out.gz"
    monkeypatch.setattr(module, "rescore", interrupted)
    result = _cli(system, system / "phrase-table.gz", out)
    assert result.exit_code == 130
    assert result.stderr.endswith(f" propose: stopped by Ctrl-C; the work done so far kept in "
                                  f"{tmp_path / '.out.gz.propose'} (run again with --resume to continue)\n")
    assert result.stderr.count("\n") == 1
    assert (tmp_path / ".out.gz.propose" / "progress.json").is_file() and not out.exists()


def test_the_options_of_for_text_without_it_are_refused(system, tmp_path) -> None:
    """``--thin-below 5`` without ``--for-text`` was ignored without a word: every source was proposed for."""
    for option in (["--thin-below", "5"], ["--max-source-words", "3"]):
        result = _cli(system, system / "phrase-table.gz", tmp_path / "out.gz", *option)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith("Error: --thin-below and --max-source-words need --for-text"), result.output
    assert list(tmp_path.iterdir()) == []


@dataclasses.dataclass
class WithANewOption(ProposeOptions):
    """The options with one more, as a new feature adds one: listed nowhere else."""

    new_knob: int = 0


def test_a_new_option_is_in_the_resume_record_unless_listed_as_one_that_may_differ(tmp_path, monkeypatch) -> None:
    """Every option is recorded but those said to be free (where the listing's copy goes; the rescoring's, which
    its own record checks); an option of --for-text only with it, and λ, μ only with a reverse model."""
    table = tmp_path / "pt.gz"
    table.write_bytes(b"")

    def record(**kw) -> dict:
        return propose_module._run_identity(str(table), object(), WithANewOption(**kw), torch.device("cpu"), 64,
                                            None)["options"]

    assert record(new_knob=1)["new_knob"] == 1 and record()["new_knob"] == 0
    assert record(list_path="a.tsv") == record(list_path="b.tsv", resume=True, rescore=RescoreOptions(workers=3))
    assert record(thin_below=9) == record() and record(thin_below=9)["thin_below"] is None
    assert record(beam=3) != record(beam=4) and record()["rerank"] is None
    monkeypatch.setattr(propose_module, "PROPOSE_MAY_DIFFER", propose_module.PROPOSE_MAY_DIFFER | {"new_knob"})
    assert "new_knob" not in record(new_knob=1)


def test_resume_with_another_option_or_input_is_refused_naming_it(system, tmp_path, monkeypatch) -> None:
    out = _stopped_while_rescoring(system, tmp_path, monkeypatch)
    work = tmp_path / ".out.gz.propose"
    result = _cli(system, system / "phrase-table.gz", out, "--resume", "--beam", "4")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"cannot --resume: {work / 'progress.json'} was made with --beam 3, now 4;" in result.output
    assert f"remove {work} to start over" in result.output
    lex = tmp_path / "lex.f2e"
    lex.write_bytes((system / "lex.f2e").read_bytes())  # the same words from another file
    # the search's matmuls in bf16 find other last bits: a resume in another precision is refused too
    result = _cli(system, system / "phrase-table.gz", out, "--resume", "--precision", "bf16")
    assert result.exit_code == 1 and "--precision fp32, now bf16;" in result.output, result.output
    result = _cli(system, system / "phrase-table.gz", out, "--resume", "--lex-f2e", str(lex))
    assert result.exit_code == 1 and "made with --lex-f2e " in result.output and str(lex) in result.output
    table = tmp_path / "phrase-table.gz"
    table.write_bytes((system / "phrase-table.gz").read_bytes())
    result = _cli(system, table, out, "--resume")
    assert result.exit_code == 1 and "cannot --resume: the input differs" in result.output
    assert work.is_dir() and not out.exists()  # refused before anything was touched


def _text_for(table: Path, sentences: int, words: int) -> str:
    """Sentences of the table's source words in a seeded random order: mostly n-grams the table lacks."""
    vocab = sorted({w for line in _lines(table) for w in split_tokens(line.split(SEP)[0].decode())})
    rng = random.Random(7)
    return "".join(" ".join(rng.choice(vocab) for _ in range(words)) + "\n" for _ in range(sentences))


def test_a_run_killed_with_sigkill_mid_search_resumes_byte_identical(system, tmp_path, one_torch_thread) -> None:
    """The reference runs here on one torch thread, as the killed command (--threads 1): on some CPUs
    the thread count moves a score's last bits."""
    text = tmp_path / "dev.en"
    text.write_text(_text_for(system / "phrase-table.gz", 16, 6))
    # Two sources a batch: some 110 batches, each recorded (about 15 ms apiece here), so the kill lands mid-search.
    args = ["--for-text", str(text), "--beam", "5", "--per-source", "2", "--rows-per-step", "10",
            "--lex-e2f", str(system / "lex.e2f"), "--lex-f2e", str(system / "lex.f2e")]
    expected = propose(str(system / "phrase-table.gz"), str(tmp_path / "expected.gz"),
                       load_checkpoint(system / "model.pt"),
                       propose_options(for_text=str(text), beam=5, per_source=2, rows_per_step=10,
                                list_path=str(tmp_path / "expected.tsv")))
    searched = expected.searched
    assert searched > 150 and expected.proposals > 0
    out, progress = tmp_path / "out.gz", tmp_path / ".out.gz.propose" / "progress.json"
    root = Path(rescorer.__file__).resolve().parent.parent  # this checkout's code, also in the child
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "rescorer.cli", "propose", str(system / "phrase-table.gz"), str(out),
           "--model", str(system / "model.pt"), "--list", str(tmp_path / "list.tsv"), *args,
           "-j", "0", "--device", "cpu", "--threads", "1", "-q"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)

    def searching() -> bool:  # at least one batch durable: killed mid-search
        with contextlib.suppress(OSError, ValueError):
            return json.loads(progress.read_text())["sources_done"] >= 1
        return False

    sigkill_when(proc, searching, "durable batch of the search")
    record = json.loads(progress.read_text())
    assert record["phase"] == "search" and 1 <= record["sources_done"] < searched, record
    assert not out.exists() and not (tmp_path / "list.tsv").exists()
    resumed = CliRunner().invoke(main, [*cmd[3:], "--resume"])  # in this process: only the killed run needs its own
    assert resumed.exit_code == 0, f"{resumed.output[-3000:]}\n{resumed.exception!r}"
    assert_same_output(out, tmp_path / "expected.gz")
    assert_same_output(tmp_path / "list.tsv", tmp_path / "expected.tsv")
    assert not progress.parent.exists()
    reported = {kind: f"{kind}: {k.sources} sources searched, {k.filled} got proposals, {k.proposals} proposals"
                for kind, k in expected.kinds.items() if k.sources}
    assert all(line in resumed.stderr for line in reported.values()), resumed.stderr


def test_the_beam_search_runs_in_the_precision_scoring_reads():
    """``--precision`` reaches the search: ``auto`` is exact fp32 as in scoring, ``bf16`` autocasts."""

    from rescorer.pipeline.rescore import RescoreOptions
    from rescorer.proposals.propose import search_dtype

    assert search_dtype(ProposeOptions(rescore=RescoreOptions(precision="auto"))) is None
    assert search_dtype(ProposeOptions(rescore=RescoreOptions(precision="fp32"))) is None
    assert search_dtype(ProposeOptions(rescore=RescoreOptions(precision="bf16"))) is torch.bfloat16


def test_a_reverse_model_is_refused_before_the_search(system, tmp_path):
    """A model of p(f|e) (rescorer train --reverse) would propose sources for targets: refused at once,
    leaving nothing behind."""
    from dataclasses import replace

    ck = load_checkpoint(system / "model.pt")
    reverse = replace(ck.config, direction="reverse")
    ck.config = ck.model.config = reverse
    with pytest.raises(RescoreError, match="a reverse model"):
        propose(str(system / "phrase-table.gz"), str(tmp_path / "out.gz"), ck, propose_options())
    assert list(tmp_path.iterdir()) == []


def test_the_directions_are_checked_once_per_run_before_the_search(system, tmp_path, monkeypatch):
    """``propose`` checks the model's direction before its search, and the rescoring it ends with does
    not check the same models again."""
    from rescorer.pipeline import train_or_load

    calls = []
    real = train_or_load.check_directions

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_or_load, "check_directions", counting)
    monkeypatch.setattr(propose_module, "check_directions", counting, raising=False)
    checkpoint = load_checkpoint(system / "model.pt")
    summary = propose(str(system / "phrase-table.gz"), str(tmp_path / "out.gz"), checkpoint, propose_options())
    assert summary.proposals > 0 and (tmp_path / "out.gz").exists()
    assert len(calls) == 1 and calls[0][0] is checkpoint
