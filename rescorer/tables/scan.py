"""One streaming pass over a Moses phrase table for the analysis commands.

``rescorer compare`` and ``rescorer report`` need a summary of the table, a few long source
phrases (the most or least frequent ones) with all their targets, and, for the report, a random
sample of whole source blocks to score and map. All of it comes from one pass that holds only
the chosen blocks, so it works on tables of any size.

A Moses table from ``train-model.perl`` has the score columns φ(f|e) lex(f|e) φ(e|f) lex(e|f)
(f = source, e = target), so the *direct* probability of the target given the source, the
quantity the RNN's log p(Y | X) estimates, is column 3 (index 2). Its counts field is
``count(target) count(source) count(pair)``; the source's count is the second number.
"""

from __future__ import annotations

import heapq
import os
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from infrastructure.files import display_name
from infrastructure.progress import progress_bar
from moses_integration.phrase_table import out_of_order_error, read_counts, read_phrase_table
from moses_integration.tokens import split_tokens

DIRECT_COLUMN = 2  # φ(e|f): p(target | source), 0-based


@dataclass
class SourceBlock:
    """All lines of one source phrase: its targets and their score columns."""

    source: str
    first_line: int
    targets: list[str]
    scores: np.ndarray  # [targets, columns] float64
    count: float  # the source's frequency: counts field, else the number of targets

    def top_by_column(self, column: int, k: int) -> list[tuple[str, float]]:
        """The k targets with the largest value in ``column`` (ties: table order)."""
        order = np.argsort(-self.scores[:, column], kind="stable")[:k]
        return [(self.targets[i], float(self.scores[i, column])) for i in order]


@dataclass
class TableSummary:
    """What an engineer checks first about a table."""

    path: str
    lines: int = 0
    sources: int = 0
    score_columns: int = 0
    has_counts: bool = True
    source_words: Counter = field(default_factory=Counter)  # words per source phrase -> sources
    target_words: Counter = field(default_factory=Counter)  # words per target phrase -> lines
    max_targets: int = 0

    @property
    def mean_targets(self) -> float:
        return self.lines / self.sources if self.sources else 0.0


@dataclass
class TableScan:
    summary: TableSummary
    frequent: list[SourceBlock]  # long sources for Table 2, most frequent first
    rare: list[SourceBlock]  # long sources for Table 2, rarest first
    sampled: list[SourceBlock]  # a uniform random sample of source blocks, in table order


def _blocks(path: str | os.PathLike[str], summary: TableSummary, progress: bool):
    """Yield one :class:`SourceBlock` per run of consecutive lines with the same source."""
    source: str | None = None
    first = 0
    targets: list[str] = []
    scores: list[list[float]] = []
    count: float | None = None
    entries = read_phrase_table(path)
    bar = progress_bar(entries, unit=" lines", unit_scale=True, show=progress, desc="reading table",
                       mininterval=1.0)
    name = display_name(path)
    previous = b""
    for entry in bar:
        if entry.raw < previous:  # a source's targets apart would be counted as two sources
            raise out_of_order_error(name, entry.line_no, "its sources' targets are read as runs of lines")
        previous = entry.raw
        counts = read_counts(entry, name)  # every line's: a damaged field is an error wherever it is
        if entry.source != source:
            if source is not None:
                yield SourceBlock(source, first, targets, np.array(scores), count if count else len(targets))
            source, first, targets, scores = entry.source, entry.line_no, [], []
            count = counts[1] if counts is not None else None
            if count is None:
                summary.has_counts = False
        target = entry.target
        targets.append(target)
        scores.append(entry.scores)
        summary.target_words[len(split_tokens(target))] += 1
    if source is not None:
        yield SourceBlock(source, first, targets, np.array(scores), count if count else len(targets))


def scan_table(
    path: str | os.PathLike[str],
    *,
    min_src_words: int = 4,
    n_chosen: int = 10,
    min_targets: int = 2,
    n_sampled: int = 0,
    seed: int = 1234,
    progress: bool = True,
) -> TableScan:
    """Read the table once: its summary, the ``n_chosen`` most frequent and the ``n_chosen``
    rarest long sources, and ``n_sampled`` random sources.

    Long sources have at least ``min_src_words`` words and ``min_targets`` targets. Ties among
    the most frequent go to the earlier in the table; ties among the rarest (there are many
    with count 1) to a seeded hash of the phrase, so a rerun picks the same ones. The random
    sample is a reservoir sample (Algorithm R) of whole source blocks.
    """
    summary = TableSummary(display_name(path))
    frequent: list[tuple[tuple[float, int], int, SourceBlock]] = []
    rare: list[tuple[tuple[float, int], int, SourceBlock]] = []
    reservoir: list[SourceBlock] = []
    rng = random.Random(seed)
    salt = seed.to_bytes(8, "little", signed=True)
    for index, block in enumerate(_blocks(path, summary, progress)):
        summary.lines += len(block.targets)
        summary.sources += 1
        summary.score_columns = block.scores.shape[1]
        summary.max_targets = max(summary.max_targets, len(block.targets))
        words = len(split_tokens(block.source))
        summary.source_words[words] += 1
        if n_sampled:
            if len(reservoir) < n_sampled:
                reservoir.append(block)
            else:
                slot = rng.randrange(index + 1)
                if slot < n_sampled:
                    reservoir[slot] = block
        if n_chosen and words >= min_src_words and len(block.targets) >= min_targets:
            _keep_best(frequent, ((block.count, -block.first_line), index, block), n_chosen)
            rare_key = (-block.count, zlib.crc32(salt + block.source.encode("utf-8")))
            _keep_best(rare, (rare_key, index, block), n_chosen)
    reservoir.sort(key=lambda block: block.first_line)
    return TableScan(summary, _best_first(frequent), _best_first(rare), reservoir)


def _keep_best(heap: list, item: tuple, size: int) -> None:
    """Keep the ``size`` items with the largest keys in a min-heap."""
    if len(heap) < size:
        heapq.heappush(heap, item)
    elif item[0] > heap[0][0]:
        heapq.heapreplace(heap, item)


def _best_first(heap: list) -> list[SourceBlock]:
    return [block for _, _, block in sorted(heap, key=lambda item: item[0], reverse=True)]
