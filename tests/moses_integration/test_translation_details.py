"""Moses' -translation-details report: the phrase pairs of each 1-best, read as Moses writes them."""

from __future__ import annotations

import gzip

import pytest

from moses_integration.decoder import decode
from moses_integration.tokens import split_tokens
from moses_integration.translation_details import PhrasePair, TranslationDetailsError, read_translation_details
from shared_paths import moses_bin_dir, shared_file

#: Moses' real report, verbatim (this build, on the fixture system of ../shared, run from its filtered/
#: folder: `printf 'the house .\n\nit is .\n' | moses -f moses.ini -T FILE`): an unknown word passed
#: through with its factors, an empty line, a 3-word pair.
REAL_EXCERPT = "\n".join([
    "",
    "TRANSLATION HYPOTHESIS DETAILS:",
    "         SOURCE: [0..0] the",
    "  TRANSLATED AS: le",
    "  WORD ALIGNED: 0-0 ",
    "         SOURCE: [1..1] house",
    "  TRANSLATED AS: house|UNK|UNK|UNK",
    "  WORD ALIGNED: 0-0 ",
    "         SOURCE: [2..2] .",
    "  TRANSLATED AS: .",
    "  WORD ALIGNED: 0-0 ",
    "",
    "SOURCE/TARGET SPANS:",
    "  SOURCE: 0 1 2",
    "  TARGET: 0 1 2",
    "",
    "",
    "SCORES (UNWEIGHTED/WEIGHTED): core=(-100.000,-3.000,3.000,-0.610,-0.698,-1.618,-1.429,"
    "-0.797,0.000,0.000,-0.270,0.000,0.000,0.000,-24.526)  weighted(TODO)",
    "",
    "TRANSLATION HYPOTHESIS DETAILS:",
    "",
    "SOURCE/TARGET SPANS:",
    "  SOURCE:",
    "  TARGET:",
    "",
    "",
    "SCORES (UNWEIGHTED/WEIGHTED): core=(0.000,0.000,0.000,0.000,0.000,0.000,0.000,0.000,"
    "0.000,0.000,0.000,0.000,0.000,0.000,0.000)  weighted(TODO)",
    "",
    "TRANSLATION HYPOTHESIS DETAILS:",
    "         SOURCE: [0..2] it is .",
    "  TRANSLATED AS: il est .",
    "  WORD ALIGNED: 0-0 1-1 2-2 ",
    "",
    "SOURCE/TARGET SPANS:",
    "  SOURCE: 0-1-2",
    "  TARGET: 0-1-2",
    "",
    "",
    "SCORES (UNWEIGHTED/WEIGHTED): core=(0.000,-3.000,1.000,0.000,-2.011,-2.773,-2.296,"
    "-0.511,0.000,0.000,0.000,0.000,0.000,0.000,-12.084)  weighted(TODO)",
]) + "\n"


def test_reads_the_phrase_pairs_of_each_sentence_in_target_order(tmp_path):
    path = tmp_path / "details"
    path.write_text(REAL_EXCERPT, encoding="utf-8")
    first, empty, third = read_translation_details(path)
    # the unknown word is read as the 1-best shows it: its first factor
    assert first.line_no == 2 and first.pairs == (PhrasePair(0, 0, "the", "le"), PhrasePair(1, 1, "house", "house"),
                                                  PhrasePair(2, 2, ".", "."))
    assert empty.line_no == 20 and empty.pairs == ()
    assert third.line_no == 29 and third.pairs == (PhrasePair(0, 2, "it is .", "il est ."),)
    assert [p.span() for p in first.pairs + third.pairs] == ["0", "1", "2", "0-2"]
    assert third.choices() == {(0, 2, "il est .")}


def test_a_phrase_choice_is_the_set_of_pairs_whatever_their_order(tmp_path):
    """Edited copies of the real excerpt (gzipped, as a reader may meet them): the first two pairs
    swapped are the same choice; another target, or a dropped word (<EPSILON>), is another."""
    first = read_translation_details(_written(tmp_path / "real.gz", REAL_EXCERPT))[0]
    le = "         SOURCE: [0..0] the\n  TRANSLATED AS: le\n  WORD ALIGNED: 0-0 \n"
    house = "         SOURCE: [1..1] house\n  TRANSLATED AS: house|UNK|UNK|UNK\n  WORD ALIGNED: 0-0 \n"
    assert le + house in REAL_EXCERPT
    swapped = REAL_EXCERPT.replace(le + house, house + le)
    variants = {"swapped": swapped, "other": REAL_EXCERPT.replace("AS: le\n", "AS: la\n"),
                "dropped": REAL_EXCERPT.replace("AS: .\n", "AS: <EPSILON>\n", 1)}
    read = {k: read_translation_details(_written(tmp_path / f"{k}.gz", v))[0] for k, v in variants.items()}
    assert [p.target for p in read["swapped"].pairs] == ["house", "le", "."]
    assert read["swapped"].choices() == first.choices()
    assert read["other"].choices() == first.choices() - {(0, 0, "le")} | {(0, 0, "la")}
    assert read["dropped"].pairs[2] == PhrasePair(2, 2, ".", "")


def _written(path, text: str):
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    return path


@pytest.mark.parametrize(("text", "where", "reason"), [
    ("0 ||| le house . ||| LM0= -1 ||| -1\n", 1, "expected 'TRANSLATION HYPOTHESIS DETAILS:' first"),
    (REAL_EXCERPT.replace("  TRANSLATED AS: le\n", ""), 4,
     "expected '  TRANSLATED AS: ...' after the SOURCE line 3, got '  WORD ALIGNED: 0-0 '"),
    (REAL_EXCERPT.split("  TRANSLATED AS: il est .")[0], 30, "the file ends after a SOURCE line"),
    (REAL_EXCERPT.replace("[0..2] it is .", "[0..1] it is ."), 30, r"span \[0..1\] does not cover the 3 source"),
])
def test_a_broken_file_names_its_line(tmp_path, text, where, reason):
    path = tmp_path / "details"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TranslationDetailsError, match=rf"^{path}:{where}: {reason}"):
        read_translation_details(path)


@pytest.mark.slow
@pytest.mark.moses
def test_real_moses_writes_one_block_per_sentence(tmp_path):
    """The fixture system decodes five test sentences and an empty line, on 2 threads, with
    -translation-details: one block per line in input order, each block's pairs cover the source
    words once, at the positions their spans say, and their targets, in order, are the 1-best."""
    fixture = shared_file("fixtures/hansard-enfr")
    test = (fixture / "data/test.tok.tc.en").read_text(encoding="utf-8").splitlines()
    lines = test[:4] + [""] + test[4:5]
    source = tmp_path / "test6.en"
    source.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    result = decode(moses_bin_dir(), fixture / "filtered/moses.ini", source, tmp_path / "test6.1best",
                    details_path=tmp_path / "test6.details", threads=2)
    assert result.details == tmp_path / "test6.details"
    found = read_translation_details(result.details)
    outputs = result.output.read_text(encoding="utf-8").splitlines()
    assert len(found) == len(lines) == len(outputs)
    for sentence, line, output in zip(found, lines, outputs, strict=True):
        words = split_tokens(line)
        covered = sorted(i for p in sentence.pairs for i in range(p.start, p.end + 1))
        assert covered == list(range(len(words)))
        assert all(split_tokens(p.source) == words[p.start:p.end + 1] for p in sentence.pairs)
        assert [w for p in sentence.pairs for w in split_tokens(p.target)] == split_tokens(output)
    assert found[4].pairs == () and any(len(p.source.split()) > 1 for s in found for p in s.pairs)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["test6.1best", "test6.1best.log", "test6.details",
                                                          "test6.en"]
