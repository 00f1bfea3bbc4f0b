"""Extra n-best features: scores Moses cannot compute, added to its n-best lists for MERT.

Moses has no run-time plugin API (SPEC §6), so a model it cannot run inside the decoder (the CSLM
of the paper, for one) enters the system by *n-best rescoring*: every hypothesis of every
n-best list gets ``Name= v …`` appended to its feature field, MERT tunes the extra weights with
the others, and at test time the decoder's n-best list is rescored with all weights. This module
holds the interface such a feature implements, the streaming rewrite of an n-best list, and the
loader that ``mert tune --feature`` uses: a built-in short name, a short name an installed package
registers (entry-point group ``mert.features``; this project's ``CSLM``), or ``module:Class[:arg]``.
MERT imports no model package: features come from above.

Feature names must be dense-feature names in Moses' sense: no ``_`` (Moses' ``extractor``
treats any name containing ``_`` as a sparse feature, SPEC §6), no blanks, no ``=``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from infrastructure.errors import UserError
from infrastructure.files import PathArg, display_name, write_json
from infrastructure.lines import read_text_lines
from infrastructure.resume_record import file_identity
from moses_integration.moses_ini import MosesIni, dense_feature_name_problem
from moses_integration.nbest import NBestEntry, NBestError, append_features
from moses_integration.tokens import split_tokens

#: Hypotheses handed to a feature per ``score`` call (whole sentences only). Large enough for a
#: neural feature to fill a batch, small enough that a 10^6-line list is never held in memory.
DEFAULT_CHUNK_HYPOTHESES = 2000


class FeatureError(UserError):
    """A feature that cannot be loaded or that returned unusable scores."""


@runtime_checkable
class NBestFeature(Protocol):
    """What an extra n-best feature provides.

    ``name`` is the n-best/``moses.ini`` name (``CSLM0``), ``num_values`` how many dense values it
    adds to each hypothesis. ``score`` gets the whole source side (one tokenized sentence per
    line, as the decoder saw it) and a batch of hypotheses from whole sentences
    (``entry.sent_id`` indexes ``source_sentences``) and returns ``[len(entries), num_values]``
    finite log-domain values: MERT combines them linearly with Moses' own features. A Protocol
    rather than a base class, so a model class needs no import from this package to qualify.
    A feature may also say which ``moses`` flags the lists it scores need, in an optional
    ``decoder_flags`` attribute (the phrase RNN: ``-include-segmentation-in-n-best``):
    :func:`decoder_flags` collects them for ``mert tune`` and ``mert evaluate``.
    """

    name: str
    num_values: int

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray: ...


def check_feature_name(name: str) -> str:
    """``name`` if Moses and ``mert`` can use it as a dense feature name, else :class:`FeatureError`.

    The rule is :func:`moses_integration.moses_ini.dense_feature_name_problem`, the one moses.ini
    editing applies too.
    """
    problem = dense_feature_name_problem(name)
    if problem:
        raise FeatureError(f"feature name {name!r} {problem}")
    return name


def check_feature(feature: object) -> NBestFeature:
    """Validate the static part of a feature (name, value count, a ``score`` method)."""
    if not isinstance(feature, NBestFeature):
        raise FeatureError(f"{feature!r} is not an n-best feature (needs name, num_values and score())")
    check_feature_name(feature.name)
    if not isinstance(feature.num_values, int) or feature.num_values < 1:
        raise FeatureError(f"feature {feature.name}: num_values must be a positive integer, got {feature.num_values!r}")
    return feature


def decoder_flags(features: Sequence[object], given: Sequence[str] = ()) -> list[str]:
    """``given`` and the ``moses`` flags the features need (their optional ``decoder_flags``), each once."""
    flags = list(given)
    for feature in features:
        flags += [flag for flag in getattr(feature, "decoder_flags", ()) if flag not in flags]
    return flags


# --------------------------------------------------------------------------------------------
# Built-in features


class WordCount:
    """The number of target words of the hypothesis.

    Mostly a reference implementation of the interface (it costs nothing and its values are
    obvious in a test): with Moses' own ``WordPenalty0`` (= −words) in the list, it is collinear
    with that feature and adds nothing to the model. Useful for n-best lists from systems that
    lack a word penalty.
    """

    num_values = 1

    def __init__(self, name: str = "WordCount") -> None:
        self.name = check_feature_name(name)

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        return np.array([[len(split_tokens(e.hypothesis))] for e in entries], dtype=np.float64)


class LengthRatio:
    """−(log((|hyp|+1)/(|src|+1)) − log r)²: how far the target/source length ratio is from r.

    Moses' word penalty is linear in the hypothesis length alone, so it can only make every
    output longer or shorter by the same push; it cannot say "about as long as the source". This
    feature peaks when the hypothesis has ``ratio`` times the source's words (French runs ~1.1×
    English in tokens) and falls off quadratically in the log ratio, so MERT can trade it against
    the word penalty to penalise too-short and too-long outputs per sentence. The +1 keeps empty
    hypotheses finite. The argument (``LengthRatio:1.1``) is ``ratio``, default 1.
    """

    num_values = 1

    def __init__(self, ratio: str | float = 1.0, name: str = "LengthRatio") -> None:
        try:
            value = float(ratio)
        except ValueError:
            raise FeatureError(f"LengthRatio: ratio {ratio!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise FeatureError(f"LengthRatio: ratio must be positive, got {ratio!r}")
        self.ratio = value
        self.name = check_feature_name(name)

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        hyp = np.array([len(split_tokens(e.hypothesis)) for e in entries], dtype=np.float64)
        src = np.array([len(split_tokens(source_sentences[e.sent_id])) for e in entries], dtype=np.float64)
        dev = np.log((hyp + 1.0) / (src + 1.0)) - math.log(self.ratio)
        return -(dev**2)[:, None]


#: Short names for ``--feature`` that this module defines: ``WordCount``, ``LengthRatio:1.1``.
BUILTIN_FEATURES: dict[str, object] = {"WordCount": WordCount, "LengthRatio": LengthRatio}

#: The entry-point group where an installed package registers an n-best feature under a short name.
#: MERT knows no model package: this project's ``pyproject.toml`` registers the CSLM of ``cslm`` as
#: ``CSLM = "cslm.nbest:CSLMFeature"``, so ``--feature CSLM:model.pt`` works without this package
#: importing it (and MERT without a CSLM never loads torch).
FEATURE_ENTRY_POINT_GROUP = "mert.features"


def registered_features() -> dict[str, tuple[str, str]]:
    """``{short name: (module, class)}`` of every feature installed packages register.

    Read from the installed packages' metadata, not from this source tree: after a change to the
    registrations in ``pyproject.toml`` the project must be installed again (``pip install -e .``).
    """
    return {ep.name: (ep.module, ep.attr) for ep in entry_points(group=FEATURE_ENTRY_POINT_GROUP)}


# --------------------------------------------------------------------------------------------
# Loading features from a spec


@dataclass(frozen=True)
class FeatureSpec:
    """A parsed ``--feature`` value: where the class lives and its optional string argument.

    The spec text is what the sidecar file of a tuned system stores, so that ``mert evaluate``
    can build the same feature again. ``head`` is the spec without its argument (``CSLM``,
    ``module:Class``).
    """

    text: str
    head: str
    module: str
    class_name: str
    arg: str | None

    def with_arg(self, arg: str) -> str:
        """The spec text of the same feature with another argument."""
        return f"{self.head}:{arg}"


def parse_feature_spec(text: str) -> FeatureSpec:
    """``module:Class[:arg]``, a built-in ``Name[:arg]`` (:data:`BUILTIN_FEATURES`) or a registered
    one (:func:`registered_features`).

    A built-in name wins over a registered one, and both over a module of the same name, so
    ``LengthRatio:1.1`` is the built-in with argument ``1.1``. The argument is everything after the
    short name's ``:`` or the class's (it may contain more colons, e.g. a path on Windows, or a
    ``key=value`` list the class parses itself).
    """
    text = text.strip()
    head, _, rest = text.partition(":")
    if head in BUILTIN_FEATURES:
        return FeatureSpec(text, head, __name__, head, rest or None)
    registered = registered_features()
    if head in registered:
        module, class_name = registered[head]
        return FeatureSpec(text, head, module, class_name, rest or None)
    class_name, sep, arg = rest.partition(":")
    if not head or not class_name:
        raise FeatureError(f"--feature {text!r}: expected module:Class[:arg], {_short_names(registered)}")
    return FeatureSpec(text, f"{head}:{class_name}", head, class_name, arg if sep else None)


def _short_names(registered: dict[str, tuple[str, str]]) -> str:
    """The short names a spec may start with, for error messages: a stale install registers none."""
    others = ", ".join(sorted(registered)) or "none: is the project installed (pip install -e .)?"
    return (f"a built-in ({', '.join(BUILTIN_FEATURES)})[:arg] or a registered feature[:arg] "
            f"(entry points {FEATURE_ENTRY_POINT_GROUP}: {others})")


def absolute_spec_path(text: str) -> str:
    """The spec with its argument made independent of the current folder, where the feature's class
    says how (an ``absolute_arg(arg) -> str`` static method): ``CSLM:model.pt`` → ``CSLM:/abs/model.pt``.

    ``mert tune`` stores the specs in the tuned system's sidecar, and ``mert evaluate`` may run from
    another folder. Other specs are returned unchanged.
    """
    parsed = parse_feature_spec(text)
    if parsed.arg is None:
        return parsed.text
    absolute_arg = getattr(_feature_class(parsed), "absolute_arg", None)
    return parsed.with_arg(absolute_arg(parsed.arg)) if callable(absolute_arg) else parsed.text


def feature_files(text: str) -> list[Path]:
    """The files the feature a spec names reads (its models, a phrase table), where its class says which
    (a ``model_files(arg) -> list[str]`` static method); none otherwise.

    ``mert evaluate --resume`` records them with its decodes: a test set rescored with an RNN or an NMT
    model since retrained in place is not the new model's output.
    """
    parsed = parse_feature_spec(text)
    model_files = getattr(_feature_class(parsed), "model_files", None) if parsed.arg is not None else None
    return [Path(name) for name in model_files(parsed.arg)] if callable(model_files) else []


#: How a resume record names a file a system reads: ``model /abs/lm.fr.binary``.
MODEL_KEY = "model "


def system_files_record(ini: MosesIni, decoder_cwd: PathArg | None, specs: Iterable[str]) -> dict[str, object]:
    """Every file a system reads, by path, size and time, under :data:`MODEL_KEY` names: what its ini's
    features read (:meth:`MosesIni.model_files`: tables, LM) and what its extra features read
    (:func:`feature_files`); one that is gone is ``None``. A table or a model retrained in place keeps its
    path: ``mert tune --resume`` and ``mert evaluate --resume`` compare this record, so that lists or
    outputs of the old system are never taken for the new one's (gigabytes are not hashed on every run)."""
    models = ini.model_files(decoder_cwd) + [path for spec in specs for path in feature_files(spec)]
    return {f"{MODEL_KEY}{path.resolve()}": file_identity(path) if path.exists() else None for path in models}


def model_names(*records: dict[str, object]) -> dict[str, str]:
    """How a refused resume names the :func:`system_files_record` keys of ``records``: "the model"."""
    return {key: "the model" for record in records for key in record if key.startswith(MODEL_KEY)}


def _feature_class(parsed: FeatureSpec) -> object:
    """The class (or factory) a spec names, imported."""
    try:
        module = importlib.import_module(parsed.module)
    except ImportError as exc:
        hint = "" if "." in parsed.module else f"; not {_short_names(registered_features())} either"
        raise FeatureError(f"--feature {parsed.text!r}: cannot import {parsed.module!r} ({exc}){hint}") from exc
    cls = getattr(module, parsed.class_name, None)
    if cls is None:
        raise FeatureError(f"--feature {parsed.text!r}: module {parsed.module!r} has no {parsed.class_name!r}")
    return cls


def load_feature(spec: str | FeatureSpec) -> NBestFeature:
    """Import and instantiate a feature: ``Class(arg)`` with an argument, ``Class()`` without."""
    parsed = parse_feature_spec(spec) if isinstance(spec, str) else spec
    cls = _feature_class(parsed)
    try:
        feature = cls(parsed.arg) if parsed.arg is not None else cls()
    except FeatureError:
        raise
    except Exception as exc:
        raise FeatureError(f"--feature {parsed.text!r}: {parsed.class_name}() failed: {exc}") from exc
    return check_feature(feature)


def load_features(specs: Iterable[str]) -> list[NBestFeature]:
    """Load every spec; two features with the same name would be indistinguishable in a list."""
    features = [load_feature(s) for s in specs]
    names = [f.name for f in features]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise FeatureError(f"feature name(s) used twice: {', '.join(dup)}")
    return features


# --------------------------------------------------------------------------------------------
# Adding features to n-best lists


def read_source_sentences(path: PathArg) -> list[str]:
    """The decoder input, one sentence per line (UTF-8, plain or gzip), newlines removed."""
    return read_text_lines(path)


def score_entries(
    features: Sequence[NBestFeature], source_sentences: list[str], entries: list[NBestEntry], *, path: str = "<n-best>"
) -> list[np.ndarray]:
    """Each feature's ``[len(entries), num_values]`` scores, checked for shape and finiteness.

    A NaN or infinite value would break every comparison MERT makes, and a wrongly shaped array
    would silently shift values between hypotheses, so both are errors naming the feature.
    """
    for entry in entries:
        if entry.sent_id >= len(source_sentences):
            raise NBestError(
                path, entry.line_no, f"sentence id {entry.sent_id} but the source has {len(source_sentences)} lines"
            )
    results = []
    for feature in features:
        values = np.asarray(feature.score(source_sentences, entries), dtype=np.float64)
        if values.ndim == 1 and feature.num_values == 1:
            values = values[:, None]
        if values.shape != (len(entries), feature.num_values):
            raise FeatureError(
                f"feature {feature.name} returned shape {values.shape}, expected ({len(entries)}, {feature.num_values})"
            )
        if not np.all(np.isfinite(values)):
            bad = int(np.flatnonzero(~np.all(np.isfinite(values), axis=1))[0])
            raise FeatureError(f"feature {feature.name} returned a non-finite value for {path}:{entries[bad].line_no}")
        results.append(values)
    return results


def add_features(
    nbest_in: PathArg,
    nbest_out: PathArg,
    source_file: PathArg | list[str],
    features: Sequence[NBestFeature],
    *,
    chunk_hypotheses: int = DEFAULT_CHUNK_HYPOTHESES,
) -> int:
    """Append every feature's ``Name= v …`` to each hypothesis of ``nbest_in``; return the line count.

    Through the one n-best rewriter (:func:`moses_integration.nbest.append_features`): chunks of
    whole sentences, every other byte kept, written atomically (gzip for a ``.gz`` name), so a
    crash never leaves a plausible but short list for MERT to merge. The total score (field 4) is
    left as Moses wrote it: it is informational, and the extra weights are not known until MERT
    has run.
    """
    feats = [check_feature(f) for f in features]
    sources = read_source_sentences(source_file) if not isinstance(source_file, list) else source_file
    name = display_name(nbest_in)

    def score(entries: list[NBestEntry]) -> list[tuple[str, np.ndarray]]:
        return [(f.name, values) for f, values in zip(feats, score_entries(feats, sources, entries, path=name),
                                                       strict=True)]

    return append_features(nbest_in, nbest_out, score, chunk_lines=chunk_hypotheses,
                           expected_sentences=len(sources))


# --------------------------------------------------------------------------------------------
# The sidecar: extra-feature weights of a tuned moses.ini

SIDECAR_SUFFIX = ".extra-features"
SIDECAR_FORMAT = "mert-extra-features/1"


@dataclass(frozen=True)
class ExtraFeatureWeights:
    """One extra feature of a tuned system: how to build it again, its name and its weights."""

    spec: str
    name: str
    weights: tuple[float, ...]


def sidecar_path(ini_path: PathArg) -> Path:
    """``moses.ini`` → ``moses.ini.extra-features``: beside the ini, so the two travel together."""
    return Path(f"{os.fspath(ini_path)}{SIDECAR_SUFFIX}")


def write_sidecar(ini_path: PathArg, extras: Sequence[ExtraFeatureWeights]) -> Path | None:
    """Write (atomically) the extra-feature weights beside ``ini_path``; remove a stale one if none.

    Moses cannot compute these features, so their weights cannot live in ``moses.ini`` (Moses
    would abort on a weight for an unknown feature). Removing an old sidecar when a config has
    no extra features matters: ``mert evaluate`` would otherwise rescore with features that
    were never tuned together with these weights.
    """
    path = sidecar_path(ini_path)
    if not extras:
        path.unlink(missing_ok=True)
        return None
    doc = {
        "format": SIDECAR_FORMAT,
        "note": "weights of n-best features Moses cannot compute; apply them by n-best rescoring "
        "(mert evaluate does this)",
        "features": [{"spec": e.spec, "name": e.name, "weights": list(e.weights)} for e in extras],
    }
    write_json(path, doc)
    return path


def read_sidecar(ini_path: PathArg) -> list[ExtraFeatureWeights]:
    """The extra features of a tuned ini (empty when it has no sidecar)."""
    path = sidecar_path(ini_path)
    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        fmt = doc.get("format")
        items = [(str(f["spec"]), str(f["name"]), tuple(float(w) for w in f["weights"])) for f in doc["features"]]
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise FeatureError(f"{path}: not a valid extra-features file ({exc})") from exc
    if fmt != SIDECAR_FORMAT:
        raise FeatureError(f"{path}: unknown format {fmt!r} (expected {SIDECAR_FORMAT})")
    return [ExtraFeatureWeights(spec, check_feature_name(name), weights) for spec, name, weights in items]
