"""Shortlist vocabularies: ids, [UNK] mapping, deterministic ties, serialisation, corpora."""

from __future__ import annotations

import gzip
import random
from collections import Counter
from pathlib import Path

import pytest

from neural.vocab import EOS, UNK, Vocab, build_vocab_from_corpus, count_tokens, split_tokens


def test_shortlist_keeps_k_minus_one_most_frequent_words() -> None:
    counts = Counter({f"w{i}": 1000 - i for i in range(100)})
    vocab = Vocab.from_counts(counts, shortlist=10)
    assert vocab.shortlist == 10  # 9 words + [UNK]
    assert len(vocab) == 11  # + </s>
    assert vocab.words[:2] == [EOS, UNK]
    assert vocab.words[2:] == [f"w{i}" for i in range(9)]
    assert vocab.eos_id == 0 and vocab.unk_id == 1


def test_small_corpus_gives_a_smaller_vocabulary() -> None:
    vocab = Vocab.from_counts(Counter({"a": 2, "b": 1}), shortlist=15000)
    assert vocab.words == [EOS, UNK, "a", "b"]
    assert vocab.shortlist == 3


def test_unknown_words_map_to_unk_and_phrases_split_like_moses() -> None:
    vocab = Vocab.from_counts(Counter({"la": 5, "maison": 4, "&amp;": 3, "rare": 1}), shortlist=4)
    assert vocab.encode(["la", "maison", "rare", "chat"]) == [2, 3, 1, 1]
    assert vocab.encode("la maison &amp;", add_eos=True) == [2, 3, 4, 0]
    assert vocab.is_known("&amp;") and not vocab.is_known("&")  # escaped tokens, no unescaping
    assert not vocab.is_known("rare")
    assert vocab.encode("La") == [1]  # no lowercasing either
    # the reserved strings are never real words, so they cannot smuggle in </s>
    assert vocab.encode([EOS, UNK]) == [1, 1]
    assert not vocab.is_known(EOS) and not vocab.is_known(UNK)
    # a no-break space is part of a Moses token, not a separator
    assert split_tokens("a\u00a0b  c\td") == ["a\u00a0b", "c", "d"]
    assert vocab.decode(vocab.encode("la chat")) == ["la", UNK]


def test_ties_are_broken_by_word_whatever_the_insertion_order() -> None:
    items = [("zeta", 3), ("alpha", 3), ("mid", 3), ("top", 9), ("beta", 3), ("low", 1)]
    vocabs = []
    for seed in range(5):
        random.Random(seed).shuffle(items)
        vocabs.append(Vocab.from_counts(Counter(dict(items)), shortlist=4))
    assert all(v == vocabs[0] for v in vocabs)
    assert vocabs[0].words == [EOS, UNK, "top", "alpha", "beta"]


def test_count_tokens_and_reserved_strings_are_not_counted() -> None:
    counts = count_tokens(["a b a", "  b c", "", "</s> [UNK] a"])
    assert counts == Counter({"a": 3, "b": 2, "c": 1, "</s>": 1, "[UNK]": 1})
    assert Vocab.count_tokens(["x"]) == Counter({"x": 1})
    vocab = Vocab.from_counts(counts, shortlist=100)
    assert vocab.words == [EOS, UNK, "a", "b", "c"]


def test_dict_round_trip_and_strict_from_dict() -> None:
    vocab = Vocab.from_counts(Counter({"é": 3, "&#124;": 2, "x": 2}), shortlist=50)
    data = vocab.to_dict()
    assert data == {"words": [EOS, UNK, "é", "&#124;", "x"]}
    restored = Vocab.from_dict(data)
    assert restored == vocab and restored.encode("x é") == vocab.encode("x é")
    with pytest.raises(ValueError, match="unknown Vocab key"):
        Vocab.from_dict({"words": data["words"], "extra": 1})
    with pytest.raises(ValueError, match="must start with"):
        Vocab.from_dict({"words": ["a", "b"]})
    with pytest.raises(ValueError, match="duplicates"):
        Vocab([EOS, UNK, "a", "a"])
    with pytest.raises(ValueError, match="single non-empty token"):
        Vocab([EOS, UNK, "two words"])


def test_words_property_cannot_corrupt_the_vocabulary() -> None:
    vocab = Vocab([EOS, UNK, "a"])
    vocab.words.append("b")
    assert len(vocab) == 3 and vocab.encode("b") == [1]


@pytest.mark.parametrize("compressed", [True, False])
def test_build_vocab_from_corpus(tmp_path: Path, compressed: bool) -> None:
    text = "le chat été\nle chien\n\nle chat\n".encode()
    path = tmp_path / "corpus.txt"  # gzip is detected by content, not by the suffix
    path.write_bytes(gzip.compress(text) if compressed else text)
    vocab = build_vocab_from_corpus(path, shortlist=3)
    assert vocab.words == [EOS, UNK, "le", "chat"]


def test_corpus_made_of_concatenated_gzip_members(tmp_path: Path) -> None:
    path = tmp_path / "corpus.gz"
    path.write_bytes(gzip.compress(b"a b\n") + gzip.compress(b"b c\nb\n"))
    assert build_vocab_from_corpus(path, shortlist=15000).words == [EOS, UNK, "b", "a", "c"]


def test_corpus_with_invalid_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: not valid UTF-8"):
        build_vocab_from_corpus(path)


def test_crlf_corpus_gives_the_same_words_as_lf(tmp_path: Path) -> None:
    lf, crlf = tmp_path / "lf.txt", tmp_path / "crlf.txt"
    lf.write_bytes("le chat\nle chien\nla\u00a0maison\n".encode())
    crlf.write_bytes("le chat\r\nle chien\r\nla\u00a0maison\r\n".encode())
    words = build_vocab_from_corpus(crlf, shortlist=100).words
    assert words == build_vocab_from_corpus(lf, shortlist=100).words
    assert "chat" in words and "la\u00a0maison" in words and not any(w.endswith("\r") for w in words)
