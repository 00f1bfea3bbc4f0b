"""Beam search over many source phrases at once: the RNN Encoder–Decoder proposing targets.

The paper (Sec. 3.1, 5) calls generating targets "an expensive sampling procedure" because it
searched one source at a time. Here a batch of sources is encoded together and every live
hypothesis of every source advances in one decoder step per target length: one
:func:`rescorer.model.generation.next_word_top_k` call for all of them (the model's own generation step,
:func:`~rescorer.model.generation.next_word_log_probs`, keeping each hypothesis' best words), so the cost
per step is one batched matmul chain whatever the number of sources, on the CPU as on a GPU.

The search is the original one of ``rescorer sample`` (which now runs it with one source): at each
step every live hypothesis of a source is extended by every word and the source keeps its best
``width − finished`` extensions; an extension that ends in ``</s>`` is finished and keeps its slot,
so a source stops with ``width`` finished targets, or when ``max_words`` words are reached (its
live hypotheses then come back unfinished). Each source's best ``width`` extensions are found
exactly from each hypothesis' best ``width`` words: no other word of a hypothesis can be among them.

``collect=True`` is the candidate search of the reranking (:mod:`rescorer.proposals.rerank`): a
finished hypothesis does not take a slot, so every source keeps ``width`` live hypotheses up to
``max_words`` words and every one chosen with ``</s>`` on the way is returned. The plain search's
slots fill with the short targets that finish first (the likeliest are short), so its candidates
cannot be as long as a source needs; the collecting one has finished targets of every length the
beam reaches, for the reranking to choose among.

A finished hypothesis carries log p(Y | X) of its words and ``</s>``: the float64 sum of the
step's log-probabilities, the very terms :meth:`RNNEncoderDecoder.score_targets` adds (the tests
check one against the other).

``amp_dtype=torch.bfloat16`` runs the search's matmuls in bf16 (autocast; states and the
log-softmax stay fp32), as ``--precision bf16`` does for scoring: for the CPU's bf16 units or a
GPU. Its log-probabilities then differ from fp32's by bf16 rounding, and near-ties among a
hypothesis' best words may come out in another order (``benchmarks/propose_speed.py
--precision fp32,bf16`` measures both).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from neural.device import autocast
from neural.vocab import EOS_ID
from rescorer.model.generation import next_word_top_k, start_decoding
from rescorer.model.network import RNNEncoderDecoder

DEFAULT_MAX_WORDS = 30
# Live hypotheses per decoder step. On the CPU the logits are handled 128 rows at a time anyway
# (rescorer.model.generation.next_word_top_k); 256 to 4096 rows per step measured the same within the noise
# of a shared 2-core machine (benchmarks/propose_speed.py), and more rows mean fewer Python steps.
# On a GPU a step's logits are one [rows, V] block: 16,384 rows × 15,001 words is 1 GB in fp32.
CPU_ROWS_PER_STEP = 4096
GPU_ROWS_PER_STEP = 16384


def default_rows_per_step(device: torch.device) -> int:
    return CPU_ROWS_PER_STEP if device.type == "cpu" else GPU_ROWS_PER_STEP


@dataclass(frozen=True)
class Hypothesis:
    """A target found by the search: word ids without ``</s>`` and log p(Y | X).

    ``finished`` is False for a hypothesis cut at ``max_words`` before the decoder chose ``</s>``;
    its ``log_p`` then covers its words only.
    """

    ids: tuple[int, ...]
    log_p: float
    finished: bool = True


def _check_search(width: int, max_words: int) -> None:
    if width < 1:
        raise ValueError(f"the beam width must be at least 1, got {width}")
    if max_words < 1:
        raise ValueError(f"max_words must be at least 1, got {max_words}")


@torch.inference_mode()
def beam_search_batch(
    model: RNNEncoderDecoder, c: Tensor, width: int, *, max_words: int = DEFAULT_MAX_WORDS, collect: bool = False
) -> list[list[Hypothesis]]:
    """For each of the ``S`` summaries ``c`` [S, d], its best ``width`` targets, best first.

    Finished targets come first, in score order; unfinished ones (``max_words`` words and no
    ``</s>`` yet) follow, best first, when fewer than ``width`` finished. With ``collect`` every
    finished target the search met, best first, and no unfinished one. See the module docstring.
    """
    _check_search(width, max_words)
    sources = c.shape[0]
    if sources == 0:
        return []
    device = c.device
    start = start_decoding(model, c)
    # The live hypotheses, flat: their source, their slot (0..width-1) within it, decoder state,
    # last word, words so far [n, t] and score (float64, summed from the steps' log-probabilities).
    src = torch.arange(sources, device=device)
    slot = torch.zeros(sources, dtype=torch.long, device=device)
    h = start.state
    prev: Tensor | None = None
    words = torch.zeros(sources, 0, dtype=torch.long, device=device)
    scores = torch.zeros(sources, dtype=torch.float64, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(sources)]
    room = torch.full((sources,), width, dtype=torch.long, device=device)  # width − finished, per source
    for step in range(max_words + 1):
        h_next, best, best_words = next_word_top_k(model, start, src, h, prev, width)  # each one's best k words
        k = best.shape[1]
        totals = scores.unsqueeze(1) + best.double()  # [n, k]
        # Each source's candidates side by side: [S, width·k], −inf where a slot has no hypothesis.
        table = torch.full((sources, width * k), -torch.inf, dtype=torch.float64, device=device)
        columns = slot.unsqueeze(1) * k + torch.arange(k, device=device)
        table[src.unsqueeze(1).expand(-1, k), columns] = totals
        row_of = torch.full((sources, width), -1, dtype=torch.long, device=device)
        row_of[src, slot] = torch.arange(len(src), device=device)
        chosen, flat = table.topk(min(width, table.shape[1]), dim=1)  # [S, width], best first
        rank = torch.arange(chosen.shape[1], device=device).unsqueeze(0)
        keep = (rank < room.unsqueeze(1)) & torch.isfinite(chosen)
        keep_source, keep_rank = keep.nonzero(as_tuple=True)  # by source, then rank
        parent = row_of[keep_source, flat[keep_source, keep_rank] // k]
        word = best_words[parent, flat[keep_source, keep_rank] % k]
        score = chosen[keep_source, keep_rank]
        ends = word == EOS_ID
        _record(finished, keep_source[ends], words[parent[ends]], score[ends], True)
        if not collect:
            room -= torch.bincount(keep_source[ends], minlength=sources)
        if step == max_words:
            if collect:
                break
            # A target has at most max_words words: the hypotheses whose best extensions go on
            # come back unfinished, with their words so far (each once).
            cut = torch.zeros(len(src), dtype=torch.bool, device=device)
            cut[parent[~ends]] = True
            _record(finished, src[cut], words[cut], scores[cut], False)
            break
        go_on = ~ends
        src, parent, word, score = keep_source[go_on], parent[go_on], word[go_on], score[go_on]
        if not len(src):
            break
        # Slots are renumbered 0.. within each source (rows come grouped by source, best first).
        slot = torch.arange(len(src), device=device) - torch.searchsorted(src, src)
        h, prev, scores = h_next[parent], word, score
        words = torch.cat([words[parent], word.unsqueeze(1)], dim=1)
    if collect:
        return [sorted(found, key=lambda g: -g.log_p) for found in finished]
    return [sorted(found, key=lambda g: (not g.finished, -g.log_p))[:width] for found in finished]


def _record(out: list[list[Hypothesis]], source: Tensor, words: Tensor, scores: Tensor, done: bool) -> None:
    """Append each row's hypothesis to its source's list (one host transfer per step)."""
    for s, ids, score in zip(source.tolist(), words.tolist(), scores.tolist(), strict=True):
        out[s].append(Hypothesis(tuple(ids), float(score), done))


@torch.inference_mode()
def encode_sources(model: RNNEncoderDecoder, sources: Sequence[Sequence[int]], device: torch.device) -> Tensor:
    """Summaries c [S, d] of sources given as word ids without ``</s>`` (one padded batch)."""
    lengths = torch.tensor([len(ids) + 1 for ids in sources], dtype=torch.long)
    batch = torch.zeros(len(sources), int(lengths.max()) if len(sources) else 1, dtype=torch.long)
    for row, ids in enumerate(sources):
        batch[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return model.encode(batch.to(device), lengths)


def search_sources(
    model: RNNEncoderDecoder,
    sources: Sequence[Sequence[int]],
    width: int,
    *,
    max_words: int = DEFAULT_MAX_WORDS,
    rows_per_step: int | None = None,
    amp_dtype: torch.dtype | None = None,
    collect: bool = False,
) -> Iterator[list[Hypothesis]]:
    """Each source's best ``width`` targets (:func:`beam_search_batch`), in the sources' order.

    Sources are encoded and searched in batches of ``rows_per_step // width``, so one decoder step
    never holds more than ``rows_per_step`` hypotheses (default: :data:`CPU_ROWS_PER_STEP` on the
    CPU, :data:`GPU_ROWS_PER_STEP` on a GPU). ``amp_dtype``: the matmuls' dtype under autocast
    (module doc), None for fp32. ``collect``: every finished target (:func:`beam_search_batch`).
    """
    _check_search(width, max_words)
    device = next(model.parameters()).device
    if rows_per_step is None:
        rows_per_step = default_rows_per_step(device)
    per_batch = max(1, rows_per_step // width)
    model.eval()
    for lo in range(0, len(sources), per_batch):
        batch = sources[lo : lo + per_batch]
        with autocast(device, amp_dtype):  # one cast of each weight per batch of sources
            found = beam_search_batch(model, encode_sources(model, batch, device), width, max_words=max_words,
                                      collect=collect)
        yield from found
