"""Shortlist vocabularies: id 0 = ``</s>``, id 1 = ``[UNK]``, ids 2..K = the K−1 most frequent words.

The paper (SPEC §1) keeps the 15,000 most frequent words per language and maps everything else to
``[UNK]``; the end-of-phrase symbol is added on top, so a shortlist of K words has K+1 ids.
``</s>`` is id 0 because the batching code pads with 0 and every padded position is masked anyway.

Words are the Moses-escaped tokens exactly as they appear in the phrase table or the tokenised
corpus (``&amp;``, ``&#124;`` ...). No other normalisation happens here: lowercasing or
unescaping would make the network score a different string from the one Moses looks up. Because
Moses escapes ``< > [ ]``, the literal strings ``</s>`` and ``[UNK]`` cannot be real tokens; if one
appears anyway it is treated as an unknown word rather than silently becoming a control symbol.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from infrastructure.lines import iter_text_lines
from moses_integration.tokens import split_tokens

__all__ = ["EOS", "UNK", "Vocab", "build_vocab_from_corpus", "count_tokens", "read_corpus_lines", "split_tokens"]

EOS = "</s>"
UNK = "[UNK]"
EOS_ID = 0
UNK_ID = 1
SPECIAL_WORDS: tuple[str, str] = (EOS, UNK)



class Vocab:
    """A shortlist mapping words to ids; immutable after construction.

    ``words[i]`` is the word with id ``i``; ``words[0] == "</s>"`` and ``words[1] == "[UNK]"``.
    """

    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    def __init__(self, words: Sequence[str]) -> None:
        words = list(words)
        if len(words) < 2 or words[0] != EOS or words[1] != UNK:
            raise ValueError(f"a Vocab's words must start with {EOS!r}, {UNK!r}; got {words[:2]!r}")
        index: dict[str, int] = {}
        for i, word in enumerate(words[2:], start=2):
            if not isinstance(word, str) or not word or split_tokens(word) != [word]:
                raise ValueError(f"vocabulary entry {i} is not a single non-empty token: {word!r}")
            if word in SPECIAL_WORDS:
                raise ValueError(f"vocabulary entry {i} repeats the reserved symbol {word!r}")
            if word in index:
                raise ValueError(f"vocabulary entry {i} duplicates entry {index[word]}: {word!r}")
            index[word] = i
        self._words: tuple[str, ...] = tuple(words)
        # Only real words are indexed, so the literal tokens "</s>"/"[UNK]" encode as [UNK].
        self._index = index

    @property
    def words(self) -> list[str]:
        """The words by id (a copy, so callers cannot break the word → id index)."""
        return list(self._words)

    @property
    def shortlist(self) -> int:
        """K: the number of real words plus ``[UNK]`` (``len(self) == K + 1`` with ``</s>``)."""
        return len(self._words) - 1

    def __len__(self) -> int:
        """Number of ids, i.e. the model's vocabulary size (``ModelConfig.*_vocab_size``)."""
        return len(self._words)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return self._words == other._words

    def __hash__(self) -> int:
        return hash(self._words)

    def __repr__(self) -> str:
        return f"Vocab(shortlist={self.shortlist}, ids={len(self)})"

    def is_known(self, word: str) -> bool:
        """True when ``word`` is in the shortlist, i.e. it is *not* scored as ``[UNK]``.

        This is what the word-penalty feature (SPEC §2) counts the complement of.
        """
        return word in self._index

    def encode(self, tokens: str | Iterable[str], *, add_eos: bool = False) -> list[int]:
        """Map tokens to ids, unknown ones to ``[UNK]`` (1).

        A ``str`` (a phrase-table field such as ``"la maison"``) is split as Moses splits it first;
        iterating over it character by character is never what a caller means. ``add_eos``
        appends ``</s>`` (0), which is how the model expects both source and target phrases.
        """
        if isinstance(tokens, str):
            tokens = split_tokens(tokens)
        get = self._index.get
        ids = [get(token, UNK_ID) for token in tokens]
        if add_eos:
            ids.append(EOS_ID)
        return ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids back to words (for debugging and tests; unknown words come back as ``[UNK]``)."""
        return [self._words[i] for i in ids]

    @staticmethod
    def count_tokens(lines: Iterable[str]) -> Counter[str]:
        """Token frequencies over Moses-tokenised lines (one phrase or sentence each)."""
        counts: Counter[str] = Counter()
        for line in lines:
            counts.update(split_tokens(line))
        return counts

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], shortlist: int = 15000) -> Vocab:
        """Keep the ``shortlist − 1`` most frequent words (plus ``[UNK]``: K = ``shortlist``).

        Ties are broken by the word itself (code-point order) so the same counts always give the
        same ids, whatever order the counter was filled in — a checkpoint's vocabulary must be
        reproducible from the data. The reserved strings and non-positive counts are skipped.
        """
        if isinstance(shortlist, bool) or not isinstance(shortlist, int) or shortlist < 1:
            raise ValueError(f"shortlist must be an integer >= 1 (it includes [UNK]), got {shortlist!r}")
        candidates = [
            (word, count)
            for word, count in counts.items()
            if count > 0 and word not in SPECIAL_WORDS and split_tokens(word) == [word]
        ]
        candidates.sort(key=lambda item: (-item[1], item[0]))
        return cls([EOS, UNK, *(word for word, _ in candidates[: shortlist - 1])])

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (a list of str) so checkpoints stay loadable with ``weights_only=True``."""
        return {"words": list(self._words)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Vocab:
        """Inverse of :meth:`to_dict`; rejects unknown keys like the config classes do."""
        if not isinstance(data, Mapping):
            raise TypeError(f"Vocab.from_dict expects a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {"words"})
        if unknown:
            raise ValueError(f"unknown Vocab key(s): {', '.join(map(str, unknown))} (known keys: words)")
        if "words" not in data:
            raise ValueError("missing Vocab key: words")
        return cls(data["words"])


count_tokens = Vocab.count_tokens


def read_corpus_lines(path: str | os.PathLike[str]) -> Iterator[str]:
    """Stream the lines of a UTF-8 text file (plain or gzip, by content), line ends removed."""
    return (line for _, line in iter_text_lines(path))


def build_vocab_from_corpus(path: str | os.PathLike[str], shortlist: int = 15000) -> Vocab:
    """Count the tokens of a tokenised corpus (one sentence per line) and keep the shortlist."""
    return Vocab.from_counts(Vocab.count_tokens(read_corpus_lines(path)), shortlist=shortlist)
