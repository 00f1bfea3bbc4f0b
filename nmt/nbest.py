"""The NMT model as an n-best feature: ``mert tune --feature NMT:model.pt`` and ``nmt nbest``.

The value of a hypothesis is log p(hypothesis | source) under the model, after the subword split of
its training text (the n-best list and the source are Moses-tokenised, as the bitext was). Given the
model of the other direction too (the same ``nmt train`` on the swapped bitext), a second column is
log p(source | hypothesis), as reranking systems usually carry both. The hypotheses of one source
sentence are scored together: the source encoded once, the hypotheses batched
(:func:`nmt.scoring.score_grouped`).

MERT imports no model package: ``pyproject.toml`` registers :class:`NMTFeature` under the short name
``NMT`` in the entry-point group ``mert.features``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from infrastructure.files import PathArg, display_name
from infrastructure.lines import read_text_lines
from moses_integration.moses_ini import dense_feature_name_problem
from moses_integration.nbest import NBestEntry, NBestError, append_features
from nmt.model import NMTError
from nmt.model_file import NMTFile, load_nmt
from nmt.scoring import score_grouped, score_pairs

DEFAULT_FEATURE_NAME = "NMT0"


def feature_name(name: str) -> str:
    """``name`` if Moses and MERT can use it as a dense feature name, else an :class:`NMTError` saying why."""
    problem = dense_feature_name_problem(name)
    if problem:
        raise NMTError(f"feature name {name!r} {problem}")
    return name


class NBestScorer:
    """log p(e|f) of hypotheses, and log p(f|e) with a reverse model: ``[hypotheses, 1 or 2]``."""

    def __init__(self, forward: NMTFile, reverse: NMTFile | None = None, *, normalize: bool = False) -> None:
        self.forward = forward
        self.reverse = reverse
        self.normalize = normalize

    @property
    def num_values(self) -> int:
        return 1 if self.reverse is None else 2

    def score(self, sources: Sequence[str], entries: Sequence[NBestEntry]) -> np.ndarray:
        """The values of ``entries``, whose ``sent_id`` indexes ``sources``."""
        sentence_ids = sorted({e.sent_id for e in entries})
        where = {sid: k for k, sid in enumerate(sentence_ids)}
        hypotheses = [e.hypothesis.strip() for e in entries]
        forward = self.forward
        columns = [score_grouped(forward.model, forward.src_subwords.encode([sources[s] for s in sentence_ids]),
                                 [where[e.sent_id] for e in entries], forward.tgt_subwords.encode(hypotheses),
                                 normalize=self.normalize)]
        if self.reverse is not None:
            reverse = self.reverse
            columns.append(score_pairs(reverse.model, reverse.src_subwords.encode(hypotheses),
                                       reverse.tgt_subwords.encode([sources[e.sent_id] for e in entries]),
                                       normalize=self.normalize))
        return np.stack(columns, axis=1)


def _options(arg: str) -> tuple[str, dict[str, str]]:
    """``model.pt,reverse=r.pt,name=X,normalize`` → the model's path and the options."""
    path, *rest = arg.split(",")
    options = {}
    for item in rest:
        key, _, value = item.partition("=")
        if key not in ("reverse", "name", "normalize"):
            raise NMTError(f"NMT feature option {key!r}: expected reverse=PATH, name=NAME or normalize")
        options[key] = value
    return path, options


class NMTFeature:
    """``mert tune --feature NMT:model.pt[,reverse=reverse.pt][,name=NMT0][,normalize]``."""

    def __init__(self, arg: str | None = None, device: str = "auto") -> None:
        if not arg:
            raise NMTError("NMT needs a model file: --feature NMT:path/to/model.pt[,reverse=path/to/reverse.pt]")
        path, options = _options(arg)
        self.name = feature_name(options.get("name") or DEFAULT_FEATURE_NAME)
        reverse = load_nmt(options["reverse"], _device(device)) if options.get("reverse") else None
        self.scorer = NBestScorer(load_nmt(path, _device(device)), reverse, normalize="normalize" in options)
        self.num_values = self.scorer.num_values

    @staticmethod
    def absolute_arg(arg: str) -> str:
        """Model paths made absolute: ``mert evaluate`` may run from another folder than ``mert tune``."""
        path, options = _options(arg)
        parts = [os.path.abspath(path)]
        for key, value in options.items():
            if key == "reverse":
                value = os.path.abspath(value)
            parts.append(f"{key}={value}" if value or key != "normalize" else key)
        return ",".join(parts)

    @staticmethod
    def model_files(arg: str) -> list[str]:
        """The model files it reads, ``reverse=`` too (``mert.features.feature_files``)."""
        path, options = _options(arg)
        return [path, *([options["reverse"]] if options.get("reverse") else [])]

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        return self.scorer.score(source_sentences, entries)


def _device(name: str):
    from neural.device import select_device

    return select_device(name)


def add_nmt_to_nbest(scorer: NBestScorer, source_file: PathArg, nbest_in: PathArg, nbest_out: PathArg, *,
                     name: str = DEFAULT_FEATURE_NAME, chunk_lines: int = 2000) -> int:
    """Append `` NAME= v [v]`` to each hypothesis of ``nbest_in``, every other byte kept; return the lines.

    The list's sentence ids must run 0, 1, … without a gap and stay within ``source_file``'s lines:
    otherwise one line naming the list's file and line, before a hypothesis is scored.
    """
    sources = read_text_lines(source_file)
    listed = display_name(nbest_in)

    def within_the_source(entry: NBestEntry) -> None:
        if entry.sent_id >= len(sources):
            raise NBestError(listed, entry.line_no, f"sentence id {entry.sent_id} but the source "
                             f"{display_name(source_file)} has {len(sources)} lines")

    def score(entries: list[NBestEntry]) -> list[tuple[str, np.ndarray]]:
        return [(name, scorer.score(sources, entries))]

    return append_features(nbest_in, nbest_out, score, chunk_lines=chunk_lines, check_entry=within_the_source)
