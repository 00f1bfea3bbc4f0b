"""The proposals row's evidence, against counts made by hand on small files."""

from __future__ import annotations

from pathlib import Path

from moses_integration.phrase_coverage import Proposal
from table1.proposal_evidence import (
    TuningDecode,
    evidence_document,
    format_evidence,
    proposal_usage,
    read_proposals,
)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _files(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    listing = _write(tmp_path / "proposals.tsv", [
        "missing\tred house\tla maison rouge\t-2.000000",  # the listing is in the table's order
        "missing\tred house\tmaison rouge\t-1.500000",
        "thin\tcat\tchatte\t-0.700000",
        "missing\tblue sky\tciel bleu\t-1.000000",
    ])
    table = _write(tmp_path / "phrase-table", [
        "cat ||| chat ||| 0.5 0.5 0.5 0.5 ||| 0-0 ||| 2 2 2",
        "dog ||| chien ||| 0.5 0.5 0.5 0.5 ||| 0-0 ||| 2 2 2",
    ])
    src = _write(tmp_path / "test.en", ["the red house and the cat", "a cat , a red house"])
    ref = _write(tmp_path / "test.fr", ["la maison rouge et le chat", "une chatte , une maison"])
    return listing, table, src, ref


def test_the_listing_reads_by_source_in_its_order(tmp_path):
    listing, _, _, _ = _files(tmp_path)
    proposals = read_proposals(listing)
    assert proposals["cat"] == [Proposal("thin", "chatte", -0.7)]
    assert [p.target for p in proposals["red house"]] == ["la maison rouge", "maison rouge"]


def test_a_reranked_listing_reads_as_its_first_four_columns(tmp_path):
    """rescorer propose --reverse-model lists log p(f|e) and the p(e|f) column's ln after log p."""
    listing = _write(tmp_path / "proposals.tsv", ["missing\tred house\tla maison rouge\t-2.000000\t-3.5\t-0.25"])
    assert read_proposals(listing) == {"red house": [Proposal("missing", "la maison rouge", -2.0)]}


def test_usage_reads_each_sentences_first_hypothesis(tmp_path):
    nbest = _write(tmp_path / "test.nbest", [
        "0 ||| a b ||| LM0= -3 PhrasePenalty0= 2 TranslationModel0= -1 -1 -1 -1 -2 0 0.999999 ||| -4",
        "0 ||| a c ||| LM0= -3 PhrasePenalty0= 3 TranslationModel0= -1 -1 -1 -1 -2 0 2.99999 ||| -5",
        "1 ||| d ||| LM0= -3 PhrasePenalty0= 3 TranslationModel0= -1 -1 -1 -1 -2 0 1.99999 ||| -4",
        "2 ||| e ||| LM0= -3 PhrasePenalty0= 4 TranslationModel0= -1 -1 -1 -1 -2 0 0 ||| -4",
    ])
    usage = proposal_usage(nbest, "TranslationModel0", 6)
    assert (usage.sentences, usage.phrases, usage.proposed, usage.sentences_using_proposals) == (3, 9, 3, 2)


def test_the_report_section_shows_the_counts(tmp_path):
    listing, table, src, ref = _files(tmp_path)
    nbest = _write(tmp_path / "run1.test.tok.nbest", [
        "0 ||| x ||| PhrasePenalty0= 4 TranslationModel0= -1 -1 -1 -1 -2 0 0.999999 ||| -4",
        "1 ||| y ||| PhrasePenalty0= 4 TranslationModel0= -1 -1 -1 -1 -2 0 0 ||| -4",
    ])
    weights = {"TranslationModel0": [0.1, 0.1, 0.1, 0.1, 0.02, 0.0, -0.05]}
    doc = evidence_document(listing, table, src, ref, [(1, nbest, weights)], "TranslationModel0", 6)
    assert doc["proposals"] == 4 and doc["sources"] == 3 and doc["proposals_by_kind"] == {"missing": 3, "thin": 1}
    assert doc["runs"] == [{"run": 1, "indicator_weight": -0.05, "usage": {
        "sentences": 2, "phrases": 8, "proposed": 1, "sentences_using_proposals": 1}}]
    assert [e["source"] for e in doc["examples"]] == ["red house"]  # two words or more
    assert doc["examples"][0]["proposed"] == [["maison rouge", -1.5], ["la maison rouge", -2.0]]  # best first
    # proposed: red house -> 2 and 3 words, cat -> 1, blue sky -> 2; the table: 1 -> 1 word twice
    assert doc["lengths"]["proposed"] == {"pairs": 4, "source_words": 7, "target_words": 8, "shorter_targets": 0}
    assert doc["lengths"]["table"] == {"pairs": 2, "source_words": 2, "target_words": 2, "shorter_targets": 0}
    md = "\n".join(format_evidence(doc, "+ RNN + proposals"))
    assert "| 1 | -0.05 | 1 | 1 of 8 (12.5%) | 1 of 2 (50.0%) |" in md
    assert "| missing | 2 | 2 of 4 (50.0%) | 1 of 2 (50.0%) | – | 0 of 2 (0.0%) |" in md
    assert "| thin | 2 | 1 of 2 (50.0%) | 1 of 2 (50.0%) | 1 of 2 (50.0%) | 1 of 2 (50.0%) |" in md
    assert "| proposed | 4 | 1.75 | 2.00 | 1.143 | 0 of 4 (0.0%) |" in md


def test_the_section_shows_what_each_tuning_iteration_made_of_the_proposals(tmp_path):
    """With the indicator at 0 the dev 1-best takes proposals; MERT's negative weight drops them."""
    listing, table, src, ref = _files(tmp_path)
    first = _write(tmp_path / "run1.nbest", [
        "0 ||| x ||| PhrasePenalty0= 3 TranslationModel0= -1 -1 -1 -1 -2 0 2 ||| -4",
        "0 ||| z ||| PhrasePenalty0= 2 TranslationModel0= -1 -1 -1 -1 -2 0 0 ||| -5",  # not the 1-best
        "1 ||| y ||| PhrasePenalty0= 3 TranslationModel0= -1 -1 -1 -1 -2 0 1 ||| -4",
    ])
    second = _write(tmp_path / "run2.nbest", [
        "0 ||| z ||| PhrasePenalty0= 2 TranslationModel0= -1 -1 -1 -1 -2 0 0 ||| -5",
        "1 ||| w ||| PhrasePenalty0= 4 TranslationModel0= -1 -1 -1 -1 -2 0 0 ||| -4",
    ])
    start, tuned = ([0.1, 0.1, 0.1, 0.1, 0.0, 0.0, indicator] for indicator in (0.0, -0.5))
    decodes = [TuningDecode(1, 1, first, {"TranslationModel0": start}, 17.134),
               TuningDecode(1, 2, second, {"TranslationModel0": tuned}, 21.5),
               TuningDecode(1, 3, tmp_path / "run3.nbest", {"TranslationModel0": tuned}, 21.5)]  # no list: left out
    doc = evidence_document(listing, table, src, ref, [], "TranslationModel0", 6, decodes)
    assert [(row["iteration"], row["indicator_weight"], row["usage"]["proposed"]) for row in doc["tuning"]] == \
        [(1, 0.0, 3), (2, -0.5, 0)]
    md = "\n".join(format_evidence(doc, "+ RNN both directions + proposals"))
    assert "| 1 | 1 | 0 | 17.13 | 3 | 3 of 6 (50.0%) | 2 of 2 (100.0%) |" in md
    assert "| 1 | 2 | -0.5 | 21.50 | 0 | 0 of 6 (0.0%) | 0 of 2 (0.0%) |" in md


def test_without_tuning_decodes_the_section_has_no_such_lines(tmp_path):
    """Runs whose tuning folders kept no n-best lists: nothing to say, not an empty table."""
    listing, table, src, ref = _files(tmp_path)
    doc = evidence_document(listing, table, src, ref, [], "TranslationModel0", 6)
    assert doc["tuning"] == []
    assert "On dev, while MERT tuned" not in "\n".join(format_evidence(doc, "+ RNN + proposals"))
