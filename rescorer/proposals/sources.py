"""Which source phrases get proposals: every source of the table, or what a text needs.

One streaming pass over the table (:func:`table_statistics`) checks what the merge relies on and
gathers what the choice and the proposed lines need, before any search:

* the table is sorted as ``LC_ALL=C sort`` sorts whole lines (what Moses' training writes and what
  the merge keeps), with Moses' four score columns;
* its longest source phrase (the n-gram length of ``--for-text``), its distinct sources;
* how many of its words the model's shortlists hold (a model made for another table stops here);
* the geometric mean of each phrase-probability column over its singleton pairs (docs/proposals.md);
* how many of its pairs have an n-word source and an m-word target (the reranking's length prior);
* for ``--for-text``, the targets the table already has for each n-gram of the text.

A text n-gram the table lacks is *missing*; one it has with fewer than ``thin_below`` targets is
*thin*; the others are covered and get nothing. A source with a word outside the model's source
shortlist gets nothing either: the network would read ``[UNK]`` there, and its targets would
translate a word it never saw.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from infrastructure.files import PathArg, display_name
from infrastructure.lines import iter_text_lines
from moses_integration.phrase_table import PhraseTableError, out_of_order_error, read_counts, read_phrase_table
from moses_integration.tokens import split_tokens
from neural.vocab import Vocab

MOSES_COLUMNS = ("p(f|e)", "lex(f|e)", "p(e|f)", "lex(e|f)")
KINDS = ("missing", "thin", "table")  # a text n-gram the table lacks; one it covers thinly; --all-sources


@dataclass(frozen=True)
class SourceToFill:
    """A source phrase to propose targets for, with the targets the table already has for it."""

    source: str
    kind: str
    targets: frozenset[str] = frozenset()


@dataclass
class Skipped:
    """Sources left out for a word outside the model's source shortlist: how many, and one of them."""

    count: int = 0
    example: str | None = None

    def add(self, source: str) -> None:
        self.count += 1
        self.example = self.example or source


@dataclass
class TableStatistics:
    """What :func:`table_statistics` learnt about the table."""

    lines: int = 0
    sources: int = 0  # distinct source phrases
    max_source_words: int = 0
    max_target_words: int = 0
    source_tokens: int = 0
    source_known: int = 0  # source tokens in the model's source shortlist
    target_tokens: int = 0
    target_known: int = 0
    singletons: int = 0  # pairs with count 1 (the counts field's third number)
    log_sums: list[float] = field(default_factory=lambda: [0.0, 0.0])  # Σ ln p(f|e), Σ ln p(e|f) over them
    all_log_sums: list[float] = field(default_factory=lambda: [0.0, 0.0])  # the same over every line
    wanted_targets: dict[str, list[str]] = field(default_factory=dict)  # --for-text: the table's targets
    lengths: Counter[tuple[int, int]] = field(default_factory=Counter)  # (source words, target words): lines
    # With a reverse model (its source side reads the table's targets): the table's words it knows.
    reverse_target_known: int = 0  # target tokens in the reverse model's source shortlist
    reverse_source_known: int = 0  # source tokens in the reverse model's target shortlist

    def length_counts(self) -> np.ndarray:
        """``counts[n, m]``: the lines with an n-word source and an m-word target."""
        counts = np.zeros((self.max_source_words + 1, self.max_target_words + 1), dtype=np.int64)
        for (n, m), lines in self.lengths.items():
            counts[n, m] = lines
        return counts

    def phrase_probabilities(self) -> tuple[float, float]:
        """(p(f|e), p(e|f)) for a proposal: the geometric means over the table's singleton pairs.

        Over every pair when the table has no counts field (or no singleton).
        """
        n, sums = (self.singletons, self.log_sums) if self.singletons else (self.lines, self.all_log_sums)
        return math.exp(sums[0] / n), math.exp(sums[1] / n)

    @property
    def known_source_share(self) -> float:
        return self.source_known / self.source_tokens if self.source_tokens else 0.0

    @property
    def known_target_share(self) -> float:
        return self.target_known / self.target_tokens if self.target_tokens else 0.0


def table_statistics(path: PathArg, src_vocab: Vocab, tgt_vocab: Vocab, wanted: set[str] | frozenset[str] = frozenset(),
                     reverse: tuple[Vocab, Vocab] | None = None) -> TableStatistics:
    """One streaming pass over a table (module doc); a line out of order is an error at that line.

    ``reverse``: a reverse model's (source, target) shortlists, whose words are counted too.
    """
    name = display_name(path)
    scan = TableStatistics()
    previous = b""
    current_source: bytes | None = None
    keep: list[str] | None = None
    source_words = 0
    for entry in read_phrase_table(path):
        raw = entry.raw
        if raw < previous:
            raise out_of_order_error(name, entry.line_no, "proposals are merged into sorted order")
        previous = raw
        scores = entry.scores
        if len(scores) != len(MOSES_COLUMNS):
            raise PhraseTableError(name, entry.line_no, f"{len(scores)} scores: proposals fill Moses' four columns "
                                   f"{' '.join(MOSES_COLUMNS)}, so the input must be a table as Moses' training "
                                   "writes it (before rescoring)")
        scan.lines += 1
        if entry.fields[0] != current_source:
            current_source = entry.fields[0]
            words = split_tokens(entry.source)
            scan.sources += 1
            scan.max_source_words = max(scan.max_source_words, len(words))
            scan.source_tokens += len(words)
            scan.source_known += sum(src_vocab.is_known(w) for w in words)
            source_words = len(words)
            if reverse is not None:
                scan.reverse_source_known += sum(reverse[1].is_known(w) for w in words)
            keep = scan.wanted_targets.setdefault(entry.source, []) if entry.source in wanted else None
        target_words = split_tokens(entry.target)
        scan.max_target_words = max(scan.max_target_words, len(target_words))
        scan.target_tokens += len(target_words)
        scan.target_known += sum(tgt_vocab.is_known(w) for w in target_words)
        scan.lengths[source_words, len(target_words)] += 1
        if reverse is not None:
            scan.reverse_target_known += sum(reverse[0].is_known(w) for w in target_words)
        if keep is not None:
            keep.append(entry.target)
        _add_probabilities(scan, read_counts(entry, name), scores)
    return scan


def _add_probabilities(scan: TableStatistics, counts: tuple[float, ...] | None, scores: list[float]) -> None:
    """Sum ln p(f|e), ln p(e|f) (columns 1 and 3, floored as Moses floors them) over all and singleton pairs
    (``counts``: the line's counts field, :func:`read_counts`)."""
    logs = [max(math.log(scores[k]), -100.0) if scores[k] > 0 else -100.0 for k in (0, 2)]
    scan.all_log_sums[0] += logs[0]
    scan.all_log_sums[1] += logs[1]
    if counts is not None and len(counts) == 3 and counts[2] == 1:
        scan.singletons += 1
        scan.log_sums[0] += logs[0]
        scan.log_sums[1] += logs[1]


def text_ngrams(path: PathArg, max_words: int) -> dict[str, int]:
    """The n-grams (1..max_words tokens, Moses' tokenisation) of a tokenised text, with their counts."""
    counts: dict[str, int] = {}
    for _, line in iter_text_lines(path):
        words = split_tokens(line)
        for i in range(len(words)):
            for j in range(i + 1, min(len(words), i + max_words) + 1):
                gram = " ".join(words[i:j])
                counts[gram] = counts.get(gram, 0) + 1
    return counts


@dataclass
class Choice:
    """The sources chosen for a text, by kind, and why the others were left out."""

    to_fill: list[SourceToFill]
    ngrams: int = 0
    covered: int = 0  # in the table with at least thin_below targets
    skipped: Skipped = field(default_factory=Skipped)  # missing or thin, with a word outside the shortlist

    def count(self, kind: str) -> int:
        return sum(s.kind == kind for s in self.to_fill)


def choose_for_text(ngrams: dict[str, int], scan: TableStatistics, src_vocab: Vocab, thin_below: int) -> Choice:
    """The text's missing and thin n-grams whose words the model knows, sorted as the table is."""
    choice = Choice([], ngrams=len(ngrams))
    for gram in ngrams:
        targets = scan.wanted_targets.get(gram)
        if targets is not None and len(targets) >= thin_below:
            choice.covered += 1
            continue
        if not all(src_vocab.is_known(w) for w in gram.split(" ")):
            choice.skipped.add(gram)
            continue
        kind = "missing" if targets is None else "thin"
        choice.to_fill.append(SourceToFill(gram, kind, frozenset(targets or ())))
    choice.to_fill.sort(key=lambda s: source_key(s.source))
    return choice


def table_sources(path: PathArg, src_vocab: Vocab, skipped: Skipped) -> Iterator[SourceToFill]:
    """Every source of a (sorted) table with its targets, in table order, streamed block by block.

    A source with a word outside the model's source shortlist is not yielded but counted in ``skipped``.
    """
    source: str | None = None
    targets: list[str] = []
    for entry in read_phrase_table(path):
        text = entry.source
        if text != source:
            if source is not None:
                yield from _known(source, targets, src_vocab, skipped)
            source, targets = text, []
        targets.append(entry.target)
    if source is not None:
        yield from _known(source, targets, src_vocab, skipped)


def _known(source: str, targets: list[str], src_vocab: Vocab, skipped: Skipped) -> Iterator[SourceToFill]:
    if all(src_vocab.is_known(w) for w in split_tokens(source)):
        yield SourceToFill(source, "table", frozenset(targets))
    else:
        skipped.add(source)


def source_key(source: str) -> bytes:
    """The bytes a source's lines start with: sorting by them sorts the blocks as the lines sort."""
    return source.encode("utf-8") + b" ||| "
