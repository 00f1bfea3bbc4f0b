"""The CSLM as an n-best feature: for ``mert tune --feature CSLM:…`` and as ``cslm nbest``, the
``--transform-decoded-file`` filter of ``mert-moses.pl``.

MERT imports no model package: ``pyproject.toml`` registers :class:`CSLMFeature` under the short
name ``CSLM`` in the entry-point group ``mert.features``, which ``mert.features`` reads.
"""

from __future__ import annotations

import os

import numpy as np

from cslm.model import CSLM, CSLMError
from cslm.model_file import load_cslm
from cslm.scoring import ScoreStats, sentence_log_probs
from infrastructure.files import PathArg
from moses_integration.moses_ini import dense_feature_name_problem
from moses_integration.nbest import NBestEntry, append_features
from moses_integration.tokens import split_tokens
from neural.vocab import Vocab

DEFAULT_FEATURE_NAME = "CSLM0"


class CSLMFeature:
    """The CSLM as an n-best feature (``mert tune --feature CSLM:model.pt``): one value per hypothesis.

    The value is the hypothesis' natural-log probability (its words and ``</s>``), which MERT
    weighs against Moses' own ``LM0``. ``model`` may end in ``,name=X`` to use another feature name.
    """

    num_values = 1

    def __init__(self, model: str | None = None, name: str = DEFAULT_FEATURE_NAME, device: str = "auto") -> None:
        if not model:
            raise CSLMError("CSLM needs a model file: --feature CSLM:path/to/cslm.pt")
        path, _, option = model.partition(",name=")
        if option:
            name = option
        self.name = dense_feature_name(name)
        self.path = path
        self.loaded = load_cslm(path, device)
        self.stats = ScoreStats()

    @staticmethod
    def absolute_arg(model: str) -> str:
        """``m.pt,name=CSLM1`` → ``/abs/m.pt,name=CSLM1``: ``mert tune`` stores the spec in the tuned
        system's sidecar, and ``mert evaluate`` may run from another folder."""
        path, comma, option = model.partition(",")
        return f"{os.path.abspath(path)}{comma}{option}"

    @staticmethod
    def model_files(model: str) -> list[str]:
        """The model file the spec names (``mert.features.feature_files``)."""
        return [model.partition(",")[0]]

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        sentences = [split_tokens(e.hypothesis) for e in entries]
        return sentence_log_probs(self.loaded.model, self.loaded.vocab, sentences, stats=self.stats)[:, None]


def dense_feature_name(name: str) -> str:
    """``name`` if Moses and MERT can use it as a dense feature name, else a ValueError saying why."""
    problem = dense_feature_name_problem(name)
    if problem:
        raise CSLMError(f"feature name {name!r} {problem}")
    return name


def add_cslm_to_nbest(
    model: CSLM,
    vocab: Vocab,
    nbest_in: PathArg,
    nbest_out: PathArg,
    *,
    name: str = DEFAULT_FEATURE_NAME,
    chunk_lines: int = 2000,
    normalize: bool = True,
    stats: ScoreStats | None = None,
) -> int:
    """Append `` NAME= v`` to every line's feature field, keeping every other byte; return the line count.

    This is the ``--transform-decoded-file`` filter for ``mert-moses.pl``: values are written as
    Moses writes its own (6 significant digits), the hypothesis, the other features, the total
    and any further fields stay byte for byte (:func:`moses_integration.nbest.append_features`, the
    one n-best rewriter). A broken list fails with its file and line; the output is atomic.
    """

    def score(entries: list[NBestEntry]) -> list[tuple[str, np.ndarray]]:
        sentences = [split_tokens(e.hypothesis) for e in entries]
        return [(name, sentence_log_probs(model, vocab, sentences, normalize=normalize, stats=stats))]

    return append_features(nbest_in, nbest_out, score, chunk_lines=chunk_lines)
