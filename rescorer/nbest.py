"""The RNN Encoder–Decoder as an n-best feature: ``mert tune --feature RNN:model.pt``.

The value of a hypothesis is what Moses would have put in its n-best list for the p_RNN column of a
table that ``rescore-phrase-table`` rescored with the same model: the sum, over the hypothesis'
phrase pairs, of ln p as Moses reads it from the column (the probability the table holds, written
by :func:`rescorer.pipeline.columns.rnn.probability_column`, parsed as a float32, its ln floored at
−100). So a model can be tried by reranking n-best lists without rescoring whole tables. A model
trained with ``rescorer train --reverse`` gives p(f|e), the column of ``--reverse-model``; the model
file says which direction it scores.

The phrase pairs come from Moses' segmentation (:attr:`moses_integration.nbest.NBestEntry.segmentation`):
decode with ``-include-segmentation-in-n-best`` (which ``mert tune`` and ``mert evaluate`` add, from
:attr:`RNNFeature.decoder_flags`). Each call scores every distinct pair of its
hypotheses once, in the batched prefix-tree scorer of ``rescore-phrase-table``
(:class:`rescorer.pipeline.scoring.PairScorer`), on the same shortlists: a word outside them is
``[UNK]``, as in the table.

A source word the phrase table does not hold, Moses passes through unknown, and the column gives
that pair 0. With ``table=PATH`` (the table the list was decoded with) such pairs are 0 here too;
without it they are scored by the model, which adds the same amount to every hypothesis of a
sentence that passes the word through.

MERT imports no model package: ``pyproject.toml`` registers :class:`RNNFeature` under the short name
``RNN`` in the entry-point group ``mert.features``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infrastructure.errors import UserError
from infrastructure.files import display_name, open_input
from moses_integration.moses_ini import dense_feature_name_problem
from moses_integration.nbest import SEGMENTATION_FLAG, NBestEntry
from moses_integration.phrase_table import LOG_FLOOR
from moses_integration.tokens import split_tokens
from neural.device import autocast_dtype, matmul_precision, scoring_precision, select_device
from rescorer.model.checkpoint import Checkpoint, load_checkpoint
from rescorer.pipeline.columns.rnn import probability_column
from rescorer.pipeline.scoring import PairScorer
from rescorer.tables.chunks import iter_line_chunks, parse_chunk, phrases_to_ids

#: The feature's name by the model's direction: p(e|f) and p(f|e) can go in one list side by side.
DEFAULT_NAMES = {"forward": "RNN0", "reverse": "RNNReverse0"}
OPTIONS = ("name", "table")
TABLE_CHUNK_LINES = 100_000


class RNNFeatureError(UserError):
    """An RNN feature that cannot be built, or a hypothesis it cannot score; one line."""


def column_values(log_probs: np.ndarray) -> np.ndarray:
    """ln p of each pair as Moses reads the table's column back: the text the table holds
    (:func:`probability_column`) parsed as a float32, its ln (float32) floored at −100."""
    text = probability_column(np.asarray(log_probs, dtype=np.float64)).to_numpy(zero_copy_only=False)
    as_read = np.asarray(text.astype(str), dtype=np.float32)
    return np.maximum(np.log(as_read), np.float32(LOG_FLOOR)).astype(np.float64)


class PhrasePairScorer:
    """ln p of (table source, table target) pairs, as the model's column of the table gives them."""

    def __init__(self, checkpoint: Checkpoint, device: str = "auto", precision: str = "auto") -> None:
        self.direction = checkpoint.config.direction
        self.precision = scoring_precision(precision)
        torch_device = select_device(device)
        self.scorer = PairScorer(checkpoint.model, torch_device, autocast_dtype(torch_device, self.precision),
                                 precision=self.precision)
        self.src_words = pa.array(checkpoint.src_vocab.words, pa.string())
        self.tgt_words = pa.array(checkpoint.tgt_vocab.words, pa.string())

    def log_probs(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        """The model's log p(target | source), or log p(source | target) for a reverse model."""
        if not pairs:
            return np.empty(0, dtype=np.float64)
        given, predicted = zip(*pairs, strict=True) if self.direction == "forward" else \
            zip(*((target, source) for source, target in pairs), strict=True)
        distinct = sorted(set(given))  # sorted: a phrase and its extensions share one encoder tree
        where = {phrase: k for k, phrase in enumerate(distinct)}
        sources = phrases_to_ids(pa.array(distinct, pa.string()), self.src_words)
        targets = phrases_to_ids(pa.array(predicted, pa.string()), self.tgt_words)
        source_of_row = np.fromiter((where[p] for p in given), dtype=np.int64, count=len(given))
        with matmul_precision(self.precision):
            return self.scorer.score(sources, source_of_row, targets)


def phrase_pairs(source: str, entry: NBestEntry) -> list[tuple[str, str]]:
    """The (source phrase, target phrase) pairs of a hypothesis, in target order."""
    if entry.segmentation is None:
        raise RNNFeatureError(f"n-best line {entry.line_no} has no phrase segmentation: the RNN feature scores "
                              "phrase pairs; decode with moses -include-segmentation-in-n-best "
                              "(mert tune and mert evaluate add it)")
    src, tgt = split_tokens(source), split_tokens(entry.hypothesis)
    covered = max((e + 1 for _, e, _, _ in entry.segmentation), default=0)  # the reader checked the tiling
    if covered != len(src):
        raise RNNFeatureError(f"n-best line {entry.line_no}: its phrases cover {covered} source words but "
                              f"sentence {entry.sent_id} of the source has {len(src)}: is it the source the list "
                              "was decoded from?")
    return [(" ".join(src[s:e + 1]), " ".join(tgt[t:u + 1])) for s, e, t, u in entry.segmentation]


def table_words(path: str) -> frozenset[str]:
    """The one-word source phrases of a Moses text table: the words Moses does not pass through unknown.

    Read with ``rescore-phrase-table``'s chunk parser, so a line Moses could not load (a binarised
    table, another file) is an error naming it, not a set of words that makes every pair unknown.
    """
    words: set[str] = set()
    num_scores = None
    with open_input(path) as fh:
        for chunk in iter_line_chunks(fh, display_name(path), TABLE_CHUNK_LINES):
            parsed = parse_chunk(chunk, display_name(path), num_scores=num_scores)
            num_scores = parsed.num_scores
            one_word = pc.invert(pc.match_substring(parsed.source, " "))
            words.update(pc.unique(parsed.source.filter(one_word)).to_pylist())
    return frozenset(words)


def _options(arg: str) -> tuple[str, dict[str, str]]:
    """``model.pt,name=X,table=PATH`` → the model's path and the options."""
    path, *rest = arg.split(",")
    options = {}
    for item in rest:
        key, _, value = item.partition("=")
        if key not in OPTIONS or not value:
            raise RNNFeatureError(f"RNN feature option {item!r}: expected name=NAME or table=PATH")
        options[key] = value
    return path, options


class RNNFeature:
    """``mert tune --feature RNN:model.pt[,name=RNN0][,table=phrase-table.gz]``: one value per hypothesis."""

    num_values = 1
    #: What the lists it scores need: ``mert tune`` and ``mert evaluate`` add it to their decoding.
    decoder_flags = (SEGMENTATION_FLAG,)

    def __init__(self, arg: str | None = None, device: str = "auto") -> None:
        if not arg:
            raise RNNFeatureError("RNN needs a model file: --feature RNN:path/to/model.pt[,table=PATH]")
        path, options = _options(arg)
        checkpoint = load_checkpoint(path)
        name = options.get("name") or DEFAULT_NAMES[checkpoint.config.direction]
        problem = dense_feature_name_problem(name)
        if problem:
            raise RNNFeatureError(f"feature name {name!r} {problem}")
        self.name = name
        self.scorer = PhrasePairScorer(checkpoint, device)
        self.known = table_words(options["table"]) if "table" in options else None

    @staticmethod
    def absolute_arg(arg: str) -> str:
        """Paths made absolute: ``mert evaluate`` may run from another folder than ``mert tune``."""
        path, options = _options(arg)
        if "table" in options:
            options["table"] = os.path.abspath(options["table"])
        return ",".join([os.path.abspath(path), *(f"{k}={v}" for k, v in options.items())])

    @staticmethod
    def model_files(arg: str) -> list[str]:
        """The model file and the ``table=`` it reads (``mert.features.feature_files``)."""
        path, options = _options(arg)
        return [path, *([options["table"]] if "table" in options else [])]

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        pairs_of = [phrase_pairs(source_sentences[e.sent_id], e) for e in entries]
        distinct = sorted({pair for pairs in pairs_of for pair in pairs})
        values = column_values(self.scorer.log_probs(distinct))
        if self.known is not None:
            values[[source not in self.known and " " not in source for source, _ in distinct]] = 0.0
        value_of = dict(zip(distinct, values.tolist(), strict=True))
        return np.array([[sum(value_of[pair] for pair in pairs)] for pairs in pairs_of], dtype=np.float64)
