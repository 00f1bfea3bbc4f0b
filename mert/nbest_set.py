"""The tuning set MERT optimises on: merged n-best lists, references and named weights.

Moses' ``mert-moses.pl`` merges the n-best lists of all tuning iterations before optimising,
so that hypotheses found with earlier weights keep constraining the search (SPEC §4); a
hypothesis that comes back in a later list (same sentence, same words, same features) is
counted once. This module does that merge, builds the :class:`~mert.line_search.MertData`
arrays (features + BLEU statistics), and reads/writes weight vectors by Moses feature names
(``LexicalReordering0= v v v v v v``), the form ``moses.ini`` and ``moses -show-weights`` use.
Everything here is library code so that the CLI only parses arguments.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from infrastructure.errors import UserError
from infrastructure.files import PathArg, display_name
from infrastructure.lines import read_text_lines
from mert.bleu import References, bleu_stats_batch, read_references
from mert.line_search import MertData
from moses_integration.nbest import FeatureNames, NBestError, column_names, load_nbest_arrays


@dataclass
class NBestSet:
    """Merged n-best hypotheses grouped by sentence (rows ``offsets[s]:offsets[s+1]``)."""

    feature_names: FeatureNames
    sent_ids: np.ndarray  # int64 [H], non-decreasing
    hypotheses: list[str]
    features: np.ndarray  # float64 [H, F]
    num_sentences: int
    sources: list[str] = field(default_factory=list)
    duplicates_removed: int = 0
    sparse_names: tuple[str, ...] = ()  # sparse features of the lists, held at their weights

    @property
    def offsets(self) -> np.ndarray:
        return np.searchsorted(self.sent_ids, np.arange(self.num_sentences + 1), side="left").astype(np.int64)

    def column_names(self) -> list[str]:
        return column_names(self.feature_names)


def _describe(names: FeatureNames) -> str:
    return " ".join(f"{n}({c})" for n, c in names)


def merge_nbest_lists(paths: Sequence[PathArg], *, expected_sentences: int | None = None) -> NBestSet:
    """Read and merge n-best lists, dropping repeated hypotheses.

    All lists must have the same features (names and value counts) and cover the same
    sentences (ids ``0..S-1``, each present); the first list sets both unless
    ``expected_sentences`` is given. A hypothesis is a repeat when its sentence, words and
    feature values all equal an earlier one's; within a sentence the first occurrence keeps its
    place (lists in the order given, each in file order).
    """
    if not paths:
        raise ValueError("at least one n-best list is needed")
    names: FeatureNames | None = None
    sent_parts: list[np.ndarray] = []
    feat_parts: list[np.ndarray] = []
    hyps: list[str] = []
    sources: list[str] = []
    sparse: set[str] = set()
    count = expected_sentences
    for path in paths:
        arrays = load_nbest_arrays(path, expected_sentences=count)
        if names is None:
            names = arrays.feature_names
        elif arrays.feature_names != names:
            raise NBestError(
                arrays.path,
                1,
                f"features {_describe(arrays.feature_names)} differ from those of {sources[0]}: {_describe(names)}",
            )
        if count is None:
            count = arrays.num_sentences
        sent_parts.append(arrays.sent_ids)
        feat_parts.append(arrays.features)
        hyps.extend(arrays.hypotheses)
        sources.append(arrays.path)
        sparse.update(arrays.sparse_names)
    assert names is not None and count is not None
    sent_ids = np.concatenate(sent_parts)
    features = np.concatenate(feat_parts)
    order = np.argsort(sent_ids, kind="stable")  # group by sentence, keep list/file order
    seen: set[tuple[int, str, bytes]] = set()
    keep: list[int] = []
    for i in order.tolist():
        key = (int(sent_ids[i]), hyps[i], features[i].tobytes())
        if key not in seen:
            seen.add(key)
            keep.append(i)
    keep_arr = np.asarray(keep, dtype=np.int64)
    return NBestSet(
        feature_names=names,
        sent_ids=sent_ids[keep_arr],
        hypotheses=[hyps[i] for i in keep],
        features=features[keep_arr],
        num_sentences=count,
        sources=sources,
        duplicates_removed=len(sent_ids) - len(keep),
        sparse_names=tuple(sorted(sparse)),
    )


def build_mert_data(nbest: NBestSet, references: References) -> MertData:
    """Features and BLEU statistics of every hypothesis, ready for the line search."""
    if len(references) != nbest.num_sentences:
        raise UserError(f"{len(references)} references for {nbest.num_sentences} sentences")
    stats = bleu_stats_batch([h.split() for h in nbest.hypotheses], nbest.sent_ids, references)
    return MertData(nbest.features, stats, nbest.offsets)


def load_tuning_set(
    nbest_paths: Sequence[PathArg], reference_paths: Sequence[PathArg]
) -> tuple[NBestSet, MertData]:
    """Merge the n-best lists, read the references (one file per reference), build the arrays.

    A reference file whose line count differs from the n-best lists' sentence count is an
    error naming that file (:class:`~mert.bleu.ReferenceFileError`).
    """
    nbest = merge_nbest_lists(nbest_paths)
    references = read_references(
        reference_paths,
        expected_sentences=nbest.num_sentences,
        expected_from=f"the n-best list {nbest.sources[0]}",
    )
    return nbest, build_mert_data(nbest, references)


# --------------------------------------------------------------------------------------------
# Weights by feature name


class WeightsError(UserError):
    """A weights or init file that does not fit the n-best features, with file and line."""

    def __init__(self, path: PathArg, line_no: int, reason: str) -> None:
        self.path = display_name(path)
        self.line_no = line_no
        self.reason = reason
        super().__init__(f"{self.path}:{line_no}: {reason}")

    def __str__(self) -> str:
        return f"{self.path}:{self.line_no}: {self.reason}"


_NAMED_LINE = re.compile(r"^\s*(\S+)=\s*(.*)$")


def _floats(text: str, path: PathArg, line_no: int) -> list[float]:
    """The numbers of a weights line: finite ones, since a weight of nan or inf scores every hypothesis alike."""
    try:
        values = [float(tok) for tok in text.split()]
    except ValueError as exc:
        raise WeightsError(path, line_no, f"not a number ({exc})") from None
    for tok, value in zip(text.split(), values, strict=True):
        if not math.isfinite(value):
            raise WeightsError(path, line_no, f"{tok!r} is not a finite number")
    return values


class InlineWeights(str):
    """Weights given on the command line instead of in a file (``--init '0.1 0.2 …'`` or
    ``--init 'LM0= 0.5 TM0= 0.2 …'``): :func:`read_weights` reads them as the lines of a weights file."""

    def lines(self) -> list[str]:
        """One ``Name= v …`` per line (a new line before each ``Name=``), or the numbers as one line."""
        return re.sub(r"\s+(?=\S+=)", "\n", self.strip()).splitlines()

    @staticmethod
    def parse(text: str) -> InlineWeights | None:
        """``text`` as weights when it starts with a number or holds a ``Name=``, else None (a file name,
        then): a typo among the weights (``'LM0= x'``) is then a weights line's error, not "no such file"."""
        words = text.split()
        if not words:
            return None
        try:
            float(words[0])
        except ValueError:
            if not any(word.endswith("=") and len(word) > 1 for word in words):
                return None
        return InlineWeights(text)


def read_weights(path: PathArg | InlineWeights, names: FeatureNames) -> np.ndarray:
    """Weights in n-best column order from ``Name= v v …`` lines, a ``moses.ini``, or numbers.

    The named form is what ``moses.ini``'s ``[weight]`` section (only that section is read when
    the file has sections), ``moses -show-weights`` and ``mert optimize`` write: features absent
    from the n-best lists (``UNTUNEABLE`` lines, untuneable or switched-off features) are
    ignored; every n-best feature must be present with the right number of values. The plain
    form must list one value per n-best column, in order. ``path`` may be the weights themselves
    (:class:`InlineWeights`), named ``--init '…'`` in errors.
    """
    if isinstance(path, InlineWeights):
        all_lines, path = path.lines(), f"--init '{path}'"
    else:
        all_lines = read_text_lines(path)
    has_sections = any(line.startswith("[") for line in all_lines)
    section = None
    lines: list[tuple[int, str]] = []
    for line_no, line in enumerate(all_lines, start=1):
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
            continue
        if not stripped or stripped.startswith("#") or (has_sections and section != "[weight]"):
            continue
        lines.append((line_no, line))
    named: dict[str, tuple[int, list[float]]] = {}
    plain: list[tuple[int, list[float]]] = []
    for line_no, line in lines:
        match = _NAMED_LINE.match(line)
        if match:
            if match.group(1) in named:  # which one is meant? moses.ini refuses it too (MosesIni.weights)
                raise WeightsError(path, line_no, f"weights for {match.group(1)} already given on line "
                                   f"{named[match.group(1)][0]}")
            named[match.group(1)] = (line_no, _floats(match.group(2), path, line_no))
        elif line.split()[-1] != "UNTUNEABLE":
            plain.append((line_no, _floats(line, path, line_no)))
    columns = sum(c for _, c in names)
    if not named:
        if len(plain) != 1 or len(plain[0][1]) != columns:
            found = sum(len(v) for _, v in plain)
            raise WeightsError(path, plain[0][0] if plain else 1, f"expected {columns} weights, found {found}")
        return np.asarray(plain[0][1], dtype=np.float64)
    values: list[float] = []
    for name, count in names:
        if name not in named:
            raise WeightsError(path, len(all_lines), f"no weights for n-best feature {name}")
        line_no, vals = named[name]
        if len(vals) != count:
            raise WeightsError(path, line_no, f"{name} has {len(vals)} weights, the n-best lists {count} values")
        values.extend(vals)
    return np.asarray(values, dtype=np.float64)


def read_init_opt(path: PathArg, num_columns: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Moses' ``init.opt``: start weights (line 1), random-restart minima (2) and maxima (3).

    Lines 2-3 are optional; ``mert-moses.pl`` writes 0s and 1s there (the default range).
    """
    lines = read_text_lines(path)
    rows: list[np.ndarray] = []
    for line_no, line in enumerate(lines[:3], start=1):
        vals = _floats(line, path, line_no)
        if len(vals) != num_columns:
            raise WeightsError(path, line_no, f"expected {num_columns} values, found {len(vals)}")
        rows.append(np.asarray(vals, dtype=np.float64))
    if not rows:
        raise WeightsError(path, 1, "empty init file")
    if len(rows) == 2:
        raise WeightsError(path, 2, "minima without maxima (line 3 is missing)")
    if len(rows) == 3:
        for column, (low, high) in enumerate(zip(rows[1].tolist(), rows[2].tolist(), strict=True), start=1):
            if not low <= high:
                raise WeightsError(path, 3, f"value {column}: the random-restart maximum {high:g} is below "
                                   f"the minimum {low:g} of line 2")
            if not math.isfinite(high - low):
                raise WeightsError(path, 3, f"value {column}: the random-restart range {low:g} to {high:g} is "
                                   "wider than a float holds")
    return rows[0], (rows[1] if len(rows) == 3 else None), (rows[2] if len(rows) == 3 else None)


def start_points(
    names: FeatureNames, *, init_opt: PathArg | None = None, init_paths: Sequence[PathArg | InlineWeights] = ()
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """Start points ``[N, F]`` and random-restart ranges from the user's init files.

    ``init_opt``'s first line comes first (its lines 2-3, when present, are the ranges), then
    each weights file. Without any, the start is all ones: a neutral guess, since with Moses'
    defaults it is the random restarts that explore.
    """
    columns = sum(c for _, c in names)
    starts: list[np.ndarray] = []
    ranges = None
    if init_opt is not None:
        first, low, high = read_init_opt(init_opt, columns)
        starts.append(first)
        if low is not None and high is not None:
            ranges = (low, high)
    starts.extend(read_weights(path, names) for path in init_paths)
    if not starts:
        starts.append(np.ones(columns))
    return np.vstack(starts), ranges


def format_weights(weights: np.ndarray, names: FeatureNames) -> list[str]:
    """``Name= v v …`` lines (Moses ``[weight]`` syntax, 6 significant digits like ``mert``)."""
    lines = []
    pos = 0
    for name, count in names:
        vals = " ".join(f"{v:.6g}" for v in weights[pos : pos + count])
        lines.append(f"{name}= {vals}")
        pos += count
    return lines


def fixed_mask(names: FeatureNames, fixed: Sequence[str]) -> np.ndarray:
    """Columns to keep fixed, given feature names (all columns) or column names (``LM0_0``)."""
    columns = column_names(names)
    mask = np.zeros(len(columns), dtype=bool)
    pos = 0
    by_feature: dict[str, tuple[int, int]] = {}
    for name, count in names:
        by_feature[name] = (pos, pos + count)
        pos += count
    for item in fixed:
        if item in by_feature:
            lo, hi = by_feature[item]
            mask[lo:hi] = True
        elif item in columns:
            mask[columns.index(item)] = True
        else:
            raise UserError(f"--fixed {item}: no such feature or column (have {' '.join(n for n, _ in names)})")
    return mask
