"""The one reader of text files line by line: corpora, references, n-best lists, weights.

Files made on Windows or passed through some tools end lines with ``\\r\\n``. Moses' C++ readers
keep a stray ``\\r`` as part of the last token, which silently turns the last word of every
sentence into an unknown word (or a reference word that never matches). Every reader here strips
exactly one line end, ``\\n`` or ``\\r\\n``, the same way, so a corpus, its references and the
n-best lists made from it always agree on the words. Phrase tables are the exception: they are
copied byte for byte (:mod:`moses_integration.phrase_table`) and never go through this module.
"""

from __future__ import annotations

from collections.abc import Iterator

from infrastructure.errors import FileLineError
from infrastructure.files import (
    CORRUPT_GZIP_ERRORS,
    PathArg,
    display_name,
    first_unreadable_line,
    open_input,
    read_twice,
)


def strip_line_end(raw: bytes) -> bytes:
    """``raw`` without one trailing ``\\n`` or ``\\r\\n`` (other ``\\r`` and spaces stay)."""
    if raw.endswith(b"\r\n"):
        return raw[:-2]
    if raw.endswith(b"\n"):
        return raw[:-1]
    return raw


def iter_raw_lines(path: PathArg, *, error: type[FileLineError] = FileLineError) -> Iterator[tuple[int, bytes]]:
    """``(1-based line number, raw line with its line end)`` of a file, plain or gzip, ``"-"`` for stdin.

    The one loop every reader is built on (text here, phrase tables and n-best lists beside it): a
    truncated or corrupt gzip raises ``error`` (a :class:`FileLineError` subclass chosen by the
    caller) at the line being read, so a user sees how far the file is good.
    """
    name = display_name(path)
    line_no = 0
    with open_input(path) as fh:
        try:
            for raw in fh:
                line_no += 1
                yield line_no, raw
        except CORRUPT_GZIP_ERRORS as exc:
            where = first_unreadable_line(path, line_no + 1)
            raise error(name, where, f"truncated or corrupt gzip input ({exc})") from exc


def iter_text_lines(path: PathArg, *, error: type[FileLineError] = FileLineError) -> Iterator[tuple[int, str]]:
    """``(1-based line number, line)`` of a UTF-8 text file, plain or gzip, ``"-"`` for stdin.

    Invalid UTF-8 and a truncated or corrupt gzip raise ``error`` (a :class:`FileLineError`
    subclass chosen by the caller) naming the file and line, so a user knows where to look.
    """
    for line_no, raw in iter_raw_lines(path, error=error):
        try:
            yield line_no, strip_line_end(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(display_name(path), line_no, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def text_lines(
    path: PathArg, *, first: int = 1, last: int | None = None, error: type[FileLineError] = FileLineError
) -> Iterator[str]:
    """Lines ``first..last`` (1-based, inclusive) of a text file, streamed: corpora of any size."""
    for line_no, line in iter_text_lines(path, error=error):
        if last is not None and line_no > last:
            return
        if line_no >= first:
            yield line


def checked_text_lines(path: PathArg, *, error: type[FileLineError] = FileLineError) -> Iterator[str]:
    """The lines of a text file, streamed after a first pass has read them all: a bad line (invalid UTF-8,
    a truncated gzip) is one error before the long work on the lines before it, not after it. Reading is
    a small part of translating or scoring a line. Standard input and a pipe (``<(zcat x.gz)``), which
    cannot be read twice (:func:`~infrastructure.files.read_twice`), are streamed as they come."""
    if read_twice(path):
        for _ in iter_text_lines(path, error=error):
            pass
    return text_lines(path, error=error)


def read_text_lines(path: PathArg, *, error: type[FileLineError] = FileLineError) -> list[str]:
    """All lines of a small text file (references, decoder input, weights), line ends removed."""
    return list(text_lines(path, error=error))
