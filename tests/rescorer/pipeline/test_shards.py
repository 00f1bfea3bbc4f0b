"""``--shard K/N`` cuts: equal shares for any table, whatever its sources, found by each shard's reader alone.

The shards are cut here exactly as each shard's reader cuts them (:func:`read_chunks` of the
shard, one reader per shard, each from the file alone), without a model: the lines
each keeps are what its run scores and writes. That the written bytes are the whole run's is
checked end to end on a filtered table (a few sources, many targets each).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rescore_runs import assert_same_output, lines_of, rescore, shard_outputs
from tiny_rescore import WORDS

from infrastructure.errors import UserError
from infrastructure.files import open_input
from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import save_checkpoint
from rescorer.pipeline import partial_output
from rescorer.pipeline.reader import ReadingSettings, read_chunks
from rescorer.pipeline.shards import ShardError, ShardFilter, count_lines, shard_cuts
from rescorer.tables.aligned import grid_points
from shared_paths import shared_file

TOLERANCE = 0.10  # what a shard may hold more or less than an equal share


def write_table(path: Path, sources: int, targets: int) -> list[bytes]:
    """A sorted table of ``sources`` source phrases with ``targets`` lines each, lines of about
    equal length (a filtered Moses table when ``targets`` is large); gzip for a ``.gz`` path."""
    lines = [f"{WORDS[s % 4]} {WORDS[4 + s % 3]} s{s:07d} ||| {WORDS[t % 7]} t{t:05d} ||| 0.5 0.5 0.5 0.5".encode()
             for s in range(sources) for t in range(targets)]
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(gzip.compress(data, compresslevel=6) if path.suffix == ".gz" else data)
    return lines


def shard_ranges(path: Path, shards: int, chunk_lines: int) -> list[tuple[int, int]]:
    """The 1-based lines ``[first, last + 1)`` each shard K/``shards`` scores, each found by a reader of its own."""
    ranges = []
    for k in range(1, shards + 1):
        kept: list[int] = []
        with open_input(path, decompress_thread=True) as fh:
            for item in read_chunks(ReadingSettings(str(path), chunk_lines, 0, (k, shards), None), fh):
                if item.in_run:
                    a, b = item.keep or (0, len(item.lines))
                    kept += [item.first_line_no + a, item.first_line_no + b]
        assert kept == sorted(kept) and all(x == y for x, y in zip(kept[1:-1:2], kept[2::2], strict=True)), kept
        ranges.append((kept[0], kept[-1]) if kept else (0, 0))
    return ranges


@pytest.mark.parametrize("data", [b"", b"a ||| b ||| 1\n", b"a ||| b ||| 1\nc ||| d ||| 1", b"\n\n\n"])
def test_the_pass_that_finds_the_cuts_counts_every_line(tmp_path, data):
    """A last line without a newline included, plain or gzip, read as the shard's pass reads them."""
    for path in (tmp_path / "pt.txt", tmp_path / "pt.gz"):
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        assert count_lines(str(path)) == data.count(b"\n") + (not data.endswith(b"\n") and bool(data))


@pytest.mark.parametrize(("points", "lines", "shards", "cuts"), [
    ([1, 51], 100, 2, [1, 51, 101]),  # share 2 starts at line 51, a grid point
    ([1, 40, 61], 100, 2, [1, 61, 101]),  # 61 is 10 lines after 51, 40 is 11 before
    ([1, 41, 61], 100, 2, [1, 41, 101]),  # as near: the earlier
    ([1, 30], 100, 2, [1, 30, 101]),  # the table's end (line 101) is 50 lines away
    ([1, 2], 2, 4, [1, 1, 2, 2, 3]),  # more shards than lines: shards 1 and 3 empty
    ([1, 4, 7, 10], 12, 3, [1, 4, 10, 13]),  # shares start at 1, 5 and 9
    ([], 0, 3, [1, 1, 1, 1]),  # an empty table
])
def test_each_cut_is_the_grid_point_nearest_to_an_equal_share(points, lines, shards, cuts):
    assert shard_cuts(np.array(points, dtype=np.int64), lines, shards) == cuts


def source(line: bytes) -> bytes:
    return line.split(b" ||| ")[0]


# 50 lines a shard at least, in sources of 1, 40 and 500 lines: a 500-line source block is split
# between shards where a share ends inside it.
CASES = [(targets, shards, -(-50 * shards // targets)) for targets in (1, 40, 500) for shards in (2, 3, 8, 16)]


@pytest.mark.parametrize("name", ["pt.txt", "pt.gz"])
@pytest.mark.parametrize(("targets", "shards", "sources"), CASES)
def test_every_shard_holds_an_equal_share_whatever_its_sources(tmp_path, name, targets, shards, sources):
    lines = write_table(tmp_path / name, sources, targets)
    cut = [shard_ranges(tmp_path / name, shards, chunk_lines) for chunk_lines in (333, 100_000)]
    assert cut[0] == cut[1]  # the same cuts whatever --chunk-lines
    ranges = cut[0]
    assert ranges[0][0] == 1 and ranges[-1][1] == len(lines) + 1
    assert all(before[1] == after[0] for before, after in zip(ranges, ranges[1:], strict=False)), ranges
    share = len(lines) / shards
    sizes = [b - a for a, b in ranges]
    assert all(abs(size / share - 1) <= TOLERANCE for size in sizes), (sizes, share)
    if targets == 500 and shards > 2:  # the cuts fall inside a source block: not at block starts
        assert any(source(lines[first - 1]) == source(lines[first - 2]) for first, _ in ranges[1:])


@pytest.mark.parametrize("shards", [2, 3, 8, 16, 25])
def test_any_table_of_50_lines_a_shard_is_cut_within_ten_percent(shards):
    """The cuts follow the line count alone, so every table size can be checked: from 50 lines a
    shard to a billion lines, at every size about 3% apart."""
    for lines in np.unique(np.geomspace(50 * shards, 10**9, 700).astype(np.int64)).tolist():
        sizes = np.diff(shard_cuts(grid_points(lines), lines, shards))
        assert abs(sizes * shards / lines - 1).max() <= TOLERANCE, (lines, sizes)


def test_a_shard_resumed_on_a_table_cut_elsewhere_is_refused(tmp_path):
    """The progress record holds the shard's lines; a table that now cuts elsewhere (changed, yet
    with the size and time the record knows) would splice two different slices."""
    write_table(tmp_path / "pt.txt", 300, 1)
    recorded = ShardFilter.of_table(str(tmp_path / "pt.txt"), (2, 3)).state()
    assert recorded == {"lines": [101, 201]}
    write_table(tmp_path / "pt.txt", 25, 11)  # 275 lines: cut at 275 // 3 + 1 and 2 · 275 // 3 + 1
    with pytest.raises(ShardError, match=r"cannot --resume shard 2/3: .*pt.txt is now cut into lines 92..183, "
                                         r"the interrupted run's were \[101, 201\]; start over without --resume"):
        ShardFilter.of_table(str(tmp_path / "pt.txt"), (2, 3), recorded)


@pytest.mark.parametrize("shards", [2, 3, 8, 16])
def test_the_fixtures_filtered_table_is_cut_into_equal_shares(shards):
    """A real filtered table (253,257 lines, 6,282 sources, one of 4,976 targets, 31% of a sixteenth):
    within ±10% in 16 shards too, where cuts that kept source blocks whole gave -12.7% and +10.3%."""
    lines = count_lines(str(shared_file("fixtures/hansard-enfr/filtered/phrase-table.0-0.1.1.gz")))
    sizes = np.diff(shard_cuts(grid_points(lines), lines, shards))
    assert lines == 253_257 and abs(sizes * shards / lines - 1).max() <= TOLERANCE, sizes


@pytest.mark.parametrize(("targets", "shards", "chunk_lines", "workers"),
                         [(40, 3, 100_000, 2), (40, 8, 1000, 0), (500, 2, 700, 0), (1, 16, 97, 0)])
def test_shards_of_a_filtered_table_concatenate_to_the_whole_run(tmp_path, tiny_checkpoint, targets, shards,
                                                                 chunk_lines, workers):
    """`cat` of the shards' gzip outputs is the unsharded run's bytes, member for member, and each
    holds its share of the lines (50 a shard; in 2 shards of one 500-line source, cut inside it)."""
    sources = -(-50 * shards // targets)
    lines = write_table(tmp_path / "pt.gz", sources, targets)
    whole, parts = shard_outputs(
        lambda out, shard: rescore(tmp_path / "pt.gz", out, tiny_checkpoint, chunk_lines=chunk_lines, token_budget=512,
                                   shard=shard, workers=workers if shard else 0), tmp_path, shards)
    assert_same_output(b"".join(part.read_bytes() for part in parts), whole)
    sizes = [len(lines_of(part)) for part in parts]
    assert sum(sizes) == len(lines)
    assert all(abs(size * shards / len(lines) - 1) <= TOLERANCE for size in sizes), sizes


def test_a_stopped_shard_resumes_to_the_bytes_of_an_uninterrupted_one(tmp_path, tiny_checkpoint, monkeypatch):
    """Ctrl-C as shard 2/3 of a filtered table writes its second chunk of lines, then ``--resume``
    (which continues from the shard filter's recorded state, past the shard's start): the shard's
    bytes are an uninterrupted run's, so the shards still concatenate to the whole run. (A shard
    stopped before its first line keeps nothing to resume.)"""
    lines = write_table(tmp_path / "pt.gz", 3 * 800 // 40, 40)
    table = tmp_path / "pt.gz"

    def run(out: Path, shard: tuple[int, int] | None, **kw: object) -> object:
        return rescore(table, out, tiny_checkpoint, chunk_lines=150, token_budget=512, shard=shard, **kw)

    whole, parts = shard_outputs(run, tmp_path, 3)
    real_write = partial_output.DurableWriter.write
    written: list[int] = []

    def stopped(self, data, *rest):
        if any(written):
            raise KeyboardInterrupt
        written.append(len(data))
        return real_write(self, data, *rest)

    monkeypatch.setattr(partial_output.DurableWriter, "write", stopped)
    out = tmp_path / "resumed.gz"
    with pytest.raises((KeyboardInterrupt, UserError)):
        run(out, (2, 3))
    monkeypatch.undo()
    progress = json.loads((tmp_path / ".resumed.gz.progress.json").read_text())
    assert 0 < progress["output_bytes"] == sum(written) < parts[1].stat().st_size
    assert len(lines) // 3 < progress["lines_done"] < 2 * len(lines) // 3  # inside the shard
    run(out, (2, 3), resume=True)
    assert_same_output(out, parts[1])
    assert_same_output(b"".join(p.read_bytes() for p in (parts[0], out, parts[2])), whole)


def test_the_command_line_shards_of_a_filtered_table_cat_to_one_run(tmp_path, tiny_checkpoint):
    """`rescore-phrase-table … --shard K/3` three times, as the docs' xargs example runs it: `cat`
    of the outputs is the unsharded command's file, and each holds a third of the lines within 10%."""
    ck = tiny_checkpoint
    model = tmp_path / "tiny.pt"
    save_checkpoint(model, model=ck.model, config=ck.config, src_vocab=ck.src_vocab, tgt_vocab=ck.tgt_vocab)
    lines = write_table(tmp_path / "pt.gz", 3 * 800 // 40, 40)

    def command(out: Path, *extra: str) -> None:
        res = CliRunner().invoke(rescore_phrase_table_command, [
            str(tmp_path / "pt.gz"), str(out), "--model", str(model), "--chunk-lines", "250", "--threads", "1",
            "-q", "-j", "0", "--device", "cpu", *extra])
        assert res.exit_code == 0, res.output

    command(tmp_path / "whole.gz")
    parts = [tmp_path / f"out.{k}.gz" for k in (1, 2, 3)]
    for k, part in enumerate(parts, start=1):
        command(part, "--shard", f"{k}/3")
    assert_same_output(b"".join(part.read_bytes() for part in parts), tmp_path / "whole.gz")
    sizes = [len(lines_of(part)) for part in parts]
    assert sum(sizes) == len(lines) and all(abs(size * 3 / len(lines) - 1) <= TOLERANCE for size in sizes), sizes


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_resumed_on_a_table_cut_elsewhere_stops_alike_with_and_without_workers(tmp_path, tiny_checkpoint,
                                                                                        monkeypatch, workers):
    """The table changed under a stopped shard, yet kept its size and time: the resume says so in one
    line and leaves no partial output, so that the run it advises, without --resume, can start; the
    reading finds the cut in every layout, and a shard's reader in a process or this one's thread stop
    the run alike."""
    def write(count: int) -> Path:  # ``count`` lines, 300 lines' bytes: the last line takes the rest
        lines = [f"la s{i:04d} ||| the t ||| 0.5 0.5 0.5 0.5\n" for i in range(count)]
        lines[-1] = lines[-1].replace("the t", "the t" + "t" * 39 * (300 - count))
        (tmp_path / "pt.txt").write_text("".join(lines))
        return tmp_path / "pt.txt"

    table, out = write(300), tmp_path / "out.gz"
    real_write = partial_output.DurableWriter.write

    def stopped(self, data, *rest):
        if data:
            real_write(self, data, *rest)
            raise KeyboardInterrupt
        return real_write(self, data, *rest)

    monkeypatch.setattr(partial_output.DurableWriter, "write", stopped)
    with pytest.raises((KeyboardInterrupt, UserError), match="good bytes kept"):
        rescore(table, out, tiny_checkpoint, chunk_lines=50, token_budget=512, shard=(2, 3), workers=workers)
    monkeypatch.undo()
    times = table.stat()
    write(299)  # 299 lines: cut at 99 + 1 and 199 + 1; the same bytes in all
    os.utime(table, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert table.stat().st_size == times.st_size
    with pytest.raises(ShardError, match=r"cannot --resume shard 2/3: .* now cut into lines 100\.\.199"):
        rescore(table, out, tiny_checkpoint, chunk_lines=50, token_budget=512, shard=(2, 3), workers=workers,
                resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pt.txt"]
    rescore(table, out, tiny_checkpoint, chunk_lines=50, token_budget=512, shard=(2, 3), workers=workers)
    assert len(lines_of(out)) == 100
