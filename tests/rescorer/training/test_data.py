"""Unique-pair extraction and batching: what the trainer sees must be exactly the table's pairs."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa
import pytest

from moses_integration.phrase_table import PhraseTableError
from neural.vocab import Vocab
from rescorer.training.data import PairData, encode_pairs, extract_unique_pairs, pad_with_eos
from shared_paths import shared_file

TABLE = b"""a ||| x ||| 1 1 1 1
a ||| x ||| 1 1 1 1
a ||| x y ||| 1 1 1 1
b c ||| y ||| 1 1 1 1
b c ||| z z ||| 1 1 1 1
"""


def test_repeated_pairs_are_dropped_and_words_counted(tmp_path):
    table = tmp_path / "pt.gz"
    table.write_bytes(gzip.compress(TABLE))
    corpus = extract_unique_pairs(str(table), tmp_path / "pairs.arrow", chunk_lines=2, progress=False)
    assert corpus.num_pairs == 4
    # each distinct source counted once, each target once per unique pair
    assert corpus.src_counts == {"a": 1, "b": 1, "c": 1}
    assert corpus.tgt_counts == {"x": 2, "y": 2, "z": 2}
    pairs = pa.ipc.open_stream(pa.OSFile(str(tmp_path / "pairs.arrow"))).read_all()
    assert pairs.column("target").to_pylist() == ["x", "x y", "y", "z z"]


def test_pad_with_eos_closes_each_sequence():
    offsets = np.array([0, 2, 3, 3 + 4])
    ids = np.array([5, 6, 7, 8, 9, 10, 11])
    padded, lengths = pad_with_eos(offsets, ids, np.array([1, 0, 2]))
    assert lengths.tolist() == [2, 3, 5]
    assert padded.tolist() == [[7, 0, 0, 0, 0], [5, 6, 0, 0, 0], [8, 9, 10, 11, 0]]


def test_pair_data_split_is_deterministic_and_disjoint(tmp_path):
    path = shared_file("fixtures/hansard-enfr/phrase-table.sample.gz")
    corpus = extract_unique_pairs(str(path), tmp_path / "pairs.arrow", progress=False)
    src = Vocab.from_counts(corpus.src_counts, 500)
    tgt = Vocab.from_counts(corpus.tgt_counts, 500)
    n = encode_pairs(tmp_path / "pairs.arrow", tmp_path / "ids.arrow", src, tgt)
    assert n == corpus.num_pairs == 5166  # the sample's lines are all distinct pairs
    a, b = PairData(tmp_path / "ids.arrow", seed=3), PairData(tmp_path / "ids.arrow", seed=3)
    assert np.array_equal(a.valid_idx, b.valid_idx)
    assert len(a.valid_idx) == 500
    assert not set(a.valid_idx) & set(a.train_idx)
    assert len(a.valid_idx) + len(a.train_idx) == n
    src_b, src_len, tgt_b, tgt_len = a.batch(np.array([0]))
    with gzip.open(path) as fh:
        first = fh.readline().split(b" ||| ")
    assert tgt_len.item() == len(first[1].split()) + 1
    assert src_b[0, src_len.item() - 1].item() == 0  # </s>
    assert src_b[0, 0].item() == src.encode(first[0].decode().split())[0]


def test_repeats_are_found_in_an_unsorted_table(tmp_path, capsys):
    lines = [b"b ||| y ||| 1 1", b"a ||| x ||| 1 1", b"b ||| y ||| 1 1", b"a ||| z ||| 1 1", b"a ||| x ||| 1 1"]
    table = tmp_path / "pt.txt"
    table.write_bytes(b"\n".join(lines) + b"\n")
    corpus = extract_unique_pairs(str(table), tmp_path / "pairs.arrow", chunk_lines=2, progress=False)
    pairs = pa.ipc.open_stream(pa.OSFile(str(tmp_path / "pairs.arrow"))).read_all()
    assert list(zip(pairs.column("source").to_pylist(), pairs.column("target").to_pylist(), strict=True)) == [
        ("b", "y"), ("a", "x"), ("a", "z")]
    assert corpus.num_pairs == 3
    assert corpus.src_counts == {"a": 1, "b": 1} and corpus.tgt_counts == {"x": 1, "y": 1, "z": 1}
    assert "pt.txt:2: the table is not sorted" in capsys.readouterr().err


def test_moses_sort_order_is_taken_as_sorted(tmp_path, capsys):
    # LC_ALL=C sort puts "x y ||| ..." before "x ||| ..." (space < '|'): not a disorder.
    lines = [b"x y ||| a b ||| 1", b"x y ||| a ||| 1", b"x ||| a ||| 1", b"x ||| a ||| 1"]
    table = tmp_path / "pt.txt"
    table.write_bytes(b"\n".join(lines) + b"\n")
    assert extract_unique_pairs(str(table), tmp_path / "p.arrow", progress=False).num_pairs == 3
    assert "not sorted" not in capsys.readouterr().err


def test_column_count_change_across_chunks_names_the_line(tmp_path):
    table = tmp_path / "pt.txt"
    table.write_bytes(b"a ||| x ||| 1 1\nb ||| y ||| 1 1\nc ||| z ||| 1 1 1\n")
    with pytest.raises(PhraseTableError, match=r"pt.txt:3: expected 2 scores, found 3"):
        extract_unique_pairs(str(table), tmp_path / "pairs.arrow", chunk_lines=2, progress=False)
    assert list(tmp_path.iterdir()) == [table]  # no temp file left behind
