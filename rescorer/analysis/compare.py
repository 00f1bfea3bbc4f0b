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
from rescorer.analysis.sampling import encode_phrases
from rescorer.model.checkpoint import Checkpoint
from rescorer.pipeline.scoring import PairScorer
from rescorer.tables.scan import DIRECT_COLUMN, SourceBlock


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
