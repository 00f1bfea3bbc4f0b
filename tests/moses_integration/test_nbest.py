"""Moses n-best lists: exact parsing and writing, arrays, and errors that name file and line."""

from __future__ import annotations

import gzip
import io
import sys
from pathlib import Path

import numpy as np
import pytest

from moses_integration.nbest import (
    NBestError,
    append_features,
    format_value,
    load_nbest_arrays,
    parse_nbest_line,
    read_nbest,
)
from shared_paths import shared_file

LINE = (
    "0 ||| un Republican stratégie pour contrer la réélection de Obama  ||| LexicalReordering0= -2.05013 0 0 "
    "-3.45155 0 0 Distortion0= 0 LM0= -81.6386 WordPenalty0= -9 PhrasePenalty0= 8 TranslationModel0= -6.09859 "
    "-6.83084 -6.98846 -8.95625 ||| -237.645"
)
NAMES = [
    ("LexicalReordering0", 6),
    ("Distortion0", 1),
    ("LM0", 1),
    ("WordPenalty0", 1),
    ("PhrasePenalty0", 1),
    ("TranslationModel0", 4),
]


def _write(path: Path, lines: list[str], *, gz: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def _small_list(ids: list[int]) -> list[str]:
    """Lines of a tiny 2-feature list, one or two hypotheses per id."""
    return [f"{i} ||| hyp {i} {k} ||| A= {i}.5 {k} B= -{k} ||| {i + k}" for i in ids for k in (1, 2)]


def test_parse_line_fields() -> None:
    entry = parse_nbest_line(LINE, path="x", line_no=3)
    assert entry.sent_id == 0
    assert entry.hypothesis == "un Republican stratégie pour contrer la réélection de Obama"
    assert entry.feature_names() == NAMES
    assert entry.features[0][1] == [-2.05013, 0.0, 0.0, -3.45155, 0.0, 0.0]
    assert entry.features[2] == ("LM0", [-81.6386])
    assert entry.total == -237.645
    assert entry.extra == ()
    assert entry.line_no == 3


def test_extra_fields_and_empty_hypothesis_round_trip() -> None:
    line = "7 |||  ||| F= 1 2 ||| -3 ||| 0-0 1-1"
    entry = parse_nbest_line(line)
    assert entry.hypothesis == ""
    assert entry.extra == ("0-0 1-1",)


def test_values_are_written_as_moses_writes_them() -> None:
    values = (0.0, -1.5, 123456789.0, 1e-5, -2.0)
    assert [format_value(v) for v in values] == ["0", "-1.5", "1.23457e+08", "1e-05", "-2"]


def test_fixture_rewritten_without_new_features_is_byte_identical(tmp_path: Path) -> None:
    path = shared_file("fixtures/hansard-enfr/nbest/dev.nbest.gz")
    count = append_features(path, tmp_path / "copy.nbest", lambda entries: [], expected_sentences=200)
    assert count == 19313
    assert (tmp_path / "copy.nbest").read_bytes() == gzip.decompress(path.read_bytes())


def test_load_arrays_on_fixture() -> None:
    arrays = load_nbest_arrays(shared_file("fixtures/hansard-enfr/nbest/dev.nbest.gz"), expected_sentences=200)
    assert arrays.features.shape == (19313, 14)
    assert arrays.feature_names == NAMES
    names_file = shared_file("fixtures/hansard-enfr/nbest/feature-names.txt").read_text().split()
    assert arrays.column_names() == names_file
    assert arrays.num_sentences == 200
    offsets = arrays.offsets
    assert offsets[0] == 0 and offsets[-1] == 19313 and len(offsets) == 201
    assert np.all(np.diff(offsets) > 0)
    assert arrays.hypotheses[0] == "un Republican stratégie pour contrer la réélection de Obama"
    np.testing.assert_allclose(arrays.features[0, 7], -81.6386)
    # Same numbers as Moses' extractor wrote to features.dat (first block).
    dat = gzip.decompress(shared_file("fixtures/hansard-enfr/nbest/features.dat.gz").read_bytes()).decode()
    first = [line for line in dat.splitlines()[1:4]]
    np.testing.assert_array_equal(arrays.features[:3], np.array([[float(v) for v in r.split()] for r in first]))


def test_plain_gzip_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _small_list([0, 1])
    plain = _write(tmp_path / "l.txt", lines)
    gz = _write(tmp_path / "l.gz", lines, gz=True)
    a = list(read_nbest(plain))
    assert a == list(read_nbest(gz))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(plain.read_bytes()))))
    assert list(read_nbest("-")) == a


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("1 ||| x ||| A= 1 2 B= -1", "expected 'id ||| hypothesis ||| features ||| total'"),
        ("1 ||| x ||| A= 1 abc B= -1 ||| 3", "feature A: 'abc' is not a number"),
        ("1 ||| x ||| A= 1 nan B= -1 ||| 3", "feature A: value is NaN"),
        ("1 ||| x ||| A= 1 2 B= -inf ||| 3", "feature B: value is infinite"),
        ("1 ||| x ||| A= inf -inf B= -1 ||| 3", "feature A: value is infinite"),
        ("1 ||| x ||| 5 A= 1 2 B= -1 ||| 3", "feature value '5' before any feature name"),
        ("1 ||| x ||| A= B= -1 ||| 3", "feature 'A' has no values"),
        ("1 ||| x ||| A= 1 2 B= -1 ||| total", "total score: 'total' is not a number"),
        ("one ||| x ||| A= 1 2 B= -1 ||| 3", "sentence id 'one' is not an integer"),
        ("1 ||| x ||| A= 1 2 A= -1 ||| 3", "feature 'A' appears twice"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad: str, message: str) -> None:
    lines = _small_list([0, 1])
    lines[2] = bad
    path = _write(tmp_path / "bad.nbest", lines)
    with pytest.raises(NBestError) as err:
        list(read_nbest(path))
    assert str(err.value).startswith(f"{path}:3: ")
    assert message in str(err.value)
    assert err.value.line_no == 3


def test_missing_sentence_id_is_reported(tmp_path: Path) -> None:
    path = _write(tmp_path / "gap.nbest", _small_list([0, 1, 3, 4]))
    with pytest.raises(NBestError, match=r"gap.nbest:5: sentence id 3 follows id 1: sentence id 2 is missing"):
        load_nbest_arrays(path)


def test_first_sentence_missing(tmp_path: Path) -> None:
    path = _write(tmp_path / "late.nbest", _small_list([1, 2]))
    with pytest.raises(NBestError, match=r"late.nbest:1: sentence id 1 starts the list: sentence id 0 is missing"):
        list(read_nbest(path))


def test_missing_sentences_at_the_end_relative_to_expected_count(tmp_path: Path) -> None:
    path = _write(tmp_path / "short.nbest", _small_list([0, 1, 2]))
    ends_early = r"short.nbest:6: the list ends at sentence id 2; expected 5 .*id 3 is missing"
    with pytest.raises(NBestError, match=ends_early):
        list(read_nbest(path, expected_sentences=5))
    with pytest.raises(NBestError, match=r"short.nbest:5: sentence id 2 is out of range: expected 2 sentences"):
        list(read_nbest(path, expected_sentences=2))
    assert len(list(read_nbest(path, expected_sentences=3))) == 6


def test_decreasing_ids(tmp_path: Path) -> None:
    lines = _small_list([0, 1, 2])
    lines.append(lines[0])
    path = _write(tmp_path / "back.nbest", lines)
    with pytest.raises(NBestError, match=r"back.nbest:7: sentence id 0 after id 2: ids must be non-decreasing"):
        list(read_nbest(path))


def test_feature_names_differing_between_lines(tmp_path: Path) -> None:
    lines = _small_list([0, 1, 2])
    lines[3] = lines[3].replace("B=", "C=")
    path = _write(tmp_path / "names.nbest", lines)
    with pytest.raises(NBestError, match=r"names.nbest:4: features \[A=2 C=1\] differ from the first line's"):
        load_nbest_arrays(path)
    lines = _small_list([0, 1])
    lines[1] = lines[1].replace("B= -2", "B= -2 7")
    path = _write(tmp_path / "counts.nbest", lines)
    with pytest.raises(NBestError, match=r"counts.nbest:2: features \[A=2 B=2\] differ"):
        load_nbest_arrays(path)


def test_encoding_empty_and_corrupt_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.nbest"
    bad.write_bytes("0 ||| caf\xe9 ||| A= 1 ||| 1\n".encode("latin-1"))
    with pytest.raises(NBestError, match=r"latin1.nbest:1: not valid UTF-8"):
        list(read_nbest(bad))
    empty = tmp_path / "empty.nbest"
    empty.write_bytes(b"")
    with pytest.raises(NBestError, match=r"empty.nbest: the n-best list is empty"):
        load_nbest_arrays(empty)
    blank = _write(tmp_path / "blank.nbest", [*_small_list([0]), ""])
    with pytest.raises(NBestError, match=r"blank.nbest:3: empty line"):
        list(read_nbest(blank))
    truncated = tmp_path / "cut.gz"
    truncated.write_bytes(gzip.compress(("\n".join(_small_list(list(range(50)))) + "\n").encode())[:-30])
    with pytest.raises(NBestError, match=r"cut.gz:\d+: truncated or corrupt gzip"):
        list(read_nbest(truncated))


def test_sparse_features_are_left_out_of_the_dense_columns(tmp_path: Path) -> None:
    dense = [
        "0 ||| le chat ||| LM0= -3.5 TranslationModel0= -1 -2 ||| -6.5",
        "0 ||| la chatte ||| LM0= -4 TranslationModel0= -1.5 -2 ||| -7.5",
        "1 ||| oui ||| LM0= -1 TranslationModel0= -0.5 -0.25 ||| -1.75",
    ]
    sparse = [  # Moses writes a sparse feature only on the hypotheses it fires on
        "0 ||| le chat ||| LM0= -3.5 TranslationModel0= -1 -2 TranslationModel0_dom_news= 1 ||| -6.5",
        "0 ||| la chatte ||| LM0= -4 TranslationModel0= -1.5 -2 ||| -7.5",
        "1 ||| oui ||| LM0= -1 TranslationModel0_dom_web= 1 TranslationModel0= -0.5 -0.25 ||| -1.75",
    ]
    plain = load_nbest_arrays(_write(tmp_path / "dense.nbest", dense))
    arrays = load_nbest_arrays(_write(tmp_path / "sparse.nbest", sparse))
    assert arrays.feature_names == plain.feature_names == [("LM0", 1), ("TranslationModel0", 2)]
    assert np.array_equal(arrays.features, plain.features)
    assert arrays.sparse_names == ("TranslationModel0_dom_news", "TranslationModel0_dom_web")
    assert plain.sparse_names == ()
    from mert.nbest_set import merge_nbest_lists

    merged = merge_nbest_lists([tmp_path / "sparse.nbest", tmp_path / "dense.nbest"])
    assert merged.sparse_names == arrays.sparse_names and merged.features.shape == (3, 3)


def test_append_features_keeps_every_other_byte_and_chunks_whole_sentences(tmp_path):
    """The one n-best rewriter: CRLF, alignment fields and Moses' spacing survive; the scorer only ever
    sees whole sentences; values are written as Moses writes them."""
    lines = [b"0 ||| a b  ||| LM0= -1.5 TM0= 0.1 0.2  ||| -3 ||| 0-0 1-1\r\n",
             b"0 ||| a  ||| LM0= -1 TM0= 0.3 0.4 ||| -2\n",
             b"1 ||| c ||| LM0= -2 TM0= 0.5 0.6 ||| -4"]
    nbest = tmp_path / "in.nbest"
    nbest.write_bytes(b"".join(lines))
    seen = []

    def score(entries):
        seen.append([e.sent_id for e in entries])
        n = len(entries)
        return [("New", np.arange(n, dtype=float) + 0.1234567), ("Pair", np.ones((n, 2)) / 3)]

    count = append_features(nbest, tmp_path / "out.nbest", score, chunk_lines=1, expected_sentences=2)
    assert count == 3 and seen == [[0, 0], [1]]
    assert (tmp_path / "out.nbest").read_bytes().splitlines(keepends=True) == [
        b"0 ||| a b  ||| LM0= -1.5 TM0= 0.1 0.2 New= 0.123457 Pair= 0.333333 0.333333  ||| -3 ||| 0-0 1-1\r\n",
        b"0 ||| a  ||| LM0= -1 TM0= 0.3 0.4 New= 1.12346 Pair= 0.333333 0.333333 ||| -2\n",
        b"1 ||| c ||| LM0= -2 TM0= 0.5 0.6 New= 0.123457 Pair= 0.333333 0.333333 ||| -4",
    ]
    with pytest.raises(NBestError, match=r"in\.nbest:1: the list already has feature\(s\) LM0"):
        append_features(nbest, tmp_path / "bad.nbest", lambda entries: [("LM0", np.zeros(len(entries)))])
    assert not (tmp_path / "bad.nbest").exists()



@pytest.mark.parametrize(("last_line", "message"), [
    ("1 ||| b ||| LM0= nan ||| -1", "feature LM0: value is NaN"),
    ("2 ||| b ||| LM0= -1 ||| -1", "sentence id 2 is past the source"),
])
def test_append_features_checks_a_whole_file_before_scoring_a_line(tmp_path, last_line, message):
    """``nmt nbest`` scored the 6,000 hypotheses before a list's bad last line (an hour at a real model's
    speed), then stopped at it: a list in a file is read whole first, ``check_entry`` included."""
    nbest = tmp_path / "in.nbest"
    nbest.write_text("0 ||| a ||| LM0= -1 ||| -1\n" * 3 + "1 ||| b ||| LM0= -1 ||| -1\n" + last_line + "\n",
                     encoding="utf-8")
    scored = []

    def score(entries):
        scored.append(len(entries))
        return [("New", np.zeros(len(entries)))]

    def within_two_sentences(entry):
        if entry.sent_id >= 2:
            raise NBestError(str(nbest), entry.line_no, f"sentence id {entry.sent_id} is past the source")

    with pytest.raises(NBestError, match=rf"in\.nbest:5: {message}"):
        append_features(nbest, tmp_path / "out.nbest", score, chunk_lines=1, check_entry=within_two_sentences)
    assert scored == [] and not (tmp_path / "out.nbest").exists()

# --------------------------------------------------------------------------------------------
# Phrase segmentation: lines as Moses writes them (the fixture system, sentence "zzqx the house",
# whose first and last words it passes through as unknown), with -include-segmentation-in-n-best,
# with -t, and with both and -print-alignment-info-in-n-best.

FEATURES = ("LexicalReordering0= 0 0 -1.26465 -0.269867 0 0 Distortion0= -4 LM0= -40.0449 WordPenalty0= -3 "
            "PhrasePenalty0= 3 TranslationModel0= -0.426491 -0.646073 -1.48557 -1.41833")
WITH_FIELD = f"2 ||| le house zzqx  ||| {FEATURES} ||| -218.878 ||| 1=0 2=1 0=2"
WITH_MARKERS = f"2 ||| le |1-1| house |2-2| zzqx |0-0|  ||| {FEATURES} ||| -218.878"
WITH_BOTH = f"2 ||| le |1-1| house |2-2| zzqx |0-0|  ||| {FEATURES} ||| -218.878 ||| 1=0 2=1 0=2 ||| 1-0 2-1 0-2 "
SPANS = ((1, 1, 0, 0), (2, 2, 1, 1), (0, 0, 2, 2))


@pytest.mark.parametrize("line", [WITH_FIELD, WITH_MARKERS, WITH_BOTH])
def test_segmentation_is_read_and_the_hypothesis_is_the_plain_text(line: str) -> None:
    entry = parse_nbest_line(line)
    assert entry.hypothesis == "le house zzqx"
    assert entry.segmentation == SPANS
    plain = parse_nbest_line(f"2 ||| le house zzqx  ||| {FEATURES} ||| -218.878")
    assert plain.segmentation is None
    assert (entry.sent_id, entry.features, entry.total) == (plain.sent_id, plain.features, plain.total)


def test_multi_word_spans_and_a_list_without_segmentation_as_before() -> None:
    line = LINE + " ||| 1=0-1 0=2 2=3 3-4=4-5 5-8=6-8"
    entry = parse_nbest_line(line)
    assert entry.segmentation == ((1, 1, 0, 1), (0, 0, 2, 2), (2, 2, 3, 3), (3, 4, 4, 5), (5, 8, 6, 8))
    assert entry.extra == ("1=0-1 0=2 2=3 3-4=4-5 5-8=6-8",)
    unsegmented = parse_nbest_line(LINE + " ||| 0-0 1-1")  # word alignment, not segmentation
    assert unsegmented.segmentation is None and unsegmented.extra == ("0-0 1-1",)
    # An escaped bar and a lone one are words: Moses' tokenizer writes | as &#124;.
    words = parse_nbest_line("0 ||| a &#124; b | c ||| F= 1 ||| 1")
    assert (words.hypothesis, words.segmentation) == ("a &#124; b | c", None)


def test_a_segmented_list_rewritten_keeps_every_byte_and_features_see_the_plain_text(tmp_path: Path) -> None:
    from mert.features import WordCount, add_features

    lines = [WITH_MARKERS.replace("2 |||", "0 |||", 1), WITH_FIELD.replace("2 |||", "1 |||", 1), WITH_BOTH]
    nbest = _write(tmp_path / "in.nbest", lines)
    add_features(nbest, tmp_path / "out.nbest", ["s0", "s1", "s2"], [WordCount()])
    out = (tmp_path / "out.nbest").read_text().splitlines()
    assert out == [line.replace(" ||| -218.878", " WordCount= 3 ||| -218.878") for line in lines]
    assert [e.segmentation for e in read_nbest(tmp_path / "out.nbest")] == [SPANS] * 3


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (WITH_FIELD.replace("2=1", "2=x1"), "segmentation '2=x1' is not SOURCE[-END]=TARGET[-END]"),
        (WITH_FIELD.replace("1=0 ", "1-0=0 "), "segmentation '1-0=0': a span ends before it starts"),
        (WITH_FIELD.replace("2=1", "2=2"), "segmentation '2=2': target word 2 where word 1 should start"),
        (WITH_FIELD.replace("0=2", "0=2-3"), "covers 4 target words but the hypothesis has 3"),
        (WITH_MARKERS.replace("|2-2|", "|2|"), "segmentation marker '|2|' is not |S-E|"),
        (WITH_MARKERS.replace("|2-2|", "|2-2,wa=1-1"), "marker '|2-2,wa=1-1' is not |S-E|"),
        (WITH_MARKERS.replace("|0-0|", "|0-0| |0-0|"), "segmentation marker '|0-0|' follows no target word"),
        (WITH_MARKERS.replace("zzqx |0-0|", "zzqx"), "words after the last |S-E| segmentation marker: 'zzqx'"),
        (WITH_MARKERS.replace("|2-2|", "|2-1|"), "segmentation '|2-1|': a span ends before it starts"),
        (WITH_BOTH.replace("2=1 0=2", "0=1 2=2"), "the |S-E| markers of the hypothesis and the segmentation field"),
        (WITH_FIELD.replace("0=2", "3=2"), "spans leave out or repeat source word 0"),
        (WITH_FIELD.replace("2=1", "1=1"), "spans leave out or repeat source word 1"),
        # A word that looks like a marker in text that is not segmented: it covers no source from 0.
        ("1 ||| le house zzqx |3-4| ||| F= 1 ||| 1", "spans leave out or repeat source word 0"),
    ],
)
def test_a_malformed_segmentation_names_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = [WITH_FIELD.replace("2 |||", f"{i} |||", 1) for i in (0, 1)]
    path = _write(tmp_path / "bad.nbest", [*good, line.replace("2 |||", "1 |||", 1)])
    with pytest.raises(NBestError) as err:
        list(read_nbest(path))
    assert str(err.value).startswith(f"{path}:3: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_large_finite_values_whose_sum_overflows_are_read() -> None:
    """The parser finds a non-finite value by its sum first: a sum that overflows is not an error."""
    entry = parse_nbest_line("0 ||| x ||| A= 1e308 1e308 ||| 0", path="x", line_no=1)
    assert entry.features == [("A", [1e308, 1e308])]


def test_a_hypothesis_holding_the_field_separator_is_written_so_that_it_reads_back() -> None:
    """``nmt translate --nbest`` wrote ``0 ||| ||| un ||| ||| NMT0= …``, which no reader can split."""
    from moses_integration.nbest import nbest_hypothesis

    for text in ("||| un |||", "a ||| b", "|||", "a | b", "a |||| b", ""):
        entry = parse_nbest_line(f"0 ||| {nbest_hypothesis(text)} ||| F= 1 ||| 1", path="x", line_no=1)
        assert entry.hypothesis.replace("&#124;", "|") == text
    assert nbest_hypothesis("a | b") == "a | b" and nbest_hypothesis("a ||| b") == "a &#124;&#124;&#124; b"
    assert nbest_hypothesis("a|||b c|d") == "a&#124;&#124;&#124;b c|d"
