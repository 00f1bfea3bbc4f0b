"""How a set of phrase pairs fits a parallel text: the pairs' lengths, and how many of the targets
proposed for a source occur in the reference sentence of each sentence whose source holds it.

table1's report reads the RNN's proposals by these (on the test set), and ``rescorer
rerank-weights`` chooses the reranking's weights by them on dev; they know nothing of any model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from infrastructure.lines import iter_text_lines, read_text_lines
from moses_integration.phrase_table import read_phrase_table
from moses_integration.tokens import split_tokens


@dataclass(frozen=True)
class Proposal:
    kind: str  # missing or thin (rescorer propose --for-text)
    target: str
    log_p: float


@dataclass
class Lengths:
    """Source and target words of a set of pairs: a target shorter than its source drops words
    (French runs about 12% longer than English on this project's dev set)."""

    pairs: int = 0
    source_words: int = 0
    target_words: int = 0
    shorter_targets: int = 0  # fewer target words than source words

    def add(self, source: str, target: str) -> None:
        ns, nt = len(split_tokens(source)), len(split_tokens(target))
        self.pairs += 1
        self.source_words += ns
        self.target_words += nt
        self.shorter_targets += nt < ns


def table_targets(table: Path, sources: set[str], lengths: Lengths | None = None) -> dict[str, list[str]]:
    """The table's targets of ``sources`` (one pass over the table), in its order; with ``lengths``,
    every pair's lengths are counted in the same pass."""
    found: dict[str, list[str]] = {}
    for entry in read_phrase_table(table):
        source, target = entry.source.strip(), entry.target.strip()
        if lengths is not None:
            lengths.add(source, target)
        if source in sources:
            found.setdefault(source, []).append(target)
    return found


@dataclass
class Overlap:
    """Targets checked against the reference sentence of each test sentence whose source holds them."""

    occurrences: int = 0  # (sentence, source) pairs: a source counted once per sentence
    proposed: int = 0  # proposed targets checked
    proposed_in_ref: int = 0
    occurrences_with_proposal_in_ref: int = 0
    table: int = 0  # the table's own targets for the same sources
    table_in_ref: int = 0
    occurrences_with_table_in_ref: int = 0


def _in_reference(target: str, padded_ref: str) -> bool:
    """Whether ``target`` occurs as whole tokens in the reference (padded with spaces)."""
    return f" {target} " in padded_ref


def reference_overlap(proposals: Mapping[str, Sequence[Proposal]], table: Mapping[str, Sequence[str]],
                      test_src: Path, test_ref: Path) -> dict[str, Overlap]:
    """Per kind: of each test sentence's sources that got proposals, how many proposed targets occur
    in that sentence's reference, against the table's targets for the same sources (a thin source
    has some; a missing one none)."""
    longest = max((len(split_tokens(s)) for s in proposals), default=0)
    refs = read_text_lines(test_ref)
    kinds: dict[str, Overlap] = {}
    for (_, line), ref in zip(iter_text_lines(test_src), refs, strict=True):
        words = split_tokens(line)
        grams = {" ".join(words[i:j]) for i in range(len(words))
                 for j in range(i + 1, min(len(words), i + longest) + 1)}
        padded = f" {' '.join(split_tokens(ref))} "
        for gram in sorted(grams & proposals.keys()):
            found = proposals[gram]
            o = kinds.setdefault(found[0].kind, Overlap())
            o.occurrences += 1
            hits = sum(_in_reference(p.target, padded) for p in found)
            o.proposed += len(found)
            o.proposed_in_ref += hits
            o.occurrences_with_proposal_in_ref += hits > 0
            own = table.get(gram, [])
            table_hits = sum(_in_reference(t, padded) for t in own)
            o.table += len(own)
            o.table_in_ref += table_hits
            o.occurrences_with_table_in_ref += table_hits > 0
    return kinds
