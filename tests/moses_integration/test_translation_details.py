"""Moses' -translation-details report: the phrase pairs of each 1-best, read as Moses writes them."""

from __future__ import annotations

import gzip
import os

import pytest

from moses_integration.decoder import decode
from moses_integration.translation_details import PhrasePair, TranslationDetailsError, read_translation_details
from shared_paths import moses_bin_dir, shared_file

#: Two sentences in the layout moses/TranslationAnalysis.cpp writes (its trailing spaces kept);
#: the second drops a word (<EPSILON>).
REAL_EXCERPT = """
TRANSLATION HYPOTHESIS DETAILS:
         SOURCE: [0..1] the house
  TRANSLATED AS: la maison
  WORD ALIGNED: 0-0 1-1\x20
         SOURCE: [2..2] is
  TRANSLATED AS: est
  WORD ALIGNED: 0-0\x20

SOURCE/TARGET SPANS:
  SOURCE: 0-1 2
  TARGET: 0-1 2


SCORES (UNWEIGHTED/WEIGHTED):  core=(0.000,-3.000,2.000) weighted(TODO)

TRANSLATION HYPOTHESIS DETAILS:
         SOURCE: [1..1] well
  TRANSLATED AS: bien
  WORD ALIGNED: 0-0\x20
         SOURCE: [0..0] very
  TRANSLATED AS: <EPSILON>
  WORD ALIGNED:\x20

SOURCE/TARGET SPANS:
  SOURCE: 1 del(0)
  TARGET: 0


WORDS/PHRASES DROPPED:
	dropped=very

SCORES (UNWEIGHTED/WEIGHTED):  core=(0.000,-1.000,2.000) weighted(TODO)
"""


def test_reads_the_phrase_pairs_of_each_sentence_in_target_order(tmp_path):
    path = tmp_path / "details"
    path.write_text(REAL_EXCERPT, encoding="utf-8")
    first, second = read_translation_details(path)
    assert first.line_no == 2 and first.pairs == (PhrasePair(0, 1, "the house", "la maison"),
                                                  PhrasePair(2, 2, "is", "est"))
    assert second.pairs == (PhrasePair(1, 1, "well", "bien"), PhrasePair(0, 0, "very", ""))
    assert [p.span() for p in first.pairs] == ["0-1", "2"]
    assert first.choices() == {(0, 1, "la maison"), (2, 2, "est")}
    # the same pairs in another order are the same phrase choice
    gz = tmp_path / "details.gz"
    gz.write_bytes(gzip.compress(REAL_EXCERPT.replace("[0..1] the house\n  TRANSLATED AS: la maison",
                                                      "[0..1] the house\n  TRANSLATED AS: le foyer").encode()))
    other = read_translation_details(gz)
    assert other[0].choices() != first.choices() and other[1].choices() == second.choices()


@pytest.mark.parametrize(("text", "where", "reason"), [
    ("0 ||| la maison ||| LM0= -1 ||| -1\n", 1, "expected 'TRANSLATION HYPOTHESIS DETAILS:' first"),
    (REAL_EXCERPT.replace("  TRANSLATED AS: est\n", ""), 7, "expected '  TRANSLATED AS: ...' after the SOURCE line 6"),
    (REAL_EXCERPT.split("  TRANSLATED AS: bien")[0], 18, "the file ends after a SOURCE line"),
    (REAL_EXCERPT.replace("[0..1] the house", "[0..2] the house"), 3, r"span \[0..2\] does not cover the 2 source"),
])
def test_a_broken_file_names_its_line(tmp_path, text, where, reason):
    path = tmp_path / "details"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TranslationDetailsError, match=rf"^{path}:{where}: {reason}"):
        read_translation_details(path)


@pytest.mark.slow
@pytest.mark.moses
def test_real_moses_writes_one_block_per_sentence(tmp_path):
    """The fixture system decodes five test sentences with -translation-details: each block's pairs
    cover the source words once, at the positions their spans say, and their targets, in order,
    are the 1-best."""
    fixture = shared_file("fixtures/hansard-enfr")
    lines = (fixture / "data/test.tok.tc.en").read_text(encoding="utf-8").splitlines()[:5]
    source = tmp_path / "test5.en"
    source.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    result = decode(moses_bin_dir(), fixture / "filtered/moses.ini", source, tmp_path / "test5.1best",
                    details_path=tmp_path / "test5.details", threads=min(2, os.cpu_count() or 1))
    assert result.details == tmp_path / "test5.details"
    found = read_translation_details(result.details)
    outputs = result.output.read_text(encoding="utf-8").splitlines()
    assert len(found) == len(lines) == len(outputs)
    for sentence, line, output in zip(found, lines, outputs, strict=True):
        words = line.split()
        covered = sorted(i for p in sentence.pairs for i in range(p.start, p.end + 1))
        assert covered == list(range(len(words)))
        assert all(p.source == " ".join(words[p.start:p.end + 1]) for p in sentence.pairs)
        assert " ".join(p.target for p in sentence.pairs if p.target) == output
    assert not list(tmp_path.glob(".*.tmp"))  # the temp names were renamed
