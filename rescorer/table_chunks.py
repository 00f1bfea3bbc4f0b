"""Columnar parsing of Moses phrase-table chunks with pyarrow.

Phrase tables run to hundreds of millions of lines, so per-line Python parsing would dominate the
cost of scoring. Here a chunk of raw lines becomes Arrow arrays in a handful of vectorised calls
(split on `` ||| ``, split tokens on ASCII space/tab as Moses does, map tokens to ids).
Validation is vectorised too; only when a chunk is found to hold a bad line do we fall back to the per-line parser of
:mod:`moses_integration.phrase_table`, which names the exact line and reason.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from moses_integration.phrase_table import PhraseTableError, parse_line, score_tokens
from moses_integration.tokens import split_tokens_arrow

FIELD_SEPARATOR = " ||| "
BLOCK_BYTES = 8 << 20


class UnreadableInputError(PhraseTableError):
    """The input stops being readable (truncated or corrupt gzip): no option gets past it."""


@dataclass
class LineChunk:
    """Consecutive raw lines (no trailing newline) and where they sit in the input."""

    first_line_no: int
    lines: list[bytes]
    end_offset: int  # bytes of (decompressed) input consumed after this chunk
    # Where each line ends in the *file* (compressed bytes for gzip), when asked for: the measure
    # --shard cuts by, so that no shard needs a pass over the table to learn its size.
    positions: np.ndarray | None = None

    @property
    def last_line_no(self) -> int:
        return self.first_line_no + len(self.lines) - 1


def iter_line_chunks(
    fh: BinaryIO,
    path: str,
    chunk_lines: int,
    *,
    start_line_no: int = 1,
    start_offset: int = 0,
    positions: Callable[[], int | None] | None = None,
) -> Iterator[LineChunk]:
    """Yield chunks of about ``chunk_lines`` lines, reading big blocks rather than line by line.

    Decompression errors (a truncated or corrupt gzip) become a :class:`PhraseTableError` naming
    the line reached, so a user knows how far the file is good. With ``positions`` (a function
    giving the bytes of the file consumed so far), each chunk carries every line's position in
    the file: the file position after the block that holds the line, interpolated by the line's
    place in the block. It depends only on the file and the fixed block size, never on
    ``chunk_lines``, so separate runs (shards) agree on it exactly.
    """
    pending: list[bytes] = []
    pending_pos: list[float] = []
    file_pos = float(positions() or 0) if positions else 0.0
    tail = b""
    line_no = start_line_no
    offset = start_offset
    # read1 returns what one decompression step gives, so a corrupt tail loses only that step
    # and the error names a line close to where the damage is.
    read = getattr(fh, "read1", fh.read)
    while True:
        try:
            block = read(BLOCK_BYTES)
        except (EOFError, zlib.error, OSError) as exc:
            raise UnreadableInputError(
                path, line_no + len(pending), f"input is truncated or corrupt ({exc})"
            ) from exc
        if not block:
            break
        block = tail + block
        cut = block.rfind(b"\n")
        if cut < 0:
            tail = block
            continue
        tail = block[cut + 1 :]
        new_lines = block[:cut].split(b"\n")
        pending.extend(new_lines)
        offset += cut + 1
        if positions:
            now = float(positions() or 0)
            ends = np.cumsum(np.fromiter((len(x) + 1 for x in new_lines), np.int64, len(new_lines)))
            pending_pos.extend((file_pos + (now - file_pos) * ends / len(block)).tolist())
            file_pos = now
        while len(pending) >= chunk_lines:
            lines, pending = pending[:chunk_lines], pending[chunk_lines:]
            line_pos, pending_pos = pending_pos[:chunk_lines], pending_pos[chunk_lines:]
            consumed = sum(len(x) + 1 for x in pending)
            yield LineChunk(line_no, lines, offset - consumed, np.asarray(line_pos) if positions else None)
            line_no += len(lines)
    if tail:
        pending.append(tail)  # last line without a newline
        pending_pos.append(float(positions() or 0) if positions else 0.0)
        offset += len(tail)
    if pending:
        yield LineChunk(line_no, pending, offset, np.asarray(pending_pos) if positions else None)


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
    sub = LineChunk(chunk.first_line_no, [chunk.lines[i] for i in good], chunk.end_offset)
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
        text = pa.array(chunk.lines, type=pa.binary()).cast(pa.string())
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
    scores = values.reshape(len(chunk.lines), expected) if want_scores else None
    rows = np.arange(len(chunk.lines), dtype=np.int64)
    return ParsedChunk(chunk, source, target, rows, [], scores, expected)


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
