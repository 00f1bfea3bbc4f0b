"""Streaming reader and writer for Moses n-best lists.

A Moses n-best line is ``id ||| hypothesis ||| Name0= v v Name1= v … ||| total`` (SPEC §4, §6):
ids are 0-based and grouped (all hypotheses of sentence 0, then sentence 1, …), the hypothesis
ends with a space, feature values have 6 significant digits, and optional further fields (word
alignment, …) may follow the total. Stateful features come first, then stateless ones, in
``moses.ini`` order; untuneable features are absent.

MERT needs the lists as dense arrays (:func:`load_nbest_arrays`), and every way a list can be
broken (a sentence without hypotheses, a feature that appears on some lines only, a stray
non-number) must be reported with the file and line, because a silently misaligned list gives a
plausible but wrong tuning result. This module imports nothing from ``rescorer`` or ``mert``.

A phrase-level feature needs the phrase pairs of each hypothesis, which Moses writes in one of two
ways (``moses/Manager.cpp``, ``OutputNBest`` and ``OutputSurface``):

* ``-include-segmentation-in-n-best``: a field after the total, one ``S[-E]=T[-U]`` per phrase in
  target order (source and target word spans, 0-based and inclusive; a one-word span is a single
  number): ``… ||| -237.645 ||| 0=0 1=1 2-3=2-3 4=4``;
* ``-report-segmentation`` (``-t``): ``|S-E|`` after each target phrase in the hypothesis itself:
  ``un |0-0| stratégie pour |2-3|``.

Either is read into :attr:`NBestEntry.segmentation`; the hypothesis is always the plain text
(markers taken out), which BLEU and every other feature see. Tokenised text never holds a bare
``|`` (Moses' tokenizer escapes it as ``&#124;``), so a ``|S-E|`` token is a marker.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from infrastructure.errors import FileLineError
from infrastructure.files import PathArg, atomic_output, display_name, read_twice
from infrastructure.lines import iter_raw_lines, strip_line_end

FIELD_SEPARATOR = "|||"
#: The ``moses`` flag that writes each hypothesis' phrase segmentation as a field of its own (read
#: into :attr:`NBestEntry.segmentation`): what phrase-level n-best features need.
SEGMENTATION_FLAG = "-include-segmentation-in-n-best"
FeatureNames = list[tuple[str, int]]
#: One phrase of a hypothesis: (source start, source end, target start, target end), 0-based, inclusive.
PhraseSpan = tuple[int, int, int, int]

_SPAN_FIELD_TOKEN = re.compile(r"(\d+)(?:-(\d+))?=(\d+)(?:-(\d+))?")
_MARKER = re.compile(r"\|(\d+)-(\d+)\|")
_MARKER_LIKE = re.compile(r"\|\d[^|]*\|?|\|[\d-]*\|")  # a token Moses' segmentation would start


class NBestError(FileLineError):
    """An n-best line that cannot be used, located by file and 1-based line.

    ``str()`` is ``"{path}:{line_no}: {reason}"`` like :class:`PhraseTableError`, so users can
    jump straight to the line (``zcat dev.nbest.gz | sed -n 1234p``).
    """


@dataclass(slots=True)
class NBestEntry:
    """One hypothesis of an n-best list.

    ``features`` keeps Moses' grouping (``("TranslationModel0", [v1, v2, v3, v4])``) in file
    order, because weights in ``moses.ini`` are written per feature function, not per column.
    ``extra`` holds any fields after the total (e.g. word alignment) verbatim, so rewriting a
    list (for instance after adding a feature) loses nothing. ``line_no`` is where the entry was
    read (0 for entries built in code) and is only used in error messages. ``segmentation`` is
    the hypothesis' phrases in target order (:data:`PhraseSpan`), when Moses wrote them
    (``-include-segmentation-in-n-best`` or ``-t``), else None; the line's own bytes keep them, so
    a rewritten list (:func:`append_features`) still carries them.
    """

    sent_id: int
    hypothesis: str
    features: list[tuple[str, list[float]]]
    total: float
    extra: tuple[str, ...] = ()
    line_no: int = field(default=0, compare=False)
    segmentation: tuple[PhraseSpan, ...] | None = None

    def feature_names(self) -> FeatureNames:
        """``[(name, number of values), …]`` in file order."""
        return [(name, len(values)) for name, values in self.features]


# --------------------------------------------------------------------------------------------
# Parsing


def _parse_float(token: str, what: str, path: str, line_no: int) -> float:
    try:
        value = float(token)
    except ValueError:
        raise NBestError(path, line_no, f"{what}: {token!r} is not a number") from None
    if math.isnan(value):
        # NaN breaks every comparison MERT makes; Moses only writes it for a broken model.
        raise NBestError(path, line_no, f"{what}: value is NaN")
    return value


def _parse_features(text: str, path: str, line_no: int) -> list[tuple[str, list[float]]]:
    tokens = text.split()
    starts = [i for i, tok in enumerate(tokens) if tok[-1] == "="]
    if tokens and (not starts or starts[0] != 0):
        raise NBestError(path, line_no, f"feature value {tokens[0]!r} before any feature name")
    features: list[tuple[str, list[float]]] = []
    seen: set[str] = set()
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(tokens)
        name = tokens[start][:-1]
        if not name:
            raise NBestError(path, line_no, "empty feature name '=' in the feature field")
        if name in seen:
            raise NBestError(path, line_no, f"feature {name!r} appears twice")
        seen.add(name)
        if end == start + 1:
            raise NBestError(path, line_no, f"feature {name!r} has no values")
        try:
            # Fast path: a line has ~15 values and a merged list 10^5 lines.
            values = list(map(float, tokens[start + 1 : end]))
        except ValueError:
            values = [_parse_float(tok, f"feature {name}", path, line_no) for tok in tokens[start + 1 : end]]
        if not math.isfinite(sum(values)):
            if any(math.isnan(v) for v in values):
                # NaN breaks every comparison MERT makes. Moses writes it when a phrase-table score
                # was negative (it takes the log of it, SPEC §6): the table needs fixing.
                raise NBestError(path, line_no, f"feature {name}: value is NaN")
            if any(math.isinf(v) for v in values):
                # Moses floors a zero probability's log at -100; an infinite score is a broken
                # feature, and MERT's line search has no intersection with it.
                raise NBestError(path, line_no, f"feature {name}: value is infinite")
        features.append((name, values))
    return features


def parse_nbest_line(line: str, *, path: str = "<n-best>", line_no: int = 0) -> NBestEntry:
    """Parse one n-best line (without its newline) into an :class:`NBestEntry`.

    The hypothesis is stripped of the surrounding spaces Moses writes; tokens inside are kept
    as they are (BLEU later splits on whitespace).
    """
    fields = line.split(FIELD_SEPARATOR)
    if len(fields) < 4:
        raise NBestError(
            path, line_no, f"expected 'id ||| hypothesis ||| features ||| total', found {len(fields)} field(s)"
        )
    id_text = fields[0].strip()
    try:
        sent_id = int(id_text)
    except ValueError:
        raise NBestError(path, line_no, f"sentence id {id_text!r} is not an integer") from None
    if sent_id < 0:
        raise NBestError(path, line_no, f"sentence id {sent_id} is negative")
    features = _parse_features(fields[2], path, line_no)
    if not features:
        raise NBestError(path, line_no, "no features in the feature field")
    total = _parse_float(fields[3].strip(), "total score", path, line_no)
    extra = tuple(f.strip() for f in fields[4:])
    hypothesis, marked = _marked_phrases(fields[1], path, line_no)
    listed = _segmentation_field(extra[0], path, line_no) if extra else None
    if marked is not None and listed is not None and marked != listed:
        raise NBestError(path, line_no, "the |S-E| markers of the hypothesis and the segmentation field disagree")
    if listed is not None and listed[-1][3] + 1 != len(hypothesis.split()):
        raise NBestError(path, line_no, f"the segmentation field covers {listed[-1][3] + 1} target words but the "
                         f"hypothesis has {len(hypothesis.split())}")
    _check_source_cover(listed or marked, path, line_no)
    return NBestEntry(sent_id, hypothesis, features, total, extra, line_no, listed or marked)


def _check_source_cover(spans: tuple[PhraseSpan, ...] | None, path: str, line_no: int) -> None:
    """Moses translates every source word once: the phrases' source spans tile words 0..n-1."""
    if not spans:
        return
    expected = 0
    for start, end in sorted(span[:2] for span in spans):
        if start != expected:
            raise NBestError(path, line_no, f"the phrases' source spans leave out or repeat source word "
                             f"{min(start, expected)}: Moses translates each source word once")
        expected = end + 1


def _segmentation_field(text: str, path: str, line_no: int) -> tuple[PhraseSpan, ...] | None:
    """The spans of ``-include-segmentation-in-n-best``'s field, or None when ``text`` is another
    field (Moses' word alignment, ``0-0 1-2``, has no ``=``)."""
    tokens = text.split()
    if not any("=" in token for token in tokens):
        return None
    spans = []
    for token in tokens:
        match = _SPAN_FIELD_TOKEN.fullmatch(token)
        if match is None:
            raise NBestError(path, line_no, f"segmentation {token!r} is not SOURCE[-END]=TARGET[-END] "
                             "(Moses' -include-segmentation-in-n-best)")
        s, e, t, u = match.groups()
        spans.append(_span(int(s), int(e or s), int(t), int(u or t), token, path, line_no))
    targets = [span[2:] for span in spans]
    expected = 0
    for (start, end), token in zip(targets, tokens, strict=True):
        if start != expected:
            raise NBestError(path, line_no, f"segmentation {token!r}: target word {start} where word {expected} "
                             "should start the next phrase")
        expected = end + 1
    return tuple(spans)


def _marked_phrases(text: str, path: str, line_no: int) -> tuple[str, tuple[PhraseSpan, ...] | None]:
    """The hypothesis without ``-t``'s ``|S-E|`` markers, and the spans they mark (None without any)."""
    if "|" not in text:
        return text.strip(), None
    tokens = text.split()
    if not any(token.startswith("|") and _MARKER_LIKE.fullmatch(token) for token in tokens):
        return text.strip(), None
    words: list[str] = []
    spans: list[PhraseSpan] = []
    for token in tokens:
        match = _MARKER.fullmatch(token)
        if match is None and _MARKER_LIKE.fullmatch(token):
            raise NBestError(path, line_no, f"segmentation marker {token!r} is not |S-E| (Moses' -t; -tt's "
                             "enriched markers are not read: decode with -include-segmentation-in-n-best)")
        if match is None:
            words.append(token)
            continue
        start = spans[-1][3] + 1 if spans else 0
        if start == len(words):
            raise NBestError(path, line_no, f"segmentation marker {token!r} follows no target word")
        spans.append(_span(int(match[1]), int(match[2]), start, len(words) - 1, token, path, line_no))
    if words[spans[-1][3] + 1:]:
        raise NBestError(path, line_no, f"words after the last |S-E| segmentation marker: "
                         f"{' '.join(words[spans[-1][3] + 1:])!r}")
    return " ".join(words), tuple(spans)


def _span(s: int, e: int, t: int, u: int, token: str, path: str, line_no: int) -> PhraseSpan:
    if e < s or u < t:
        raise NBestError(path, line_no, f"segmentation {token!r}: a span ends before it starts")
    return s, e, t, u


def read_nbest(
    path: PathArg, *, expected_sentences: int | None = None, check_ids: bool = True, per_sentence: int | None = None
) -> Iterator[NBestEntry]:
    """Stream the entries of a Moses n-best list (plain or gzip, ``"-"`` = stdin).

    ``per_sentence`` keeps only each sentence's first that many hypotheses: Moses writes them best
    first, so the first k of a distinct 1000-best list are its distinct k-best (every line is still
    read and checked).

    With ``check_ids`` (the default) the ids must start at 0 and each new id must be the
    previous one plus 1: Moses writes at least one hypothesis for every input sentence, so a
    gap means a truncated or hand-edited list, which would silently shift every later sentence
    against its reference. With ``expected_sentences`` the list must also cover exactly ids
    ``0 … expected_sentences-1``; a list that stops early is reported at its last line.
    """
    rank, prev_id = 0, -1
    for _, entry in _read_lines_and_entries(path, expected_sentences=expected_sentences, check_ids=check_ids):
        rank = rank + 1 if entry.sent_id == prev_id else 0
        prev_id = entry.sent_id
        if per_sentence is None or rank < per_sentence:
            yield entry


def _read_lines_and_entries(
    path: PathArg, *, expected_sentences: int | None = None, check_ids: bool = True
) -> Iterator[tuple[bytes, NBestEntry]]:
    """:func:`read_nbest`'s entries, each with its raw line (line end included), for byte-exact rewriting."""
    name = display_name(path)
    prev_id = -1
    line_no = 0
    for line_no, raw in iter_raw_lines(path, error=NBestError):
        try:
            line = strip_line_end(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise NBestError(name, line_no, f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
        if not line.strip():
            raise NBestError(name, line_no, "empty line")
        entry = parse_nbest_line(line, path=name, line_no=line_no)
        if check_ids:
            _check_id(entry.sent_id, prev_id, expected_sentences, name, line_no)
        prev_id = entry.sent_id
        yield raw, entry
    if check_ids and expected_sentences is not None and prev_id + 1 != expected_sentences:
        if prev_id < 0:
            raise NBestError(name, None, f"the list is empty; expected {expected_sentences} sentences")
        raise NBestError(
            name,
            line_no,
            f"the list ends at sentence id {prev_id}; expected {expected_sentences} sentences "
            f"(ids 0..{expected_sentences - 1}): sentence id {prev_id + 1} is missing",
        )


def _check_id(sent_id: int, prev_id: int, expected: int | None, name: str, line_no: int) -> None:
    if sent_id == prev_id:
        return
    if sent_id < prev_id:
        raise NBestError(
            name, line_no, f"sentence id {sent_id} after id {prev_id}: ids must be non-decreasing"
        )
    if sent_id != prev_id + 1:
        missing = f"{prev_id + 1}" if sent_id == prev_id + 2 else f"{prev_id + 1}..{sent_id - 1}"
        after = f"follows id {prev_id}" if prev_id >= 0 else "starts the list"
        raise NBestError(name, line_no, f"sentence id {sent_id} {after}: sentence id {missing} is missing")
    if expected is not None and sent_id >= expected:
        raise NBestError(
            name,
            line_no,
            f"sentence id {sent_id} is out of range: expected {expected} sentences (ids 0..{expected - 1})",
        )


# --------------------------------------------------------------------------------------------
# Writing


def nbest_hypothesis(text: str) -> str:
    """``text`` as an n-best line's hypothesis: a word holding ``|||`` would read as the field separator, so
    its bars are written as Moses' tokenizer writes one (``&#124;``). Moses' own lists never hold one; a
    model trained on text that was not tokenized by Moses can produce it."""
    if FIELD_SEPARATOR not in text:
        return text
    return " ".join(word.replace("|", "&#124;") if FIELD_SEPARATOR in word else word for word in text.split(" "))


def format_value(value: float) -> str:
    """A feature value as Moses writes it: C++ stream default, i.e. ``%g`` with 6 digits.

    Matching Moses byte for byte lets a read/write round trip reproduce its lists exactly.
    """
    return f"{value:.6g}"


#: Scores of new features for a chunk of entries: ``[(name, values [len(entries), k]), …]``.
FeatureScorer = Callable[[list[NBestEntry]], Sequence[tuple[str, np.ndarray]]]


def _sentence_chunks(
    rows: Iterator[tuple[bytes, NBestEntry]], size: int
) -> Iterator[list[tuple[bytes, NBestEntry]]]:
    """Consecutive rows grouped into chunks of whole sentences, about ``size`` rows each."""
    chunk: list[tuple[bytes, NBestEntry]] = []
    for row in rows:
        if len(chunk) >= size and row[1].sent_id != chunk[-1][1].sent_id:
            yield chunk
            chunk = []
        chunk.append(row)
    if chunk:
        yield chunk


def _with_features(raw: bytes, added: bytes) -> bytes:
    """``raw`` with ``added`` appended to its feature field (the third); every other byte kept."""
    if not added:
        return raw
    body = strip_line_end(raw)
    ending = raw[len(body):]
    fields = body.split(FIELD_SEPARATOR.encode())
    feats = fields[2]
    kept = feats.rstrip(b" ")
    fields[2] = kept + b" " + added + feats[len(kept):]
    return FIELD_SEPARATOR.encode().join(fields) + ending


def append_features(
    nbest_in: PathArg,
    nbest_out: PathArg,
    score: FeatureScorer,
    *,
    chunk_lines: int = 2000,
    expected_sentences: int | None = None,
    check_entry: Callable[[NBestEntry], None] | None = None,
) -> int:
    """The one n-best rewriter: append `` Name= v …`` to each line's features; return the line count.

    ``score`` gets chunks of whole sentences (about ``chunk_lines`` hypotheses) and returns each new
    feature's name and values. Every other byte of a line stays as it was (hypothesis, the other
    features, the total as Moses wrote it, alignment fields, the line end), so the result is also
    a valid ``--transform-decoded-file`` output for ``mert-moses.pl``. Lines are parsed and their
    ids checked as :func:`read_nbest` does, and each entry by ``check_entry`` (a caller's own rule,
    raising :class:`NBestError`), so a broken list fails with its file and line: a list that can be
    read twice (:func:`~infrastructure.files.read_twice`) is checked whole before the first line is
    scored, since a neural feature scores a list for an hour. A feature the list already has is an
    error (a second copy would make the list unreadable). Values are written as Moses writes its
    own; the output is written atomically.
    """
    name = display_name(nbest_in)
    count = 0

    def checked_rows() -> Iterator[tuple[bytes, NBestEntry]]:
        for raw, entry in _read_lines_and_entries(nbest_in, expected_sentences=expected_sentences):
            if check_entry is not None:
                check_entry(entry)
            yield raw, entry

    if read_twice(nbest_in):
        for _ in checked_rows():
            pass
    rows = checked_rows()
    with atomic_output(nbest_out) as out:
        for chunk in _sentence_chunks(rows, chunk_lines):
            entries = [entry for _, entry in chunk]
            scores = score(entries)
            new_names = {feature for feature, _ in scores}
            for entry in entries:
                clash = sorted(new_names & {n for n, _ in entry.features})
                if clash:
                    raise NBestError(name, entry.line_no, f"the list already has feature(s) {', '.join(clash)}")
            columns = [(feature, np.asarray(values, dtype=np.float64).reshape(len(entries), -1))
                       for feature, values in scores]
            for i, (raw, _) in enumerate(chunk):
                added = " ".join(f"{feature}= " + " ".join(format_value(v) for v in values[i].tolist())
                                 for feature, values in columns)
                out.write(_with_features(raw, added.encode("utf-8")))
            count += len(chunk)
    return count


# --------------------------------------------------------------------------------------------
# Arrays


def column_names(names: Sequence[tuple[str, int]]) -> list[str]:
    """Per-column names as Moses' ``extractor`` writes them: ``LM0_0``, ``TranslationModel0_3``."""
    return [f"{name}_{i}" for name, count in names for i in range(count)]


def _describe(names: Sequence[tuple[str, int]]) -> str:
    return "[" + " ".join(f"{n}={c}" for n, c in names) + "]"


@dataclass(slots=True)
class NBestArrays:
    """A whole n-best list as arrays, the form MERT works on.

    Rows are hypotheses in file order (so grouped by sentence). ``offsets[s]:offsets[s+1]`` are
    the rows of sentence ``s``. ``feature_names`` is ``[(name, count), …]`` in column order.
    """

    sent_ids: np.ndarray  # int64 [H]
    hypotheses: list[str]
    features: np.ndarray  # float64 [H, F]
    feature_names: FeatureNames
    totals: np.ndarray  # float64 [H]
    path: str = ""
    sparse_names: tuple[str, ...] = ()  # sparse features seen (left out of ``features``)

    @property
    def num_sentences(self) -> int:
        return int(self.sent_ids[-1]) + 1 if len(self.sent_ids) else 0

    @property
    def offsets(self) -> np.ndarray:
        """``[S+1]`` row offsets of each sentence (ids are contiguous from 0)."""
        return np.searchsorted(self.sent_ids, np.arange(self.num_sentences + 1), side="left").astype(np.int64)

    def column_names(self) -> list[str]:
        return column_names(self.feature_names)


def load_nbest_arrays(
    path: PathArg, *, expected_sentences: int | None = None, per_sentence: int | None = None
) -> NBestArrays:
    """Read a whole n-best list into :class:`NBestArrays` (each sentence's first ``per_sentence``
    hypotheses only, when given: :func:`read_nbest`).

    Every line must carry the same dense features with the same value counts as the first line,
    reported otherwise with the offending line. Sparse features (``Name_x= v``: a name with
    ``_``, as Moses' extractor tells them apart, SPEC §6) fire on some hypotheses only; they are
    left out of the dense columns and their names listed in ``sparse_names``, as Moses' ``mert``
    optimises the dense weights and holds the sparse ones where they are.
    """
    name = display_name(path)
    sent_ids: list[int] = []
    hyps: list[str] = []
    rows: list[list[float]] = []
    totals: list[float] = []
    names: FeatureNames | None = None
    sparse: set[str] = set()
    for entry in read_nbest(path, expected_sentences=expected_sentences, per_sentence=per_sentence):
        if any("_" in feature for feature, _ in entry.features):
            sparse.update(feature for feature, _ in entry.features if "_" in feature)
            entry = NBestEntry(entry.sent_id, entry.hypothesis,
                               [(f, v) for f, v in entry.features if "_" not in f], entry.total, entry.extra,
                               entry.line_no)
        own = entry.feature_names()
        if names is None:
            names = own
        elif own != names:
            raise NBestError(
                name, entry.line_no, f"features {_describe(own)} differ from the first line's {_describe(names)}"
            )
        sent_ids.append(entry.sent_id)
        hyps.append(entry.hypothesis)
        rows.append([v for _, values in entry.features for v in values])
        totals.append(entry.total)
    if names is None:
        raise NBestError(name, None, "the n-best list is empty")
    return NBestArrays(
        sent_ids=np.asarray(sent_ids, dtype=np.int64),
        hypotheses=hyps,
        features=np.asarray(rows, dtype=np.float64).reshape(len(rows), -1),
        feature_names=names,
        totals=np.asarray(totals, dtype=np.float64),
        path=name,
        sparse_names=tuple(sorted(sparse)),
    )
