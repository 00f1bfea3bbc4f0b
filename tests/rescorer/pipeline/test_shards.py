"""``--shard K/N`` cuts: equal shares for any table, found by each shard's reader alone.

The shards are cut here exactly as each shard's reader cuts them (:func:`table_chunks` with a
:class:`ShardFilter`, one reader per shard, each from the file alone), without a model: the lines
each keeps are what its run scores and writes. That the written bytes are the whole run's is
checked end to end on a filtered table (a few sources, many targets each).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from rescore_runs import assert_same_output, lines_of, rescore, shard_outputs

from infrastructure.errors import UserError
from infrastructure.files import open_input
from neural.vocab import EOS, UNK, Vocab
from rescorer.model.checkpoint import Checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline import partial_output
from rescorer.pipeline.reader import table_chunks
from rescorer.pipeline.shards import ShardFilter
from rescorer.tables.chunks import count_lines, iter_line_chunks

WORDS = ["la", "maison", "the", "house", "a", "b", "c"]
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
        shard = ShardFilter.of_table(str(path), (k, shards))
        with open_input(path, decompress_thread=True) as fh:
            for item in table_chunks(fh, str(path), chunk_lines, 0, shard):
                if item.in_run:
                    a, b = item.keep or (0, len(item.chunk))
                    kept += [item.chunk.first_line_no + a, item.chunk.first_line_no + b]
        assert kept == sorted(kept) and all(x == y for x, y in zip(kept[1:-1:2], kept[2::2], strict=True)), kept
        ranges.append((kept[0], kept[-1]) if kept else (0, 0))
    return ranges


@pytest.mark.parametrize("data", [b"", b"a ||| b ||| 1\n", b"a ||| b ||| 1\nc ||| d ||| 1", b"\n\n\n"])
def test_the_lines_a_shard_counts_are_the_lines_read(tmp_path, data):
    """Every line, a last one without a newline included, plain or gzip: as the reader cuts them."""
    for path in (tmp_path / "pt.txt", tmp_path / "pt.gz"):
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
        with open_input(path, decompress_thread=True) as fh:
            counted = count_lines(fh, str(path))
        with open_input(path) as fh:
            assert counted == sum(len(chunk) for chunk in iter_line_chunks(fh, str(path), 2))


def source(line: bytes) -> bytes:
    return line.split(b" ||| ")[0]


# Sources of 1 line need 50 lines per shard; longer source blocks, which are never split, need
# about 20 of them per shard (a shard's ends move to a block's start).
CASES = [(targets, shards, max(50, 20 * targets) * shards // targets)
         for targets in (1, 40, 500) for shards in (2, 3, 8, 16)]


@pytest.mark.parametrize("name", ["pt.txt", "pt.gz"])
@pytest.mark.parametrize(("targets", "shards", "sources"), CASES)
def test_every_shard_holds_an_equal_share_and_no_source_is_split(tmp_path, name, targets, shards, sources):
    lines = write_table(tmp_path / name, sources, targets)
    for chunk_lines in (333, 100_000):
        ranges = shard_ranges(tmp_path / name, shards, chunk_lines)
        assert ranges[0][0] == 1 and ranges[-1][1] == len(lines) + 1
        assert all(before[1] == after[0] for before, after in zip(ranges, ranges[1:], strict=False)), ranges
        share = len(lines) / shards
        sizes = [b - a for a, b in ranges]
        assert all(abs(size / share - 1) <= TOLERANCE for size in sizes), (chunk_lines, sizes, share)
        for first, _ in ranges[1:]:  # each shard starts a source block
            assert source(lines[first - 1]) != source(lines[first - 2])


@pytest.fixture(scope="module")
def tiny_checkpoint() -> Checkpoint:
    vocab = Vocab([EOS, UNK, *WORDS])
    config = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), hidden=8, embedding=4,
                         maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, vocab, vocab)


@pytest.mark.parametrize(("targets", "shards", "chunk_lines", "workers"),
                         [(40, 3, 100_000, 2), (40, 8, 1000, 0), (500, 2, 700, 0), (1, 16, 97, 0)])
def test_shards_of_a_filtered_table_concatenate_to_the_whole_run(tmp_path, tiny_checkpoint, targets, shards,
                                                                 chunk_lines, workers):
    """`cat` of the shards' gzip outputs is the unsharded run's bytes, member for member, and each
    holds its share of the lines."""
    sources = max(50, 20 * targets) * shards // targets
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
