"""Unique-pair extraction and batching: what the trainer sees must be exactly the table's pairs."""

from __future__ import annotations

import gzip

import numpy as np
import pyarrow as pa

from rescorer.data import PairData, encode_pairs, extract_unique_pairs, pad_with_eos
from rescorer.vocab import Vocab
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
