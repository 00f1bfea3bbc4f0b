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

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from infrastructure.errors import FileLineError
from infrastructure.files import PathArg, display_name
from infrastructure.lines import iter_raw_lines
from moses_integration.tokens import split_tokens

SEPARATOR = b" ||| "
LOG_FLOOR = -100.0

_WRITE_BATCH_LINES = 4096



class PhraseTableError(FileLineError):
    """A phrase-table line Moses (or the rescorer) cannot use, located by file and 1-based line.

    The location matters more than the exception type: on a 100M-line table a user needs to know
    exactly which line to look at (``zcat t.gz | sed -n 1234p``).
    """


def no_lines_error(path: PathArg, consequence: str) -> PhraseTableError:
    """The error for a table with no phrase-table line (an empty file, an empty gzip), said the same way by
    every command that needs one: ``path: the table holds no phrase-table lines; {consequence}``.

    A command that divides by the table's lines or pairs would otherwise fail with a ZeroDivisionError,
    or write an empty result as if it had found nothing worth keeping.
    """
    return PhraseTableError(display_name(path), None, f"the table holds no phrase-table lines; {consequence}")


def out_of_order_error(path: PathArg, line_no: int, consequence: str) -> PhraseTableError:
    """The error for a line that sorts before the one above it, said the same way by every command that
    reads a table as Moses writes it (sorted as ``LC_ALL=C sort`` sorts the lines, so that a source's
    targets are next to each other): ``path:line: the table is not sorted …; {consequence}``."""
    return PhraseTableError(display_name(path), line_no, "the table is not sorted as `LC_ALL=C sort` sorts it "
                            f"(this line sorts before the one above); {consequence}")


# --------------------------------------------------------------------------------------------
# Reading lines and entries


def iter_lines(path: PathArg) -> Iterator[tuple[int, bytes]]:
    """Yield ``(1-based line number, raw line without the trailing "\\n")`` of a table.

    A truncated or corrupt gzip surfaces as :class:`PhraseTableError` naming the line being read
    when decompression failed, so a user sees how far the file is good instead of a bare EOFError.
    Only ``\\n`` is stripped: a ``\\r`` stays part of the line, as it does for Moses.
    """
    for line_no, line in iter_raw_lines(path, error=PhraseTableError):
        yield line_no, line[:-1] if line.endswith(b"\n") else line


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


#: The most words a source or target phrase may have. Moses extracts phrases of up to 7 words by default
#: (20 is a large setting); a longer "phrase" is a sentence or a damaged line, and a 5M-word line took a
#: tiny model 326 s to score. Such a line is a bad line, at its line number.
MAX_PHRASE_WORDS = 1000


def _check_phrase(field: bytes, side: str) -> str | None:
    """Why a source/target field is unusable (invalid UTF-8, empty, or longer than
    :data:`MAX_PHRASE_WORDS`), or None."""
    try:
        text = field.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{side} phrase is not valid UTF-8 (byte {exc.start})"
    words = len(split_tokens(text))
    if not words:
        return f"empty {side} phrase"
    if words > MAX_PHRASE_WORDS:
        return f"{side} phrase of {words} words, more than the {MAX_PHRASE_WORDS} a phrase may have"
    return None


def score_tokens(field: bytes) -> list[bytes]:
    """The score tokens of a third field: split on ASCII space/tab as Moses does.

    A trailing ``\r`` (a table written with CRLF line ends whose scores are the last field) is
    dropped, since Moses' number parser stops before it too.
    """
    return [token for token in field.rstrip(b"\r").replace(b"\t", b" ").split(b" ") if token]


#: The 0-based field of ``count(target) count(source) count(pair)`` (older Moses wrote the first two only).
COUNTS_FIELD = 4


def read_counts(entry: PhraseTableEntry, path: PathArg) -> tuple[float, ...] | None:
    """The counts field's numbers (two or three), or None when the line has no counts field (or an empty one).

    Every reader of the counts goes through here, so a damaged field (``271 x 3``) is an error at its
    line instead of a line read as having no counts, which silently changed what was ranked by.
    """
    if len(entry.fields) <= COUNTS_FIELD:
        return None
    tokens = score_tokens(entry.fields[COUNTS_FIELD])
    if not tokens:
        return None
    text = entry.fields[COUNTS_FIELD].decode("utf-8", "replace").strip()
    if len(tokens) not in (2, 3):
        raise PhraseTableError(display_name(path), entry.line_no, f"counts field {text!r} has {len(tokens)} "
                               "numbers; expected 'count(target) count(source) count(pair)'")
    for token in tokens:
        reason = _check_score(token)
        if reason is not None:
            raise PhraseTableError(display_name(path), entry.line_no,
                                   f"counts field {text!r}: {reason.replace('score ', 'count ', 1)}")
    return tuple(float(token) for token in tokens)


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
