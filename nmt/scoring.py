"""Scoring: log p(target | source) of given pairs, and of the hypotheses of a Moses n-best list.

Pairs are scored in batches of similar target length. An n-best list has many hypotheses per
source: the scorer encodes each distinct source once and decodes its hypotheses in batches that
gather its annotations by index, which gives the same numbers as scoring each pair alone (the
padding of a batch changes no score, :mod:`nmt.model`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from neural.device import autocast
from nmt.data import length_sorted_batches
from nmt.model import BOS_ID, EOS_ID, AttentionNMT, at_least_fp32, pad_batch

#: Padded target units per decoding batch: large enough to fill a CPU's matmuls, small enough to bound
#: the [batch, length, vocabulary] logits (8k units × 8k pieces × 4 bytes = 256 MB, and its softmax).
DEFAULT_BATCH_TOKENS = 8192
#: Sources encoded at once.
ENCODE_BATCH = 64


def _normalised(values: np.ndarray, targets: Sequence[Sequence[int]], normalize: bool) -> np.ndarray:
    """log p per target unit (EOS counted) with ``normalize``, else as it is."""
    if not normalize:
        return values
    return values / np.array([len(t) + 1 for t in targets], dtype=np.float64)


@torch.no_grad()
def score_grouped(model: AttentionNMT, sources: Sequence[Sequence[int]], groups: Sequence[int],
                  targets: Sequence[Sequence[int]], *, normalize: bool = False,
                  batch_tokens: int = DEFAULT_BATCH_TOKENS, amp_dtype: torch.dtype | None = None) -> np.ndarray:
    """log p(targets[k] | sources[groups[k]]) for each k: each source encoded once, targets batched."""
    device = next(model.parameters()).device
    annotations, keys, first, masks = [], [], [], []
    for start in range(0, len(sources), ENCODE_BATCH):
        chunk = [list(s) + [EOS_ID] for s in sources[start : start + ENCODE_BATCH]]
        src, src_mask = pad_batch(chunk, device)
        with autocast(device, amp_dtype):
            a, f = model.encode(src, src_mask)
            k = model.annotation_keys(a)
        for row, seq in enumerate(chunk):  # each source alone, without the chunk's padding
            annotations.append(a[row, : len(seq)])
            keys.append(k[row, : len(seq)])
            first.append(f[row])
            masks.append(len(seq))
    values = np.zeros(len(targets), dtype=np.float64)
    for rows in length_sorted_batches([len(t) for t in targets], batch_tokens):
        owners = [groups[r] for r in rows]
        width = max(masks[o] for o in owners)
        ann = torch.stack([_padded(annotations[o], width) for o in owners])
        key = torch.stack([_padded(keys[o], width) for o in owners])
        src_mask = torch.arange(width, device=device).unsqueeze(0) < torch.tensor(
            [masks[o] for o in owners], device=device).unsqueeze(1)
        tgt_out, tgt_mask = pad_batch([list(targets[r]) + [EOS_ID] for r in rows], device)
        tgt_in, _ = pad_batch([[BOS_ID] + list(targets[r]) for r in rows], device)
        with autocast(device, amp_dtype):
            outputs, _ = model.decoder_outputs(ann, torch.stack([first[o] for o in owners]), src_mask, tgt_in,
                                               keys=key)
            logits = at_least_fp32(model.output(outputs))
        picked = logits.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        values[rows] = picked.masked_fill(~tgt_mask, 0.0).double().sum(dim=1).cpu().numpy()
    return _normalised(values, targets, normalize)


def _padded(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` ``[J, D]`` padded with zeros to ``[width, D]``."""
    return torch.nn.functional.pad(tensor, (0, 0, 0, width - tensor.shape[0]))


def score_pairs(model: AttentionNMT, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                normalize: bool = False, batch_tokens: int = DEFAULT_BATCH_TOKENS,
                amp_dtype: torch.dtype | None = None) -> np.ndarray:
    """log p(targets[k] | sources[k]) of each pair (identical sources encoded once)."""
    distinct: dict[tuple[int, ...], int] = {}
    groups = [distinct.setdefault(tuple(s), len(distinct)) for s in sources]
    return score_grouped(model, [list(s) for s in distinct], groups, targets, normalize=normalize,
                         batch_tokens=batch_tokens, amp_dtype=amp_dtype)
