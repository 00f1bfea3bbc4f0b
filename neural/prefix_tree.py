"""Target sequences of the same source as a prefix tree, so each shared prefix is decoded once.

In an encoder–decoder the decoder's state after y_<t depends only on the source and y_<t, and so does
the next-unit distribution p(· | y_<t, x). Targets of one source often begin alike, and then
decoding the tree instead of each target separately computes every recurrent step, output layer and
softmax normaliser once per distinct prefix, exactly (same equations, no approximation), with no
padding at all. The empty prefix of each source is its root: what depends on the source alone (the
decoder's first state, the first step and its softmax) is computed once per source. Two scorers read
targets this way:

- the phrase RNN (``rescorer.model.tree_scoring``): in a Moses table a source phrase has several
  targets ("la", "la maison", "la maison de", …); on the fixture Hansard table, 100,000 lines have
  545,094 target positions (words plus ``</s>``) but only 408,448 distinct (source, prefix) pairs;
- the NMT model (``nmt.scoring``): the hypotheses of a Moses n-best list of one sentence differ by a
  few edits, and a 100-best list of newstest has about 2.4 words per distinct prefix.

The tree is numbered level by level (level k holds the prefixes of k words), so the decoder runs one
batched GRU step per level, and the parents of a level are all in the level before it.

The encoder gains even more from the same structure. It reads a source left to right, so its state
after x_1..x_k is shared by every source that begins with those words, and a Moses table lists
each phrase next to its extensions ("of the", "of the house", …): the 57,092 distinct sources of
the first 100,000 fixture lines take 326,948 encoder steps one by one, but only 118,813 distinct
prefixes (``</s>`` included). All sources then hang from one root, the empty prefix with h⟨0⟩ = 0.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:  # torch is imported only where tensors are made, so worker processes build trees without it
    import torch


class RaggedIds(Protocol):
    """Id sequences end to end: ``ids[offsets[i]:offsets[i+1]]`` is sequence i."""

    offsets: np.ndarray
    ids: np.ndarray


@dataclass
class PrefixTree:
    """Distinct (source, prefix) nodes and the scored positions that read them.

    Node ``i`` is the prefix ``y_1..y_k`` of some target of source ``source[i]``; ``parent[i]`` is
    the node of ``y_1..y_{k-1}`` and ``token[i]`` is ``y_k``, the decoder's input e(y_k) at that
    step (level-0 nodes, the empty prefixes, have parent −1 and take e(y_0) = 0 whatever their
    token). Position ``j`` is one term of a pair's log-probability: log p(``next[j]`` | node
    ``position_node[j]``), summed into pair ``position_row[j]``.
    """

    level_sizes: list[int]
    parent: torch.Tensor  # int64 [nodes]
    token: torch.Tensor  # int64 [nodes]
    source: torch.Tensor  # int64 [nodes], index into the c given with the tree
    position_node: torch.Tensor  # int64 [positions]
    position_next: torch.Tensor  # int64 [positions]
    position_row: torch.Tensor  # int64 [positions]
    final_node: torch.Tensor  # int64 [rows], the node of each row's whole sequence
    rows: int

    @property
    def nodes(self) -> int:
        return sum(self.level_sizes)

    def to(self, device: torch.device, non_blocking: bool = False) -> PrefixTree:
        """The same tree with its index tensors on ``device``."""
        import torch

        moved = {
            f.name: getattr(self, f.name).to(device, non_blocking=non_blocking)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return PrefixTree(level_sizes=self.level_sizes, rows=self.rows, **moved)


@dataclass
class TreeArrays:
    """A :class:`PrefixTree` as NumPy arrays (int32 where it fits): built and shipped by workers.

    Torch-free, so the processes that parse chunks build the trees too and the scoring thread
    only turns them into tensors (:meth:`tensors`).
    """

    level_sizes: list[int]
    parent: np.ndarray
    token: np.ndarray
    source: np.ndarray
    position_node: np.ndarray
    position_next: np.ndarray
    position_row: np.ndarray
    final_node: np.ndarray
    rows: int

    def tensors(self) -> PrefixTree:
        import torch

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a.astype(np.int64, copy=False))

        return PrefixTree(
            level_sizes=self.level_sizes, rows=self.rows,
            **{f.name: tensor(getattr(self, f.name)) for f in fields(self) if f.name not in ("level_sizes", "rows")},
        )


def build_tree_arrays(source_of_row: np.ndarray, targets: RaggedIds, rows: np.ndarray, *,
                      end_id: int) -> TreeArrays:
    """The prefix tree of ``targets[rows]``, where row ``rows[i]`` belongs to source ``source_of_row[i]``.

    ``source_of_row`` holds dense source indices 0..S−1 (every one used), in the order of the c
    that will be scored with the tree. ``end_id`` is the model's end of sequence: the last term of
    each row, and the token of the roots. Torch-free: a few vectorised NumPy calls per level;
    :meth:`TreeArrays.tensors` makes the :class:`PrefixTree` the scorer uses.
    """
    starts = targets.offsets[rows]
    lengths = targets.offsets[rows + 1] - starts
    n_sources = int(source_of_row.max()) + 1 if len(rows) else 0
    # Keys (parent node, word) must be unique integers: word ids are below ``radix``.
    radix = int(targets.ids.max()) + 1 if len(targets.ids) else 1
    node_of_row = source_of_row.astype(np.int64)  # each row's node at the current level
    local_rows = np.arange(len(rows), dtype=np.int64)

    level_sizes = [n_sources]
    parents = [np.full(n_sources, -1, dtype=np.int64)]
    tokens = [np.full(n_sources, end_id, dtype=np.int64)]
    sources = [np.arange(n_sources, dtype=np.int64)]
    position_node, position_next, position_row = [], [], []
    first_node = 0
    active = local_rows
    level = 0
    while len(active):
        # Every active row scores its next word (or </s> where its target ends) at its node.
        ending = lengths[active] == level
        next_word = np.full(len(active), end_id, dtype=np.int64)
        going = active[~ending]
        next_word[~ending] = targets.ids[starts[going] + level]
        position_node.append(node_of_row[active])
        position_next.append(next_word)
        position_row.append(active)
        if not len(going):
            break
        # The children of this level: distinct (node, next word) among rows that go on.
        keys = node_of_row[going] * radix + next_word[~ending]
        unique_keys, inverse = np.unique(keys, return_inverse=True)
        first_node += level_sizes[-1]
        parent = unique_keys // radix
        parents.append(parent)
        tokens.append(unique_keys % radix)
        sources.append(sources[-1][parent - (first_node - level_sizes[-1])])
        level_sizes.append(len(unique_keys))
        node_of_row[going] = first_node + inverse.reshape(-1)
        active = going
        level += 1

    small = np.int32 if max(first_node + level_sizes[-1], len(rows), radix) < 2**31 else np.int64

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(small, copy=False)

    return TreeArrays(
        level_sizes=level_sizes,
        parent=cat(parents),
        token=cat(tokens),
        source=cat(sources),
        position_node=cat(position_node),
        position_next=cat(position_next),
        position_row=cat(position_row),
        final_node=node_of_row.astype(small, copy=False),
        rows=len(rows),
    )
