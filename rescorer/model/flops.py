"""Counting the model's forward FLOPs, for the benchmarks' throughput figures."""

from __future__ import annotations

from rescorer.model.config import ModelConfig


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

    For :func:`rescorer.model.tree_scoring.score_prefix_tree` the decoder steps are the tree's nodes and
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
