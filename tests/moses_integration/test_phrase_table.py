"""Tests of the Moses phrase-table reader/writer: byte fidelity, gzip handling, validation, formatting.

The real sample table (``fixtures/hansard-enfr/phrase-table.sample.gz``, Moses output) anchors the
format; synthetic files cover the failure cases, each checked for the exact 1-based line number,
since that is what a user needs to find the bad line in a 100M-line table.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import math
import random
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from infrastructure.files import atomic_output, open_input
from moses_integration.phrase_table import (
    LOG_FLOOR,
    SEPARATOR,
    PhraseTableEntry,
    PhraseTableError,
    append_score_columns_bulk,
    format_log_probability,
    iter_lines,
    parse_line,
    read_counts,
    read_phrase_table,
)
from shared_paths import REPO_ROOT, shared_file
from table_lines import GOOD, write_bytes, write_lines

SAMPLE = "fixtures/hansard-enfr/phrase-table.sample.gz"
EXAMPLE_TABLE = REPO_ROOT / "examples" / "phrase-table.en-fr.gz"



@pytest.fixture(scope="module")
def sample_bytes() -> bytes:
    return gzip.decompress(shared_file(SAMPLE).read_bytes())


# ---------------------------------------------------------------------------------------------
# Byte fidelity on the real Moses table


def test_real_sample_fields_join_back_to_original_bytes(sample_bytes: bytes) -> None:
    path = shared_file(SAMPLE)
    entries = list(read_phrase_table(path))
    original = sample_bytes.split(b"\n")
    assert original[-1] == b""  # file ends with a newline
    original = original[:-1]
    assert len(entries) == len(original) == 5166
    for entry, line in zip(entries, original, strict=True):
        assert entry.raw == line
        assert SEPARATOR.join(entry.fields) == line
        assert len(entry.scores) == 4
    assert [e.line_no for e in entries[:3]] == [1, 2, 3]
    first = entries[0]
    assert first.source == "$ 12 million"
    assert first.target == "de 12 millions de dollars"
    assert first.scores == [1.0, 0.00396938, 0.5, 0.00380962]
    assert first.fields[3] == b"0-0 1-1 2-2 2-4"


def test_written_gzip_reads_back_byte_identical(tmp_path: Path, sample_bytes: bytes) -> None:
    out = tmp_path / "copy.gz"
    with atomic_output(out) as fh:
        count = write_lines(fh, [raw for _, raw in iter_lines(shared_file(SAMPLE))])
    assert count == 5166
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(out.read_bytes()) == sample_bytes
    with open_input(out) as fh:
        assert fh.read() == sample_bytes












def test_last_line_without_newline_and_crlf_kept(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_bytes(GOOD[0] + b"\r\n" + GOOD[1])
    assert list(iter_lines(path)) == [(1, GOOD[0] + b"\r"), (2, GOOD[1])]


def test_empty_file_yields_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert list(read_phrase_table(path)) == []


# ---------------------------------------------------------------------------------------------
# stdin / stdout


class _FakeStdin:
    """Stands in for sys.stdin: only ``.buffer`` is used by the reader."""

    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


@pytest.mark.parametrize("gz", [False, True])
def test_dash_reads_stdin_plain_or_gzip(monkeypatch: pytest.MonkeyPatch, gz: bool) -> None:
    data = b"".join(x + b"\n" for x in GOOD)
    monkeypatch.setattr(sys, "stdin", _FakeStdin(gzip.compress(data) if gz else data))
    entries = list(read_phrase_table("-"))
    assert [e.raw for e in entries] == GOOD
    assert not sys.stdin.buffer.closed  # `with open_input("-")` must not close the process's stdin


def test_dash_errors_name_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", _FakeStdin(GOOD[0] + b"\nbroken line\n"))
    with pytest.raises(PhraseTableError, match=r"^<stdin>:2: "):
        list(read_phrase_table("-"))


def test_stdin_to_stdout_through_a_real_pipe(sample_bytes: bytes) -> None:
    code = (
        "from infrastructure.files import open_output\nfrom moses_integration.phrase_table import iter_lines\n"
        "with open_output('-') as fh:\n"
        "    fh.write(b''.join(raw + b'\\n' for _, raw in iter_lines('-')))\n"
    )
    gz = gzip.compress(sample_bytes, compresslevel=1)
    result = subprocess.run(
        [sys.executable, "-c", code], input=gz, capture_output=True, check=True, cwd=REPO_ROOT, timeout=60
    )
    assert result.stdout == sample_bytes


# ---------------------------------------------------------------------------------------------
# Validation: every malformed case names the file and the right line


BAD_CASES = {
    "too few fields": (b"a ||| b", "at least 3 fields"),
    "no separator spaces": (b"a|||b|||0.5 0.5 0.5 0.5", "at least 3 fields"),
    "wrong score count": (b"a ||| b ||| 0.5 0.5 0.5", "expected 4 scores, found 3"),
    "no scores": (b"a ||| b |||  ||| 0-0", "no scores"),
    "non-numeric score": (b"a ||| b ||| 0.5 abc 0.5 0.5", "'abc' is not a number"),
    "underscore number": (b"a ||| b ||| 0.5 1_0 0.5 0.5", "is not a number"),
    "negative score": (b"a ||| b ||| 0.5 -0.25 0.5 0.5", "negative"),
    "nan score": (b"a ||| b ||| 0.5 nan 0.5 0.5", "not finite"),
    "inf score": (b"a ||| b ||| 0.5 inf 0.5 0.5", "not finite"),
    "empty source": (b" ||| b ||| 0.5 0.5 0.5 0.5", "empty source phrase"),
    "blank source": (b"   ||| b ||| 0.5 0.5 0.5 0.5", "empty source phrase"),
    "empty target": (b"a |||  ||| 0.5 0.5 0.5 0.5", "empty target phrase"),
    "invalid utf-8 source": (b"caf\xe9 ||| b ||| 0.5 0.5 0.5 0.5", "source phrase is not valid UTF-8"),
    "invalid utf-8 target": (b"a ||| \xff\xfe ||| 0.5 0.5 0.5 0.5", "target phrase is not valid UTF-8"),
    "blank line": (b"", "at least 3 fields"),
}


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_malformed_line_reports_file_and_line(tmp_path: Path, case: str, gz: bool) -> None:
    bad, reason = BAD_CASES[case]
    path = write_bytes(tmp_path / "my-table.gz", [*GOOD, GOOD[1], bad, GOOD[2]], gz=gz)
    seen: list[int] = []
    with pytest.raises(PhraseTableError) as info:
        for entry in read_phrase_table(path):
            seen.append(entry.line_no)
    err = info.value
    assert seen == [1, 2, 3, 4]  # streaming: good lines before the bad one came through
    assert err.line_no == 5
    assert err.path == str(path)
    assert str(err).startswith(f"{path}:5: ")
    assert "my-table.gz" in str(err)
    assert reason in err.reason
    assert isinstance(err, ValueError)


def test_score_count_fixed_by_explicit_num_scores(tmp_path: Path) -> None:
    path = write_bytes(tmp_path / "t", GOOD)
    with pytest.raises(PhraseTableError, match=r":1: expected 5 scores, found 4"):
        list(read_phrase_table(path, num_scores=5))
    assert len(list(read_phrase_table(path, num_scores=4))) == 3


def test_zero_and_above_one_scores_are_accepted() -> None:
    # Moses floors ln(0) at -100 (a well-defined "never") and 2.718 = e is the old phrase penalty.
    entry = parse_line(b"a ||| b ||| 0 2.718 1e-50 1 ||| 0-0", path="t", line_no=7)
    assert entry.scores == [0.0, 2.718, 1e-50, 1.0]
    assert entry.line_no == 7


def test_parse_line_error_carries_attributes() -> None:
    with pytest.raises(PhraseTableError) as info:
        parse_line(b"a ||| b ||| 0.5", path="x/y.gz", line_no=42, num_scores=2)
    assert (info.value.path, info.value.line_no) == ("x/y.gz", 42)
    assert str(info.value) == "x/y.gz:42: expected 2 scores, found 1"


@pytest.mark.parametrize("counts, numbers", [(None, None), (b"", None), (b"232 271 200", (232.0, 271.0, 200.0)),
                                             (b"232 271", (232.0, 271.0)), (b"1 1 0.5\r", (1.0, 1.0, 0.5))])
def test_read_counts_gives_the_numbers_or_none_without_a_counts_field(counts, numbers) -> None:
    fields = (b"a", b"b", b"0.5", b"0-0") + (() if counts is None else (counts,))
    assert read_counts(PhraseTableEntry(3, fields), "t.gz") == numbers


@pytest.mark.parametrize("counts, reason", [
    (b"271 x 3", "counts field '271 x 3': count 'x' is not a number"),
    (b"271 -1 3", "counts field '271 -1 3': count '-1' is negative"),
    (b"271", "counts field '271' has 1 numbers; expected 'count(target) count(source) count(pair)'"),
    (b"1 2 3 4", "counts field '1 2 3 4' has 4 numbers; expected 'count(target) count(source) count(pair)'"),
])
def test_a_damaged_counts_field_is_an_error_at_its_line(counts, reason) -> None:
    with pytest.raises(PhraseTableError) as info:
        read_counts(PhraseTableEntry(3, (b"a", b"b", b"0.5", b"0-0", counts)), "t.gz")
    assert str(info.value).startswith(f"t.gz:3: {reason}")


def test_entry_is_frozen_and_slotted() -> None:
    entry = PhraseTableEntry(1, (b"a", b"b", b"0.5"))
    with pytest.raises(AttributeError):
        entry.line_no = 2  # type: ignore[misc]
    assert not hasattr(entry, "__dict__")


def _truncated_gzip(tmp_path: Path, n_lines: int, keep_fraction: float) -> tuple[Path, list[bytes]]:
    rng = random.Random(7)
    lines = [
        b"src%d %d ||| tgt%d ||| %f 0.5 0.5 0.5 ||| 0-0" % (i, rng.randrange(10**9), i, rng.random() + 0.01)
        for i in range(n_lines)
    ]
    data = gzip.compress(b"".join(x + b"\n" for x in lines))
    path = tmp_path / "cut.gz"
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    return path, lines


@pytest.mark.parametrize("keep_fraction", [0.5, 0.999])
def test_truncated_gzip_names_file_and_line_reached(tmp_path: Path, keep_fraction: float) -> None:
    path, lines = _truncated_gzip(tmp_path, 20000, keep_fraction)
    got: list[bytes] = []
    with pytest.raises(PhraseTableError) as info:
        for line_no, raw in iter_lines(path):
            assert line_no == len(got) + 1
            got.append(raw)
    err = info.value
    assert got == lines[: len(got)]  # every line handed out is complete and correct
    assert 0 < len(got) < len(lines)
    # The true position: the complete lines of all that decompresses, + 1. The reader's buffers hold back
    # some of them, a different number for each reader; every command names this line.
    complete = zlib.decompressobj(wbits=31).decompress(path.read_bytes()).count(b"\n")
    assert err.line_no == complete + 1 >= len(got) + 1
    assert str(err).startswith(f"{path}:{complete + 1}: ")
    assert "truncated" in err.reason


def test_truncated_gzip_through_read_phrase_table(tmp_path: Path) -> None:
    path, _ = _truncated_gzip(tmp_path, 5000, 0.7)
    with pytest.raises(PhraseTableError, match="cut.gz:[0-9]+: truncated"):
        list(read_phrase_table(path))


def test_trailing_garbage_after_gzip_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.gz"
    path.write_bytes(gzip.compress(b"".join(x + b"\n" for x in GOOD)) + b"not gzip at all")
    # ISA-L's reader fails the whole read that meets the garbage, so the line named is the first of
    # that read (here line 1), never one past the damage; zlib's named line 4.
    with pytest.raises(PhraseTableError, match=r"garbage.gz:[1-4]: truncated or corrupt gzip"):
        list(iter_lines(path))


# ---------------------------------------------------------------------------------------------
# Score formatting


@pytest.mark.parametrize(
    "f", [0.0, 1.0, -1e-3, -0.1, -0.5, -1.0, -2.302585, -7.5, -10.0, -37.2, -86.9, -99.99, -100.0]
)
def test_format_log_probability_round_trips_through_log(f: float) -> None:
    text = format_log_probability(f)
    value = float(text)
    assert value > 0 and text != "0"
    assert abs(math.log(value) - f) <= 1e-5 * max(1.0, abs(f))
    assert len(text.replace("-", "").replace(".", "").split("e")[0].lstrip("0")) <= 6


def test_format_log_probability_random_sweep_and_float32() -> None:
    """Moses parses scores as 32-bit floats: the log must survive that too (above exp(-87))."""
    rng = random.Random(1234)
    for _ in range(2000):
        f = -rng.uniform(0, 87)
        text = format_log_probability(f)
        assert abs(math.log(float(text)) - f) <= 1e-5 * max(1.0, abs(f))
        assert abs(float(np.log(np.float32(text))) - f) <= 1e-5 * max(1.0, abs(f))


def test_format_log_probability_floors_at_minus_100() -> None:
    floor = format_log_probability(LOG_FLOOR)
    assert floor == "3.72008e-44"
    for f in [-100.5, -150.0, -1e6, -math.inf]:
        assert format_log_probability(f) == floor
    assert max(math.log(float(floor)), LOG_FLOOR) == pytest.approx(LOG_FLOOR, abs=1e-5)


def test_format_log_probability_rejects_nan_and_plus_inf() -> None:
    for f in [math.nan, math.inf]:
        with pytest.raises(ValueError):
            format_log_probability(f)


def test_word_penalty_column_reads_back_as_minus_count() -> None:
    for n_unk in range(6):
        assert math.log(float(format_log_probability(-n_unk))) == pytest.approx(-n_unk, abs=5e-6)


# ---------------------------------------------------------------------------------------------
# Appending columns


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"a ||| b ||| 0.5 0.2", b"a ||| b ||| 0.5 0.2 0.1 0.3"),
        (b"a ||| b ||| 0.5 0.2 ||| 0-0", b"a ||| b ||| 0.5 0.2 0.1 0.3 ||| 0-0"),
        (
            b"a ||| b ||| 0.5 0.2 ||| 0-0 ||| 1 1 1 ||| ",
            b"a ||| b ||| 0.5 0.2 0.1 0.3 ||| 0-0 ||| 1 1 1 ||| ",
        ),
        (
            b"a ||| b ||| 0.5 0.2 ||| 0-0 ||| 1 1 1 ||| |||",
            b"a ||| b ||| 0.5 0.2 0.1 0.3 ||| 0-0 ||| 1 1 1 ||| |||",
        ),
        (
            b"a b ||| c ||| 0.5 0.2 ||| 0-0 1-0 ||| 1 1 1 ||| sparse 1 ||| {{prop}}",
            b"a b ||| c ||| 0.5 0.2 0.1 0.3 ||| 0-0 1-0 ||| 1 1 1 ||| sparse 1 ||| {{prop}}",
        ),
        (b"a ||| b ||| 0.5\r", b"a ||| b ||| 0.5 0.1 0.3\r"),
    ],
)
def test_append_score_columns_cases(line: bytes, expected: bytes) -> None:
    assert append_score_columns_bulk([line], [b"0.1 0.3"]) == [expected]


def test_append_score_columns_keeps_real_lines_byte_identical(sample_bytes: bytes) -> None:
    lines = sample_bytes.split(b"\n")[:-1]
    columns = [
        f"{format_log_probability(-i / 100)} {format_log_probability(-(i % 3))}" for i in range(len(lines))
    ]
    bulk = append_score_columns_bulk(lines, [c.encode() for c in columns])
    for i, (old, new) in enumerate(zip(lines, bulk, strict=True)):
        old_fields, new_fields = old.split(SEPARATOR), new.split(SEPARATOR)
        assert len(new_fields) == len(old_fields)
        assert new_fields[:2] == old_fields[:2] and new_fields[3:] == old_fields[3:]
        assert new_fields[2] == old_fields[2] + b" " + columns[i].encode()
        entry = parse_line(new, path="x", line_no=i + 1, num_scores=6)
        assert entry.scores[:4] == parse_line(old, path="x", line_no=i + 1).scores


def test_append_score_columns_rejects_non_table_line_and_length_mismatch() -> None:
    with pytest.raises(ValueError):
        append_score_columns_bulk([b"a ||| b"], [b"0.5"])
    with pytest.raises(ValueError):
        append_score_columns_bulk([b"a ||| b ||| 1"], [])
    assert append_score_columns_bulk([b"a ||| b ||| 1"], [b""]) == [b"a ||| b ||| 1"]


# ---------------------------------------------------------------------------------------------
# Atomic output






# ---------------------------------------------------------------------------------------------
# The project's built-in sample


def _example_entries() -> Iterator[PhraseTableEntry]:
    return read_phrase_table(EXAMPLE_TABLE, num_scores=4)


def test_example_table_parses_cleanly_and_is_moses_sorted() -> None:
    entries = list(_example_entries())
    assert 300 <= len(entries) <= 400
    raws = [e.raw for e in entries]
    assert raws == sorted(raws)  # LC_ALL=C byte order of whole lines, as Moses tables are
    assert len(set(raws)) == len(raws)
    # each source phrase is one contiguous block
    sources = [e.fields[0] for e in entries]
    blocks = [s for i, s in enumerate(sources) if i == 0 or s != sources[i - 1]]
    assert len(blocks) == len(set(blocks))
    assert len(blocks) >= 80
    assert any("é" in e.target for e in entries) and any("&apos;" in e.target for e in entries)


def test_example_table_fields_are_consistent() -> None:
    for e in _example_entries():
        assert e.source == e.source.lower() and e.target == e.target.lower()
        assert all(0 < p <= 1 for p in e.scores)
        assert len(e.fields) == 6 and e.fields[5] == b"|||"  # "... ||| counts ||| |||" like Moses
        n_src, n_tgt = len(e.source.split()), len(e.target.split())
        points = [tuple(int(x) for x in p.split(b"-")) for p in e.fields[3].split()]
        assert points and all(0 <= s < n_src and 0 <= t < n_tgt for s, t in points)
        c_tgt, c_src, c_pair = (int(x) for x in e.fields[4].split())
        assert c_pair <= c_tgt and c_pair <= c_src
        assert e.scores[0] == pytest.approx(c_pair / c_tgt, rel=1e-5)
        assert e.scores[2] == pytest.approx(c_pair / c_src, rel=1e-5)


def test_example_table_is_what_its_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("make_sample", REPO_ROOT / "examples" / "make_sample.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    expected = b"".join(line + b"\n" for line in module.build_lines())
    assert gzip.decompress(EXAMPLE_TABLE.read_bytes()) == expected




def test_example_word_tables_are_what_its_generator_writes() -> None:
    """examples/lex.f2e and lex.e2f (what ``rescorer propose`` reads beside the sample table) come
    from the same generator and counts as the table, in Moses' ``e f w(e|f)`` / ``f e w(f|e)`` layout."""
    spec = importlib.util.spec_from_file_location("make_sample", REPO_ROOT / "examples" / "make_sample.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    f2e, e2f = module.build_lex_lines()
    assert (REPO_ROOT / "examples" / "lex.f2e").read_bytes() == b"".join(line + b"\n" for line in f2e)
    assert (REPO_ROOT / "examples" / "lex.e2f").read_bytes() == b"".join(line + b"\n" for line in e2f)
    # w(e|f) sums to 1 over e for each source word f, as Moses' relative frequencies do.
    totals: dict[bytes, float] = {}
    for line in f2e:
        _e, f, w = line.split()
        totals[f] = totals.get(f, 0.0) + float(w)
    assert b"house" in totals and all(abs(t - 1) < 1e-5 for t in totals.values())
