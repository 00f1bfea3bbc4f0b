"""Schwenk's continuous-space language model (CSLM): a feed-forward n-gram neural LM (SPEC §5).

The paper's configuration is a 7-gram model: the 6 previous words are each embedded in 512
dimensions and concatenated (3,072 inputs), followed by ReLU layers of 1,536 and 1,024 units and a
softmax over the target shortlist (15,000 words with ``[UNK]``, plus ``</s>``). The start of a
sentence is padded with ``<s>``, an input-only symbol: it is never predicted, so it has an input
embedding but no output unit. Weights start from U(−0.01, 0.01).

A sentence's score is the natural-log probability of its words and ``</s>``, each given its 6
predecessors. Words outside the shortlist are ``[UNK]`` on both sides: as history they use the
``[UNK]`` embedding, and as a predicted word they get the probability of the ``[UNK]`` class (all
out-of-shortlist words together), which is what the paper's model computes too.

Fast n-best rescoring (:func:`sentence_log_probs`): a 100-best list repeats the same 6-word
histories many times. The network runs once per distinct history in a batch (hidden layers and
the softmax normaliser), and each token then only needs one dot product with its word's output
row. This is exactly equal to the one-n-gram-at-a-time computation, only cheaper.

Model files are self-describing (config, vocabulary, weights, optional training state) and load
with ``torch.load(weights_only=True)``, like the RNN's checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from moses_integration.moses_ini import dense_feature_name_problem
from moses_integration.nbest import FIELD_SEPARATOR, NBestEntry, NBestError, format_value, parse_nbest_line
from moses_integration.phrase_table import LOG_FLOOR, PathArg, atomic_output, display_name, open_input
from moses_integration.tokens import split_tokens
from rescorer.checkpoint import _check_loadable, read_model_file
from rescorer.config import _check_positive_int, _strict_from_dict
from rescorer.device import autocast, autocast_dtype, select_device
from rescorer.vocab import Vocab

FORMAT_NAME = "moses-rnn-rescorer-cslm"
FORMAT_VERSION = 1
DEFAULT_FEATURE_NAME = "CSLM0"
#: Tokens per scoring batch: large enough that the histories of a whole 100-best list (and of
#: several sentences) are deduplicated together, small enough to bound the [U, V] softmax.
DEFAULT_BATCH_TOKENS = 16384
#: Distinct histories per output-layer chunk: bounds the [chunk, V] logits to ~60 MB at V=15,001.
SOFTMAX_CHUNK = 1024


class CSLMError(ValueError):
    """A file that is not a usable CSLM model, or input the model cannot score."""


@dataclass
class CSLMConfig:
    """Sizes of the CSLM; the defaults are the paper's (SPEC §5).

    ``vocab_size`` counts output ids: the shortlist words, ``[UNK]`` and ``</s>`` (15,001 for a
    15,000-word shortlist). The input side has one more id, ``<s>`` (= ``vocab_size``).
    ``order`` is n: the model sees ``order - 1`` previous words.
    """

    vocab_size: int
    order: int = 7
    embedding: int = 512
    hidden: list[int] = field(default_factory=lambda: [1536, 1024])
    init_range: float = 0.01

    def __post_init__(self) -> None:
        _check_positive_int("CSLMConfig", "vocab_size", self.vocab_size, minimum=2)
        _check_positive_int("CSLMConfig", "order", self.order, minimum=2)
        _check_positive_int("CSLMConfig", "embedding", self.embedding)
        self.hidden = list(self.hidden)
        for i, units in enumerate(self.hidden):
            _check_positive_int("CSLMConfig", f"hidden[{i}]", units)
        if not (isinstance(self.init_range, (int, float)) and 0 < float(self.init_range) < 1):
            raise ValueError(f"CSLMConfig.init_range must be in (0, 1), got {self.init_range!r}")
        self.init_range = float(self.init_range)

    @property
    def context(self) -> int:
        return self.order - 1

    @property
    def bos_id(self) -> int:
        """The input-only ``<s>`` id that pads histories at the start of a sentence."""
        return self.vocab_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CSLMConfig:
        return _strict_from_dict(cls, data)


class CSLM(nn.Module):
    """Embeddings of the ``order − 1`` previous words → ReLU layers → softmax over the shortlist."""

    def __init__(self, config: CSLMConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size + 1, config.embedding)
        layers: list[nn.Module] = []
        width = config.context * config.embedding
        for units in config.hidden:
            layers += [nn.Linear(width, units), nn.ReLU()]
            width = units
        self.hidden_layers = nn.Sequential(*layers)
        self.output = nn.Linear(width, config.vocab_size)
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        r = self.config.init_range
        for p in self.parameters():
            p.uniform_(-r, r)

    def hidden(self, histories: torch.Tensor) -> torch.Tensor:
        """``[N, order−1]`` input ids → ``[N, H]`` last hidden layer."""
        return self.hidden_layers(self.embed(histories).flatten(1))

    def forward(self, histories: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores ``[N, V]`` of every output word after each history."""
        return self.output(self.hidden(histories))

    def log_probs(self, histories: torch.Tensor) -> torch.Tensor:
        """Normalised log-probabilities ``[N, V]`` (fp32)."""
        return torch.log_softmax(self(histories).float(), dim=-1)


# --------------------------------------------------------------------------------------------
# Histories


def sentence_positions(lengths: np.ndarray, context: int) -> np.ndarray:
    """For a flat stream of sentences of ``lengths`` tokens, each token's position, capped at ``context``.

    The cap is all :func:`gather_histories` needs (is offset −k still inside the sentence?) and
    lets a corpus store positions as ``uint8``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.arange(int(lengths.sum()), dtype=np.int64) - starts
    return np.minimum(pos, context)


def gather_histories(
    tokens: np.ndarray, positions: np.ndarray, idx: np.ndarray, context: int, bos_id: int
) -> np.ndarray:
    """``[len(idx), context]`` histories of the tokens at ``idx`` in a flat sentence stream.

    ``tokens`` holds each sentence's ids followed by ``</s>``, sentence after sentence;
    ``positions[i]`` is token i's position in its sentence (capped at ``context``). Words before the
    sentence start are ``<s>``; the oldest word is in column 0.
    """
    idx = np.asarray(idx, dtype=np.int64)
    offsets = np.arange(-context, 0, dtype=np.int64)
    where = idx[:, None] + offsets[None, :]
    hist = np.asarray(tokens)[np.maximum(where, 0)].astype(np.int64)
    before_start = offsets[None, :] < -np.asarray(positions)[idx].astype(np.int64)[:, None]
    hist[before_start] = bos_id
    return hist


def encode_sentences(vocab: Vocab, sentences: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id stream (each sentence closed by ``</s>``) and the sentence lengths including it."""
    lengths = np.fromiter((len(s) + 1 for s in sentences), dtype=np.int64, count=len(sentences))
    ids = np.empty(int(lengths.sum()), dtype=np.int64)
    at = 0
    for sent in sentences:
        ids[at : at + len(sent)] = vocab.encode(sent)
        ids[at + len(sent)] = vocab.eos_id
        at += len(sent) + 1
    return ids, lengths


# --------------------------------------------------------------------------------------------
# Scoring


def raw_scores(logits: torch.Tensor) -> torch.Tensor:
    """Per-word raw scores as Moses' ``NeuralLM`` adds them: the logit, floored at ``LOG_FLOOR`` (−100)."""
    return torch.clamp(logits, min=LOG_FLOOR)


@dataclass
class ScoreStats:
    """What a scoring run did: tokens scored and distinct histories the network computed."""

    sentences: int = 0
    tokens: int = 0
    distinct_histories: int = 0
    log_prob: float = 0.0

    @property
    def history_share(self) -> float:
        """Distinct histories as a share of scored tokens: 1.0 means no sharing at all."""
        return self.distinct_histories / self.tokens if self.tokens else 0.0

    @property
    def perplexity(self) -> float:
        return float(np.exp(-self.log_prob / self.tokens)) if self.tokens else float("nan")


@dataclass
class TokenScores:
    """Each token's unnormalised score (its output logit) and its history's log Z, fp32 on the model's device.

    ``logit - log_z`` is the normalised log-probability; ``logit`` alone is what Moses' ``NeuralLM``
    adds for a model exported with ``export-nplm``, which is the log-probability only as far as
    the model is self-normalised (log Z ≈ 0). ``log_z`` is None when it was not computed.
    """

    logit: torch.Tensor
    log_z: torch.Tensor | None
    distinct_histories: int

    def log_probs(self) -> torch.Tensor:
        assert self.log_z is not None, "log Z was not computed (normalize=False)"
        return self.logit - self.log_z


@torch.no_grad()
def token_scores(
    model: CSLM,
    histories: torch.Tensor,
    targets: torch.Tensor,
    *,
    share_histories: bool = True,
    normalize: bool = True,
    amp_dtype: torch.dtype | None = None,
) -> TokenScores:
    """The target logit of each row and, with ``normalize``, its history's log Z.

    With ``share_histories`` the hidden layers and the softmax normaliser run once per distinct
    history; each token then adds one dot product with its word's output row. Without
    ``normalize`` the [histories, V] output layer is never computed, as in the decoder.
    """
    device = model.output.weight.device
    histories = histories.to(device)
    targets = targets.to(device)
    if share_histories:
        unique, inverse = torch.unique(histories, dim=0, return_inverse=True)
    else:
        unique, inverse = histories, torch.arange(len(histories), device=device)
    weight, bias = model.output.weight, model.output.bias
    lse = torch.empty(len(unique), dtype=torch.float32, device=device) if normalize else None
    with autocast(device, amp_dtype):
        hidden = model.hidden(unique)
        if lse is not None:
            for start in range(0, len(unique), SOFTMAX_CHUNK):
                h = hidden[start : start + SOFTMAX_CHUNK]
                lse[start : start + len(h)] = torch.logsumexp(model.output(h).float(), dim=-1)
        h_tok = hidden[inverse].float()
        tgt_logit = (h_tok * weight[targets].float()).sum(-1) + bias[targets].float()
    return TokenScores(tgt_logit, None if lse is None else lse[inverse], len(unique))


def _token_batches(lengths: np.ndarray, batch_tokens: int) -> Iterator[tuple[int, int]]:
    """Consecutive sentence ranges ``[a, b)`` of about ``batch_tokens`` tokens (at least one sentence)."""
    a, total = 0, 0
    for b, n in enumerate(lengths):
        if total and total + n > batch_tokens:
            yield a, b
            a, total = b, 0
        total += int(n)
    if a < len(lengths):
        yield a, len(lengths)


def sentence_log_probs(
    model: CSLM,
    vocab: Vocab,
    sentences: Sequence[Sequence[str]],
    *,
    share_histories: bool = True,
    batch_tokens: int = DEFAULT_BATCH_TOKENS,
    precision: str = "auto",
    normalize: bool = True,
    stats: ScoreStats | None = None,
) -> np.ndarray:
    """Natural-log probability of each tokenised sentence (its words and ``</s>``), float64.

    Sentences are batched together (``batch_tokens`` tokens per network call), so histories
    shared between sentences, as in an n-best list, are computed once. ``normalize=False`` gives
    what Moses' ``NeuralLM`` adds for the exported model: each word's raw score, floored at
    ``LOG_FLOOR`` as Moses floors every LM score, summed (see :func:`raw_scores`).
    """
    cfg = model.config
    device = model.output.weight.device
    amp_dtype = autocast_dtype(device, precision)
    ids, lengths = encode_sentences(vocab, sentences)
    positions = sentence_positions(lengths, cfg.context)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    result = np.zeros(len(sentences), dtype=np.float64)
    for a, b in _token_batches(lengths, batch_tokens):
        idx = np.arange(starts[a], ends[b - 1], dtype=np.int64)
        hist = torch.from_numpy(gather_histories(ids, positions, idx, cfg.context, cfg.bos_id))
        scores = token_scores(model, hist, torch.from_numpy(ids[idx]), share_histories=share_histories,
                              normalize=normalize, amp_dtype=amp_dtype)
        distinct = scores.distinct_histories
        per_token = (scores.log_probs() if normalize else raw_scores(scores.logit)).double().cpu().numpy()
        sums = np.add.reduceat(per_token, (starts[a:b] - starts[a]).astype(np.int64))
        result[a:b] = sums
        if stats is not None:
            stats.distinct_histories += distinct
    if stats is not None:
        stats.sentences += len(sentences)
        stats.tokens += int(lengths.sum())
        stats.log_prob += float(result.sum())
    return result


def score_lines(
    model: CSLM, vocab: Vocab, lines: Iterable[str], *, chunk_lines: int = 2000, normalize: bool = True,
    stats: ScoreStats | None = None,
) -> Iterator[float]:
    """Stream sentence log-probabilities of tokenised text lines (Moses' tokenisation)."""
    chunk: list[list[str]] = []
    for line in lines:
        chunk.append(split_tokens(line.rstrip("\r\n")))
        if len(chunk) >= chunk_lines:
            yield from sentence_log_probs(model, vocab, chunk, normalize=normalize, stats=stats).tolist()
            chunk = []
    if chunk:
        yield from sentence_log_probs(model, vocab, chunk, normalize=normalize, stats=stats).tolist()


# --------------------------------------------------------------------------------------------
# Model files


@dataclass
class CSLMFile:
    """A loaded CSLM: the model (eval mode), its vocabulary, and training state if saved."""

    model: CSLM
    vocab: Vocab
    train_config: dict[str, Any] | None = None
    optimizer_state: dict[str, Any] | None = None
    train_state: dict[str, Any] | None = None
    path: Path | None = None


def save_cslm(
    path: PathArg,
    model: CSLM,
    vocab: Vocab,
    *,
    train_config: Mapping[str, Any] | None = None,
    optimizer_state: Mapping[str, Any] | None = None,
    train_state: Mapping[str, Any] | None = None,
) -> Path:
    """Write a model file atomically (temp file beside it, fsync, rename)."""
    if len(vocab) != model.config.vocab_size:
        raise CSLMError(f"vocabulary has {len(vocab)} ids but the model {model.config.vocab_size}")
    for name, value in (("train_config", train_config), ("optimizer_state", optimizer_state),
                        ("train_state", train_state)):
        if value is not None:
            _check_loadable(value, name)
    payload = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "config": model.config.to_dict(),
        "vocab": vocab.to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "train_config": dict(train_config) if train_config is not None else None,
        "optimizer_state": optimizer_state,
        "train_state": train_state,
    }
    with atomic_output(path) as fh:
        torch.save(payload, fh)
    return Path(path)


def load_cslm(path: PathArg, device: str | torch.device = "cpu") -> CSLMFile:
    """Read a model file written by :func:`save_cslm`; anything else is a :class:`CSLMError`."""
    path = Path(path)
    payload = read_model_file(path, FORMAT_NAME, FORMAT_VERSION, CSLMError, "CSLM model file")
    try:
        config = CSLMConfig.from_dict(payload["config"])
        vocab = Vocab.from_dict(payload["vocab"])
        with torch.device("meta"):
            model = CSLM(config)
        model.load_state_dict(payload["state_dict"], assign=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CSLMError(f"{path}: damaged CSLM model file ({exc})") from exc
    if len(vocab) != config.vocab_size:
        raise CSLMError(f"{path}: vocabulary size {len(vocab)} differs from the config's {config.vocab_size}")
    model.to(select_device(device) if isinstance(device, str) else device)
    model.eval()
    return CSLMFile(model, vocab, payload.get("train_config"), payload.get("optimizer_state"),
                    payload.get("train_state"), path)


# --------------------------------------------------------------------------------------------
# The n-best feature


class CSLMFeature:
    """The CSLM as an n-best feature (``mert tune --feature CSLM:model.pt``): one value per hypothesis.

    The value is the hypothesis' natural-log probability (its words and ``</s>``), which MERT
    weighs against Moses' own ``LM0``. ``model`` may end in ``,name=X`` to use another feature name.
    """

    num_values = 1

    def __init__(self, model: str, name: str = DEFAULT_FEATURE_NAME, device: str = "auto") -> None:
        path, _, option = model.partition(",name=")
        if option:
            name = option
        self.name = dense_feature_name(name)
        self.path = path
        self.loaded = load_cslm(path, device)
        self.stats = ScoreStats()

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        sentences = [split_tokens(e.hypothesis) for e in entries]
        return sentence_log_probs(self.loaded.model, self.loaded.vocab, sentences, stats=self.stats)[:, None]


def dense_feature_name(name: str) -> str:
    """``name`` if Moses and MERT can use it as a dense feature name, else a ValueError saying why."""
    problem = dense_feature_name_problem(name)
    if problem:
        raise CSLMError(f"feature name {name!r} {problem}")
    return name


def _nbest_sentence_chunks(lines: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    """Raw n-best lines grouped in runs of whole sentences of about ``size`` lines."""
    chunk: list[bytes] = []
    prev_id = b""
    for raw in lines:
        sent_id = raw.split(b"|||", 1)[0]
        if len(chunk) >= size and sent_id != prev_id:
            yield chunk
            chunk = []
        chunk.append(raw)
        prev_id = sent_id
    if chunk:
        yield chunk


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
    and any further fields stay byte for byte. Lines are checked with the project's n-best parser,
    so a broken list fails with its file and line. The output is written atomically.
    """
    where = display_name(nbest_in)
    marker = f"{name}=".encode()
    line_no = 0
    with open_input(nbest_in) as fh, atomic_output(nbest_out) as out:
        for chunk in _nbest_sentence_chunks(fh, chunk_lines):
            parsed: list[tuple[bytes, list[bytes]]] = []
            sentences: list[list[str]] = []
            for raw in chunk:
                line_no += 1
                ending = b"\n" if raw.endswith(b"\n") else b""
                body = raw[: len(raw) - len(ending)]
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise NBestError(where, line_no, f"not valid UTF-8 ({exc.reason})") from None
                entry = parse_nbest_line(text.rstrip("\r"), path=where, line_no=line_no)
                if any(n == name for n, _ in entry.features):
                    raise NBestError(where, line_no, f"the list already has feature {name}")
                fields = body.split(FIELD_SEPARATOR.encode())
                parsed.append((ending, fields))
                sentences.append(split_tokens(entry.hypothesis))
            scores = sentence_log_probs(model, vocab, sentences, normalize=normalize, stats=stats)
            for (ending, fields), value in zip(parsed, scores.tolist(), strict=True):
                feats = fields[2]
                kept = feats.rstrip(b" ")
                fields[2] = kept + b" " + marker + b" " + format_value(value).encode() + feats[len(kept):]
                out.write(FIELD_SEPARATOR.encode().join(fields) + ending)
    return line_no


def set_threads(threads: int | None) -> None:
    """Apply ``--threads`` (intra-op threads for CPU matmuls); ``None`` keeps torch's default."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)

