"""What the scorer will compute for a chunk, decided before the model runs: groups and prefix trees.

Grouping the rows and building their prefix trees (:mod:`neural.prefix_tree`) is NumPy work
that does not need the model, so it runs where the chunk is parsed (a worker process, or with
``-j 1`` the thread that hands the chunks read on) and overlaps the model instead of holding up the scoring thread. The
plan depends only on the chunk, the token budget and the scoring options, so a plan made in a
worker gives exactly the groups, trees and scores :meth:`rescorer.pipeline.scoring.PairScorer.score`
would make itself. Torch-free: worker processes import no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from neural.prefix_tree import TreeArrays, build_tree_arrays
from rescorer.tables.chunks import EOS_ID, TokenIds, with_end_of_phrase


@dataclass
class ScoringPlan:
    """A chunk's pairs and, with source sharing, its encoder and decoder trees, group by group."""

    sources: TokenIds  # distinct sources of the chunk
    source_of_row: np.ndarray  # int64 [rows], index into sources
    targets: TokenIds  # one per row
    token_budget: int
    # (source rows, tree of those sources with </s>) per encoder group
    encoder_groups: list[tuple[np.ndarray, TreeArrays]] = field(default_factory=list)
    # (rows, their distinct sources in tree order, tree of their targets) per decoder group
    decoder_groups: list[tuple[np.ndarray, np.ndarray, TreeArrays]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.source_of_row)


def encoder_groups(sequences: TokenIds, token_budget: int) -> list[np.ndarray]:
    """Consecutive sources cut by a budget of tokens read one by one.

    The budget is about twice the distinct prefixes (nodes) the tree will hold: a Moses table is
    sorted, so phrases and their extensions sit together and share most of their prefixes.
    """
    n = len(sequences.offsets) - 1
    tokens = np.cumsum(sequences.lengths)
    group = (tokens - sequences.lengths) // (2 * token_budget)
    return [rows for rows in np.split(np.arange(n), np.flatnonzero(np.diff(group)) + 1) if len(rows)]


def encoder_tree(sequences: TokenIds, rows: np.ndarray) -> TreeArrays:
    """All sources of ``rows`` under one root, the empty prefix."""
    return build_tree_arrays(np.zeros(len(rows), dtype=np.int64), sequences, rows, end_id=EOS_ID)


def source_groups(
    source_of_row: np.ndarray, target_tokens: np.ndarray, token_budget: int, sort_by_length: bool
) -> list[np.ndarray]:
    """Rows cut into groups of whole sources with about ``token_budget`` target tokens each.

    A source's targets stay together so that their common prefixes are decoded once. When
    sorting, sources are ordered by their longest target: the tree levels of a group are then
    about equally deep, so no level is left with a handful of rows (each level is one matmul
    over the recurrent weights, which costs about the same for 5 rows as for 100).
    """
    n_sources = int(source_of_row.max()) + 1 if len(source_of_row) else 0
    tokens = np.bincount(source_of_row, weights=target_tokens, minlength=n_sources)
    if sort_by_length:
        depth = np.zeros(n_sources, dtype=np.int64)
        np.maximum.at(depth, source_of_row, target_tokens)
        order = np.argsort(depth, kind="stable")
    else:
        order = np.arange(n_sources)
    before = np.cumsum(tokens[order]) - tokens[order]
    group_of_source = np.empty(n_sources, dtype=np.int64)
    group_of_source[order] = before // token_budget
    group_of_row = group_of_source[source_of_row]
    row_order = np.argsort(group_of_row, kind="stable")
    cuts = np.flatnonzero(np.diff(group_of_row[row_order])) + 1
    return np.split(row_order, cuts)


def decoder_tree(source_of_row: np.ndarray, targets: TokenIds, rows: np.ndarray) -> tuple[np.ndarray, TreeArrays]:
    """The distinct sources of ``rows`` (the c the tree is scored with) and their targets' tree."""
    used, local_source = np.unique(source_of_row[rows], return_inverse=True)
    return used, build_tree_arrays(local_source.reshape(-1), targets, rows, end_id=EOS_ID)


def plan_scoring(
    sources: TokenIds,
    source_of_row: np.ndarray,
    targets: TokenIds,
    token_budget: int,
    *,
    share_sources: bool = True,
    sort_by_length: bool = True,
) -> ScoringPlan:
    """The groups and trees of a chunk; without source sharing only the pairs (padded batches)."""
    plan = ScoringPlan(sources, source_of_row, targets, token_budget)
    if not share_sources or not len(source_of_row):
        return plan
    sequences = with_end_of_phrase(sources)
    plan.encoder_groups = [(rows, encoder_tree(sequences, rows)) for rows in encoder_groups(sequences, token_budget)]
    for rows in source_groups(source_of_row, targets.lengths + 1, token_budget, sort_by_length):
        used, tree = decoder_tree(source_of_row, targets, rows)
        plan.decoder_groups.append((rows, used, tree))
    return plan
