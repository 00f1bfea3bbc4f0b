"""Prefix-tree decoding: each distinct (source, prefix) once, scores exactly those of the model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neural.prefix_tree import build_tree_arrays
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.tree_scoring import encode_prefix_tree, score_prefix_tree
from rescorer.tables.chunks import EOS_ID, TokenIds, with_end_of_phrase

A, B, C, D = 2, 3, 4, 5


def ragged(seqs: list[list[int]]) -> TokenIds:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    ids = np.array([i for s in seqs for i in s], dtype=np.int32)
    return TokenIds(offsets, ids, np.zeros(len(seqs), dtype=np.int32))


def test_tree_holds_each_shared_prefix_once():
    # Source 0: "a b", "a c", "a", "d"; source 1: "a b". Prefix "a" of source 0 is shared by three
    # targets but is one node; source 1's "a" is a different node (another c).
    targets = ragged([[A, B], [A, C], [A], [D], [A, B]])
    tree = build_tree_arrays(np.array([0, 0, 0, 0, 1]), targets, np.arange(5), end_id=EOS_ID).tensors()
    assert tree.level_sizes == [2, 3, 3]
    assert tree.nodes == 8 and tree.rows == 5
    level1 = slice(2, 5)
    level1_nodes = zip(tree.source[level1].tolist(), tree.token[level1].tolist(), strict=True)
    assert sorted(level1_nodes) == [(0, A), (0, D), (1, A)]
    assert tree.parent[:2].tolist() == [-1, -1]
    # Every node's parent is on the level before it and belongs to the same source.
    for node in range(2, 8):
        parent = int(tree.parent[node])
        assert (parent < 2) if node < 5 else (2 <= parent < 5)
        assert tree.source[parent] == tree.source[node]
    # One scored position per target word plus its </s>: 3 + 3 + 2 + 2 + 3.
    assert len(tree.position_node) == 13
    assert np.bincount(tree.position_row.numpy()).tolist() == [3, 3, 2, 2, 3]


def test_rows_subset_keeps_row_order():
    targets = ragged([[A], [B, C], [A, D], [C]])
    rows = np.array([3, 1])
    tree = build_tree_arrays(np.array([0, 0]), targets, rows, end_id=EOS_ID).tensors()
    assert tree.rows == 2
    # Local row 0 is table row 3 ("c"): it scores c then </s>.
    first = tree.position_row == 0
    assert sorted(tree.position_next[first].tolist()) == [0, C]


@pytest.fixture(scope="module")
def float64_model() -> RNNEncoderDecoder:
    torch.manual_seed(3)
    config = ModelConfig(src_vocab_size=20, tgt_vocab_size=7, hidden=12, embedding=5, maxout_units=6, output_rank=4)
    return RNNEncoderDecoder(config).double().eval()


def test_tree_scores_equal_one_pair_at_a_time(float64_model):
    """A small target vocabulary forces many shared prefixes; every pair's log p must be the model's."""
    model = float64_model
    rng = np.random.default_rng(7)
    sources = [list(rng.integers(2, 20, rng.integers(1, 5))) for _ in range(6)]
    source_of_row = np.concatenate([np.arange(6), rng.integers(0, 6, 50)])
    targets = [list(rng.integers(1, 7, rng.integers(0, 6))) for _ in source_of_row]  # includes empty targets
    tree = build_tree_arrays(source_of_row, ragged(targets), np.arange(len(targets)), end_id=EOS_ID).tensors()
    assert tree.nodes < sum(len(t) + 1 for t in targets)  # the test does exercise sharing
    with torch.no_grad():
        c = torch.cat([model.encode(torch.tensor([s + [0]]), torch.tensor([len(s) + 1])) for s in sources])
        got = score_prefix_tree(model, c, tree).numpy()
        expected = [
            model(
                torch.tensor([sources[s] + [0]]),
                torch.tensor([len(sources[s]) + 1]),
                torch.tensor([t + [0]]),
                torch.tensor([len(t) + 1]),
            ).item()
            for s, t in zip(source_of_row, targets, strict=True)
        ]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_tree_rejects_summaries_of_the_wrong_shape(float64_model):
    tree = build_tree_arrays(np.array([0, 1]), ragged([[A], [B]]), np.arange(2), end_id=EOS_ID).tensors()
    with pytest.raises(ValueError, match="c must be"):
        score_prefix_tree(float64_model, torch.zeros(3, 12, dtype=torch.float64), tree)


def test_end_of_phrase_is_appended_to_every_phrase():
    phrases = with_end_of_phrase(ragged([[A, B], [], [C]]))
    assert phrases.offsets.tolist() == [0, 3, 4, 6]
    assert phrases.ids.tolist() == [A, B, 0, 0, C, 0]


def test_source_tree_summaries_equal_the_encoder(float64_model):
    """Sources that extend each other, as in a sorted Moses table, share their encoder prefixes."""
    model = float64_model
    sources = [[A], [A, B], [A, B, C], [A, C], [B], [B, B, B, B], [D, A]]
    sequences = with_end_of_phrase(ragged(sources))
    rows = np.array([6, 0, 1, 2, 3, 4, 5])
    tree = build_tree_arrays(np.zeros(len(rows), dtype=np.int64), sequences, rows, end_id=EOS_ID).tensors()
    assert tree.nodes - 1 < sum(len(s) + 1 for s in sources)
    with torch.no_grad():
        got = encode_prefix_tree(model, tree)
        expected = torch.cat(
            [model.encode(torch.tensor([sources[i] + [0]]), torch.tensor([len(sources[i]) + 1])) for i in rows]
        )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_position_sums_equal_index_add_whatever_the_targets():
    """The deterministic per-pair sum (no CUDA atomics) relies on positions coming level by level with
    each level's rows ascending: on random trees it must equal a plain index_add_ in float64."""
    from rescorer.model.tree_scoring import sum_positions

    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(1, 40))
        targets = ragged([list(rng.integers(2, 6, rng.integers(0, 8))) for _ in range(n)])
        source_of_row = np.sort(rng.integers(0, max(1, n // 3), n))
        source_of_row = np.unique(source_of_row, return_inverse=True)[1]
        rows = np.sort(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
        local = source_of_row[rows] - source_of_row[rows].min()
        tree = build_tree_arrays(local, targets, rows, end_id=EOS_ID).tensors()
        scores = torch.from_numpy(rng.normal(size=len(tree.position_row)))
        expected = torch.zeros(tree.rows, dtype=torch.float64).index_add_(0, tree.position_row, scores)
        got = sum_positions(scores, tree.position_row, tree.rows, len(tree.level_sizes))
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
