"""Generating targets word by word: the decoder step and output layer of one position at a time.

The beam searches (:mod:`rescorer.proposals.beam`, :mod:`rescorer.analysis.sampling`) start from
:func:`start_decoding` and advance every live hypothesis with :func:`next_word_log_probs` or
:func:`next_word_top_k`. The GRU step, maxout and output layer are the model's own methods, the very
ones the scoring paths use, so a generated target's summed step scores equal
:meth:`RNNEncoderDecoder.score_targets` of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rescorer.model import block_sizes
from rescorer.model.network import RNNEncoderDecoder


def top_k_by_chunks(logits: Tensor, k: int, chunk: int = block_sizes.TOP_K_CHUNK) -> tuple[Tensor, Tensor]:
    """``logits.topk(k, dim=1)`` (values best first, and their columns), found through chunk maxima.

    The row is cut into chunks of ``chunk`` columns (the last ``V mod chunk`` columns are a tail
    that is always a candidate). A chunk holding one of the k best values has its maximum at least
    the k-th best value, and at most k chunk maxima can be, so the k chunks with the largest maxima
    hold every one of the k best values outside the tail: a top-k over those k·chunk columns and the
    tail is exact. It reads the row once for the maxima instead of sorting through it (ties may
    come back in another order than torch.topk's, which promises none).
    """
    rows, vocab = logits.shape
    chunks = vocab // chunk
    if chunks <= k or rows == 0:
        return logits.topk(k, dim=1)
    full = chunks * chunk
    blocks = logits.as_strided((rows, chunks, chunk), (logits.stride(0), chunk, logits.stride(1)))
    _, best_chunks = blocks.amax(dim=2).topk(k, dim=1, sorted=False)  # [rows, k]
    candidates = blocks.gather(1, best_chunks.unsqueeze(2).expand(-1, -1, chunk)).reshape(rows, k * chunk)
    candidates = torch.cat([candidates, logits[:, full:]], dim=1)
    values, at = candidates.topk(k, dim=1)
    in_chunk = at < k * chunk
    columns = torch.where(in_chunk, best_chunks.gather(1, (at // chunk).clamp(max=k - 1)) * chunk + at % chunk,
                          full + at - k * chunk)
    return values, columns


@dataclass
class DecoderStart:
    """Per-pair decoder terms for generating word by word (:func:`start_decoding`).

    ``state`` is h'⟨0⟩ = tanh(V' c); ``gate_context`` [C_r c; C_z c]; ``cand_context`` C c plus the
    bias the reset multiplies; ``out_context`` O_c c plus the deep-output bias.
    """

    state: Tensor
    gate_context: Tensor
    cand_context: Tensor
    out_context: Tensor


def start_decoding(model: RNNEncoderDecoder, c: Tensor) -> DecoderStart:
    """What generation needs from the summaries c [B, d]: h'⟨0⟩ and the per-pair context terms.

    The model's per-pair terms (:meth:`RNNEncoderDecoder.decoder_init`,
    :meth:`RNNEncoderDecoder.decoder_context` and the ``out_context`` of
    :meth:`RNNEncoderDecoder.output_features`) once per pair, so :func:`next_word_log_probs`
    repeats none of them per step.
    """
    gate_context, cand_context = model.decoder_context(c)
    return DecoderStart(state=model.decoder_init(c), gate_context=gate_context, cand_context=cand_context,
                        out_context=model.out_context(c))


def next_word_log_probs(
    model: RNNEncoderDecoder, start: DecoderStart, rows: Tensor, h: Tensor, prev: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One generation step: (h'⟨t⟩ [n, d], log p(y_t = · | y_<t, X) [n, V]).

    ``rows`` [n] picks each hypothesis' pair in ``start`` (several hypotheses may share one
    source), ``h`` [n, d] is h'⟨t−1⟩ and ``prev`` [n] the ids y_{t−1}, or None at t = 1 where
    e(y_0) = 0. The GRU step, maxout and output layer are the very methods the scoring paths
    use, so a generated target's summed step scores equal :meth:`RNNEncoderDecoder.score_targets` of it.
    """
    h, s = _next_word_step(model, start, rows, h, prev)
    return h, torch.log_softmax(model.logits(s), dim=-1)


def next_word_top_k(
    model: RNNEncoderDecoder, start: DecoderStart, rows: Tensor, h: Tensor, prev: Tensor | None, k: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The step of :func:`next_word_log_probs` keeping each hypothesis' ``k`` likeliest words:
    (h'⟨t⟩ [n, d], their log-probabilities [n, k], best first, and their ids [n, k]).

    log p = (G s)_w − log Σ exp(G s), the top k taken on the logits: the full [n, V] of
    log-probabilities is never written. On the CPU the rows go in blocks whose logits stay in
    cache between the matmul, the top-k and the log-sum-exp (a beam search's cost is mostly
    here: benchmarks/propose_speed.py).
    """
    h, s = _next_word_step(model, start, rows, h, prev)
    k = min(k, model.config.tgt_vocab_size)
    block = block_sizes.CPU_GENERATION_BLOCK_ROWS if s.device.type == "cpu" else max(1, s.shape[0])
    values, ids = [], []
    for lo in range(0, s.shape[0], block):
        logits = model.logits(s[lo : lo + block])
        top, top_ids = top_k_by_chunks(logits, k) if s.device.type == "cpu" else logits.topk(k, dim=1)
        values.append(top - torch.logsumexp(logits, dim=1, keepdim=True))
        ids.append(top_ids)
    if not values:
        return h, s.new_zeros(0, k), torch.zeros(0, k, dtype=torch.long, device=s.device)
    return h, torch.cat(values), torch.cat(ids)


def _next_word_step(
    model: RNNEncoderDecoder, start: DecoderStart, rows: Tensor, h: Tensor, prev: Tensor | None
) -> tuple[Tensor, Tensor]:
    """h'⟨t⟩ and the maxout units s⟨t⟩ of one generation step (see :func:`next_word_log_probs`)."""
    if prev is None:
        embedded = h.new_zeros(h.shape[0], model.config.embedding, dtype=model.tgt_embed.weight.dtype)
    else:
        embedded = model.tgt_embed(prev)
    gate_inputs, cand_inputs = model.decoder_inputs(embedded)
    h = model.decoder_step(h, gate_inputs + start.gate_context[rows], cand_inputs, start.cand_context[rows])
    return h, model.output_features(h, embedded, start.out_context[rows])

