"""rescore-phrase-table end to end on the real fixture sample, with a small trained model.

The checks are the ones a Moses user would notice: line count and original bytes preserved, two
positive probability columns, scores equal to the model's own, byte-identical output whatever the
batching, workers, interruption or sharding, and clear errors on bad input.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from rescore_runs import (
    RESCORE_SCRIPT,
    SAMPLE_TABLE,
    assert_ran,
    assert_same_output,
    lines_of,
    rescore,
    run_command,
    shard_outputs,
    sigkill_after_chunks,
)

from moses_integration.phrase_table import PhraseTableError
from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import load_checkpoint
from rescorer.pipeline.errors import RescoreError
from shared_paths import shared_file


@pytest.fixture(scope="module")
def sample() -> Path:
    return shared_file(SAMPLE_TABLE)


@pytest.fixture(scope="module")
def model_path(sample_model) -> Path:
    return sample_model


@pytest.fixture(scope="module")
def checkpoint(model_path):
    ck = load_checkpoint(model_path)
    ck.path = model_path
    return ck


@pytest.fixture(scope="module")
def reference_output(sample, checkpoint, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "out.gz"
    rescore(sample, out, checkpoint, chunk_lines=1000)
    return out


def test_round_trip_keeps_every_field_and_adds_two_probabilities(sample, reference_output):
    before, after = lines_of(sample), lines_of(reference_output)
    assert len(before) == len(after) == 5166
    for old, new in zip(before, after, strict=True):
        of, nf = old.split(b" ||| "), new.split(b" ||| ")
        assert len(of) == len(nf)
        assert nf[:2] == of[:2] and nf[3:] == of[3:]
        old_scores, new_scores = of[2].split(), nf[2].split()
        assert new_scores[:-2] == old_scores
        values = [float(x) for x in new_scores[-2:]]
        assert all(0 < v <= 1 for v in values), new


def test_rnn_column_is_the_models_own_probability(sample, reference_output, checkpoint):
    lines = lines_of(reference_output)
    model, sv, tv = checkpoint.model, checkpoint.src_vocab, checkpoint.tgt_vocab
    for i in np.random.default_rng(0).choice(len(lines), 25, replace=False):
        src, tgt, scores = lines[i].decode().split(" ||| ")[:3]
        s = torch.tensor([[*sv.encode(src.split()), 0]])
        t = torch.tensor([[*tv.encode(tgt.split()), 0]])
        with torch.no_grad():
            logp = model(s, torch.tensor([s.shape[1]]), t, torch.tensor([t.shape[1]])).item()
        rnn, wp = (float(x) for x in scores.split()[-2:])
        assert math.log(rnn) == pytest.approx(max(logp, -100), abs=1e-4)
        n_unk = sum(not tv.is_known(w) for w in tgt.split())
        assert math.log(wp) == pytest.approx(-n_unk, abs=1e-5)


def test_output_does_not_depend_on_batching_chunks_or_workers(sample, checkpoint, reference_output, tmp_path):
    ref = np.array([[float(x) for x in line.split(b" ||| ")[2].split()[-2:]] for line in lines_of(reference_output)])
    variants = ({"token_budget": 64, "chunk_lines": 777}, {"token_budget": 100000}, {"chunk_lines": 1000, "workers": 2})
    for kw in variants:
        out = tmp_path / "o.gz"
        rescore(sample, out, checkpoint, **kw)
        got = np.array([[float(x) for x in line.split(b" ||| ")[2].split()[-2:]] for line in lines_of(out)])
        assert np.abs(np.log(got) - np.log(ref)).max() < 1e-4
        if kw.get("workers"):  # same chunks and batches, other worker count: byte-identical file
            assert_same_output(out, reference_output)


def test_shards_concatenate_to_the_whole_run_byte_for_byte(sample, checkpoint, tmp_path):
    """`cat` of the K/3 outputs is the unsharded output, every digit: a shard cuts its chunks, and so
    its batches, where the whole run does, not at the shard's first line (where the last digits of
    1,288 lines differ)."""
    whole, parts = shard_outputs(
        lambda out, shard: rescore(sample, out, checkpoint, chunk_lines=200, token_budget=256, shard=shard), tmp_path)
    split = [lines_of(part) for part in parts]
    assert all(split)
    assert_same_output(b"".join(part.read_bytes() for part in parts), whole)


def test_resume_after_sigkill_is_byte_identical(sample, model_path, tmp_path):
    """The killed and resumed command ends with the bytes of the same command left alone (the same
    --threads too: on some CPUs the thread count moves a score's last bits). Only the killed run needs
    a process of its own; the one left alone and the resumed one run in this process."""
    out = tmp_path / "out.gz"
    progress = tmp_path / ".out.gz.progress.json"
    options = ["--model", str(model_path), "--chunk-lines", "100", "-j", "0", "--device", "cpu", "--quiet"]
    expected = tmp_path / "expected.gz"
    assert_ran(run_command([str(sample), str(expected), *options]))
    sigkill_after_chunks([RESCORE_SCRIPT, str(sample), str(out), *options], progress)
    assert not out.exists() and progress.exists()
    assert_ran(run_command([str(sample), str(out), *options, "--resume"]))
    assert_same_output(out, expected)
    assert not progress.exists()


def test_moses_ini_gets_two_more_features(sample, model_path, tmp_path):
    ini = shared_file("fixtures/hansard-enfr/filtered/moses.ini")
    out_ini = tmp_path / "moses.ini"
    res = CliRunner().invoke(rescore_phrase_table_command, [
        str(sample), str(tmp_path / "o.gz"), "--model", str(model_path), "--moses-ini", str(ini),
        "--moses-ini-out", str(out_ini), "--quiet", "-j", "0", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    text = out_ini.read_text()
    feature = next(line for line in text.splitlines() if line.startswith("PhraseDictionaryMemory"))
    assert "num-features=6" in feature and f"path={tmp_path / 'o.gz'}" in feature
    weights = next(line for line in text.splitlines() if line.startswith("TranslationModel0="))
    assert len(weights.split()) == 1 + 6
    # default start weights 0: the untuned system decodes exactly as the original one
    assert weights.split()[1:] == ["0.2"] * 4 + ["0", "0"]


def test_malformed_line_stops_with_file_and_line(tmp_path, checkpoint):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a ||| b ||| 0.5 0.5\nc ||| d ||| 0.5 oops\n")
    with pytest.raises(PhraseTableError, match=r"bad.txt:2:"):
        rescore(bad, tmp_path / "o.gz", checkpoint)
    assert not (tmp_path / "o.gz").exists()


def test_skip_bad_lines_moves_them_to_rejects(tmp_path, checkpoint):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a ||| b ||| 0.5 0.5\nbroken line\nc ||| d ||| 0.5 0.5\n")
    with pytest.warns(UserWarning, match="shortlists"):  # a, b, c, d are not words of the model
        summary = rescore(bad, tmp_path / "o.txt", checkpoint, skip_bad_lines=True)
    lines = (tmp_path / "o.txt").read_bytes().splitlines()
    assert summary.rejected == 1 and summary.lines == 2 and len(lines) == 2
    assert (tmp_path / "o.txt.rejects").read_bytes() == b"broken line\n"
    assert all(len(line.split(b" ||| ")[2].split()) == 4 for line in lines)


def test_truncated_gzip_is_an_error_and_keeps_nothing(sample, tmp_path, checkpoint):
    data = sample.read_bytes()
    cut = tmp_path / "cut.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(PhraseTableError, match="truncated"):
        rescore(cut, tmp_path / "o.gz", checkpoint, chunk_lines=500)
    assert not (tmp_path / "o.gz").exists()
    # a rerun would stop at the same place: no partial file, no progress record to --resume from
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.gz"]


def test_refuses_to_overwrite_input(sample, tmp_path, checkpoint):
    copy = tmp_path / "t.gz"
    copy.write_bytes(b"a ||| b ||| 1\n")
    with pytest.raises(RescoreError, match="overwrite"):
        rescore(copy, copy, checkpoint)


def test_foreign_vocabulary_warns_with_overlap(tmp_path, checkpoint):
    other = tmp_path / "de.txt"
    other.write_bytes(b"".join(b"wort%d ||| mot%d ||| 0.5 0.5\n" % (i, i) for i in range(50)))
    with pytest.warns(UserWarning, match=r"0\.0% of source words"):
        rescore(other, tmp_path / "o.txt", checkpoint)


def test_without_model_trains_on_the_table_then_scores(tmp_path):
    table = Path(__file__).resolve().parents[3] / "examples" / "phrase-table.en-fr.gz"
    out = tmp_path / "out.gz"
    res = CliRunner().invoke(rescore_phrase_table_command, [
        str(table), str(out), "--train-steps", "5", "--hidden", "16", "--embedding", "8", "--maxout-units", "8",
        "--output-rank", "8", "--quiet", "-j", "0", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out.gz.model.pt").exists()
    assert len(lines_of(out)) == len(lines_of(table))


def test_scores_parquet_matches_the_written_columns(sample, checkpoint, reference_output, tmp_path):
    import pyarrow.parquet as pq

    parquet = tmp_path / "scores.parquet"
    rescore(sample, tmp_path / "o.gz", checkpoint, chunk_lines=1000, scores_parquet=str(parquet))
    table = pq.read_table(parquet)
    assert table.num_rows == 5166
    assert not (tmp_path / "scores.parquet.parts").exists()
    lines = lines_of(reference_output)
    for i in (0, 1234, 5165):
        fields = lines[i].decode().split(" ||| ")
        assert table.column("source")[i].as_py() == fields[0]
        assert table.column("target")[i].as_py() == fields[1]
        scores = [float(x) for x in fields[2].split()]
        assert table.column("table_scores")[i].as_py() == scores[:4]
        assert math.log(scores[4]) == pytest.approx(table.column("log_p")[i].as_py(), abs=1e-4)
        assert table.column("n_unk")[i].as_py() == -round(math.log(scores[5]))


def test_stdin_to_stdout(sample, model_path, reference_output):
    result = run_command(["-", "-", "--model", str(model_path), "--chunk-lines", "1000", "-j", "0",
                          "--token-budget", "4096", "--device", "cpu", "--quiet"],
                         input=gzip.decompress(sample.read_bytes()))
    assert_ran(result)
    assert result.stdout_bytes.splitlines() == lines_of(reference_output)
    assert "rescored 5166 lines" in result.stderr


def test_empty_table_gives_a_valid_empty_gzip(tmp_path, checkpoint):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    summary = rescore(empty, tmp_path / "o.gz", checkpoint)
    assert summary.lines == 0 and lines_of(tmp_path / "o.gz") == []


def test_compress_level_reaches_every_gzip_member(sample, checkpoint, reference_output, tmp_path):
    """``compress_level`` goes from the options to zlib unchanged: level 9 writes a smaller file
    than level 1, level 0 stores, and all hold the default level's lines."""
    sizes = {}
    for level in (0, 1, 9):
        out = tmp_path / f"level{level}.gz"
        rescore(sample, out, checkpoint, chunk_lines=1000, compress_level=level)
        assert lines_of(out) == lines_of(reference_output)
        sizes[level] = out.stat().st_size
    assert sizes[9] < sizes[1] < sizes[0]
    assert sizes[0] > len(b"\n".join(lines_of(reference_output)))  # stored: larger than the text


def test_cli_refuses_a_level_gzip_lacks_before_any_work(sample, tmp_path):
    """gzip's levels are 0..9: 10 is refused on the command line, where it is given."""
    out = tmp_path / "o.gz"
    res = CliRunner().invoke(rescore_phrase_table_command, [str(sample), str(out), "--compress-level", "10", "-q"])
    assert res.exit_code != 0
    assert res.output == "Error: Invalid value for '--compress-level': 10 is not in the range 0<=x<=9.\n"
    assert list(tmp_path.iterdir()) == []
