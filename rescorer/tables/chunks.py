"""Columnar parsing of Moses phrase-table chunks with pyarrow.

Phrase tables run to hundreds of millions of lines, so per-line Python parsing would dominate the
cost of scoring. Here a chunk of raw lines becomes Arrow arrays in a handful of vectorised calls
(split on `` ||| ``, split tokens on ASCII space/tab as Moses does, map tokens to ids).
Validation is vectorised too; only when a chunk is found to hold a bad line do we fall back to the per-line parser of
:mod:`moses_integration.phrase_table`, which names the exact line and reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infrastructure.files import CORRUPT_GZIP_ERRORS, first_unreadable_line
from moses_integration.phrase_table import MAX_PHRASE_WORDS, SEPARATOR, PhraseTableError, parse_line, score_tokens
from moses_integration.tokens import split_tokens_arrow

FIELD_SEPARATOR = SEPARATOR.decode()  # the same separator, as the str pyarrow's string kernels take
BLOCK_BYTES = 8 << 20


class UnreadableInputError(PhraseTableError):
    """The input stops being readable (truncated or corrupt gzip): no option gets past it."""


@dataclass
class LineChunk:
    """Consecutive raw lines and where they sit in the input.

    The lines are held as one ``bytes`` object, each line followed by ``\\n`` (also the file's last
    line when it has none), with ``offsets[i]`` the start of line i and ``offsets[-1]`` the end:
    a chunk is then two objects, not a hundred thousand, so it crosses to a worker process as
    fast as a memory copy and becomes an Arrow array without a per-line step.
    """

    first_line_no: int
    data: bytes
    offsets: np.ndarray  # int64 [lines + 1]
    end_offset: int  # bytes of (decompressed) input consumed after this chunk
    # Whether the first line is a sync point of :mod:`rescorer.tables.aligned` (where every run cuts).
    sync: bool = False

    @classmethod
    def from_lines(cls, first_line_no: int, lines: list[bytes], end_offset: int = 0) -> LineChunk:
        """A chunk of the given lines (without their newlines)."""
        ends = np.cumsum(np.fromiter((len(x) + 1 for x in lines), np.int64, len(lines)))
        return cls(first_line_no, b"".join(x + b"\n" for x in lines), np.concatenate([[0], ends]), end_offset)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lines(self) -> list[bytes]:
        """The lines without their newlines (a new list at each call: keep it if used twice)."""
        return self.data[: self.offsets[-1] - 1].split(b"\n") if len(self) else []

    def line(self, i: int) -> bytes:
        return self.data[self.offsets[i] : self.offsets[i + 1] - 1]

    @property
    def last_line_no(self) -> int:
        return self.first_line_no + len(self) - 1

    def slice(self, start: int, stop: int) -> LineChunk:
        """Lines ``start`` to ``stop`` (exclusive); one copy of their bytes."""
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        return LineChunk(self.first_line_no + start, self.data[a:b], self.offsets[start : stop + 1] - a,
                         self.end_offset - (len(self.data) - b))

    def take(self, rows: np.ndarray) -> LineChunk:
        """The chunk of lines ``rows`` (increasing); line numbers start at the first one's."""
        if len(rows) == len(self):
            return self
        first = self.first_line_no + (int(rows[0]) if len(rows) else 0)
        if len(rows) and int(rows[-1]) - int(rows[0]) + 1 == len(rows):  # a contiguous run: one slice
            a, b = int(self.offsets[rows[0]]), int(self.offsets[rows[-1] + 1])
            return LineChunk(first, self.data[a:b], self.offsets[rows[0] : rows[-1] + 2] - a, self.end_offset)
        return LineChunk.from_lines(first, [self.line(int(i)) for i in rows], self.end_offset)

    def arrow(self) -> pa.Array:
        """The lines as an Arrow binary array, without their newlines."""
        if not len(self):
            return pa.array([], type=pa.binary())
        buffers = [None, pa.py_buffer(self.offsets.astype(np.int64, copy=False)), pa.py_buffer(self.data)]
        with_newline = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(self), buffers)
        return pc.binary_slice(with_newline, 0, -1).cast(pa.binary())


def iter_line_chunks(
    fh: BinaryIO,
    path: str,
    chunk_lines: int,
    *,
    start_line_no: int = 1,
    start_offset: int = 0,
) -> Iterator[LineChunk]:
    """Yield chunks of exactly ``chunk_lines`` lines (the last one fewer), reading big blocks.

    Lines are found by a vectorised search for newlines, never one by one, so this serial step
    keeps up with decompression. Decompression errors (a truncated or corrupt gzip) become a
    :class:`PhraseTableError` naming the line reached, so a user knows how far the file is good.
    """
    pieces: list[bytes] = []  # complete lines read and not yet yielded
    ends = np.zeros(0, dtype=np.int64)  # where each of those lines ends in b"".join(pieces)
    held = 0  # bytes in pieces
    tail = b""
    line_no = start_line_no
    offset = start_offset
    read = _reader(fh)
    while block := _read_block(read, path, line_no + len(ends)):
        block = tail + block
        newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == NEWLINE)
        if not len(newlines):
            tail = block
            continue
        cut = int(newlines[-1])
        tail = block[cut + 1 :]
        pieces.append(block[: cut + 1])
        ends = np.concatenate([ends, held + newlines + 1])
        held += cut + 1
        offset += cut + 1
        if len(ends) >= chunk_lines:
            chunks, pieces, ends, held, line_no = _cut_chunks(b"".join(pieces), ends, chunk_lines, line_no, offset)
            yield from chunks
    if tail:  # last line without a newline
        pieces.append(tail + b"\n")
        ends = np.concatenate([ends, [held + len(tail) + 1]])
        offset += len(tail)
        held += len(tail) + 1
    if len(ends):
        chunks, *_ = _cut_chunks(b"".join(pieces), ends, len(ends), line_no, offset + (1 if tail else 0))
        if tail:
            chunks[-1].end_offset -= 1
        yield from chunks


def _reader(fh: BinaryIO) -> Callable[[int], bytes]:
    """How to read the stream: read1 returns what one decompression step gives, so a corrupt tail
    loses only that step and the error names a line close to where the damage is."""
    return getattr(fh, "read1", fh.read)


def _read_block(read: Callable[[int], bytes], path: str, line_reached: int) -> bytes:
    """The next block of up to :data:`BLOCK_BYTES` (empty at the end); a truncated or corrupt gzip
    is an :class:`UnreadableInputError` naming the first line it loses (the search starts at
    ``line_reached``, the line the caller has reached)."""
    try:
        return read(BLOCK_BYTES)
    except CORRUPT_GZIP_ERRORS as exc:
        raise UnreadableInputError(
            path, first_unreadable_line(path, line_reached), f"truncated or corrupt gzip input ({exc})"
        ) from exc


NEWLINE = ord("\n")


def _cut_chunks(data: bytes, ends: np.ndarray, chunk_lines: int, line_no: int, offset: int):
    """Whole chunks of ``chunk_lines`` lines from ``data``, and what is left for the next block."""
    chunks: list[LineChunk] = []
    start = 0  # byte where the next chunk starts
    first = 0  # its first line among ``ends``
    while len(ends) - first >= chunk_lines:
        stop = int(ends[first + chunk_lines - 1])
        offsets = np.concatenate([[0], ends[first : first + chunk_lines] - start])
        chunks.append(LineChunk(line_no, data[start:stop], offsets, offset - (len(data) - stop)))
        line_no += chunk_lines
        first += chunk_lines
        start = stop
    rest = data[start:]
    return chunks, ([rest] if rest else []), ends[first:] - start, len(rest), line_no


@dataclass
class ParsedChunk:
    """Source/target phrases of a chunk, with the rows that failed validation set aside."""

    chunk: LineChunk
    source: pa.Array  # utf8, one per good row
    target: pa.Array
    good_rows: np.ndarray  # indices into chunk.lines of the rows in source/target
    bad_rows: list[tuple[int, str]]  # (line_no, reason) of rows skipped with --skip-bad-lines
    scores: np.ndarray | None = None  # [good rows, num_scores] float64, when requested
    num_scores: int | None = None  # score columns of the good rows (None when there are none)


def parse_chunk(
    chunk: LineChunk,
    path: str,
    *,
    num_scores: int | None = None,
    skip_bad_lines: bool = False,
    want_scores: bool = False,
) -> ParsedChunk:
    """Split a chunk into phrases, validating every line as Moses would need it.

    The vectorised path checks field count, empty phrases, score count and that each score is a
    finite non-negative number. Any failure re-parses the chunk line by line to name the culprit.
    ``num_scores`` is the column count every line must have (from moses.ini or the table's first
    line); None lets this chunk's first good line decide. Callers pass on ``num_scores`` of the
    result so that a count changing from one chunk to the next is caught as well.
    """
    try:
        return _parse_fast(chunk, path, num_scores, want_scores)
    except _NeedsSlowPath:
        pass
    good: list[int] = []
    bad: list[tuple[int, str]] = []
    for i, raw in enumerate(chunk.lines):
        line_no = chunk.first_line_no + i
        try:
            entry = parse_line(raw, path=path, line_no=line_no, num_scores=num_scores)
            if num_scores is None:
                num_scores = len(score_tokens(entry.fields[2]))
        except PhraseTableError as exc:
            if not skip_bad_lines:
                raise
            bad.append((line_no, exc.reason))
            continue
        good.append(i)
    sub = LineChunk.from_lines(chunk.first_line_no, [chunk.line(i) for i in good], chunk.end_offset)
    if not good:
        empty = pa.array([], type=pa.string())
        scores = np.zeros((0, num_scores or 0)) if want_scores else None
        return ParsedChunk(chunk, empty, empty, np.zeros(0, dtype=np.int64), bad, scores, num_scores)
    parsed = _parse_fast(sub, path, num_scores, want_scores)
    return ParsedChunk(
        chunk, parsed.source, parsed.target, np.asarray(good, dtype=np.int64), bad, parsed.scores, parsed.num_scores
    )


_NO_TOKEN = "^[ \t]*$"


class _NeedsSlowPath(Exception):
    pass


def _parse_fast(chunk: LineChunk, path: str, num_scores: int | None, want_scores: bool) -> ParsedChunk:
    try:
        text = chunk.arrow().cast(pa.string())
    except pa.ArrowInvalid as exc:
        raise _NeedsSlowPath from exc
    fields = pc.split_pattern(text, FIELD_SEPARATOR, max_splits=3)
    if pc.min(pc.list_value_length(fields)).as_py() < 3:
        raise _NeedsSlowPath
    source = pc.list_element(fields, 0)
    target = pc.list_element(fields, 1)
    # A phrase of separators only has no token for Moses (a no-break space alone is a token).
    if pc.any(pc.match_substring_regex(source, _NO_TOKEN)).as_py() or pc.any(
        pc.match_substring_regex(target, _NO_TOKEN)
    ).as_py():
        raise _NeedsSlowPath
    if _too_long(source) or _too_long(target):
        raise _NeedsSlowPath
    score_text = split_tokens_arrow(pc.utf8_rtrim(pc.list_element(fields, 2), characters="\r"))
    counts = pc.list_value_length(score_text).to_numpy(zero_copy_only=False)
    expected = num_scores if num_scores is not None else int(counts[0])
    if expected < 1 or (counts != expected).any():
        raise _NeedsSlowPath
    try:
        values = pc.cast(pc.list_flatten(score_text), pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise _NeedsSlowPath from exc
    if not np.isfinite(values).all() or (values < 0).any():
        raise _NeedsSlowPath
    scores = values.reshape(len(chunk), expected) if want_scores else None
    rows = np.arange(len(chunk), dtype=np.int64)
    return ParsedChunk(chunk, source, target, rows, [], scores, expected)


def _too_long(phrases: pa.Array) -> bool:
    """Whether a phrase has more than :data:`MAX_PHRASE_WORDS` words. Words are counted only where a phrase
    is long enough in bytes to hold that many (a word and a blank are 2 bytes at least): never, in a real table."""
    if pc.max(pc.binary_length(phrases)).as_py() <= 2 * MAX_PHRASE_WORDS:
        return False
    return pc.max(pc.list_value_length(split_tokens_arrow(phrases))).as_py() > MAX_PHRASE_WORDS


@dataclass
class TokenIds:
    """Ragged id sequences: ``ids[offsets[i]:offsets[i+1]]`` are phrase i's word ids."""

    offsets: np.ndarray  # int64 [n+1]
    ids: np.ndarray  # int32 [total]
    n_unk: np.ndarray  # int32 [n], words outside the shortlist

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


UNK_ID = 1
EOS_ID = 0


def with_end_of_phrase(phrases: TokenIds) -> TokenIds:
    """The same phrases with ``</s>`` appended to each, as the encoder reads them."""
    ids = np.insert(phrases.ids, phrases.offsets[1:], EOS_ID)
    offsets = phrases.offsets + np.arange(len(phrases.offsets), dtype=np.int64)
    return TokenIds(offsets, ids, phrases.n_unk)


def phrases_to_ids(phrases: pa.Array, vocab_words: pa.Array) -> TokenIds:
    """Map phrases to shortlist ids in one vectorised pass, split into tokens as Moses splits them.

    ``vocab_words[i]`` is the word with id i (0 = ``</s>``, 1 = ``[UNK]``). A literal ``</s>``
    token inside a phrase is treated as unknown, since id 0 is reserved for the end of phrase.
    """
    tokens = split_tokens_arrow(phrases)
    flat = pc.list_flatten(tokens)
    index = pc.index_in(flat, value_set=vocab_words)
    ids = pc.fill_null(index, UNK_ID).to_numpy(zero_copy_only=False).astype(np.int32)
    ids[ids == EOS_ID] = UNK_ID
    offsets = tokens.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    unk = (ids == UNK_ID).astype(np.int32)
    cum = np.concatenate([[0], np.cumsum(unk, dtype=np.int64)])
    n_unk = (cum[offsets[1:]] - cum[offsets[:-1]]).astype(np.int32)
    return TokenIds(offsets, ids, n_unk)
