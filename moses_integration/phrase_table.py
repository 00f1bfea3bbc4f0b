"""Streaming reader and writer for Moses text phrase tables.

A Moses phrase-table line is ``source ||| target ||| s1 … sk [||| alignment [||| counts [||| sparse]]]``.
Tables run to tens of GB and hundreds of millions of lines, so everything here streams: nothing
ever holds a whole table, and lines stay as raw ``bytes`` so that fields we do not touch
(alignment, counts, sparse/property fields, odd spacing) are written back byte for byte.

Moses reads each score column as a probability and takes ``max(ln p, -100)``; a negative value
silently becomes NaN (SPEC §3 and §6). Columns we add must therefore be written in the probability
domain (:func:`format_log_probability`) and the reader rejects values Moses would misread.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import sys
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from moses_integration.errors import FileLineError
from moses_integration.tokens import split_tokens

SEPARATOR = b" ||| "
LOG_FLOOR = -100.0
GZIP_MAGIC = b"\x1f\x8b"
STDIO_NAME = "-"

_READ_BUFFER = 1 << 20
_WRITE_BATCH_LINES = 4096

PathArg = str | os.PathLike[str]


class PhraseTableError(FileLineError):
    """A phrase-table line Moses (or the rescorer) cannot use, located by file and 1-based line.

    The location matters more than the exception type: on a 100M-line table a user needs to know
    exactly which line to look at (``zcat t.gz | sed -n 1234p``).
    """


def display_name(path: PathArg) -> str:
    """The name used in error messages: ``<stdin>`` is clearer than a bare ``-``."""
    name = os.fspath(path)
    return "<stdin>" if name == STDIO_NAME else name


# --------------------------------------------------------------------------------------------
# Opening files


class _PrefixedRaw(io.RawIOBase):
    """A raw stream that first returns ``prefix`` and then reads from ``inner``.

    Used for stdin and other non-seekable inputs (pipes, ``<(zcat ...)``): we must look at the
    first two bytes to detect gzip, and a pipe can be neither rewound nor reopened. ``owns``
    is False for stdin, so that ``with open_input("-")`` does not close the process's stdin.
    """

    def __init__(self, prefix: bytes, inner: BinaryIO, *, owns: bool) -> None:
        super().__init__()
        self._prefix = prefix
        self._inner = inner
        self._owns = owns

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._prefix:
            n = min(len(view), len(self._prefix))
            view[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        reader = getattr(self._inner, "read1", None) or self._inner.read
        data = reader(len(view))
        n = len(data)
        view[:n] = data
        return n

    def close(self) -> None:
        if not self.closed and self._owns:
            self._inner.close()
        super().close()


class _OwningGzipFile(gzip.GzipFile):
    """A reading GzipFile that also closes the stream it reads from (GzipFile leaves it open)."""

    def __init__(self, owned: BinaryIO) -> None:
        super().__init__(fileobj=owned, mode="rb")
        self._owned = owned

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._owned.close()


class _NonClosingWriter(io.RawIOBase):
    """Writes through to ``inner`` (stdout) and flushes on close instead of closing it."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._inner.write(data)
        return len(data)

    def flush(self) -> None:
        if not self.closed:
            self._inner.flush()

    def close(self) -> None:
        if not self.closed:
            self._inner.flush()
        super().close()


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes, looping because a pipe may hand them over one at a time."""
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def open_input(path: PathArg) -> BinaryIO:
    """Open a table for binary reading: ``"-"`` is stdin; gzip is detected by its magic bytes.

    Detection by content rather than suffix because tables are often renamed or piped, and
    Moses itself does not care about the suffix either. Multi-member gzip (concatenated members,
    as written by parallel compressors) is read as one stream. The file is opened once, so
    named pipes and ``/dev/stdin`` work too.
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        return _wrap_unseekable(sys.stdin.buffer, owns=False)
    fh = open(name, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 - handed to the caller, who closes it
    try:
        if not fh.seekable():
            return _wrap_unseekable(fh, owns=True)
        magic = fh.read(2)
        fh.seek(0)
        return _OwningGzipFile(fh) if magic == GZIP_MAGIC else fh
    except BaseException:
        fh.close()
        raise


def input_position(stream: BinaryIO) -> int | None:
    """Bytes of the file (compressed, for gzip) that a stream from :func:`open_input` has consumed.

    A progress bar in input bytes is the only honest one for gzip, whose decompressed size is
    unknown until the end. None for pipes and stdin, which have no position.
    """
    raw = stream._owned if isinstance(stream, _OwningGzipFile) else stream
    try:
        return raw.tell() if raw.seekable() else None
    except (OSError, ValueError):
        return None


def _wrap_unseekable(inner: BinaryIO, *, owns: bool) -> BinaryIO:
    """Sniff the gzip magic of a pipe and hand the two bytes back in front of the rest."""
    prefix = _read_exactly(inner, 2)
    stream: BinaryIO = io.BufferedReader(_PrefixedRaw(prefix, inner, owns=owns), _READ_BUFFER)  # type: ignore[arg-type]
    return _OwningGzipFile(stream) if prefix == GZIP_MAGIC else stream  # type: ignore[return-value]


def open_output(path: PathArg, compresslevel: int = 6) -> BinaryIO:
    """Open a table for binary writing: ``"-"`` is stdout, a ``.gz`` suffix means gzip.

    Here the suffix decides (there is no content yet). Level 6 (gzip's own default) gives up a
    little size for a much faster write than level 9, which matters on 100M-line outputs.
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        return io.BufferedWriter(_NonClosingWriter(sys.stdout.buffer), _READ_BUFFER)  # type: ignore[return-value]
    if name.endswith(".gz"):
        return gzip.open(name, "wb", compresslevel=compresslevel)  # type: ignore[return-value]
    return open(name, "wb", buffering=_READ_BUFFER)


def _current_umask() -> int:
    """The process umask, so an atomically written file gets the permissions a plain open() gives."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: PathArg) -> Iterator[Path]:
    """The project's one atomic write: a temp file beside ``path``, fsync, then rename over it.

    Yields the temp file's path, for writers that want a file name (pyarrow, torch.save); the
    file exists and is empty. If the block raises, the temp file is removed and ``path`` is left
    as it was, so a kill, a full disk or a bug never leaves a half-written file under the final
    name. The temp file lives in the destination folder so the rename is an atomic
    same-filesystem ``os.replace``; the file gets the permissions a plain ``open()`` would give.
    """
    dest = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(dest.parent)


@contextlib.contextmanager
def atomic_output(path: PathArg, compresslevel: int = 6) -> Iterator[BinaryIO]:
    """Write ``path`` all-or-nothing through :func:`atomic_path`, as an open binary stream.

    A rescoring run over a huge table can die hours in; a half-written table that Moses then
    loads (or that a rerun mistakes for finished output) is worse than none. Compression follows
    the destination's suffix. ``"-"`` passes stdout through unchanged.
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        fh = open_output(name)
        try:
            yield fh
        finally:
            fh.close()
        return
    with atomic_path(name) as tmp, open(tmp, "wb", buffering=_READ_BUFFER) as raw:
        if name.endswith(".gz"):
            # filename="" keeps the temp name out of the gzip header (and stays reproducible).
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=0) as gz:
                yield gz  # type: ignore[misc]
        else:
            yield raw


def atomic_write_bytes(path: PathArg, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (small files: progress records, weights)."""
    with atomic_output(path) as fh:
        fh.write(data)


def fsync_directory(folder: Path) -> None:
    """Persist the rename itself; best effort, since some filesystems refuse directory fsync."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------------------------
# Reading lines and entries


def iter_lines(path: PathArg) -> Iterator[tuple[int, bytes]]:
    """Yield ``(1-based line number, raw line without the trailing "\\n")`` of a table.

    A truncated or corrupt gzip surfaces as :class:`PhraseTableError` naming the line being read
    when decompression failed, so a user sees how far the file is good instead of a bare EOFError.
    Only ``\\n`` is stripped: a ``\\r`` stays part of the line, as it does for Moses.
    """
    name = display_name(path)
    line_no = 0
    with open_input(path) as fh:
        try:
            for line in fh:
                line_no += 1
                yield line_no, line[:-1] if line.endswith(b"\n") else line
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise PhraseTableError(name, line_no + 1, f"truncated or corrupt gzip input ({exc})") from exc


@dataclass(frozen=True, slots=True)
class PhraseTableEntry:
    """One phrase-table line kept as its raw fields, so writing it back changes no byte.

    Decoded views (``source``, ``target``, ``scores``) are computed on demand: most callers only
    need one of them, and decoding every field of every line would dominate the cost.
    """

    line_no: int
    fields: tuple[bytes, ...]

    @property
    def source(self) -> str:
        return self.fields[0].decode("utf-8")

    @property
    def target(self) -> str:
        return self.fields[1].decode("utf-8")

    @property
    def scores(self) -> list[float]:
        return [float(tok) for tok in score_tokens(self.fields[2])]

    @property
    def raw(self) -> bytes:
        return SEPARATOR.join(self.fields)


def _check_score(token: bytes) -> str | None:
    """Why ``token`` is not a score Moses reads correctly, or None if it is fine.

    Accepted: finite numbers >= 0. Zero is allowed on purpose: Moses floors ln(0) to -100, a
    well-defined "never" that real tables and our own writer (below exp(-100)) can produce.
    Rejected: negatives (Moses silently reads ln of a negative as NaN, so the option can never
    win), NaN, infinities, and anything not a plain decimal number.
    """
    if b"_" in token or any(byte <= 0x20 for byte in token):  # float() accepts "1_0" and "\v1"
        return f"score {token.decode('utf-8', 'replace')!r} is not a number"
    try:
        value = float(token)
    except ValueError:
        return f"score {token.decode('utf-8', 'replace')!r} is not a number"
    if not math.isfinite(value):
        return f"score {token.decode('utf-8', 'replace')!r} is not finite"
    if value < 0:
        return (
            f"score {token.decode('utf-8', 'replace')!r} is negative "
            "(Moses takes the log of each score and would silently read NaN)"
        )
    return None


def _check_phrase(field: bytes, side: str) -> str | None:
    """Why a source/target field is unusable (invalid UTF-8 or empty), or None."""
    try:
        text = field.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{side} phrase is not valid UTF-8 (byte {exc.start})"
    if not split_tokens(text):
        return f"empty {side} phrase"
    return None


def score_tokens(field: bytes) -> list[bytes]:
    """The score tokens of a third field: split on ASCII space/tab as Moses does.

    A trailing ``\r`` (a table written with CRLF line ends whose scores are the last field) is
    dropped, since Moses' number parser stops before it too.
    """
    return [token for token in field.rstrip(b"\r").replace(b"\t", b" ").split(b" ") if token]


def parse_line(raw: bytes, *, path: PathArg, line_no: int, num_scores: int | None = None) -> PhraseTableEntry:
    """Split and validate one line (without ``\\n``); raise :class:`PhraseTableError` if unusable.

    Validation happens here, once, so that every later stage can trust source/target decode and
    scores parse. ``num_scores`` is the expected number of score columns, if known.
    """
    fields = tuple(raw.split(SEPARATOR))
    reason: str | None = None
    if len(fields) < 3:
        reason = f"expected at least 3 fields separated by ' ||| ', found {len(fields)}"
    else:
        reason = _check_phrase(fields[0], "source") or _check_phrase(fields[1], "target")
        if reason is None:
            tokens = score_tokens(fields[2])
            if not tokens:
                reason = "no scores in the third field"
            elif num_scores is not None and len(tokens) != num_scores:
                reason = f"expected {num_scores} scores, found {len(tokens)}"
            else:
                for token in tokens:
                    reason = _check_score(token)
                    if reason is not None:
                        break
    if reason is not None:
        raise PhraseTableError(display_name(path), line_no, reason)
    return PhraseTableEntry(line_no, fields)


def read_phrase_table(path: PathArg, *, num_scores: int | None = None) -> Iterator[PhraseTableEntry]:
    """Stream validated entries; when ``num_scores`` is None the first line fixes the count.

    Moses requires the same number of columns on every line (and ``num-features`` to match), so a
    change of count mid-file is reported at the line where it happens.
    """
    name = display_name(path)
    expected = num_scores
    for line_no, raw in iter_lines(path):
        entry = parse_line(raw, path=name, line_no=line_no, num_scores=expected)
        if expected is None:
            expected = len(score_tokens(entry.fields[2]))
        yield entry


# --------------------------------------------------------------------------------------------
# Writing score columns


def format_log_probability(f: float) -> str:
    """The phrase-table text for a log-domain feature value ``f``: ``exp(max(f, -100))``, 6 digits.

    Moses reads each column as a probability p and uses max(ln p, -100), so writing exp(f)
    makes Moses see f. Clipping at -100 first keeps the value from underflowing to "0" and
    matches Moses' own floor; 6 significant digits (``%.6g``) bound the error of the recovered
    log by about 5e-6. (Moses holds scores as 32-bit floats, so below about exp(-87) the value is
    subnormal there and the recovered log is only good to ~1e-3 near the floor.)
    """
    if math.isnan(f) or f == math.inf:
        raise ValueError(f"cannot write log-probability {f!r} as a phrase-table score")
    return f"{math.exp(max(f, LOG_FLOOR)):.6g}"


def append_score_columns_bulk(lines: Sequence[bytes], columns: Sequence[bytes]) -> list[bytes]:
    """``lines`` (no ``\n``) with ``columns[i]`` (space-joined bytes) appended to line i's scores.

    Only the text right after the last score changes, whether or not alignment/counts/sparse
    fields follow, so a ``diff`` of old and new tables shows just the new numbers.

    Takes pre-encoded bytes per line so a scorer can format a whole batch at once and avoid the
    per-line str→bytes conversion; on 100M lines every per-line step counts, hence the inlined
    common case (a scores field ending in a digit) instead of a call per line.
    """
    if len(lines) != len(columns):
        raise ValueError(f"{len(lines)} lines but {len(columns)} column strings")
    out: list[bytes] = []
    append = out.append
    sep = SEPARATOR
    for line, extra in zip(lines, columns, strict=True):
        parts = line.split(sep, 3)
        if len(parts) >= 3 and parts[2] and parts[2][-1] > 0x20 and extra:
            parts[2] = parts[2] + b" " + extra
            append(sep.join(parts))
        else:
            append(_insert_scores(line, extra))
    return out


def _insert_scores(line: bytes, extra: bytes) -> bytes:
    """Insert ``extra`` at the end of field 3, before its trailing blanks (a stray ``\r`` stays last).

    One space separates it from the existing scores unless the field is empty.
    """
    if not extra:
        return line
    parts = line.split(SEPARATOR, 3)
    if len(parts) < 3:
        raise ValueError(f"not a phrase-table line (fewer than 3 fields): {line[:80]!r}")
    field = parts[2]
    body = field.rstrip()
    parts[2] = (body + b" " + extra if body else extra) + field[len(body) :]
    return SEPARATOR.join(parts)
