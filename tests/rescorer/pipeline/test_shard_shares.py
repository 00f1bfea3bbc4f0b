"""--shard K/N on small tables of the tiny model's words: the shards partition the table, equal shares at the
default chunk size, and an empty shard that writes no byte."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from rescore_runs import assert_same_output
from tiny_rescore import (
    run,
    table_lines,
    write_table,
)


def split_sources(parts: list[list[bytes]]) -> int:
    """How many source blocks two consecutive shards' lines share."""
    return sum(before[-1].split(b" ||| ")[0] == after[0].split(b" ||| ")[0]
               for before, after in zip(parts, parts[1:], strict=False))


@pytest.mark.parametrize("name", ["pt.txt", "pt.gz"])
def test_shards_partition_the_table(tmp_path: Path, tiny_checkpoint, name: str) -> None:
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
    assert all(parts) and sum(len(p) for p in parts) == len(whole)
    joined = [line for part in parts for line in part]
    assert joined == whole  # byte for byte: the shards cut their chunks where the whole run does
    # A source block split by a chunk cut is counted once; one split between two shards, in both.
    assert sources == summary.distinct_sources + split_sources(parts)


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
    texts = [gzip.decompress(p).splitlines() for p in parts]
    assert sources == whole.distinct_sources + split_sources(texts)  # each shard counts its own lines only
    sizes = [len(text) for text in texts]
    assert all(abs(size / 15_000 - 1) <= 0.15 for size in sizes), sizes
    assert_same_output(b"".join(parts), tmp_path / "whole.gz")


def test_an_empty_shard_writes_no_byte(tmp_path: Path, tiny_checkpoint) -> None:
    """Two lines in 4 shards: the shards without one write empty files, not an empty gzip member
    each, so that `cat` of the shards is still the whole run's output."""
    table = tmp_path / "pt.gz"
    table.write_bytes(gzip.compress(b"\n".join(table_lines(2)) + b"\n"))
    run(table, tmp_path / "whole.gz", tiny_checkpoint)
    parts = []
    for k in range(1, 5):
        run(table, tmp_path / f"part{k}.gz", tiny_checkpoint, shard=(k, 4))
        parts.append((tmp_path / f"part{k}.gz").read_bytes())
    assert sum(1 for p in parts if not p) >= 2
    assert_same_output(b"".join(parts), tmp_path / "whole.gz")
