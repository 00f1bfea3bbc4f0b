"""The one line reader strips \\n and \\r\\n alike, on plain, gzip and piped input."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from infrastructure.errors import FileLineError
from infrastructure.lines import checked_text_lines, iter_text_lines, read_text_lines, strip_line_end, text_lines


def test_strip_line_end() -> None:
    assert strip_line_end(b"a b\r\n") == b"a b"
    assert strip_line_end(b"a b\n") == b"a b"
    assert strip_line_end(b"a b") == b"a b"
    assert strip_line_end(b"a b \r") == b"a b \r"  # a lone \r is not a line end
    assert strip_line_end(b"a\r\r\n") == b"a\r"


def test_crlf_and_lf_files_read_the_same(tmp_path: Path) -> None:
    lf, crlf, gz = tmp_path / "lf.txt", tmp_path / "crlf.txt", tmp_path / "crlf.gz"
    lf.write_bytes(b"le chat\nla\xc2\xa0maison \nfin")
    crlf.write_bytes(b"le chat\r\nla\xc2\xa0maison \r\nfin")
    gz.write_bytes(gzip.compress(crlf.read_bytes()))
    expected = ["le chat", "la\u00a0maison ", "fin"]
    assert read_text_lines(lf) == read_text_lines(crlf) == read_text_lines(gz) == expected


def test_bad_utf8_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(FileLineError, match=r"bad.txt:2: not valid UTF-8"):
        list(iter_text_lines(path))


def test_text_lines_slices_gzip_and_names_bad_utf8(tmp_path):
    path = tmp_path / "t.gz"
    with gzip.open(path, "wb") as fh:
        fh.write("un\ndeux\u2028x\ntrois\n".encode())
    assert list(text_lines(path, first=2, last=3)) == ["deux\u2028x", "trois"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\n")
    with pytest.raises(ValueError, match=r"bad\.txt:2: not valid UTF-8"):
        list(text_lines(bad))


def test_checked_lines_find_a_bad_last_line_before_the_first_is_given(tmp_path: Path) -> None:
    """``nmt translate`` translated 3,000 good lines, then stopped at line 3,001's bad byte and lost them."""
    path = tmp_path / "text.en"
    path.write_bytes(b"good\n" * 3000 + b"le \xff chat\n")
    with pytest.raises(FileLineError, match=r"text\.en:3001: not valid UTF-8"):
        next(checked_text_lines(path))
    path.write_bytes(b"one\r\ntwo\n")
    assert list(checked_text_lines(path)) == list(text_lines(path)) == ["one", "two"]


def test_checked_lines_of_a_pipe_are_read_once() -> None:
    """``nmt translate MODEL <(zcat test.gz) OUT`` checked the pipe's lines, then found it empty: 0 sentences
    translated, an empty OUT and exit 0. Bash gives the command the pipe as ``/dev/fd/N``, as here."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"one\r\ntwo\n")
        os.close(write_end)
        assert list(checked_text_lines(f"/dev/fd/{read_end}")) == ["one", "two"]
    finally:
        os.close(read_end)
