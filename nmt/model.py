"""The attention encoder–decoder of Bahdanau et al. 2015 (SPEC §7), sentence level.

Source ids x_1..x_J and target ids y_1..y_I are subword units (:mod:`nmt.subwords`). The network:

- encoder: embeddings, a forward and a backward GRU; annotation h_j = [h_j^f ; h_j^b] ∈ R^{2H};
- GRU (both encoder directions and the decoder), as SPEC §7 writes it: the update gate z keeps the
  *new* state, h_j = (1 − z_j) ⊙ h_{j−1} + z_j ⊙ h̃_j, h̃_j = tanh(W x_j + U [r_j ⊙ h_{j−1}]);
- attention: a_ij = v_aᵀ tanh(W_a s_{i−1} + U_a h_j), α_ij = softmax over the real source positions
  (padding gets −∞), c_i = Σ_j α_ij h_j;
- decoder: a GRU fed y_{i−1}'s embedding and c_i, its state starting at s_0 = tanh(W_s h_1^b);
- output: p(y_i | y_<i, x) = softmax(V η), η = maxout (pairs of units) of a linear map of y_{i−1}'s
  embedding, s_i and c_i.

Padded positions keep the state they had (source) or are ignored by the loss (target), so a pair's
score is the same whatever it is batched with. Two paths compute the same equations: the teacher-
forced :meth:`AttentionNMT.forward` for training and scoring, and :meth:`AttentionNMT.decoder_step`,
one step for many hypotheses, for the searches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from infrastructure.errors import UserError
from neural.config import DictConfig, check_positive_int
from neural.layers import embedding_layer
from neural.output_layer import target_log_probs
from nmt.recurrence import decoder_states, encoder_states

#: Ids every vocabulary of this package reserves (nmt.subwords trains sentencepiece with them).
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


def at_least_fp32(tensor: torch.Tensor) -> torch.Tensor:
    """fp32 for a bf16 or fp16 tensor (softmaxes sum in fp32), the tensor itself otherwise (fp64 tests)."""
    return tensor.float() if tensor.dtype in (torch.bfloat16, torch.float16) else tensor


class NMTError(UserError):
    """A model file, an option or an input the NMT model cannot use."""


@dataclass
class NMTConfig(DictConfig):
    """Sizes of the network (SPEC §7's R, H, N, L) and of its two vocabularies."""

    src_vocab: int
    tgt_vocab: int
    embedding: int = 256  # R
    hidden: int = 256  # H: each encoder direction and the decoder
    alignment: int = 256  # N: the attention MLP's hidden layer
    maxout: int = 256  # L: maxout units (each the max of a pair)

    def __post_init__(self) -> None:
        for name in ("src_vocab", "tgt_vocab"):
            check_positive_int("NMTConfig", name, getattr(self, name), minimum=EOS_ID + 2)
        for name in ("embedding", "hidden", "alignment", "maxout"):
            check_positive_int("NMTConfig", name, getattr(self, name))


class GRUWeights(nn.Module):
    """One GRU of SPEC §7: input maps for (r, z, candidate) in one matrix, recurrent maps for (r, z)
    and for the candidate apart (the candidate's applies to r ⊙ h, not to h)."""

    def __init__(self, input_size: int, hidden: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.hidden = hidden
        self.input = nn.Linear(input_size, 3 * hidden, device=device)
        self.gates = nn.Linear(hidden, 2 * hidden, bias=False, device=device)
        self.candidate = nn.Linear(hidden, hidden, bias=False, device=device)

    def step(self, projected: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The next state from ``projected`` = W x (+ bias) for all three parts, ``[N, 3H]``, and ``h``."""
        H = self.hidden
        rz = torch.sigmoid(projected[:, : 2 * H] + self.gates(h))
        r, z = rz[:, :H], rz[:, H:]
        candidate = torch.tanh(projected[:, 2 * H :] + self.candidate(r * h))
        return h + z * (candidate - h)


class AttentionNMT(nn.Module):
    """Bahdanau et al.'s RNNsearch: p(y | x) for source and target id sequences.

    ``hand_written_backward`` (on): when a gradient will be asked for, the recurrences run through
    :mod:`nmt.recurrence` (the same values; each weight's gradient one matmul over all steps); off,
    through plain autograd, the tests' reference.
    """

    hand_written_backward: bool = True

    def __init__(self, config: NMTConfig, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = config
        R, H, N, L = config.embedding, config.hidden, config.alignment, config.maxout
        self.src_embedding = embedding_layer(config.src_vocab, R, device)
        self.tgt_embedding = embedding_layer(config.tgt_vocab, R, device)
        self.encoder_forward = GRUWeights(R, H, device)
        self.encoder_backward = GRUWeights(R, H, device)
        self.init_state = nn.Linear(H, H, device=device)  # W_s: s_0 = tanh(W_s h_1^b)
        self.attention_state = nn.Linear(H, N, bias=False, device=device)  # W_a
        self.attention_annotation = nn.Linear(2 * H, N, device=device)  # U_a (its bias is the MLP's)
        self.attention_v = nn.Linear(N, 1, bias=False, device=device)  # v_a
        self.decoder = GRUWeights(R + 2 * H, H, device)
        self.readout = nn.Linear(R + H + 2 * H, 2 * L, device=device)  # the linear map maxout pools
        self.output = nn.Linear(L, config.tgt_vocab, device=device)  # V

    # ----------------------------------------------------------------------------- encoder

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Annotations ``[B, J, 2H]`` and the decoder's first state ``[B, H]`` of a right-padded batch.

        A padded position keeps the state before it, so the backward direction starts at each
        sentence's last real position from zeros, as it would alone.
        """
        if self._hand_written_backward():
            return self._encode_for_training(src, src_mask)
        B, J = src.shape
        H = self.config.hidden
        emb = self.src_embedding(src)
        keep = src_mask.unsqueeze(-1)
        states = []
        for gru, order in ((self.encoder_forward, range(J)), (self.encoder_backward, range(J - 1, -1, -1))):
            # unbind, not [:, j]: the backward of J slices would fill J zero tensors of the whole size
            projected = gru.input(emb).unbind(1)
            h = emb.new_zeros(B, H)
            out: list[torch.Tensor] = [h] * J
            for j in order:
                h = torch.where(keep[:, j], gru.step(projected[j], h), h)
                out[j] = h
            states.append(torch.stack(out, dim=1))
        annotations = torch.cat(states, dim=2)
        first = torch.tanh(self.init_state(states[1][:, 0]))
        return annotations, first

    def _hand_written_backward(self) -> bool:
        """Whether the recurrences take :mod:`nmt.recurrence`'s path: when a gradient will be asked for."""
        return self.hand_written_backward and torch.is_grad_enabled() and self.decoder.gates.weight.requires_grad

    def _encode_for_training(self, src: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`encode` through :func:`nmt.recurrence.encoder_states`: both directions as a batch of
        two, the backward one fed its positions in reverse; the same values, one weight gradient each."""
        B, J = src.shape
        H = self.config.hidden
        f, b = self.encoder_forward, self.encoder_backward
        both = nn.functional.linear(self.src_embedding(src.t()), torch.cat([f.input.weight, b.input.weight]),
                                    torch.cat([f.input.bias, b.input.bias])).view(J, B, 2, 3 * H)
        projected = torch.stack([both[:, :, 0], both[:, :, 1].flip(0)], dim=1)  # [J, 2, B, 3H]
        keep = src_mask.t().unsqueeze(-1)
        keep = torch.stack([keep, keep.flip(0)], dim=1)
        states = encoder_states(projected, keep, torch.stack([f.gates.weight, b.gates.weight]),
                                torch.stack([f.candidate.weight, b.candidate.weight]))
        backward_states = states[:, 1].flip(0)
        annotations = torch.cat([states[:, 0], backward_states], dim=2).transpose(0, 1)
        first = torch.tanh(self.init_state(backward_states[0]))
        return annotations, first

    # ----------------------------------------------------------------------------- one step

    def attend(self, s_prev: torch.Tensor, keys: torch.Tensor, annotations: torch.Tensor,
               src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Context ``[N, 2H]`` and weights ``[N, J]``; ``keys`` = U_a h_j (+ bias), ``[N, J, N_a]``."""
        scores = self.attention_v(torch.tanh(keys + self.attention_state(s_prev).unsqueeze(1))).squeeze(-1)
        scores = at_least_fp32(scores).masked_fill(~src_mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).to(annotations.dtype)
        return torch.bmm(weights.unsqueeze(1), annotations).squeeze(1), weights

    def maxout(self, emb_prev: torch.Tensor, s: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """η(y_{i−1}, s_i, c_i): the max of each pair of units of one linear map of the three."""
        t = self.readout(torch.cat([emb_prev, s, context], dim=-1))
        return t.view(*t.shape[:-1], self.config.maxout, 2).amax(dim=-1)

    def annotation_keys(self, annotations: torch.Tensor) -> torch.Tensor:
        """U_a h_j for every source position, computed once per source."""
        return self.attention_annotation(annotations)

    def decoder_step(self, y_prev: torch.Tensor, s_prev: torch.Tensor, keys: torch.Tensor,
                     annotations: torch.Tensor, src_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step for N hypotheses: log p(· | y_<i, x) ``[N, V]`` (fp32) and the new state s_i."""
        emb = self.tgt_embedding(y_prev)
        context, _ = self.attend(s_prev, keys, annotations, src_mask)
        s = self.decoder.step(self.decoder.input(torch.cat([emb, context], dim=-1)), s_prev)
        logits = self.output(self.maxout(emb, s, context))
        return torch.log_softmax(at_least_fp32(logits), dim=-1), s

    # ----------------------------------------------------------------------------- teacher forcing

    def decoder_outputs(self, annotations: torch.Tensor, first: torch.Tensor, src_mask: torch.Tensor,
                        tgt_in: torch.Tensor, keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The maxout outputs ``[B, I, L]`` for target inputs ``tgt_in`` (BOS, y_1..y_{I−1}) and the
        attention weights ``[B, I, J]``; ``keys`` (:meth:`annotation_keys`) when already computed."""
        emb, states, contexts, weights = self.teacher_forced(annotations, first, src_mask, tgt_in, keys)
        # The maxout layer needs no recurrence: one map over every step at once.
        return self.maxout(emb, states, contexts).transpose(0, 1), weights.transpose(0, 1)

    def teacher_forced(self, annotations: torch.Tensor, first: torch.Tensor, src_mask: torch.Tensor,
                       tgt_in: torch.Tensor, keys: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoder run over ``tgt_in``, time-major: the embeddings E y_{i−1} ``[I, B, R]``, the
        states s_i ``[I, B, H]``, the contexts c_i ``[I, B, 2H]`` and the attention weights ``[I, B, J]``."""
        if keys is None:
            keys = self.annotation_keys(annotations)
        emb = self.tgt_embedding(tgt_in.t())
        R = self.config.embedding
        # The embedding's share of the decoder's input map, for every step at once.
        emb_projected = nn.functional.linear(emb, self.decoder.input.weight[:, :R], self.decoder.input.bias)
        context_weight = self.decoder.input.weight[:, R:]
        if self._hand_written_backward():
            states, contexts, weights = decoder_states(
                emb_projected, first, keys, annotations, src_mask, self.attention_state.weight,
                self.attention_v.weight, context_weight, self.decoder.gates.weight, self.decoder.candidate.weight)
            return emb, states, contexts, weights
        s = first
        states, contexts, weights = [], [], []
        for step_input in emb_projected.unbind(0):
            context, alpha = self.attend(s, keys, annotations, src_mask)
            s = self.decoder.step(step_input + nn.functional.linear(context, context_weight), s)
            states.append(s)
            contexts.append(context)
            weights.append(alpha)
        return emb, torch.stack(states), torch.stack(contexts), torch.stack(weights)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, tgt_in: torch.Tensor,
                tgt_out: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
        """log p(y_i | y_<i, x) of each target position ``[B, I]`` (fp32), 0 where ``tgt_mask`` is False."""
        annotations, first = self.encode(src, src_mask)
        return self.target_log_probs(annotations, first, src_mask, tgt_in, tgt_out, tgt_mask)

    def target_log_probs(self, annotations: torch.Tensor, first: torch.Tensor, src_mask: torch.Tensor,
                         tgt_in: torch.Tensor, tgt_out: torch.Tensor, tgt_mask: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` from encoded sources (the n-best scorer encodes each source once).

        The maxout and output layers run on the real target positions only (a batch's padding is a
        fifth of its positions); for training, the output layer is :mod:`neural.output_layer`'s (the
        RNN's too: in vocabulary blocks, with a hand-written backward)."""
        emb, states, contexts, _ = self.teacher_forced(annotations, first, src_mask, tgt_in)
        real = tgt_mask.t()
        features, targets = self.maxout(emb[real], states[real], contexts[real]), tgt_out.t()[real]
        if self._hand_written_backward():
            picked = target_log_probs(features, self.output.weight, self.output.bias, targets)
        else:
            logits = at_least_fp32(self.output(features))
            picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return picked.new_zeros(real.shape).masked_scatter(real, picked).t()


def pad_batch(sequences: list[list[int]], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[B, T]`` (PAD_ID) and the mask of real positions."""
    width = max(1, max((len(s) for s in sequences), default=1))
    ids = torch.full((len(sequences), width), PAD_ID, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    mask = torch.arange(width).unsqueeze(0) < torch.as_tensor([len(s) for s in sequences]).unsqueeze(1)
    return ids.to(device), mask.to(device)


@dataclass
class PairBatch:
    """Sources (each ending in EOS), decoder inputs (BOS, y_1..y_{I−1}) and targets (y_1..y_I, EOS)."""

    src: torch.Tensor
    src_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_mask: torch.Tensor

    @property
    def target_tokens(self) -> int:
        return int(self.tgt_mask.sum())


def make_batch(sources: list[list[int]], targets: list[list[int]],
               device: torch.device | str = "cpu") -> PairBatch:
    """A training or scoring batch of id sequences (without EOS; it is added here)."""
    src, src_mask = pad_batch([list(s) + [EOS_ID] for s in sources], device)
    tgt_out, tgt_mask = pad_batch([list(t) + [EOS_ID] for t in targets], device)
    tgt_in, _ = pad_batch([[BOS_ID] + list(t) for t in targets], device)
    return PairBatch(src, src_mask, tgt_in, tgt_out, tgt_mask)


def pair_log_probs(model: AttentionNMT, batch: PairBatch) -> torch.Tensor:
    """log p(y | x) of each pair (EOS included), ``[B]`` fp32."""
    return model(batch.src, batch.src_mask, batch.tgt_in, batch.tgt_out, batch.tgt_mask).sum(dim=1)
