"""Batched CSLM scoring with shared histories: token scores, sentence log-probabilities, raw scores.

Fast n-best rescoring (:func:`sentence_log_probs`): a 100-best list repeats the same 6-word
histories many times. The network runs once per distinct history in a batch (hidden layers and
the softmax normaliser), and each token then only needs one dot product with its word's output
row. This is exactly equal to the one-n-gram-at-a-time computation, only cheaper.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cslm.model import CSLM
from moses_integration.phrase_table import LOG_FLOOR
from moses_integration.tokens import split_tokens
from neural.device import autocast, autocast_dtype
from neural.vocab import Vocab

#: Tokens per scoring batch: large enough that the histories of a whole 100-best list (and of
#: several sentences) are deduplicated together, small enough to bound the [U, V] softmax.
DEFAULT_BATCH_TOKENS = 16384
#: Distinct histories per output-layer chunk: bounds the [chunk, V] logits to ~60 MB at V=15,001.
SOFTMAX_CHUNK = 1024


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
