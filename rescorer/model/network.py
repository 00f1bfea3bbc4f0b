"""The RNN Encoder–Decoder of Cho et al. (2014), exactly as in SPEC §1.

Parameter layout (all ``nn.Linear`` weights are ``[out, in]``; stacked blocks are in the order
*reset, update, candidate*, so e.g. ``enc_input.weight[:d]`` is W_r, ``[d:2d]`` is W_z, ``[2d:]`` is W):

=====================  ==========================================  ====================
module / parameter     paper symbol                                shape
=====================  ==========================================  ====================
src_embed, tgt_embed   e(x) = E x (rank-``embedding`` factor)      [V, emb]
enc_input              [W_r; W_z; W] + biases                      [3d, emb]
enc_rec_gates          [U_r; U_z]  (orthogonal blocks, no bias)    [2d, d]
enc_rec_cand           U           (orthogonal, no bias)           [d, d]
enc_summary            V + bias:  c = tanh(V h⟨N⟩)                 [d, d]
dec_init               V' + bias: h'⟨0⟩ = tanh(V' c)               [d, d]
dec_input              [W'_r; W'_z; W'] + biases                   [3d, emb]
dec_rec                [U'_r; U'_z; U'] (orthogonal blocks)        [3d, d]
dec_context            [C_r; C_z; C]   (no bias, see below)        [3d, d]
dec_cand_bias          bias inside r' ⊙ (U' h' + C c + b)          [d]
out_hidden, out_prev   O_h, O_y (no bias)                          [2m, d], [2m, emb]
out_context            O_c + the deep-output bias                  [2m, d]
out_rank, out_vocab    G_r (no bias), G_l + bias: G = G_l G_r      [r, m], [V, r]
=====================  ==========================================  ====================

"Biases everywhere": every pre-activation has exactly one bias. A second bias on a recurrent or
context matrix would only add to the first (same gradient, no new function), except inside the
decoder's reset-after candidate, where ``dec_cand_bias`` is multiplied by r' and therefore is a
separate degree of freedom (like cuDNN's ``b_hn``).

Efficiency: the input projections of all time steps are one matmul before the loop; the context
projections (V', C_*, O_c) are one matmul each per pair; the Python loop holds only the
recurrent products (encoder: [U_r; U_z] in one matmul plus U on r ⊙ h; decoder: [U'_r; U'_z; U']
in one matmul since all act on h'); the deep output, maxout and softmax run for all steps at once
after the loop, and the (large) vocabulary projection only for real, non-padding positions.

Training (gradients enabled) runs the same equations through :mod:`rescorer.model.gru` and
:mod:`neural.output_layer`, whose backward is written by hand (the tests compare it with
autograd on the plain equations in float64).

This module holds the parameters, the encoder and decoder, and the training forward. The other
jobs on the same parameters are functions taking the model, each in its own module, built from the
model's public pieces below (as fairseq's ``extract_features``/``output_layer``), never from its
private methods, so that the equations live here once and a change to them reaches every path:

* :meth:`RNNEncoderDecoder.encoder_inputs`, :meth:`~RNNEncoderDecoder.encoder_step` and
  :meth:`~RNNEncoderDecoder.summary`: the encoder one step at a time, for batches of the caller's
  shape (prefix-tree levels, static shapes);
* :meth:`~RNNEncoderDecoder.decoder_states` and :meth:`~RNNEncoderDecoder.decoder_step`: the decoder
  over whole targets or one step, the step's arguments from :meth:`~RNNEncoderDecoder.decoder_init`,
  :meth:`~RNNEncoderDecoder.decoder_context` (once per source) and
  :meth:`~RNNEncoderDecoder.decoder_inputs` (per previous word);
* :meth:`~RNNEncoderDecoder.output_features` (the maxout units s) and
  :meth:`~RNNEncoderDecoder.logits` (G s + b), with :attr:`~RNNEncoderDecoder.score_dtype`.

The modules using them:

* :mod:`rescorer.model.normalizer`: the scoring output layer (softmax normaliser variants), given the
  output layer ``out_vocab``, not the model;
* :mod:`rescorer.model.tree_scoring`: scoring a phrase table over prefix trees, each shared prefix once;
* :mod:`rescorer.model.generation`: generating targets word by word (the beam searches);
* :mod:`rescorer.model.static_shape`: the training forward with static shapes (CUDA graphs);
* :mod:`rescorer.model.flops`: counting the forward FLOPs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neural.device import matmul_dtype
from neural.layers import embedding_layer
from neural.output_layer import target_log_probs
from neural.vocab import EOS_ID
from rescorer.model import block_sizes, normalizer
from rescorer.model.config import ModelConfig
from rescorer.model.gru import decoder_recurrence, encoder_recurrence, hold_state_at_padding, shape_multiple, step_rows


def _orthogonal_(weight: Tensor, block: int) -> None:
    """Fill each [block, block] slice of ``weight`` with the left singular vectors of a Gaussian.

    Saxe et al.'s orthogonal init, as in SPEC §1. The left singular vectors of A are the
    eigenvectors of A Aᵀ; ``eigh`` on that Gram matrix (float64) gives them faster than a full
    SVD on CPU, and returns an orthonormal basis to machine precision whatever A's conditioning.

    The decomposition runs single-threaded: its tridiagonal reduction is a long chain of small
    BLAS-2 calls, each a thread barrier, and on a shared or oversubscribed CPU the threaded
    version was measured 15× slower (35 s instead of 2.4 s for the paper's six 1000×1000 blocks).
    """
    rows = weight.shape[0]
    if rows % block or weight.shape[1] != block:
        raise ValueError(f"cannot split a {tuple(weight.shape)} matrix into [{block}, {block}] blocks")
    if weight.is_meta:  # shapes only (a model about to receive a checkpoint's weights)
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for start in range(0, rows, block):
                gaussian = torch.randn(block, block, dtype=torch.float64)
                _, left_vectors = torch.linalg.eigh(gaussian @ gaussian.T)
                weight[start : start + block].copy_(left_vectors.to(weight.dtype))
    finally:
        torch.set_num_threads(threads)


def lengths_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Boolean [B, max_len] mask, True at positions < length: the ``mask`` that
    :meth:`RNNEncoderDecoder.decoder_states` takes."""
    positions = torch.arange(max_len, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


def _training_positions(mask: Tensor, multiple: int) -> Tensor:
    """Flat indices into ``mask`` ([B, T]) of the positions training's output layer scores: the real
    ones (True) in order, then padding ones up to a multiple of ``multiple`` (at most all B·T), so
    that its matmuls' rows and K come from a small fixed set (:func:`rescorer.model.gru.shape_multiple`)."""
    flat = mask.flatten()
    real = flat.nonzero().squeeze(1)
    wanted = min(flat.numel(), -(-real.numel() // multiple) * multiple)
    if wanted == real.numel():
        return real
    return torch.cat([real, (~flat).nonzero().squeeze(1)[: wanted - real.numel()]])


def _check_batch(ids: Tensor, lengths: Tensor, what: str) -> int:
    """Validate a batch and return its longest length (one host sync for min and max).

    The checks turn what would be confusing broadcasting or indexing errors into clear ones.
    """
    if ids.dim() != 2:
        raise ValueError(f"{what} ids must be [B, L], got shape {tuple(ids.shape)}")
    if lengths.dim() != 1 or lengths.shape[0] != ids.shape[0]:
        raise ValueError(f"{what}_len must be [B] with B={ids.shape[0]}, got shape {tuple(lengths.shape)}")
    if ids.shape[0] == 0:
        return 0
    low, high = (int(v) for v in torch.aminmax(lengths))
    if low < 1 or high > ids.shape[1]:
        raise ValueError(
            f"{what}_len must be in [1, {ids.shape[1]}] (it counts the </s>); got [{low}, {high}]"
        )
    return high


class RNNEncoderDecoder(nn.Module):
    """log p(Y | X) for phrase pairs, with the SPEC §1 equations as the only code path.

    Shape conventions: ``src`` is ``LongTensor[B, N]`` holding the source word ids followed by
    ``</s>`` (0), ``src_len[b]`` counts that ``</s>``; likewise ``tgt``/``tgt_len``. Positions at
    or beyond the length are padding: their ids may be anything (they are replaced by 0 before the
    embedding lookup) and they never influence a score, so a pair scores the same alone or in any
    padded batch.
    """

    def __init__(self, config: ModelConfig, device: torch.device | str | None = None) -> None:
        """``device="meta"`` builds the layers without memory or initialisation, for a checkpoint's
        weights to be assigned (:func:`rescorer.model.checkpoint.load_checkpoint`): a device passed to
        each layer, not ``with torch.device(...)``, whose function mode makes every init call import
        torch._dynamo (2.6 s of a command's start-up)."""
        super().__init__()
        self.config = config
        d, emb, m = config.hidden, config.embedding, config.maxout_units
        self.src_embed = embedding_layer(config.src_vocab_size, emb, device)
        self.tgt_embed = embedding_layer(config.tgt_vocab_size, emb, device)
        # Encoder.
        self.enc_input = nn.Linear(emb, 3 * d, device=device)
        self.enc_rec_gates = nn.Linear(d, 2 * d, bias=False, device=device)
        self.enc_rec_cand = nn.Linear(d, d, bias=False, device=device)
        self.enc_summary = nn.Linear(d, d, device=device)
        # Decoder.
        self.dec_init = nn.Linear(d, d, device=device)
        self.dec_input = nn.Linear(emb, 3 * d, device=device)
        self.dec_rec = nn.Linear(d, 3 * d, bias=False, device=device)
        self.dec_context = nn.Linear(d, 3 * d, bias=False, device=device)
        self.dec_cand_bias = nn.Parameter(torch.zeros(d, device=device))
        # Deep output with maxout, and the low-rank softmax matrix G = G_l G_r.
        self.out_hidden = nn.Linear(d, 2 * m, bias=False, device=device)
        self.out_prev = nn.Linear(emb, 2 * m, bias=False, device=device)
        self.out_context = nn.Linear(d, 2 * m, device=device)
        self.out_rank = nn.Linear(m, config.output_rank, bias=False, device=device)
        self.out_vocab = nn.Linear(config.output_rank, config.tgt_vocab_size, device=device)
        if torch.device(device or "cpu").type != "meta":
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """SPEC §1 init: weights N(0, init_std²), biases 0, recurrent matrices orthogonal.

        Uses torch's global RNG, so ``torch.manual_seed`` before construction makes it repeatable.
        """
        recurrent = {"enc_rec_gates.weight", "enc_rec_cand.weight", "dec_rec.weight"}
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name in recurrent:
                    _orthogonal_(param, self.config.hidden)
                elif name.endswith("bias"):
                    param.zero_()
                else:
                    param.normal_(0.0, self.config.init_std)

    # ------------------------------------------------------------------ encoder

    def _run_encoder(self, src: Tensor, src_len: Tensor) -> Tensor:
        """The encoder GRU (reset before the recurrent product); returns h⟨N⟩ [B, d].

        Rows run longest first, so the sequences still going at step t are the first n_t rows: each
        step updates only those, and a finished sequence keeps its last state without a mask (no
        work is spent on padding, and padding never changes h⟨N⟩).
        """
        steps = _check_batch(src, src_len, "src")
        batch, d = src.shape[0], self.config.hidden
        # Sorted where the lengths live: lengths kept on the host (as training passes them) make
        # the row counts below free, where device lengths would cost a host sync.
        lengths, order = torch.sort(src_len, descending=True, stable=True)
        running = (lengths.unsqueeze(0) > torch.arange(steps, device=lengths.device).unsqueeze(1)).sum(1).tolist()
        lengths, order = lengths.to(src.device, non_blocking=True), order.to(src.device, non_blocking=True)
        mask = lengths_mask(lengths, steps)  # [B, T], in the longest-first order
        ids = src[order, :steps].masked_fill(~mask, EOS_ID)
        state_dtype = self.enc_rec_cand.weight.dtype
        # One matmul for W_r e, W_z e, W e (+ biases) of every step, time-major from the (small) ids
        # so the [T, B, 3d] projections need no transposing copy.
        inputs = self.encoder_inputs(ids.t())  # [T, B, 3d]
        restore = torch.empty_like(order)
        restore[order] = torch.arange(batch, device=order.device)
        if torch.is_grad_enabled() and self.enc_rec_cand.weight.requires_grad:
            # Training: the same steps with a backward through time written by hand (rescorer.model.gru),
            # each on a row count from a small fixed set, the rows added holding their state.
            mm_dtype = matmul_dtype(src.device, self.enc_rec_cand.weight.dtype)
            rows = step_rows(running, batch, shape_multiple(block_sizes.TRAIN_STEP_ROWS, src.device, mm_dtype))
            if rows != running:
                inputs = hold_state_at_padding(inputs, mask)
            h = encoder_recurrence(inputs, self.enc_rec_gates.weight, self.enc_rec_cand.weight, rows, state_dtype)
            return h[restore]
        h = torch.zeros(batch, d, dtype=state_dtype, device=src.device)
        for t, n in enumerate(running):
            h_new = self.encoder_step(h[:n], inputs[t, :n])
            h = h_new if n == batch else torch.cat([h_new, h[n:]])
        return h[restore]

    def encoder_inputs(self, ids: Tensor) -> Tensor:
        """[W_r; W_z; W] e(x) + b of each id ([..., 3d]), in the states' dtype: the input side of
        :meth:`encoder_step`, computed for many steps at once (one matmul) by whoever runs the steps."""
        return self.enc_input(self.src_embed(ids)).to(self.enc_rec_cand.weight.dtype)

    def encoder_step(self, h: Tensor, inputs: Tensor, out: Tensor | None = None) -> Tensor:
        """One encoder GRU step (reset before the recurrent product) from [W_r; W_z; W] e + b ([n, 3d]).

        Public because the prefix-tree encoder (:mod:`rescorer.model.tree_scoring`) runs it on
        batches of its own (one tree level, rows from their parents' states); ``inputs`` come from
        :meth:`encoder_inputs`, ``out`` may be a view of the caller's state buffer.

        addmm folds the input term into the matmul and lerp does z⊙h + (1−z)⊙h̃ in one pass: the
        same equations with fewer passes over [n, d] memory, which dominate small steps. States
        stay in h's dtype (fp32) under autocast, where the matmuls run in bf16/fp16.
        """
        d = self.config.hidden
        gates = torch.sigmoid(torch.addmm(inputs[:, : 2 * d], h, self.enc_rec_gates.weight.t())).to(h.dtype)
        r, z = gates[:, :d], gates[:, d:]
        candidate = torch.tanh(torch.addmm(inputs[:, 2 * d :], r * h, self.enc_rec_cand.weight.t())).to(h.dtype)
        return torch.lerp(candidate, h, z, out=out)

    def summary(self, h: Tensor) -> Tensor:
        """c = tanh(V h⟨N⟩ + b) from the encoder's last states: what :meth:`encode` returns, for
        callers that run the encoder steps themselves."""
        return torch.tanh(self.enc_summary(h))

    def encode(self, src: Tensor, src_len: Tensor) -> Tensor:
        """Summary vector c = tanh(V h⟨N⟩) of each source phrase: Float[B, d]."""
        return self.summary(self._run_encoder(src, src_len))

    # ------------------------------------------------------------------ decoder

    def _prev_embeddings(self, tgt: Tensor, mask: Tensor) -> Tensor:
        """e(y_{t−1}) for t = 1..T as [B, T, emb], with e(y_0) = 0 (a zero vector, not an id)."""
        ids = tgt.masked_fill(~mask, EOS_ID)
        embedded = self.tgt_embed(ids[:, :-1])
        return F.pad(embedded, (0, 0, 1, 0))[:, : tgt.shape[1]]

    def _run_decoder(self, c: Tensor, tgt: Tensor, tgt_len: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Decoder states h'⟨1..T⟩ [B, T, d], inputs e(y_{t−1}) [B, T, emb] and the mask [B, T].

        T is ``tgt_len.max()``. No masking is needed inside the loop: the decoder is causal, so
        padding after position t cannot change anything at positions ≤ t.
        """
        steps = _check_batch(tgt, tgt_len, "tgt")
        if c.dim() != 2 or c.shape[0] != tgt.shape[0] or c.shape[1] != self.config.hidden:
            raise ValueError(
                f"c must be [B={tgt.shape[0]}, d={self.config.hidden}], got shape {tuple(c.shape)}"
            )
        mask = lengths_mask(tgt_len.to(tgt.device), steps)
        states, prev = self.decoder_states(c, tgt[:, :steps], mask)
        return states, prev, mask

    def decoder_states(self, c: Tensor, tgt: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Decoder states [B, T, d] and inputs e(y_{t−1}) [B, T, emb] for T = ``tgt.shape[1]`` steps.

        ``mask`` [B, T] is True at real positions (:func:`lengths_mask`). No lengths are checked or
        read on the host, which is why the static-shape training forward
        (:mod:`rescorer.model.static_shape`) calls this rather than :meth:`token_logprobs`.
        """
        batch, steps, d = tgt.shape[0], tgt.shape[1], self.config.hidden
        prev = self._prev_embeddings(tgt, mask)  # [B, T, emb]
        # Context projections, once per pair: C_r c, C_z c go straight into the gate inputs of every
        # step; C c (+ its bias) stays separate because the reset multiplies it.
        context = self.dec_context(c)  # [B, 3d]
        inputs = self.dec_input(prev.transpose(0, 1))  # [T, B, 3d], time-major (see the encoder)
        gate_inputs = inputs[:, :, : 2 * d] + context[:, : 2 * d]  # [T, B, 2d]
        cand_inputs = inputs[:, :, 2 * d :]  # [T, B, d]
        # Widened before the (fp32) bias is added: under autocast the context is bf16, and an add of
        # mixed dtypes converts element by element inside the add.
        cand_context = context[:, 2 * d :].to(self.dec_cand_bias.dtype) + self.dec_cand_bias  # [B, d]
        h = self.decoder_init(c)
        states: list[Tensor] = []
        gate_inputs = gate_inputs.to(h.dtype)
        cand_inputs = cand_inputs.to(h.dtype)
        cand_context = cand_context.to(h.dtype)
        if steps and torch.is_grad_enabled() and self.dec_rec.weight.requires_grad:
            # Training: the same steps with a backward through time written by hand (rescorer.model.gru).
            states_t = decoder_recurrence(h, gate_inputs, cand_inputs, cand_context, self.dec_rec.weight)
            return states_t.transpose(0, 1), prev
        weights = self._decoder_weights()
        for t in range(steps):
            h = self.decoder_step(h, gate_inputs[t], cand_inputs[t], cand_context, weights=weights)
            states.append(h)
        all_states = torch.stack(states, dim=1) if states else c.new_zeros(batch, 0, d)
        return all_states, prev

    def decoder_init(self, c: Tensor) -> Tensor:
        """h'⟨0⟩ = tanh(V' c + b) of each summary ([B, d]), in the states' dtype (fp32 even under autocast).

        Public, with :meth:`decoder_context` and :meth:`decoder_inputs`, so that callers running
        :meth:`decoder_step` on batches of their own (prefix-tree levels, beam hypotheses) build its
        arguments from the model's equations instead of from its parameter layout.
        """
        return torch.tanh(self.dec_init(c)).to(self.dec_rec.weight.dtype)

    def decoder_context(self, c: Tensor) -> tuple[Tensor, Tensor]:
        """The decoder's terms that depend on c alone, once per summary, in the states' dtype:
        ([C_r c; C_z c] [B, 2d], C c + the bias the reset multiplies [B, d]).

        The first is added to :meth:`decoder_inputs`' gate part to give :meth:`decoder_step`'s
        ``gate_inputs``; the second is its ``cand_context``.
        """
        d, state_dtype = self.config.hidden, self.dec_rec.weight.dtype
        context = self.dec_context(c)  # [B, 3d]: C_r c, C_z c, C c
        return context[:, : 2 * d].to(state_dtype), (context[:, 2 * d :] + self.dec_cand_bias).to(state_dtype)

    def decoder_inputs(self, embedded: Tensor) -> tuple[Tensor, Tensor]:
        """The decoder's terms of the previous word's embedding e(y_{t−1}) ([n, emb]), in the
        states' dtype: ([W'_r; W'_z] e + b [n, 2d], W' e + b [n, d]), the latter being
        :meth:`decoder_step`'s ``cand_inputs``."""
        d = self.config.hidden
        inputs = self.dec_input(embedded).to(self.dec_rec.weight.dtype)
        return inputs[:, : 2 * d], inputs[:, 2 * d :]

    def _decoder_weights(self) -> tuple[Tensor, Tensor]:
        """[U'_r; U'_z]ᵀ and U'ᵀ, the decoder step's two recurrent matrices as views."""
        d = self.config.hidden
        return self.dec_rec.weight[: 2 * d].t(), self.dec_rec.weight[2 * d :].t()

    def decoder_step(
        self, h: Tensor, gate_inputs: Tensor, cand_inputs: Tensor, cand_context: Tensor, out: Tensor | None = None,
        weights: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """One decoder GRU step: the class doc's equations, additions folded into addmm (see the encoder).

        Public because the prefix-tree scorer and the beam searches (:mod:`rescorer.model.tree_scoring`,
        :mod:`rescorer.model.generation`) advance their own batches of states one step at a time.
        ``gate_inputs`` = [W'_r; W'_z] e + [C_r; C_z] c + b ([n, 2d]); ``cand_inputs`` = W' e + b
        ([n, d]); ``cand_context`` = C c + its bias ([n, d]), which the reset r' multiplies: the
        parts come from :meth:`decoder_inputs` and :meth:`decoder_context`, h'⟨0⟩ from :meth:`decoder_init`.
        ``weights``: the two recurrent matrices, taken once by the loop of :meth:`decoder_states`; other
        callers leave it None.
        """
        d = self.config.hidden
        gate_weight, cand_weight = weights if weights is not None else self._decoder_weights()
        gates = torch.sigmoid(torch.addmm(gate_inputs, h, gate_weight)).to(h.dtype)
        r, z = gates[:, :d], gates[:, d:]
        recurrent = torch.addmm(cand_context, h, cand_weight).to(h.dtype)
        candidate = torch.tanh(torch.addcmul(cand_inputs, r, recurrent))
        return torch.lerp(candidate, h, z, out=out)

    def output_features(self, states: Tensor, prev: Tensor, out_context: Tensor) -> Tensor:
        """s⟨t⟩ = maxout over adjacent pairs of O_h h'⟨t⟩ + O_y e(y_{t−1}) + O_c c: [..., m].

        The deep output below the softmax (fairseq's ``extract_features``), which every path feeds to
        the output layer (:meth:`logits`, or ``out_rank`` then :mod:`rescorer.model.normalizer`).
        ``out_context`` is ``out_context(c)`` (O_c c + the deep-output bias) broadcast to the rows of
        ``states`` and ``prev``: it depends on the source alone, so callers compute it once per source.
        """
        return self._maxout_pool(self.out_hidden(states) + self.out_prev(prev) + out_context)

    def _maxout_pool(self, pre: Tensor) -> Tensor:
        """max over adjacent pairs of the last dimension: [..., 2m] → [..., m]."""
        return pre.unflatten(-1, (self.config.maxout_units, 2)).amax(dim=-1)

    def logits(self, s: Tensor) -> Tensor:
        """G s = G_l (G_r s) + bias, in at least float32 so the softmax never runs in bf16/fp16.

        The whole [n, V] of logits (fairseq's ``output_layer``), for generation, which needs every
        word's; scoring needs only the target's and the normaliser (:mod:`rescorer.model.normalizer`).
        (A float64 model, as used by the reference tests, stays in float64.)
        """
        logits = self.out_vocab(self.out_rank(s))
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    @property
    def score_dtype(self) -> torch.dtype:
        """The dtype of log-probabilities: the parameters' dtype, at least float32, so that scores
        never round to bf16/fp16 (a float64 model scores in float64)."""
        return torch.promote_types(self.out_vocab.weight.dtype, torch.float32)

    def token_logprobs(self, c: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """log p(y_t | y_<t, X) per position: Float[B, M] (M = ``tgt.shape[1]``), 0 past the length.

        Float32 for an fp32/bf16/fp16 model or under autocast; float64 for a float64 model.

        The vocabulary projection and log-sum-exp run only on real positions (padding can be a
        third of a phrase-table batch, and G_l is the largest matmul per step).
        """
        states, prev, mask = self._run_decoder(c, tgt, tgt_len)
        score_dtype = self.score_dtype
        out = torch.zeros(tgt.shape, dtype=score_dtype, device=tgt.device)
        if mask.numel() == 0:
            return out
        features = self.output_features(states, prev, self.out_context(c).unsqueeze(1))
        if torch.is_grad_enabled() and self.out_vocab.weight.requires_grad:
            # Training: the same values through a backward that recomputes the logits per block
            # instead of storing them (neural.output_layer), on a number of positions from a
            # small fixed set: the real ones, then padding ones whose scores are dropped (zero gradient).
            mm_dtype = matmul_dtype(mask.device, self.out_vocab.weight.dtype)
            positions = _training_positions(mask, shape_multiple(block_sizes.TRAIN_POSITIONS, mask.device, mm_dtype))
            targets = tgt[:, : mask.shape[1]].masked_fill(~mask, EOS_ID).flatten()[positions]
            picked = target_log_probs(self.out_rank(features.flatten(0, 1)[positions]), self.out_vocab.weight,
                                      self.out_vocab.bias, targets)
            real = int(mask.sum())
            scores = out.new_zeros(mask.numel())
            scores[positions[:real]] = picked[:real].to(score_dtype)
            out[:, : mask.shape[1]] = scores.view(mask.shape)
            return out
        s = features[mask]  # [P, m], P real positions
        targets = tgt[:, : mask.shape[1]][mask]
        rows = block_sizes.CPU_OUTPUT_BLOCK_ROWS if s.device.type == "cpu" else max(1, s.shape[0])
        output_matrix = normalizer.output_matrix(self.out_vocab)
        scores = [
            self._target_log_probs(s[i : i + rows], targets[i : i + rows], score_dtype, output_matrix)
            for i in range(0, s.shape[0], rows)
        ]
        out[:, : mask.shape[1]][mask] = torch.cat(scores)
        return out

    def _target_log_probs(self, s: Tensor, targets: Tensor, dtype: torch.dtype, output_matrix: Tensor) -> Tensor:
        """log softmax(G s)[target] for a block of rows, never materialising [rows, V] at once on CPU."""
        low = self.out_rank(s)  # G_r s: [rows, r]
        picked = normalizer.picked_logits(self.out_vocab, low, targets, dtype)
        return picked - normalizer.log_normalizer(low, dtype, output_matrix)

    def score_targets(self, c: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """log p(Y | X) = Σ_t log p(y_t | y_<t, X), including ``</s>``: Float[B] (float32 or wider)."""
        return self.token_logprobs(c, tgt, tgt_len).sum(dim=1)

    def forward(self, src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """log p(Y | X) of each pair: ``score_targets(encode(src, src_len), tgt, tgt_len)``."""
        return self.score_targets(self.encode(src, src_len), tgt, tgt_len)
