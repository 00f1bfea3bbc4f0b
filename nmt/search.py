"""Greedy and beam search (SPEC §7), batched over sentences.

Beam search: each live hypothesis of each sentence is expanded with every target unit, the
candidates of a sentence are pruned to its current width, and each hypothesis that ends with EOS
leaves the beam and narrows it by one; a sentence is done when its width reaches 0. Every live
hypothesis of every sentence of a batch is advanced by one :meth:`~nmt.model.AttentionNMT.decoder_step`
call per length, its source's annotations gathered by index (each source encoded once). A
hypothesis reaching ``max_length`` units is closed with EOS. The result is the most probable
complete hypothesis, or with ``normalize`` the one of highest log-probability per unit (EOS counted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.model import BOS_ID, EOS_ID, AttentionNMT, pad_batch


@dataclass(frozen=True)
class Hypothesis:
    """A complete translation: its ids (without EOS) and log p(ids, EOS | source)."""

    ids: tuple[int, ...]
    log_prob: float

    def score(self, normalize: bool) -> float:
        return self.log_prob / (len(self.ids) + 1) if normalize else self.log_prob


def default_max_length(source_length: int) -> int:
    """Units a translation may have: twice the source's and 10 more (subwords of a sentence)."""
    return 2 * source_length + 10


@torch.no_grad()
def _encoded(model: AttentionNMT, sources: list[list[int]]):
    device = next(model.parameters()).device
    src, src_mask = pad_batch([list(s) + [EOS_ID] for s in sources], device)
    annotations, first = model.encode(src, src_mask)
    return annotations, model.annotation_keys(annotations), first, src_mask


@torch.no_grad()
def beam_search(model: AttentionNMT, sources: list[list[int]], beam: int, *, nbest: int = 1,
                normalize: bool = False, max_length: int | None = None) -> list[list[Hypothesis]]:
    """The ``nbest`` best complete hypotheses of each source (at most ``beam``), best first."""
    if not sources:
        return []
    annotations, keys, first, src_mask = _encoded(model, sources)
    device = annotations.device
    limits = [max_length if max_length is not None else default_max_length(len(s)) for s in sources]
    width = [beam] * len(sources)
    finished: list[list[Hypothesis]] = [[] for _ in sources]
    # The live hypotheses of all sentences, flat: their sentence, ids so far, log-prob and state.
    owner = list(range(len(sources)))
    prefixes: list[tuple[int, ...]] = [() for _ in sources]
    totals = torch.zeros(len(sources), dtype=torch.float64, device=device)
    state = first
    last = torch.full((len(sources),), BOS_ID, dtype=torch.long, device=device)
    while owner:
        rows = torch.as_tensor(owner, device=device)
        log_probs, state = model.decoder_step(last, state, keys[rows], annotations[rows], src_mask[rows])
        candidates = totals.unsqueeze(1) + log_probs.double()
        next_owner, next_prefix, next_rows, next_last, next_totals = [], [], [], [], []
        start = 0
        while start < len(owner):
            sentence = owner[start]
            end = start
            while end < len(owner) and owner[end] == sentence:
                end += 1
            block = candidates[start:end]
            if len(prefixes[start]) + 1 >= limits[sentence]:  # the last unit allowed: only EOS
                block = torch.full_like(block, float("-inf"))
                block[:, EOS_ID] = candidates[start:end, EOS_ID]
            k = min(width[sentence], block.numel())
            values, flat = block.flatten().topk(k)
            vocab = block.shape[1]
            for value, index in zip(values.tolist(), flat.tolist(), strict=True):
                if value == float("-inf"):  # fewer possible hypotheses than the beam (only EOS allowed)
                    break
                row, unit = divmod(index, vocab)
                if unit == EOS_ID:
                    finished[sentence].append(Hypothesis(prefixes[start + row], value))
                    width[sentence] -= 1
                else:
                    next_owner.append(sentence)
                    next_prefix.append(prefixes[start + row] + (unit,))
                    next_rows.append(start + row)
                    next_last.append(unit)
                    next_totals.append(value)
            if width[sentence] == 0:  # the survivors of a sentence whose beam closed are dropped
                while next_owner and next_owner[-1] == sentence:
                    for kept in (next_owner, next_prefix, next_rows, next_last, next_totals):
                        kept.pop()
            start = end
        if not next_owner:
            break
        pick = torch.as_tensor(next_rows, device=device)
        owner, prefixes, state = next_owner, next_prefix, state[pick]
        last = torch.as_tensor(next_last, dtype=torch.long, device=device)
        totals = torch.as_tensor(next_totals, dtype=torch.float64, device=device)
    return [sorted(done, key=lambda h: -h.score(normalize))[:nbest] for done in finished]


@torch.no_grad()
def greedy_search(model: AttentionNMT, sources: list[list[int]],
                  max_length: int | None = None) -> list[Hypothesis]:
    """The most probable unit at each step until EOS (or ``max_length`` units, then EOS)."""
    if not sources:
        return []
    annotations, keys, first, src_mask = _encoded(model, sources)
    device = annotations.device
    limits = [max_length if max_length is not None else default_max_length(len(s)) for s in sources]
    ids: list[list[int]] = [[] for _ in sources]
    totals = [0.0] * len(sources)
    live = list(range(len(sources)))
    state = first
    last = torch.full((len(sources),), BOS_ID, dtype=torch.long, device=device)
    while live:
        rows = torch.as_tensor(live, device=device)
        log_probs, state = model.decoder_step(last, state, keys[rows], annotations[rows], src_mask[rows])
        best = log_probs.argmax(dim=-1).tolist()
        keep = []
        for n, sentence in enumerate(live):
            unit = EOS_ID if len(ids[sentence]) + 1 >= limits[sentence] else best[n]
            totals[sentence] += float(log_probs[n, unit].double())
            if unit != EOS_ID:
                ids[sentence].append(unit)
                keep.append(n)
        live = [live[n] for n in keep]
        pick = torch.as_tensor(keep, dtype=torch.long, device=device)
        state = state[pick]
        last = torch.as_tensor([ids[s][-1] for s in live], dtype=torch.long, device=device)
    return [Hypothesis(tuple(i), t) for i, t in zip(ids, totals, strict=True)]
