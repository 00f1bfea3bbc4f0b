"""Lexical weights of a proposed pair, from the word tables Moses' training writes.

``train-model.perl`` step 4 writes two word translation tables beside the phrase table
(``scripts/training/LexicalTranslationModel.pm``): ``lex.f2e`` holds lines ``e f w(e|f)`` and
``lex.e2f`` lines ``f e w(f|e)``, with f the source language, e the target, and ``NULL`` standing
for "unaligned" on either side. Moses' ``score`` (``phrase-extract/score-main.cpp``,
``computeLexicalTranslation``) turns them into the table's lexical weights (Koehn et al. 2003):

    lex(e|f, a) = Π_i  mean_{j:(j,i)∈a} w(e_i | f_j),   or w(e_i | NULL) when e_i is unaligned,

and lex(f|e, a) the same way from ``lex.e2f`` over the source words. ``score`` takes the
alignment from the word-aligned training data; a proposed pair has none, so one is derived here:
each target word e_i is linked to the source word f_j with the largest w(e_i|f_j) · w(f_j|e_i),
the pair both directions of the training alignment support best (the product is 0, so no link,
for words never aligned to each other). Unlinked words are explained by ``NULL`` as in ``score``.

A pair the tables lack scores as Moses' ``score`` never has to score it: for ``NULL`` links of a
word never seen unaligned, the weight is the smallest w in that file (the least support the
training data gives any word pair), not ``score``'s permissive 1.0, which would make a proposal's
unexplained words free.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from infrastructure.errors import FileLineError
from infrastructure.files import display_name
from infrastructure.lines import iter_text_lines
from moses_integration.tokens import split_tokens

NULL = "NULL"


class LexFileError(FileLineError):
    """A word table Moses' training would not have written: ``path:line: reason``."""


@dataclass
class WordTable:
    """One of ``lex.f2e`` / ``lex.e2f``: w(word | given) for the pairs the file lists."""

    path: str
    probs: dict[tuple[str, str], float] = field(default_factory=dict)  # (given, word) -> w(word | given)
    floor: float = 1.0  # the smallest w in the file

    def get(self, given: str, word: str) -> float | None:
        return self.probs.get((given, word))

    def null(self, word: str) -> float:
        """w(word | NULL), or the file's smallest weight for a word never seen unaligned."""
        return self.probs.get((NULL, word), self.floor)


def read_word_table(path: str | os.PathLike[str]) -> WordTable:
    """Read ``WORD GIVEN PROB`` lines (3 tokens, 0 < PROB ≤ 1); a bad line is an error at its line.

    Moses' ``score`` skips a malformed line with a warning; here it stops the run before any
    search, since a table cut short would silently change every lexical weight.
    """
    name = display_name(path)
    table = WordTable(name)
    if not os.path.isfile(path):
        raise LexFileError(name, None, "no such word translation table (train-model.perl step 4 writes "
                           "lex.e2f and lex.f2e beside the phrase table)")
    floor = math.inf
    for line_no, line in iter_text_lines(path, error=LexFileError):
        tokens = split_tokens(line)  # ASCII space and tab only, as Moses splits (SPEC §3)
        if len(tokens) != 3:
            raise LexFileError(name, line_no, f"expected 'word given probability', found {len(tokens)} fields")
        try:
            prob = float(tokens[2])
        except ValueError:
            raise LexFileError(name, line_no, f"probability {tokens[2]!r} is not a number") from None
        if not 0 < prob <= 1:
            raise LexFileError(name, line_no, f"probability {tokens[2]} is not in (0, 1]")
        table.probs[(tokens[1], tokens[0])] = prob
        floor = min(floor, prob)
    if not table.probs:
        raise LexFileError(name, None, "the word translation table is empty")
    table.floor = floor
    return table


@dataclass(frozen=True)
class LexicalScores:
    """The two lexical columns of a pair and the alignment they were computed with."""

    source_given_target: float  # lex(f|e), the table's 2nd column
    target_given_source: float  # lex(e|f), the table's 4th column
    alignment: tuple[tuple[int, int], ...]  # (source index, target index), sorted as Moses writes them

    def alignment_field(self) -> str:
        return " ".join(f"{j}-{i}" for j, i in self.alignment)


def lexical_scores(source: Sequence[str], target: Sequence[str], f2e: WordTable, e2f: WordTable) -> LexicalScores:
    """Koehn et al.'s lexical weights of (source, target) under the derived alignment (module doc)."""
    links: list[tuple[int, int]] = []
    for i, e in enumerate(target):
        best, best_j = 0.0, None
        for j, f in enumerate(source):
            forward, backward = f2e.get(f, e), e2f.get(e, f)
            if forward is not None and backward is not None and forward * backward > best:
                best, best_j = forward * backward, j
        if best_j is not None:
            links.append((best_j, i))
    links.sort()
    return LexicalScores(_weight(source, target, links, e2f),
                         _weight(target, source, [(i, j) for j, i in links], f2e), tuple(links))


def _weight(words: Sequence[str], others: Sequence[str], links: list[tuple[int, int]], table: WordTable) -> float:
    """Π over ``words`` of the mean w(word | linked other word), or w(word | NULL) when unlinked.

    ``links`` are (index in ``words``, index in ``others``); ``table`` maps (other, word).
    """
    linked: dict[int, list[int]] = {}
    for k, other in links:
        linked.setdefault(k, []).append(other)
    weight = 1.0
    for k, word in enumerate(words):
        if k not in linked:
            weight *= table.null(word)
            continue
        values = [table.get(others[o], word) for o in linked[k]]
        # Links are made only where both tables hold the pair, so each value exists.
        weight *= sum(v for v in values if v is not None) / len(values)
    return weight
