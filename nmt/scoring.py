"""Scoring: log p(target | source) of given pairs, and of the hypotheses of a Moses n-best list.

The targets of one source are scored as a prefix tree (:mod:`neural.prefix_tree`): each distinct
prefix is one decoder step, shared by every target that starts with it, and each target's
log-probability is the sum of the steps on its path, EOS included. The hypotheses of an n-best list
share most of their prefixes (a Moses 100-best list of newstest has about 2.4 target words for each
distinct prefix), so this decodes a fraction of what teacher forcing each hypothesis would; pairs
with nothing in common cost what teacher forcing does.

Sources are sorted by length and taken in chunks of about ``batch_rows`` targets; a chunk's sources
are encoded together (padding changes no score, :mod:`nmt.model`) and its tree advanced one depth at
a time, the nodes of a depth in :meth:`~nmt.model.AttentionNMT.decoder_step` calls of at most
``batch_rows`` rows that gather each node's annotations by index. The numbers are the model's
per-step log-softmax, summed in float64: the same as scoring each pair alone (tested).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from neural.device import autocast
from neural.prefix_tree import build_tree_arrays
from nmt.model import BOS_ID, EOS_ID, AttentionNMT, pad_batch

#: Targets scored together (a chunk's tree has at most this many nodes at any depth, so it bounds a
#: step's rows): a step's [rows, V] log-probabilities and its gathered [rows, J, 2H + N] annotations and
#: keys stay within tens of MB at 8,000 units, and the output layer's matmul is still a large one.
DEFAULT_BATCH_ROWS = 512


def _normalised(values: np.ndarray, targets: Sequence[Sequence[int]], normalize: bool) -> np.ndarray:
    """log p per target unit (EOS counted) with ``normalize``, else as it is."""
    if not normalize:
        return values
    return values / np.array([len(t) + 1 for t in targets], dtype=np.float64)


@dataclass
class _Ragged:
    """A chunk's targets end to end, as :func:`neural.prefix_tree.build_tree_arrays` reads them."""

    offsets: np.ndarray
    ids: np.ndarray

    @classmethod
    def of(cls, sequences: Sequence[Sequence[int]]) -> _Ragged:
        lengths = np.fromiter((len(t) for t in sequences), dtype=np.int64, count=len(sequences))
        ids = np.fromiter((u for t in sequences for u in t), dtype=np.int64, count=int(lengths.sum()))
        return cls(np.concatenate([[0], np.cumsum(lengths)]), ids)


@torch.no_grad()
def score_grouped(model: AttentionNMT, sources: Sequence[Sequence[int]], groups: Sequence[int],
                  targets: Sequence[Sequence[int]], *, normalize: bool = False,
                  batch_rows: int = DEFAULT_BATCH_ROWS, amp_dtype: torch.dtype | None = None) -> np.ndarray:
    """log p(targets[k] | sources[groups[k]]) for each k: each source encoded once, its targets' shared
    prefixes decoded once."""
    members: dict[int, list[int]] = {}
    for k, g in enumerate(groups):
        members.setdefault(g, []).append(k)
    values = np.zeros(len(targets), dtype=np.float64)
    chunk: list[int] = []
    rows = 0
    for g in sorted(members, key=lambda g: len(sources[g])):
        if chunk and rows + len(members[g]) > batch_rows:
            _score_chunk(model, sources, members, chunk, targets, values, batch_rows, amp_dtype)
            chunk, rows = [], 0
        chunk.append(g)
        rows += len(members[g])
    if chunk:
        _score_chunk(model, sources, members, chunk, targets, values, batch_rows, amp_dtype)
    return _normalised(values, targets, normalize)


def _score_chunk(model: AttentionNMT, sources: Sequence[Sequence[int]], members: dict[int, list[int]],
                 chunk: list[int], targets: Sequence[Sequence[int]], values: np.ndarray, batch_rows: int,
                 amp_dtype: torch.dtype | None) -> None:
    """Write into ``values`` the log-probabilities of the targets of the sources ``chunk``."""
    device = next(model.parameters()).device
    src, src_mask = pad_batch([list(sources[g]) + [EOS_ID] for g in chunk], device)
    with autocast(device, amp_dtype):
        annotations, first = model.encode(src, src_mask)
        keys = model.annotation_keys(annotations)
    rows = np.array([k for g in chunk for k in members[g]], dtype=np.int64)
    source_of_row = np.repeat(np.arange(len(chunk)), [len(members[g]) for g in chunk])
    # The chunk's own targets only: the builder reads all it is given (its largest id, for one).
    tree = build_tree_arrays(source_of_row, _Ragged.of([targets[k] for k in rows]), np.arange(len(rows)),
                             end_id=EOS_ID)
    units = torch.from_numpy(tree.token.astype(np.int64))
    units[: tree.level_sizes[0]] = BOS_ID  # a root's step reads BOS
    node_source = torch.from_numpy(tree.source.astype(np.int64)).to(device)
    units, parent = units.to(device), tree.parent.astype(np.int64)
    # Each term of a target's sum, log p(next unit | node), taken where its node's step runs.
    by_node = np.argsort(tree.position_node, kind="stable")
    term_node, term_next = tree.position_node[by_node].astype(np.int64), tree.position_next[by_node].astype(np.int64)
    terms = np.zeros(len(by_node), dtype=np.float64)
    sizes = tree.level_sizes
    start, state = 0, first  # the states the nodes of the depth at ``start`` read: the roots', s_0
    for depth, size in enumerate(sizes):
        reached = []
        for a in range(start, start + size, batch_rows):
            b = min(a + batch_rows, start + size)
            at = node_source[a:b]
            with autocast(device, amp_dtype):
                log_probs, s = model.decoder_step(units[a:b], state[a - start : b - start], keys.index_select(0, at),
                                                  annotations.index_select(0, at), src_mask.index_select(0, at))
            reached.append(s)
            lo, hi = np.searchsorted(term_node, [a, b])
            picked = log_probs[torch.as_tensor(term_node[lo:hi] - a, device=device),
                               torch.as_tensor(term_next[lo:hi], device=device)]
            terms[lo:hi] = picked.double().cpu().numpy()
        end = start + size
        if depth + 1 < len(sizes):  # the next depth's nodes, each reading the state its parent reached
            parents = torch.as_tensor(parent[end : end + sizes[depth + 1]] - start, device=device)
            state = torch.cat(reached).index_select(0, parents)
        start = end
    order = np.empty_like(by_node)
    order[by_node] = np.arange(len(by_node))
    values[rows] = np.bincount(tree.position_row.astype(np.int64), weights=terms[order], minlength=len(rows))


def score_pairs(model: AttentionNMT, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                normalize: bool = False, batch_rows: int = DEFAULT_BATCH_ROWS,
                amp_dtype: torch.dtype | None = None) -> np.ndarray:
    """log p(targets[k] | sources[k]) of each pair (identical sources encoded once)."""
    distinct: dict[tuple[int, ...], int] = {}
    groups = [distinct.setdefault(tuple(s), len(distinct)) for s in sources]
    return score_grouped(model, [list(s) for s in distinct], groups, targets, normalize=normalize,
                         batch_rows=batch_rows, amp_dtype=amp_dtype)
