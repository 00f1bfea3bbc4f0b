"""Parsing, id mapping and prefix trees in worker processes give exactly the serial pipeline's run.

The checks are on a slice of the real fixture table, with malformed lines placed where the
parallel path has to fix up what a worker could not know (the column count of the table while
the first chunk is still being parsed), and compare everything a user sees: output bytes, rejects
bytes, messages, summary, and the partial output a stopped run keeps.
"""

from __future__ import annotations

import gzip
import itertools
import multiprocessing
import pickle
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from rescore_runs import assert_same_output

from infrastructure.processes import process_tag
from moses_integration.phrase_table import PhraseTableError
from neural.vocab import Vocab
from rescorer.model.checkpoint import Checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline.chunk_prep import PrepareTask, prepare_chunk, send_planners, worker_pool
from rescorer.pipeline.columns.rnn import FORWARD, ForwardPlanner
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.scoring import PairScorer, ScoringOptions
from rescorer.pipeline.spool import SpooledObject
from rescorer.pipeline.train_or_load import Models
from rescorer.tables.aligned import aligned_chunks
from rescorer.tables.chunks import LineChunk, iter_line_chunks
from shared_paths import shared_file

CHUNK = 100


@pytest.fixture(scope="module")
def real_lines() -> list[bytes]:
    with gzip.open(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz")) as fh:
        return [line.rstrip(b"\n") for line in itertools.islice(fh, 1500)]


@pytest.fixture(scope="module")
def checkpoint(real_lines) -> Checkpoint:
    src, tgt = Counter(), Counter()
    for line in real_lines:
        fields = line.decode().split(" ||| ")
        src.update(fields[0].split())
        tgt.update(fields[1].split())
    src_vocab, tgt_vocab = Vocab.from_counts(src, 300), Vocab.from_counts(tgt, 300)
    config = ModelConfig(src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab), hidden=8, embedding=4,
                         maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, src_vocab, tgt_vocab)


def with_scores(line: bytes, prefix: bytes) -> bytes:
    fields = line.split(b" ||| ")
    fields[2] = prefix + fields[2]
    return b" ||| ".join(fields)


def with_bad_lines(lines: list[bytes]) -> list[bytes]:
    """Malformed lines in several chunks: a wrong column count first in a chunk, a bad score, bad UTF-8."""
    lines = list(lines)
    lines[3] = with_scores(lines[3], b"oops ")  # chunk 1
    lines[CHUNK] = with_scores(lines[CHUNK], b"0.5 ")  # 5 scores, first line of chunk 2
    lines[4 * CHUNK + 7] = b"no separators here"
    lines[9 * CHUNK] = with_scores(lines[9 * CHUNK], b"0.5 ")  # first line of chunk 10
    lines[11 * CHUNK + 50] = b"\xff\xfe ||| la ||| 0.5 0.5 0.5 0.5"
    return lines


def run(table: Path, out: Path, ck: Checkpoint, workers: int, **kw):
    opts = RescoreOptions(progress=False, device="cpu", workers=workers, chunk_lines=CHUNK,
                          scoring=ScoringOptions(token_budget=256), **kw)
    return rescore(str(table), str(out), Models(ck), opts)


@pytest.mark.slow
def test_workers_give_the_serial_output_rejects_and_messages(real_lines, checkpoint, tmp_path, capfd):
    lines = with_bad_lines(real_lines)
    table = tmp_path / "pt.gz"
    table.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    results = {}
    for workers in (1, 3):
        for shard in (None, (2, 3)):
            out = tmp_path / f"out-{workers}-{shard is not None}.gz"
            summary = run(table, out, checkpoint, workers, skip_bad_lines=True, shard=shard)
            rejects = out.with_name(out.name + ".rejects")
            results[workers, shard] = (out.read_bytes(), rejects.read_bytes() if rejects.exists() else b"",
                                       capfd.readouterr().err, summary.lines, summary.rejected,
                                       summary.distinct_sources, summary.sum_log_prob)
    for shard in (None, (2, 3)):
        assert results[3, shard] == results[1, shard]
    data, rejects, err, n_lines, n_rejected, *_ = results[1, None]
    assert n_rejected == 5 and n_lines + n_rejected == len(lines)
    assert rejects == b"".join(lines[i] + b"\n" for i in (3, CHUNK, 4 * CHUNK + 7, 9 * CHUNK, 11 * CHUNK + 50))
    assert f"pt.gz:{CHUNK + 1}: expected 4 scores, found 5" in err
    assert len(gzip.decompress(data).splitlines()) == n_lines


def test_a_malformed_line_stops_workers_where_it_stops_a_serial_run(real_lines, checkpoint, tmp_path):
    lines = list(real_lines)
    lines[7 * CHUNK + 20] = with_scores(lines[7 * CHUNK + 20], b"0.5 ")
    table = tmp_path / "pt.txt"
    table.write_bytes(b"\n".join(lines) + b"\n")
    kept = {}
    for workers in (1, 3):
        out = tmp_path / f"out-{workers}.gz"
        with pytest.raises(PhraseTableError, match=rf"pt.txt:{7 * CHUNK + 21}: expected 4 scores, found 5"):
            run(table, out, checkpoint, workers)
        kept[workers] = (tmp_path / f".out-{workers}.gz.partial").read_bytes()
    assert kept[3] == kept[1]
    # Every chunk before the one holding the bad line (chunks are cut where the content says).
    with open(table, "rb") as fh:
        holding = next(c for c in aligned_chunks(iter_line_chunks(fh, str(table), CHUNK), CHUNK)
                       if c.last_line_no >= 7 * CHUNK + 21)
    assert len(gzip.decompress(kept[1]).splitlines()) == holding.first_line_no - 1 > 5 * CHUNK


def test_a_plan_made_in_a_worker_scores_exactly_as_the_scorer(real_lines, checkpoint):
    planner = ForwardPlanner.of_words(checkpoint.src_vocab.words, checkpoint.tgt_vocab.words)
    scorer = PairScorer(checkpoint.model, torch.device("cpu"), options=ScoringOptions(token_budget=64))
    task = PrepareTask(LineChunk.from_lines(1, real_lines[:400]), "pt", None, False, False, scorer.token_budget)
    prepared = pickle.loads(pickle.dumps(prepare_chunk(task, (planner,))))  # as it comes back from a process
    plan = prepared.plans[FORWARD]
    assert len(plan.decoder_groups) > 1 and len(plan.encoder_groups) >= 1
    expected = scorer.score(plan.sources, plan.source_of_row, plan.targets)
    assert np.array_equal(scorer.score_plan(plan), expected)


def test_a_pool_starts_its_workers_side_by_side_with_a_paper_size_shortlist(real_lines, checkpoint, tmp_path):
    """A pool starts before its planners exist, and they reach its workers through the spool: with a
    paper-size model's shortlists (15,000 words a side, hundreds of KiB pickled) sent down the pipe
    each worker is started through, each start waited for its worker to import and read them, so
    14 workers started one after the other, seconds in which a GPU had nothing to score (measured by
    benchmarks/pipeline_speed, docs/performance.md). A worker's plan is the one made here."""
    def padded(words: list[str], side: str) -> list[str]:
        return words + [f"{side}-filler-{i}" for i in range(15_000 - len(words))]

    planners = (ForwardPlanner.of_words(padded(checkpoint.src_vocab.words, "src"),
                                        padded(checkpoint.tgt_vocab.words, "tgt")),)
    assert len(pickle.dumps(planners)) > 4 * 65536  # far more than a pipe holds
    pool = worker_pool(2, tmp_path)  # what each worker is started with holds no planner
    try:
        send_planners(planners, tmp_path)
        task = PrepareTask(LineChunk.from_lines(1, real_lines[:400]), "pt", None, False, False, 64)
        in_workers = [future.result() for future in [pool.submit(prepare_chunk, task) for _ in range(4)]]
    finally:
        pool.shutdown()
    here = pickle.dumps(prepare_chunk(task, planners).plans)
    assert all(pickle.dumps(prepared.plans) == here for prepared in in_workers)


def test_the_workers_and_the_reader_start_while_the_models_load_and_end_when_the_load_fails(
    real_lines, checkpoint, tmp_path, monkeypatch
):
    """-j 2 on a file: the two workers and the reader process are running when the models are
    loaded, so that their start-up (their imports, a second or so each) overlaps the loading instead
    of following it, and the output is the serial run's; a load that fails ends them all, and the
    spool with them."""
    table = tmp_path / "pt.gz"
    table.write_bytes(gzip.compress(b"\n".join(real_lines) + b"\n"))
    serial = tmp_path / "serial.gz"
    run(table, serial, checkpoint, 1)
    loading_beside: list[list[bool]] = []
    ours = f"rescore-spool-{process_tag()}-*"  # this process' spools: other runs on the machine make theirs

    def spools() -> set[Path]:
        return {*Path(tempfile.gettempdir()).glob(ours), *Path("/dev/shm").glob(ours)}

    before = spools()
    loaded = Models.load

    def load(self, *args):
        loading_beside.append(sorted(child.name == "rescore-reader" for child in multiprocessing.active_children()))
        if len(loading_beside) == 2:
            assert len(spools() - before) == 1
            raise RescoreError("this model does not load")
        return loaded(self, *args)

    monkeypatch.setattr(Models, "load", load)
    out = tmp_path / "out.gz"
    run(table, out, checkpoint, 2)
    assert_same_output(out, serial)
    with pytest.raises(RescoreError, match="does not load"):
        run(table, tmp_path / "failed.gz", checkpoint, 2)
    assert loading_beside == [[False, False, True]] * 2  # two workers and the reader
    assert spools() == before
    assert multiprocessing.active_children() == []


def test_a_first_chunk_of_only_malformed_lines_is_skipped_alike(real_lines, checkpoint, tmp_path, capfd):
    lines = [b"no separators here"] * CHUNK + real_lines[: 2 * CHUNK]
    table = tmp_path / "pt.txt"
    table.write_bytes(b"\n".join(lines) + b"\n")
    got = {}
    for workers in (1, 3):
        out = tmp_path / f"out-{workers}.gz"
        summary = run(table, out, checkpoint, workers, skip_bad_lines=True)
        got[workers] = (out.read_bytes(), summary.lines, summary.rejected, capfd.readouterr().err.count("(rejected)"))
    assert got[3] == got[1]
    assert got[1][1:] == (2 * CHUNK, CHUNK, CHUNK)


@pytest.mark.slow
def test_with_workers_the_main_process_reads_no_line_and_the_spool_goes_with_the_run(
    real_lines, checkpoint, tmp_path, monkeypatch
):
    """-j 2: a reader process reads the table and workers parse and format it; the main process
    handles spool names, plans and compressed chunks only. Reading a line here fails the test;
    the output is still the serial one's, and no spool file outlives the run, done or failed."""
    table = tmp_path / "pt.gz"
    table.write_bytes(gzip.compress(b"\n".join(real_lines) + b"\n"))
    serial = tmp_path / "serial.gz"
    run(table, serial, checkpoint, 1)

    def read_here(*_a, **_k):
        raise AssertionError("the main process read the table")

    # this process's spools only: other runs on the machine (another test session, a Table 1 run) make theirs
    ours = f"rescore-spool-{process_tag()}-*"
    before = {p for p in Path(tempfile.gettempdir()).glob(ours)} | {p for p in Path("/dev/shm").glob(ours)}
    monkeypatch.setattr("rescorer.pipeline.reader.iter_line_chunks", read_here)
    monkeypatch.setattr("rescorer.tables.chunks.iter_line_chunks", read_here)
    out = tmp_path / "out.gz"
    run(table, out, checkpoint, 2)
    assert_same_output(out, serial)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\n".join([*real_lines[:700], b"no separators here", *real_lines[700:]]) + b"\n")
    with pytest.raises(PhraseTableError, match="bad.txt:701: "):
        run(bad, tmp_path / "bad-out.gz", checkpoint, 2)
    after = {p for p in Path(tempfile.gettempdir()).glob(ours)} | {p for p in Path("/dev/shm").glob(ours)}
    assert after == before


def test_a_spooled_object_comes_back_equal_with_its_arrays_mapped(tmp_path):
    plan = {"rows": np.arange(10, dtype=np.int32), "empty": np.zeros(0), "nested": [(np.ones((3, 2)), "x")]}
    ref = SpooledObject.dump(plan, str(tmp_path / "obj"))
    assert len(ref.meta) < 1000 and ref.sizes == (40, 0, 48)  # the arrays are in the file, not the pickle
    back = ref.load()
    assert not (tmp_path / "obj").exists()
    assert np.array_equal(back["rows"], plan["rows"]) and back["rows"].dtype == np.int32
    assert np.array_equal(back["nested"][0][0], plan["nested"][0][0]) and back["nested"][0][1] == "x"
    back["rows"][0] = 7  # copy-on-write: the scorer may write to a plan's arrays
    assert back["rows"][0] == 7
