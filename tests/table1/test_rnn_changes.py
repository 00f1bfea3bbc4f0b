"""Where + RNN's test 1-best differs from Baseline's: shares and chosen sentences on hand-made decodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrastructure.lines import read_text_lines
from mert.evaluate import decode_test_set
from moses_integration.moses_ini import MosesIni
from moses_integration.translation_details import TranslationDetailsError
from shared_paths import moses_bin_dir, shared_file
from table1.analysis import DecodedRun, format_rnn_changes, rnn_changes_document
from table1.tuning import details_output

Pairs = list[tuple[int, int, str, str]]  # (first source word, last, source words, target phrase)


def write_details(path: Path, sentences: list[Pairs]) -> Path:
    """A ``-translation-details`` file as Moses writes it (moses/TranslationAnalysis.cpp)."""
    blocks = []
    for pairs in sentences:
        lines = ["", "TRANSLATION HYPOTHESIS DETAILS:"]
        for start, end, source, target in pairs:
            lines += [f"         SOURCE: [{start}..{end}] {source}", f"  TRANSLATED AS: {target}", "  WORD ALIGNED: "]
        lines += ["", "SOURCE/TARGET SPANS:", "  SOURCE: 0", "  TARGET: 0", "", "",
                  "SCORES (UNWEIGHTED/WEIGHTED):  core=(0.000,-1.000) weighted(TODO)"]
        blocks.append("\n".join(lines) + "\n")
    path.write_text("".join(blocks), encoding="utf-8")
    return path


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    return path


SOURCE = ["a b", "c d", "e f", "g h", "i j", "k l"]
BASELINE: list[Pairs] = [
    [(0, 1, "a b", "A B")], [(0, 0, "c", "C"), (1, 1, "d", "D")], [(0, 0, "e", "E"), (1, 1, "f", "F")],
    [(0, 1, "g h", "G H")], [(0, 0, "i", "I"), (1, 1, "j", "J")], [(0, 1, "k l", "K L")]]
RNN: list[Pairs] = [
    BASELINE[0],
    [(1, 1, "d", "D"), (0, 0, "c", "C")],  # the same pairs in another order: 1-best changed, phrase choice not
    [(0, 1, "e f", "E F")],  # the same words from another segmentation: phrase choice changed, 1-best not
    [(0, 1, "g h", "X")],  # both changed
    [(0, 0, "i", "Y"), (1, 1, "j", "J")],  # both changed, one pair of two
    BASELINE[5]]


def one_best(sentences: list[Pairs]) -> list[str]:
    return [" ".join(target for *_, target in pairs) for pairs in sentences]


def decodes(tmp_path: Path) -> tuple[list[DecodedRun], list[DecodedRun], Path, Path]:
    """Run 1 of both rows with details; run 2 decoded before the details were kept (+ RNN differs on
    its last sentence only); + RNN's run 3 has no Baseline run to pair with."""
    base, rnn = [], []
    for run, b, r in ((1, BASELINE, RNN), (2, BASELINE, BASELINE[:5] + [[(0, 1, "k l", "Z")]])):
        for row, found, sentences in (("base", base, b), ("rnn", rnn, r)):
            output = write_lines(tmp_path / f"{row}{run}.tok", one_best(sentences))
            details = tmp_path / f"{row}{run}.tok.details"
            if run == 1:
                write_details(details, sentences)
            found.append(DecodedRun(run, 999 + run, output, details))
    rnn.append(DecodedRun(3, 1002, write_lines(tmp_path / "rnn3.tok", one_best(RNN)), tmp_path / "rnn3.tok.details"))
    source = write_lines(tmp_path / "test.en", SOURCE)
    reference = write_lines(tmp_path / "test.fr", [s.upper() for s in SOURCE])
    return base, rnn, source, reference


def test_shares_per_run_and_overall_and_the_changed_phrase_pairs(tmp_path):
    base, rnn, source, reference = decodes(tmp_path)
    doc = rnn_changes_document(base, rnn, source, reference, examples=2)
    assert doc["runs"] == [
        {"run": 1, "seeds": [1000, 1000], "sentences": 6, "changed_1best": 3, "changed_phrase_choice": 3},
        {"run": 2, "seeds": [1001, 1001], "sentences": 6, "changed_1best": 1, "changed_phrase_choice": None}]
    assert doc["overall"] == {"sentences": 12, "changed_1best": 4, "sentences_with_details": 6,
                              "changed_phrase_choice": 3}
    assert doc["missing_details"] == [str(tmp_path / "base2.tok.details"), str(tmp_path / "rnn2.tok.details")]
    # Phrase choice changed on sentences 3, 4, 5 (1-based); two of three evenly spaced: positions 0 and 1.
    shown = doc["examples"]
    assert shown["run"] == 1 and shown["changed"] == 3 and "floor(j N / 2) + 1 for j = 0..1" in shown["selection"]
    assert [s["line"] for s in shown["sentences"]] == [3, 4]
    assert rnn_changes_document(base, rnn, source, reference)["examples"]["sentences"][2] == {
        "line": 5, "source": "i j", "reference": "I J",
        "baseline": {"output": "I J", "pairs": [{"span": "0", "source": "i", "target": "I", "changed": True},
                                                {"span": "1", "source": "j", "target": "J", "changed": False}]},
        "system": {"output": "Y J", "pairs": [{"span": "0", "source": "i", "target": "Y", "changed": True},
                                              {"span": "1", "source": "j", "target": "J", "changed": False}]}}
    md = "\n".join(format_rnn_changes(doc, "+ RNN", "Baseline"))
    assert "| 1 | 1000 / 1000 | 6 | 3 (50.0%) | 3 (50.0%) |" in md
    assert "| 2 | 1001 / 1001 | 6 | 1 (16.7%) | – |" in md
    assert "| all | | 12 | 4 (33.3%) | 3 (50.0%) |" in md
    assert f"No translation details for 2 decode(s), decoded before the eval step kept them (–: phrase choice " \
           f"unknown there): `{tmp_path}/base2.tok.details`, `{tmp_path}/rnn2.tok.details`." in md
    assert "### 2 sentences where + RNN changed the phrase choice (run 1)" in md
    assert ("```text\ntest sentence 3\nsource    : e f\nreference : E F\nBaseline  : E F\n  *0: e → E | *1: f → F\n"
            "+ RNN     : E F\n  *0-1: e f → E F\n```") in md


def test_each_row_against_itself_tuned_with_other_seeds(tmp_path):
    """The scale for the shares above: Baseline's two runs translate alike (0 of 6); + RNN's run 2
    differs from runs 1 and 3 on sentences 2, 4, 5 and 6 (1-based), runs 1 and 3 on none. Only
    + RNN's runs 1 and 2 both kept details; they differ in phrase choice on sentences 3-6."""
    base, rnn, source, reference = decodes(tmp_path)
    doc = rnn_changes_document(base, rnn, source, reference)
    assert doc["between_runs"] == [
        {"row": "baseline", "runs": [1, 2], "seeds": [1000, 1001], "sentences": 6, "changed_1best": 0,
         "changed_phrase_choice": None},
        {"row": "system", "runs": [1, 2], "seeds": [1000, 1001], "sentences": 6, "changed_1best": 4,
         "changed_phrase_choice": None},
        {"row": "system", "runs": [1, 3], "seeds": [1000, 1002], "sentences": 6, "changed_1best": 0,
         "changed_phrase_choice": None},
        {"row": "system", "runs": [2, 3], "seeds": [1001, 1002], "sentences": 6, "changed_1best": 4,
         "changed_phrase_choice": None}]
    write_details(tmp_path / "rnn2.tok.details", BASELINE[:5] + [[(0, 1, "k l", "Z")]])
    doc = rnn_changes_document(base, rnn, source, reference)
    assert doc["between_runs"][1]["changed_phrase_choice"] == 4  # sentences 3, 4, 5 and 6
    md = "\n".join(format_rnn_changes(doc, "+ RNN", "Baseline"))
    assert "| Baseline | 1 / 2 | 1000 / 1001 | 0 (0.0%) | – |" in md
    assert "| + RNN | 1 / 2 | 1000 / 1001 | 4 (66.7%) | 4 (66.7%) |" in md
    assert "| + RNN | 2 / 3 | 1001 / 1002 | 4 (66.7%) | – |" in md


def test_ten_examples_evenly_spaced_through_the_changed_sentences(tmp_path):
    """30 sentences, the phrase choice changed on the 15 even ones (0-based): positions ⌊15 j / 10⌋ =
    0, 1, 3, 4, 6, 7, 9, 10, 12, 13 of them, i.e. sentences 0, 2, 6, 8, 12, 14, 18, 20, 24, 26."""
    source = write_lines(tmp_path / "test.en", [f"w{i}" for i in range(30)])
    base = [[(0, 0, f"w{i}", f"t{i}")] for i in range(30)]
    rnn = [[(0, 0, f"w{i}", f"u{i}" if i % 2 == 0 else f"t{i}")] for i in range(30)]
    found = [[DecodedRun(1, 1000, write_lines(tmp_path / f"{n}.tok", one_best(s)),
                         write_details(tmp_path / f"{n}.tok.details", s))] for n, s in (("b", base), ("r", rnn))]
    doc = rnn_changes_document(*found, source, source)
    assert doc["overall"]["changed_1best"] == 15 and doc["runs"][0]["changed_phrase_choice"] == 15
    assert [s["line"] for s in doc["examples"]["sentences"]] == [1, 3, 7, 9, 13, 15, 19, 21, 25, 27]
    md = "\n".join(format_rnn_changes(doc, "+ RNN", "Baseline"))
    assert "### 10 sentences where + RNN changed the phrase choice (run 1)" in md
    assert "of the N = 15 test sentences of run 1 whose phrase choice changed" in md


def test_no_details_anywhere_still_gives_the_1best_shares(tmp_path):
    base, rnn, source, reference = decodes(tmp_path)
    for d in (base[0], rnn[0]):
        d.details.unlink()
    doc = rnn_changes_document(base, rnn, source, reference)
    assert doc["overall"]["changed_1best"] == 4 and doc["examples"] is None
    md = "\n".join(format_rnn_changes(doc, "+ RNN", "Baseline"))
    assert "| all | | 12 | 4 (33.3%) | – |" in md
    assert "No translation details for 4 decode(s)" in md
    assert "No sentences to show: no run of both rows has translation details." in md


def test_details_of_another_decode_are_refused(tmp_path):
    base, rnn, source, reference = decodes(tmp_path)
    write_details(base[0].details, BASELINE[:5])  # one sentence short
    with pytest.raises(TranslationDetailsError, match=r"base1\.tok\.details: 5 sentences, but the test set has 6"):
        rnn_changes_document(base, rnn, source, reference)
    write_details(base[0].details, BASELINE[:4] + [[(0, 0, "i", "I"), (1, 1, "x", "J")]] + BASELINE[5:])
    # the fifth block's header is on line 56: 9 lines per block and 3 per pair, 4 blocks and 6 pairs before it
    with pytest.raises(TranslationDetailsError, match=r"base1\.tok\.details:56: source words \[1\] are 'x' here "
                                                      r"but not in the test source line 'i j'"):
        rnn_changes_document(base, rnn, source, reference)
    write_lines(rnn[0].output, ["x"])
    with pytest.raises(ValueError, match=r"rnn1\.tok: 1 lines, but the test set has 6 sentences"):
        rnn_changes_document(base, rnn, source, reference)


@pytest.mark.slow
@pytest.mark.moses
def test_real_decodes_of_two_weightings(tmp_path):
    """The eval step's call (decode_test_set with the n-best list kept and details) on 20 test
    sentences of the fixture system, with its weights and with p(e|f) weighted 3x: the report's
    figures come out of real details, and every example is consistent with its 1-bests."""
    fixture = shared_file("fixtures/hansard-enfr")
    source = write_lines(tmp_path / "test.en", read_text_lines(fixture / "data/test.tok.tc.en")[:20])
    reference = write_lines(tmp_path / "test.fr", read_text_lines(fixture / "data/test.tok.tc.fr")[:20])
    found = []
    for name, p_ef in (("baseline", 0.2), ("system", 0.6)):
        ini = MosesIni.read(fixture / "filtered/moses.ini")
        ini.set_weights("TranslationModel0", [0.2, 0.2, p_ef, 0.2])
        ini.write(tmp_path / f"{name}.ini")
        output = tmp_path / name / "run1.test.tok"
        decode_test_set(tmp_path / f"{name}.ini", source, output, moses_bin_dir=moses_bin_dir(), threads=2,
                        nbest_size=10, decoder_cwd=fixture / "filtered", keep_nbest=True,
                        details=details_output(output))
        found.append([DecodedRun(1, 1000, output, details_output(output))])
    doc = rnn_changes_document(*found, source, reference)
    run = doc["runs"][0]
    assert run["sentences"] == 20 and 0 < run["changed_phrase_choice"] <= 20 and run["changed_1best"] <= 20
    shown = doc["examples"]["sentences"]
    assert len(shown) == min(10, run["changed_phrase_choice"]) and doc["missing_details"] == []
    for s in shown:
        assert s["source"] == read_text_lines(source)[s["line"] - 1]
        for side in (s["baseline"], s["system"]):
            assert [w for p in side["pairs"] for w in p["target"].split()] == side["output"].split()
        assert any(p["changed"] for p in s["baseline"]["pairs"]) and any(p["changed"] for p in s["system"]["pairs"])
