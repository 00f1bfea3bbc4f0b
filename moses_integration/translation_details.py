"""Moses' ``-translation-details`` report (``-T FILE``): how each 1-best was built from phrase pairs.

A 1-best string does not say which phrase pairs made it: two systems can print the same words
from different pairs, or different words in another order from the same pairs. The report
Moses writes with ``-T`` does (``moses/TranslationAnalysis.cpp``). For each input sentence, in
input order, it writes one block::

    <blank line>
    TRANSLATION HYPOTHESIS DETAILS:
             SOURCE: [0..1] le chat
      TRANSLATED AS: the cat
      WORD ALIGNED: 0-0 1-1
    ... one SOURCE / TRANSLATED AS / WORD ALIGNED triple per phrase pair, in target order

    SOURCE/TARGET SPANS:
      SOURCE: 0-1 ...
      TARGET: 0-1 ...

    (LM statistics and WORDS/PHRASES DROPPED, when there are some)
    SCORES (UNWEIGHTED/WEIGHTED): ...

Source spans are 0-based and inclusive (``[2..2]`` is the third word). A pair that drops its
source words is translated as ``<EPSILON>``; we keep it with an empty target. Moses prints every
factor of a word, joined by ``|``: an unknown word, passed through, is ``Wingsuit|UNK|UNK|UNK``.
The systems here have one factor (and Moses' tokeniser escapes a literal ``|`` as ``&#124;``), so
each word is read as its first factor, the word the 1-best shows. Only the phrase pairs are read:
the rest repeats what the n-best list holds. A sentence with no words gets a block with no pairs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from infrastructure.errors import FileLineError
from infrastructure.files import PathArg, display_name
from infrastructure.lines import iter_text_lines
from moses_integration.tokens import split_tokens

HEADER = "TRANSLATION HYPOTHESIS DETAILS:"
SPANS = "SOURCE/TARGET SPANS:"
EPSILON = "<EPSILON>"  # Moses' target for a pair that drops its source words
FACTOR_DELIMITER = "|"  # Moses' default, between the factors of a word

_SOURCE = re.compile(r" +SOURCE: \[(\d+)\.\.(\d+)\] (.*)")
_TARGET = re.compile(r" +TRANSLATED AS: (.*)")


class TranslationDetailsError(FileLineError):
    """A translation-details file that is not what Moses writes (names the file and line)."""


@dataclass(frozen=True)
class PhrasePair:
    """One phrase pair of a 1-best: source words ``start..end`` (0-based, inclusive) -> ``target``."""

    start: int
    end: int
    source: str
    target: str  # "" where the pair drops its source words (Moses' <EPSILON>)

    @property
    def choice(self) -> tuple[int, int, str]:
        """What identifies the choice: the source span and the target phrase chosen for it."""
        return (self.start, self.end, self.target)

    def span(self) -> str:
        """``3`` or ``3-5``: the source words covered, 0-based as Moses numbers them."""
        return str(self.start) if self.start == self.end else f"{self.start}-{self.end}"


@dataclass(frozen=True)
class DetailedTranslation:
    """The phrase pairs of one sentence's 1-best, in target order; ``line_no``: its block's header."""

    line_no: int
    pairs: tuple[PhrasePair, ...]

    def choices(self) -> frozenset[tuple[int, int, str]]:
        """The set of (source span, target phrase) chosen: equal sets mean the same phrase choice,
        whatever order the pairs were put in."""
        return frozenset(p.choice for p in self.pairs)


def iter_translation_details(path: PathArg) -> Iterator[DetailedTranslation]:
    """The sentences of a ``-translation-details`` file (plain or gzip), in input order.

    Raises :class:`TranslationDetailsError` at the first line that breaks the format: text before
    the first block, a SOURCE line without its TRANSLATED AS line, or a span that does not count
    the words it names.
    """
    name = display_name(path)
    header_line: int | None = None
    pairs: list[PhrasePair] = []
    in_pairs = False
    pending: tuple[int, re.Match[str]] | None = None  # a SOURCE line waiting for its TRANSLATED AS
    for line_no, line in iter_text_lines(path, error=TranslationDetailsError):
        if pending is not None:
            target = _TARGET.fullmatch(line)
            if target is None:
                raise TranslationDetailsError(name, line_no, f"expected '  TRANSLATED AS: ...' after the SOURCE "
                                              f"line {pending[0]}, got {line[:80]!r}")
            pairs.append(_pair(name, *pending, target.group(1)))
            pending = None
            continue
        if line == HEADER:
            if header_line is not None:
                yield DetailedTranslation(header_line, tuple(pairs))
            header_line, pairs, in_pairs = line_no, [], True
            continue
        if header_line is None:
            if line.strip():
                raise TranslationDetailsError(name, line_no, f"expected {HEADER!r} first (is this a Moses "
                                              f"-translation-details file?), got {line[:80]!r}")
            continue
        if line == SPANS:
            in_pairs = False
        elif in_pairs and (source := _SOURCE.fullmatch(line)) is not None:
            pending = (line_no, source)
    if pending is not None:
        raise TranslationDetailsError(name, pending[0], "the file ends after a SOURCE line (truncated?)")
    if header_line is not None:
        yield DetailedTranslation(header_line, tuple(pairs))


def read_translation_details(path: PathArg) -> list[DetailedTranslation]:
    """Every sentence of a ``-translation-details`` file (one per decoded input line)."""
    return list(iter_translation_details(path))


def _pair(name: str, line_no: int, source: re.Match[str], target: str) -> PhrasePair:
    start, end, words = int(source.group(1)), int(source.group(2)), _first_factors(source.group(3))
    count = len(split_tokens(words))
    if end < start or count != end - start + 1:
        raise TranslationDetailsError(name, line_no, f"span [{start}..{end}] does not cover the "
                                      f"{count} source word(s) {words[:80]!r}")
    return PhrasePair(start, end, words, "" if target == EPSILON else _first_factors(target))


def _first_factors(phrase: str) -> str:
    """The words of a phrase as the 1-best shows them: each word's first factor."""
    return " ".join(word.split(FACTOR_DELIMITER, 1)[0] for word in split_tokens(phrase))
