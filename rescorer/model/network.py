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
:mod:`rescorer.model.output_layer`, whose backward is written by hand (the tests compare it with
autograd on the plain equations in float64).

Scoring a phrase table uses :meth:`RNNEncoderDecoder.encode_prefix_tree` and
:meth:`RNNEncoderDecoder.score_prefix_tree` instead: the same equations over prefix trees
(:mod:`rescorer.model.prefix_tree`), so that a prefix shared by several phrases is computed once. The
tests check both against the padded path at 1e-12 in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rescorer.model.config import ModelConfig
from rescorer.model.device import matmul_dtype, no_autocast
from rescorer.model.gru import decoder_recurrence, encoder_recurrence
from rescorer.model.lse_kernel import log_sum_exp, use_kernel
from rescorer.model.output_layer import target_log_probs
from rescorer.model.prefix_tree import PrefixTree
from rescorer.model.vocab import EOS_ID

# On CPU the output layer runs in blocks of rows × vocabulary entries: small enough for a block
# of logits to stay in cache between the matmul and its log-sum-exp, large enough for efficient
# matmuls. Measured on 2 cores, paper sizes: 28 µs/token against 61 µs for whole-row blocks.
# On GPUs one block covers everything (blocks would only add kernel launches).
CPU_OUTPUT_BLOCK_ROWS = 512
CPU_OUTPUT_BLOCK_VOCAB = 2048
# Prefix-tree levels run in pieces of this many nodes on CPU, so the step's temporaries are reused
# from the allocator instead of being fresh (page-faulting) buffers.
CPU_TREE_STEP_ROWS = 512
# Scoring (no gradient) on CPU: blocks for the in-place log-sum-exp, whose buffer of logits
# (1024 × 512 floats, 2 MB) stays in the cores' L2 through the matmul, exp and sum. Measured on 2
# cores, paper sizes: 19 µs/row against 22 µs with 512 × 2048 blocks.
CPU_SCORING_BLOCK_ROWS = 1024
CPU_SCORING_BLOCK_VOCAB = 512
# Generation (beam search) on CPU: rows per block of logits for the top-k and log-sum-exp; a block
# of 128 rows × 15,000 words is 7.7 MB, near the cores' share of cache.
CPU_GENERATION_BLOCK_ROWS = 128
# Words per chunk of top_k_by_chunks: on the CPU, torch.topk's per-row selection over 15,001 logits
# cost more than the vocabulary matmul itself (benchmarks/propose_speed.py, docs/proposals.md).
TOP_K_CHUNK = 64


def top_k_by_chunks(logits: Tensor, k: int, chunk: int = TOP_K_CHUNK) -> tuple[Tensor, Tensor]:
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


def _lengths_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Boolean [B, max_len] mask, True at positions < length."""
    positions = torch.arange(max_len, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


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


@dataclass
class DecoderStart:
    """Per-pair decoder terms for generating word by word (:meth:`RNNEncoderDecoder.start_decoding`).

    ``state`` is h'⟨0⟩ = tanh(V' c); ``gate_context`` [C_r c; C_z c]; ``cand_context`` C c plus the
    bias the reset multiplies; ``out_context`` O_c c plus the deep-output bias.
    """

    state: Tensor
    gate_context: Tensor
    cand_context: Tensor
    out_context: Tensor


def embedding_layer(rows: int, dim: int, device: torch.device | str | None) -> nn.Embedding:
    """An embedding table; on the meta device without its init, whose ``normal_`` has only a Python meta
    kernel there, and that imports torch._dynamo (2.5 s) for a table a checkpoint then replaces."""
    if device is not None and torch.device(device).type == "meta":
        return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim, device=device))
    return nn.Embedding(rows, dim, device=device)


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
        mask = _lengths_mask(lengths, steps)  # [B, T], in the longest-first order
        ids = src[order, :steps].masked_fill(~mask, EOS_ID)
        state_dtype = self.enc_rec_cand.weight.dtype
        # One matmul for W_r e, W_z e, W e (+ biases) of every step, time-major from the (small) ids
        # so the [T, B, 3d] projections need no transposing copy.
        inputs = self.enc_input(self.src_embed(ids.t())).to(state_dtype)  # [T, B, 3d]
        restore = torch.empty_like(order)
        restore[order] = torch.arange(batch, device=order.device)
        if torch.is_grad_enabled() and self.enc_rec_cand.weight.requires_grad:
            # Training: the same steps with a backward through time written by hand (rescorer.model.gru).
            h = encoder_recurrence(inputs, self.enc_rec_gates.weight, self.enc_rec_cand.weight, running, state_dtype)
            return h[restore]
        h = torch.zeros(batch, d, dtype=state_dtype, device=src.device)
        for t, n in enumerate(running):
            h_new = self._encoder_step(h[:n], inputs[t, :n])
            h = h_new if n == batch else torch.cat([h_new, h[n:]])
        return h[restore]

    def _encoder_step(self, h: Tensor, inputs: Tensor, out: Tensor | None = None) -> Tensor:
        """One encoder GRU step (reset before the recurrent product) from [W_r; W_z; W] e + b ([n, 3d]).

        addmm folds the input term into the matmul and lerp does z⊙h + (1−z)⊙h̃ in one pass: the
        same equations with fewer passes over [n, d] memory, which dominate small steps. States
        stay in h's dtype (fp32) under autocast, where the matmuls run in bf16/fp16.
        """
        d = self.config.hidden
        gates = torch.sigmoid(torch.addmm(inputs[:, : 2 * d], h, self.enc_rec_gates.weight.t())).to(h.dtype)
        r, z = gates[:, :d], gates[:, d:]
        candidate = torch.tanh(torch.addmm(inputs[:, 2 * d :], r * h, self.enc_rec_cand.weight.t())).to(h.dtype)
        return torch.lerp(candidate, h, z, out=out)

    def encode(self, src: Tensor, src_len: Tensor) -> Tensor:
        """Summary vector c = tanh(V h⟨N⟩) of each source phrase: Float[B, d]."""
        return torch.tanh(self.enc_summary(self._run_encoder(src, src_len)))

    def encode_prefix_tree(self, tree: PrefixTree) -> Tensor:
        """Summary c of each of the ``tree.rows`` sources in a one-root tree of sources + ``</s>``.

        Each distinct source prefix is one encoder step (see :mod:`rescorer.model.prefix_tree`): the
        root is the empty prefix with h⟨0⟩ = 0, each level one batched GRU step from the parents'
        states, and c = tanh(V h) at each source's final node (the one that read its ``</s>``).
        """
        if tree.level_sizes[0] != 1:
            raise ValueError(f"a source tree has one root, got {tree.level_sizes[0]}")
        state_dtype = self.enc_rec_cand.weight.dtype
        states = torch.empty(tree.nodes, self.config.hidden, dtype=state_dtype, device=tree.token.device)
        states[0] = 0
        rows = CPU_TREE_STEP_ROWS if states.device.type == "cpu" else max(1, tree.nodes)
        start = 1
        for size in tree.level_sizes[1:]:
            for lo in range(start, start + size, rows):
                hi = min(lo + rows, start + size)
                # One encoder step for a piece of one level, from the parents' states.
                inputs = self.enc_input(self.src_embed(tree.token[lo:hi])).to(state_dtype)
                self._encoder_step(states[tree.parent[lo:hi]], inputs, out=states[lo:hi])
            start += size
        return torch.tanh(self.enc_summary(states[tree.final_node]))

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
        mask = _lengths_mask(tgt_len.to(tgt.device), steps)
        states, prev = self._decode(c, tgt[:, :steps], mask)
        return states, prev, mask

    def _decode(self, c: Tensor, tgt: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Decoder states [B, T, d] and inputs e(y_{t−1}) [B, T, emb] for T = ``tgt.shape[1]`` steps."""
        batch, steps, d = tgt.shape[0], tgt.shape[1], self.config.hidden
        prev = self._prev_embeddings(tgt, mask)  # [B, T, emb]
        # Context projections, once per pair: C_r c, C_z c go straight into the gate inputs of every
        # step; C c (+ its bias) stays separate because the reset multiplies it.
        context = self.dec_context(c)  # [B, 3d]
        inputs = self.dec_input(prev.transpose(0, 1))  # [T, B, 3d], time-major (see the encoder)
        gate_inputs = inputs[:, :, : 2 * d] + context[:, : 2 * d]  # [T, B, 2d]
        cand_inputs = inputs[:, :, 2 * d :]  # [T, B, d]
        cand_context = context[:, 2 * d :] + self.dec_cand_bias  # [B, d]
        # States kept in the parameters' dtype (fp32) even under autocast, like the encoder's.
        h = torch.tanh(self.dec_init(c)).to(self.dec_rec.weight.dtype)
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
            h = self._decoder_step(h, gate_inputs[t], cand_inputs[t], cand_context, weights=weights)
            states.append(h)
        all_states = torch.stack(states, dim=1) if states else c.new_zeros(batch, 0, d)
        return all_states, prev

    def _decoder_weights(self) -> tuple[Tensor, Tensor]:
        """[U'_r; U'_z]ᵀ and U'ᵀ, the decoder step's two recurrent matrices as views."""
        d = self.config.hidden
        return self.dec_rec.weight[: 2 * d].t(), self.dec_rec.weight[2 * d :].t()

    def _decoder_step(
        self, h: Tensor, gate_inputs: Tensor, cand_inputs: Tensor, cand_context: Tensor, out: Tensor | None = None,
        weights: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """One decoder GRU step: the class doc's equations, additions folded into addmm (see the encoder).

        ``gate_inputs`` = [W'_r; W'_z] e + [C_r; C_z] c + b ([n, 2d]); ``cand_inputs`` = W' e + b
        ([n, d]); ``cand_context`` = C c + its bias ([n, d]), which the reset r' multiplies.
        ``weights``: :meth:`_decoder_weights`, taken once by a caller that loops over steps.
        """
        d = self.config.hidden
        gate_weight, cand_weight = weights if weights is not None else self._decoder_weights()
        gates = torch.sigmoid(torch.addmm(gate_inputs, h, gate_weight)).to(h.dtype)
        r, z = gates[:, :d], gates[:, d:]
        recurrent = torch.addmm(cand_context, h, cand_weight).to(h.dtype)
        candidate = torch.tanh(torch.addcmul(cand_inputs, r, recurrent))
        return torch.lerp(candidate, h, z, out=out)

    def _maxout(self, c: Tensor, states: Tensor, prev: Tensor) -> Tensor:
        """s⟨t⟩ for all steps: maxout over adjacent pairs of O_h h' + O_y e(y_{t−1}) + O_c c."""
        pre = self.out_hidden(states) + self.out_prev(prev) + self.out_context(c).unsqueeze(1)
        return self._maxout_pool(pre)

    def _maxout_pool(self, pre: Tensor) -> Tensor:
        """max over adjacent pairs of the last dimension: [..., 2m] → [..., m]."""
        return pre.unflatten(-1, (self.config.maxout_units, 2)).amax(dim=-1)

    def _logits(self, s: Tensor) -> Tensor:
        """G s = G_l (G_r s) + bias, in at least float32 so the softmax never runs in bf16/fp16.

        (A float64 model, as used by the reference tests, stays in float64.)
        """
        logits = self.out_vocab(self.out_rank(s))
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    # ------------------------------------------------------------------ generation, one word at a time

    def start_decoding(self, c: Tensor) -> DecoderStart:
        """What generation needs from the summaries c [B, d]: h'⟨0⟩ and the per-pair context terms.

        The same projections as :meth:`_run_decoder` and :meth:`_maxout` compute once per pair, so
        :meth:`next_word_log_probs` repeats none of them per step.
        """
        d = self.config.hidden
        state_dtype = self.dec_rec.weight.dtype
        context = self.dec_context(c)  # [B, 3d]: C_r c, C_z c, C c
        return DecoderStart(
            state=torch.tanh(self.dec_init(c)).to(state_dtype),
            gate_context=context[:, : 2 * d].to(state_dtype),
            cand_context=(context[:, 2 * d :] + self.dec_cand_bias).to(state_dtype),
            out_context=self.out_context(c),
        )

    def next_word_log_probs(
        self, start: DecoderStart, rows: Tensor, h: Tensor, prev: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """One generation step: (h'⟨t⟩ [n, d], log p(y_t = · | y_<t, X) [n, V]).

        ``rows`` [n] picks each hypothesis' pair in ``start`` (several hypotheses may share one
        source), ``h`` [n, d] is h'⟨t−1⟩ and ``prev`` [n] the ids y_{t−1}, or None at t = 1 where
        e(y_0) = 0. The GRU step, maxout and output layer are the very methods the scoring paths
        use, so a generated target's summed step scores equal :meth:`score_targets` of it.
        """
        h, s = self._next_word_step(start, rows, h, prev)
        return h, torch.log_softmax(self._logits(s), dim=-1)

    def next_word_top_k(
        self, start: DecoderStart, rows: Tensor, h: Tensor, prev: Tensor | None, k: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The step of :meth:`next_word_log_probs` keeping each hypothesis' ``k`` likeliest words:
        (h'⟨t⟩ [n, d], their log-probabilities [n, k], best first, and their ids [n, k]).

        log p = (G s)_w − log Σ exp(G s), the top k taken on the logits: the full [n, V] of
        log-probabilities is never written. On the CPU the rows go in blocks whose logits stay in
        cache between the matmul, the top-k and the log-sum-exp (a beam search's cost is mostly
        here: benchmarks/propose_speed.py).
        """
        h, s = self._next_word_step(start, rows, h, prev)
        k = min(k, self.config.tgt_vocab_size)
        block = CPU_GENERATION_BLOCK_ROWS if s.device.type == "cpu" else max(1, s.shape[0])
        values, ids = [], []
        for lo in range(0, s.shape[0], block):
            logits = self._logits(s[lo : lo + block])
            top, top_ids = top_k_by_chunks(logits, k) if s.device.type == "cpu" else logits.topk(k, dim=1)
            values.append(top - torch.logsumexp(logits, dim=1, keepdim=True))
            ids.append(top_ids)
        if not values:
            return h, s.new_zeros(0, k), torch.zeros(0, k, dtype=torch.long, device=s.device)
        return h, torch.cat(values), torch.cat(ids)

    def _next_word_step(
        self, start: DecoderStart, rows: Tensor, h: Tensor, prev: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """h'⟨t⟩ and the maxout units s⟨t⟩ of one generation step (see :meth:`next_word_log_probs`)."""
        if prev is None:
            embedded = h.new_zeros(h.shape[0], self.config.embedding, dtype=self.tgt_embed.weight.dtype)
        else:
            embedded = self.tgt_embed(prev)
        d = self.config.hidden
        inputs = self.dec_input(embedded).to(h.dtype)  # W'_r e, W'_z e, W' e (+ biases)
        gate_inputs = inputs[:, : 2 * d] + start.gate_context[rows]
        h = self._decoder_step(h, gate_inputs, inputs[:, 2 * d :], start.cand_context[rows])
        pre = self.out_hidden(h) + self.out_prev(embedded) + start.out_context[rows]
        return h, self._maxout_pool(pre)

    def token_logprobs(self, c: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """log p(y_t | y_<t, X) per position: Float[B, M] (M = ``tgt.shape[1]``), 0 past the length.

        Float32 for an fp32/bf16/fp16 model or under autocast; float64 for a float64 model.

        The vocabulary projection and log-sum-exp run only on real positions (padding can be a
        third of a phrase-table batch, and G_l is the largest matmul per step).
        """
        states, prev, mask = self._run_decoder(c, tgt, tgt_len)
        score_dtype = torch.promote_types(self.out_vocab.weight.dtype, torch.float32)
        out = torch.zeros(tgt.shape, dtype=score_dtype, device=tgt.device)
        if mask.numel() == 0:
            return out
        s = self._maxout(c, states, prev)[mask]  # [P, m], P = number of real positions
        targets = tgt[:, : mask.shape[1]][mask]
        if torch.is_grad_enabled() and self.out_vocab.weight.requires_grad:
            # Training: the same values through a backward that recomputes the logits per block
            # instead of storing them (rescorer.model.output_layer).
            picked = target_log_probs(self.out_rank(s), self.out_vocab.weight, self.out_vocab.bias, targets)
            out[:, : mask.shape[1]][mask] = picked.to(score_dtype)
            return out
        rows = CPU_OUTPUT_BLOCK_ROWS if s.device.type == "cpu" else max(1, s.shape[0])
        output_matrix = self._output_matrix()
        scores = [
            self._target_log_probs(s[i : i + rows], targets[i : i + rows], score_dtype, output_matrix)
            for i in range(0, s.shape[0], rows)
        ]
        out[:, : mask.shape[1]][mask] = torch.cat(scores)
        return out

    def _target_log_probs(self, s: Tensor, targets: Tensor, dtype: torch.dtype, output_matrix: Tensor) -> Tensor:
        """log softmax(G s)[target] for a block of rows, never materialising [rows, V] at once on CPU."""
        low = self.out_rank(s)  # G_r s: [rows, r]
        return self._picked_logits(low, targets, dtype) - self._log_normalizer(low, dtype, output_matrix)

    def _output_matrix(self) -> Tensor:
        """[G_l | bias | 1] ([V, r + 2]): the bias rides in the matmul as a column, against a
        constant 1 appended to G_r s, instead of being broadcast into every block of logits; the
        last column lets :meth:`_log_normalizer` subtract a shift inside the matmul the same way.

        Under CPU bf16 autocast (scoring with ``--precision bf16``) it is cast to bf16 here, once
        per scored batch, not once per block of rows (:meth:`_log_normalizer_in_place`).
        """
        weight = self.out_vocab.weight
        matrix = torch.cat([weight, self.out_vocab.bias.unsqueeze(1), weight.new_ones(weight.shape[0], 1)], dim=1)
        if weight.device.type == "cpu" and not torch.is_grad_enabled():
            return matrix.to(matmul_dtype(weight.device, matrix.dtype))
        return matrix

    def _picked_logits(self, low: Tensor, targets: Tensor, dtype: torch.dtype) -> Tensor:
        """(G s)[target] + bias as a row-wise dot product of G_r s with the target's row of G_l."""
        weight, bias = self.out_vocab.weight, self.out_vocab.bias
        return (low.to(dtype) * weight[targets].to(dtype)).sum(-1) + bias[targets].to(dtype)

    def _log_normalizer(self, low: Tensor, dtype: torch.dtype, output_matrix: Tensor) -> Tensor:
        """log Σ_w exp((G s)_w + b_w) per row, from G_r s ([rows, r]) and :meth:`_output_matrix`.

        On CPU the vocabulary is cut into blocks whose logits stay in cache (never [rows, V] at once).
        """
        vocab = output_matrix.shape[0]
        on_cpu = low.device.type == "cpu"
        differentiable = torch.is_grad_enabled() and (low.requires_grad or output_matrix.requires_grad)
        if on_cpu and not differentiable and (low.dtype == output_matrix.dtype == dtype
                                              or output_matrix.dtype == torch.bfloat16 != dtype):
            return self._log_normalizer_in_place(low, output_matrix, min(vocab, CPU_SCORING_BLOCK_VOCAB), dtype)
        low_and_one = F.pad(low, (0, 1), value=1.0)
        if not differentiable and use_kernel(low):
            # GPUs: the logits never leave the chip (rescorer.model.lse_kernel).
            return log_sum_exp(low_and_one, output_matrix[:, :-1]).to(dtype)
        step = CPU_OUTPUT_BLOCK_VOCAB if on_cpu else vocab
        # Per-block log-sum-exps combined exactly (logsumexp of logsumexps); used for training,
        # on GPUs without Triton (one block) and under autocast on the CPU.
        parts = [
            torch.logsumexp(F.linear(low_and_one, output_matrix[j : j + step, :-1]).to(dtype), dim=-1)
            for j in range(0, vocab, step)
        ]
        return parts[0] if len(parts) == 1 else torch.logsumexp(torch.stack(parts), dim=0)

    def _log_normalizer_in_place(self, low: Tensor, output_matrix: Tensor, step: int,
                                 dtype: torch.dtype | None = None) -> Tensor:
        """The CPU scoring path of :meth:`_log_normalizer`: fewer passes over each block of logits.

        log Σ exp(x) = m + log Σ exp(x − m) for any shift m. The first block (the most frequent
        words, where the largest logit usually is) is shifted by its own row maximum; every later
        block is shifted by that same m, which the matmul subtracts itself (a −m column against
        the constant-1 column of :meth:`_output_matrix`), so each later block costs the matmul, one
        in-place exp and one sum, in one reused buffer: no max pass and no fresh tensor. Words far
        below m underflow to 0, which changes nothing at float precision since the first block
        contributes at least exp(0) = 1. A later logit more than ~88 above m would overflow; those
        rows are recomputed the plain way, so the result is always the exact log-sum-exp.
        Measured 10% faster for the whole scorer than per-block torch.logsumexp at paper sizes.

        With a bf16 ``output_matrix`` (``--precision bf16`` on the CPU) the matmuls run on the CPU's
        bf16 units and write bf16 logits, and the sums accumulate in ``dtype`` (fp32). Rounding a
        logit x of 10–20 to bf16 would cost up to 0.04 nats, so every block, the first included
        (computed twice: once for m, a bf16 value, then shifted), holds x − m, rounded once after
        the matmul's fp32 accumulation: small where it matters, at the likeliest words.
        """
        vocab = output_matrix.shape[0]
        mixed = output_matrix.dtype != (dtype or low.dtype)
        with no_autocast(low.device):
            extended = F.pad(low.to(output_matrix.dtype), (0, 2), value=1.0)  # [G_r s, 1, −m]
            buffer = extended.new_empty(low.shape[0], step)
            torch.mm(extended[:, :-1], output_matrix[:step, :-1].t(), out=buffer)
            shift = buffer.amax(dim=1)
            if mixed:
                extended[:, -1] = -shift
                torch.mm(extended, output_matrix[:step].t(), out=buffer)
                total = buffer.exp_().sum(dim=1, dtype=dtype)
            else:
                total = buffer.sub_(shift.unsqueeze(1)).exp_().sum(dim=1)
                extended[:, -1] = -shift
            for j in range(step, vocab, step):
                block = output_matrix[j : j + step]
                logits = buffer[:, : block.shape[0]]
                torch.mm(extended, block.t(), out=logits)
                total += logits.exp_().sum(dim=1, dtype=total.dtype)
            result = total.log_().add_(shift.to(total.dtype))
            overflowed = ~torch.isfinite(result)
            if overflowed.any():
                low_and_one = F.pad(low[overflowed].to(result.dtype), (0, 1), value=1.0)
                matrix = output_matrix[:, :-1].to(result.dtype)
                result[overflowed] = torch.logsumexp(F.linear(low_and_one, matrix), dim=-1)
        return result

    def score_prefix_tree(self, c: Tensor, tree: PrefixTree) -> Tensor:
        """log p(Y | X) of the ``tree.rows`` targets held in ``tree``, each prefix decoded once.

        ``c`` [S, d] holds the summaries of the tree's sources. The same equations as
        :meth:`score_targets`, computed per distinct (source, prefix) node instead of per target
        position (see :mod:`rescorer.model.prefix_tree`): what depends on c alone (h'⟨0⟩ = tanh(V' c),
        C c, O_c c) once per source, each level of the tree as one batched GRU step, the maxout
        and the softmax normaliser once per node, and only the picked logit per position.
        """
        d = self.config.hidden
        if c.dim() != 2 or c.shape[1] != d or c.shape[0] != tree.level_sizes[0]:
            raise ValueError(f"c must be [S={tree.level_sizes[0]}, d={d}], got shape {tuple(c.shape)}")
        state_dtype = self.dec_rec.weight.dtype
        score_dtype = torch.promote_types(self.out_vocab.weight.dtype, torch.float32)
        roots = tree.level_sizes[0]
        # e(y_k) of each node; the roots' input is e(y_0) = 0, so W' e + b is just the bias there.
        embedded = self.tgt_embed(tree.token)
        embedded[:roots] = 0
        # What depends on c alone, once per source: C_r c, C_z c and C c + its bias (kept apart
        # from W' e because the reset multiplies it), h'⟨0⟩ = tanh(V' c) and O_c c.
        context = self.dec_context(c).to(state_dtype)
        context[:, 2 * d :] += self.dec_cand_bias
        states = torch.empty(tree.nodes, d, dtype=state_dtype, device=c.device)
        # Work in pieces of at most ``rows`` nodes: on CPU the temporaries then stay small enough to
        # be reused from the allocator and to sit in cache (fresh large buffers cost page faults).
        rows = CPU_TREE_STEP_ROWS if c.device.type == "cpu" else max(1, tree.nodes)
        start = 0
        for level, size in enumerate(tree.level_sizes):
            for lo in range(start, start + size, rows):
                hi = min(lo + rows, start + size)
                # The parents' states; for the roots h'⟨0⟩ = tanh(V' c), in fp32 like every state.
                h = torch.tanh(self.dec_init(c[lo:hi])).to(state_dtype) if level == 0 else states[tree.parent[lo:hi]]
                # One GRU step for a piece of the level: the decoder equations of _run_decoder.
                pre_context = context.index_select(0, tree.source[lo:hi])  # [n, 3d]
                inputs = self.dec_input(embedded[lo:hi]).to(state_dtype)
                pre_context[:, : 2 * d] += inputs[:, : 2 * d]
                gate_inputs, cand_context = pre_context[:, : 2 * d], pre_context[:, 2 * d :]
                self._decoder_step(h, gate_inputs, inputs[:, 2 * d :], cand_context, out=states[lo:hi])
            start += size
        out_context = self.out_context(c)  # [S, 2m]
        output_matrix = self._output_matrix()
        low = torch.empty(tree.nodes, self.config.output_rank, dtype=score_dtype, device=c.device)
        normalizer = torch.empty(tree.nodes, dtype=score_dtype, device=c.device)
        out_rows = CPU_SCORING_BLOCK_ROWS if c.device.type == "cpu" else max(1, tree.nodes)
        for lo in range(0, tree.nodes, out_rows):
            hi = min(lo + out_rows, tree.nodes)
            pre = self.out_hidden(states[lo:hi]) + self.out_prev(embedded[lo:hi])
            pre += out_context.index_select(0, tree.source[lo:hi])
            s = self._maxout_pool(pre)  # [n, m]
            block_low = self.out_rank(s)  # G_r s
            low[lo:hi] = block_low
            normalizer[lo:hi] = self._log_normalizer(block_low, score_dtype, output_matrix)
        position_scores = (
            self._picked_logits(low[tree.position_node], tree.position_next, score_dtype)
            - normalizer[tree.position_node]
        )
        return _sum_positions(position_scores, tree.position_row, tree.rows, len(tree.level_sizes))

    def score_targets(self, c: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """log p(Y | X) = Σ_t log p(y_t | y_<t, X), including ``</s>``: Float[B] (float32 or wider)."""
        return self.token_logprobs(c, tgt, tgt_len).sum(dim=1)

    def forward(self, src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """log p(Y | X) of each pair: ``score_targets(encode(src, src_len), tgt, tgt_len)``."""
        return self.score_targets(self.encode(src, src_len), tgt, tgt_len)

    def static_log_likelihood(self, src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """log p(Y | X) of each row, Float[B], by work that the tensors' shapes alone decide.

        What :meth:`forward` computes for training, written for a step that a CUDA graph captures
        once per shape and replays (``rescorer.training.step``): no value is read on the host, no
        shape depends on a length, and the lengths live on the ids' device. The price is work the
        ragged path skips (every row runs all N encoder steps; the output layer covers padded
        positions), which is why the CPU keeps that path.

        * Encoder: at a padded step the update gate's pre-activation is +inf, so z = 1 exactly and
          the GRU returns h⟨t−1⟩ bit for bit (``lerp`` with weight 1 returns its end point); the
          hand-written backward (:mod:`rescorer.model.gru`) then passes the gradient through
          unchanged and gives the step's inputs and weights exactly zero gradient (z(1 − z) = 0,
          1 − z = 0).
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
        d = self.config.hidden
        state_dtype = self.enc_rec_cand.weight.dtype
        src_mask = _lengths_mask(src_len, src.shape[1])  # [B, N]
        inputs = self.enc_input(self.src_embed(src.masked_fill(~src_mask, EOS_ID).t())).to(state_dtype)
        update_gate = (torch.arange(3 * d, device=src.device) // d) == 1  # the z block of [r; z; candidate]
        inputs = inputs.masked_fill(~src_mask.t().unsqueeze(2) & update_gate, math.inf)
        h = encoder_recurrence(inputs, self.enc_rec_gates.weight, self.enc_rec_cand.weight, [batch] * src.shape[1],
                               state_dtype)
        c = torch.tanh(self.enc_summary(h))
        mask = _lengths_mask(tgt_len, tgt.shape[1])  # [B, T]
        states, prev = self._decode(c, tgt, mask)
        low = self.out_rank(self._maxout(c, states, prev)).flatten(0, 1)  # G_r s of every position
        targets = tgt.masked_fill(~mask, EOS_ID).flatten()
        picked = target_log_probs(low, self.out_vocab.weight, self.out_vocab.bias, targets)
        score_dtype = torch.promote_types(self.out_vocab.weight.dtype, torch.float32)
        return torch.where(mask, picked.view(mask.shape).to(score_dtype), 0.0).sum(dim=1)


def _sum_positions(scores: Tensor, row: Tensor, rows: int, levels: int) -> Tensor:
    """Σ of each row's position scores, in the same order whatever the device: deterministic.

    ``index_add_`` would do, but on CUDA it adds with atomics in whatever order the threads come,
    so the same pair could get different last bits from run to run (and a resumed run different
    bytes). Positions come level by level, each level's rows ascending (:mod:`rescorer.model.prefix_tree`),
    so a row's level is the number of times the row index fails to rise before it; each (level,
    row) is written once into a dense [levels, rows] matrix, which is summed over its few levels.
    ``levels`` is the tree's number of levels, known on the host (no device sync).
    """
    new_level = torch.zeros_like(row)
    new_level[1:] = row[1:] <= row[:-1]
    level = torch.cumsum(new_level, 0)
    dense = scores.new_zeros(levels, rows)
    dense[level, row] = scores
    return dense.sum(0)


def count_flops_per_pair(config: ModelConfig, src_len: int, tgt_len: int) -> int:
    """Forward-pass FLOPs (2 × multiply-adds of the matmuls) to score one pair on its own.

    ``src_len``/``tgt_len`` count the ``</s>`` (they are the numbers of encoder/decoder steps).
    Embedding lookups, element-wise ops and the softmax are not counted. This matches what
    :meth:`RNNEncoderDecoder.forward` computes: the decoder's first step still multiplies W' by
    e(y_0) = 0, and the context projections are counted once per pair. A training step costs
    about 3× this.
    """
    return count_flops(config, encoder_steps=src_len, summaries=1, decoder_steps=tgt_len)


def count_flops(config: ModelConfig, *, encoder_steps: int, summaries: int, decoder_steps: int) -> int:
    """Forward FLOPs of ``encoder_steps`` encoder steps, ``summaries`` times the work on c alone
    (V, V', [C_r; C_z; C], O_c) and ``decoder_steps`` decoder steps with their output layer.

    For :meth:`RNNEncoderDecoder.score_prefix_tree` the decoder steps are the tree's nodes and
    the summaries its sources; the picked logits (an r-sized dot product per position) are not
    counted.
    """
    d, emb, m, r, v = (
        config.hidden,
        config.embedding,
        config.maxout_units,
        config.output_rank,
        config.tgt_vocab_size,
    )
    encoder_step = 3 * d * emb + 2 * d * d + d * d  # [W_r;W_z;W] e, [U_r;U_z] h, U (r⊙h)
    per_summary = d * d + d * d + 3 * d * d + 2 * m * d  # V, V', [C_r;C_z;C], O_c
    decoder_step = 3 * d * emb + 3 * d * d + 2 * m * d + 2 * m * emb + m * r + (r + 1) * v  # bias as a column
    return 2 * (encoder_steps * encoder_step + summaries * per_summary + decoder_steps * decoder_step)
