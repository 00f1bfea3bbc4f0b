"""The training forward with static shapes: what a CUDA graph captures once per shape and replays."""

from __future__ import annotations

import torch
from torch import Tensor

from neural.output_layer import target_log_probs
from neural.vocab import EOS_ID
from rescorer.model.gru import encoder_recurrence, hold_state_at_padding
from rescorer.model.network import RNNEncoderDecoder, lengths_mask


def static_log_likelihood(
    model: RNNEncoderDecoder, src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor
) -> Tensor:
    """log p(Y | X) of each row, Float[B], by work that the tensors' shapes alone decide.

    What :meth:`RNNEncoderDecoder.forward` computes for training, written for a step that a CUDA graph captures
    once per shape and replays (``rescorer.training.step``): no value is read on the host, no
    shape depends on a length, and the lengths live on the ids' device. The price is work the
    ragged path skips (every row runs all N encoder steps; the output layer covers padded
    positions), which is why the CPU keeps that path.

    * Encoder: every row runs every step, and a padded step holds its row's state bit for bit
      with exactly zero gradient (:func:`rescorer.model.gru.hold_state_at_padding`).
    * Output layer: every position is scored and the padded ones are dropped by ``where``, so
      they get exactly zero gradient.

    A row with ``tgt_len`` 0 (and ``src_len`` 0) is an empty row that fills a batch up to its
    fixed size: it scores 0 and contributes no gradient.
    """
    batch = src.shape[0]
    if src.dim() != 2 or tgt.dim() != 2 or tgt.shape[0] != batch or src_len.shape != (batch,) \
            or tgt_len.shape != (batch,):
        raise ValueError(f"static batch shapes do not fit: src {tuple(src.shape)}, src_len "
                         f"{tuple(src_len.shape)}, tgt {tuple(tgt.shape)}, tgt_len {tuple(tgt_len.shape)}")
    src_mask = lengths_mask(src_len, src.shape[1])  # [B, N]
    inputs = model.encoder_inputs(src.masked_fill(~src_mask, EOS_ID).t())
    inputs = hold_state_at_padding(inputs, src_mask)
    h = encoder_recurrence(inputs, model.enc_rec_gates.weight, model.enc_rec_cand.weight, [batch] * src.shape[1],
                           inputs.dtype)
    c = model.summary(h)
    mask = lengths_mask(tgt_len, tgt.shape[1])  # [B, T]
    states, prev = model.decoder_states(c, tgt, mask)
    s = model.output_features(states, prev, model.out_context(c).unsqueeze(1))
    low = model.out_rank(s).flatten(0, 1)  # G_r s of every position
    targets = tgt.masked_fill(~mask, EOS_ID).flatten()
    picked = target_log_probs(low, model.out_vocab.weight, model.out_vocab.bias, targets)
    return torch.where(mask, picked.view(mask.shape).to(model.score_dtype), 0.0).sum(dim=1)

