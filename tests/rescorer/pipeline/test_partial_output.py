"""Output Moses can always load: rejected lines kept apart and accounted for, a full disk or a stopped run
keeping only good bytes, and --resume completing them to the uninterrupted run's bytes."""

from __future__ import annotations

import gzip
import json
from dataclasses import fields
from pathlib import Path

import pytest
from rescore_runs import assert_same_output
from tiny_rescore import (
    cli,
    counted,
    interrupted_run,
    kill_after_two_chunks,
    listing,
    run,
    table_lines,
    write_table,
)

from full_disk import FullDisk
from held_output import held_by_another_process
from rescorer.model.checkpoint import load_checkpoint
from rescorer.pipeline import partial_output, train_or_load
from rescorer.pipeline import rescore as rescore_module
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.partial_output import ChunkProgress


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


def test_a_second_run_into_a_held_output_keeps_its_partial_output(tmp_path: Path, model_file: Path) -> None:
    """``--resume`` while the first run still writes: refused before touching its partial files."""
    table, _ = interrupted_run(tmp_path, model_file)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with held_by_another_process(tmp_path / "out.gz") as holder:
        res = cli(str(table), str(tmp_path / "out.gz"), "--model", str(model_file), "--resume")
    assert res.exit_code == 1 and f"Error: {tmp_path / 'out.gz'} is in use by pid {holder.pid} " in res.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


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
