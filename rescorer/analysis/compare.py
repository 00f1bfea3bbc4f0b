"""Top targets of long source phrases by the phrase table and by the RNN, side by side (Table 2).

For each chosen source, its targets in the table are ranked twice: by the table's direct
probability φ(e|f) (column 3) and by the RNN's log p(Y | X) of the same targets. Where the two
lists differ is what the RNN adds to a system (the paper's point: the RNN prefers literal,
well-formed translations and ignores the table's counts).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from infrastructure.errors import UserError
from infrastructure.files import PathArg, display_name
from moses_integration.phrase_table import no_lines_error
from rescorer.analysis.sampling import encode_phrases
from rescorer.model.checkpoint import Checkpoint
from rescorer.pipeline.scoring import PairScorer
from rescorer.pipeline.train_or_load import FORWARD_ONLY, check_directions
from rescorer.tables.scan import DIRECT_COLUMN, SourceBlock, scan_table


@dataclass
class ComparedSource:
    source: str
    count: float
    targets: int
    by_table: list[tuple[str, float]]  # (target, φ(e|f)), best first
    by_rnn: list[tuple[str, float]]  # (target, log p(Y|X)), best first

    def to_dict(self) -> dict:
        return {
            "source": self.source, "count": self.count, "targets": self.targets,
            "by_table": [{"target": t, "p": p} for t, p in self.by_table],
            "by_rnn": [{"target": t, "log_p": lp} for t, lp in self.by_rnn],
        }


def score_blocks(
    checkpoint: Checkpoint, blocks: Sequence[SourceBlock], device: torch.device | None = None
) -> list[np.ndarray]:
    """The RNN's log p(target | source) of every line of every block, one array per block.

    Uses the scorer of ``rescore-phrase-table`` (:class:`rescorer.pipeline.scoring.PairScorer`), so the
    numbers are the ones that would go into the rescored table.
    """
    if not blocks:
        return []
    scorer = PairScorer(checkpoint.model, device or next(checkpoint.model.parameters()).device)
    sources = encode_phrases([block.source for block in blocks], checkpoint.src_vocab)
    targets = encode_phrases([t for block in blocks for t in block.targets], checkpoint.tgt_vocab)
    source_of_row = np.repeat(np.arange(len(blocks)), [len(block.targets) for block in blocks])
    scores = scorer.score(sources, source_of_row, targets)
    cuts = np.cumsum([len(block.targets) for block in blocks])[:-1]
    return np.split(scores, cuts)


def compare_blocks(
    checkpoint: Checkpoint, blocks: Sequence[SourceBlock], *, top: int = 3, column: int = DIRECT_COLUMN,
    rnn_scores: Sequence[np.ndarray] | None = None,
) -> list[ComparedSource]:
    """Table 2 rows: each block's ``top`` targets by table column ``column`` and by the RNN."""
    if blocks and column >= blocks[0].scores.shape[1]:
        raise UserError(f"the table has {blocks[0].scores.shape[1]} score columns; there is no column {column + 1}")
    if rnn_scores is None:
        rnn_scores = score_blocks(checkpoint, blocks)
    rows = []
    for block, log_p in zip(blocks, rnn_scores, strict=True):
        order = np.argsort(-log_p, kind="stable")[:top]
        rows.append(ComparedSource(
            block.source, block.count, len(block.targets), block.top_by_column(column, top),
            [(block.targets[i], float(log_p[i])) for i in order],
        ))
    return rows


def format_markdown(rows: Sequence[ComparedSource], *, frequency: str) -> str:
    """One table row per rank; the source (with its count) on its first row."""
    lines = [
        f"| source ({frequency}) | # | translation model: target, φ(e\\|f) | RNN Encoder–Decoder: target, log p |",
        "|---|---:|---|---|",
    ]
    for row in rows:
        for rank in range(max(len(row.by_table), len(row.by_rnn))):
            source = f"{_cell(row.source)} ({row.count:g})" if rank == 0 else ""
            table = f"{_cell(row.by_table[rank][0])} ({row.by_table[rank][1]:.3g})" if rank < len(row.by_table) else ""
            rnn = f"{_cell(row.by_rnn[rank][0])} ({row.by_rnn[rank][1]:.2f})" if rank < len(row.by_rnn) else ""
            lines.append(f"| {source} | {rank + 1} | {table} | {rnn} |")
    return "\n".join(lines)


def format_json(rows: Sequence[ComparedSource]) -> str:
    return json.dumps([row.to_dict() for row in rows], ensure_ascii=False, indent=1)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


@dataclass
class ComparedTable:
    """``rescorer compare``'s rows, and what their frequency column counts: the table's ``count`` of the
    source where its lines have a counts field, else its number of ``targets``."""

    rows: list[ComparedSource]
    frequency: str


def compare_table(checkpoint: Checkpoint, table: PathArg, *, min_src_words: int, frequent: bool, sources: int,
                  top: int, min_targets: int, column: int, seed: int, progress: bool) -> ComparedTable:
    """Table 2 of a whole phrase table: its ``sources`` most frequent (or rarest) long sources, each with its
    ``top`` targets by table column ``column`` (0-based) and by the RNN. A reverse model, an empty table and
    a column the table lacks are one-line errors naming what is wrong."""
    check_directions(checkpoint, None, advice=FORWARD_ONLY)  # a p(f|e) model's log p would be listed as p(e|f)'s
    scan = scan_table(table, min_src_words=min_src_words, n_chosen=sources, min_targets=min_targets, seed=seed,
                      progress=progress)
    if scan.summary.lines == 0:
        raise no_lines_error(table, "there are no sources to compare")
    if column >= scan.summary.score_columns:
        raise UserError(f"{display_name(table)}: the table has {scan.summary.score_columns} score columns; "
                        f"there is no column {column + 1}")
    rows = compare_blocks(checkpoint, scan.frequent if frequent else scan.rare, top=top, column=column)
    return ComparedTable(rows, "count" if scan.summary.has_counts else "targets")
