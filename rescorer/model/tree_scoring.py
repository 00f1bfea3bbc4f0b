"""Scoring over prefix trees: the SPEC §1 equations with each shared prefix computed once.

The phrase-table scorer (:mod:`rescorer.pipeline.scoring`) uses :func:`encode_prefix_tree` and
:func:`score_prefix_tree` instead of :meth:`RNNEncoderDecoder.encode` and
:meth:`RNNEncoderDecoder.score_targets`: the same equations over prefix trees
(:mod:`neural.prefix_tree`), so that a prefix shared by several phrases is computed once. The
tests check both against the padded path at 1e-12 in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from neural.prefix_tree import PrefixTree
from rescorer.model import block_sizes, normalizer
from rescorer.model.network import RNNEncoderDecoder


def encode_prefix_tree(model: RNNEncoderDecoder, tree: PrefixTree) -> Tensor:
    """Summary c of each of the ``tree.rows`` sources in a one-root tree of sources + ``</s>``.

    Each distinct source prefix is one encoder step (see :mod:`neural.prefix_tree`): the
    root is the empty prefix with h⟨0⟩ = 0, each level one batched GRU step from the parents'
    states, and c = tanh(V h) at each source's final node (the one that read its ``</s>``).
    """
    if tree.level_sizes[0] != 1:
        raise ValueError(f"a source tree has one root, got {tree.level_sizes[0]}")
    states = torch.empty(tree.nodes, model.config.hidden, dtype=model.enc_rec_cand.weight.dtype,
                         device=tree.token.device)
    states[0] = 0
    rows = block_sizes.CPU_TREE_STEP_ROWS if states.device.type == "cpu" else max(1, tree.nodes)
    start = 1
    for size in tree.level_sizes[1:]:
        for lo in range(start, start + size, rows):
            hi = min(lo + rows, start + size)
            # One encoder step for a piece of one level, from the parents' states.
            inputs = model.encoder_inputs(tree.token[lo:hi])
            model.encoder_step(states[tree.parent[lo:hi]], inputs, out=states[lo:hi])
        start += size
    return model.summary(states[tree.final_node])


def score_prefix_tree(model: RNNEncoderDecoder, c: Tensor, tree: PrefixTree) -> Tensor:
    """log p(Y | X) of the ``tree.rows`` targets held in ``tree``, each prefix decoded once.

    ``c`` [S, d] holds the summaries of the tree's sources. The same equations as
    :meth:`RNNEncoderDecoder.score_targets`, computed per distinct (source, prefix) node instead of per target
    position (see :mod:`neural.prefix_tree`): what depends on c alone (h'⟨0⟩ = tanh(V' c),
    C c, O_c c) once per source, each level of the tree as one batched GRU step, the maxout
    and the softmax normaliser once per node, and only the picked logit per position.
    """
    d = model.config.hidden
    if c.dim() != 2 or c.shape[1] != d or c.shape[0] != tree.level_sizes[0]:
        raise ValueError(f"c must be [S={tree.level_sizes[0]}, d={d}], got shape {tuple(c.shape)}")
    state_dtype = model.dec_rec.weight.dtype
    score_dtype = model.score_dtype
    roots = tree.level_sizes[0]
    # e(y_k) of each node; the roots' input is e(y_0) = 0, so W' e + b is just the bias there.
    embedded = model.tgt_embed(tree.token)
    embedded[:roots] = 0
    # What depends on c alone, once per source: C_r c, C_z c and C c + its bias (kept apart
    # from W' e because the reset multiplies it); h'⟨0⟩ = tanh(V' c) per piece of roots, O_c c below.
    gate_context, cand_context = model.decoder_context(c)
    states = torch.empty(tree.nodes, d, dtype=state_dtype, device=c.device)
    # Work in pieces of at most ``rows`` nodes: on CPU the temporaries then stay small enough to
    # be reused from the allocator and to sit in cache (fresh large buffers cost page faults).
    rows = block_sizes.CPU_TREE_STEP_ROWS if c.device.type == "cpu" else max(1, tree.nodes)
    start = 0
    for level, size in enumerate(tree.level_sizes):
        for lo in range(start, start + size, rows):
            hi = min(lo + rows, start + size)
            # The parents' states; for the roots h'⟨0⟩ = tanh(V' c), in fp32 like every state.
            h = model.decoder_init(c[lo:hi]) if level == 0 else states[tree.parent[lo:hi]]
            # One GRU step for a piece of the level, each node with its source's context terms.
            sources = tree.source[lo:hi]
            gate_inputs, cand_inputs = model.decoder_inputs(embedded[lo:hi])
            gate_inputs += gate_context.index_select(0, sources)
            model.decoder_step(h, gate_inputs, cand_inputs, cand_context.index_select(0, sources), out=states[lo:hi])
        start += size
    out_context = model.out_context(c)  # [S, 2m]
    output_matrix = normalizer.output_matrix(model.out_vocab)
    low = torch.empty(tree.nodes, model.config.output_rank, dtype=score_dtype, device=c.device)
    normalizers = torch.empty(tree.nodes, dtype=score_dtype, device=c.device)
    out_rows = block_sizes.CPU_SCORING_BLOCK_ROWS if c.device.type == "cpu" else max(1, tree.nodes)
    for lo in range(0, tree.nodes, out_rows):
        hi = min(lo + out_rows, tree.nodes)
        s = model.output_features(states[lo:hi], embedded[lo:hi], out_context.index_select(0, tree.source[lo:hi]))
        block_low = model.out_rank(s)  # G_r s
        low[lo:hi] = block_low
        normalizers[lo:hi] = normalizer.log_normalizer(block_low, score_dtype, output_matrix)
    position_scores = (
        normalizer.picked_logits(model.out_vocab, low[tree.position_node], tree.position_next, score_dtype)
        - normalizers[tree.position_node]
    )
    return sum_positions(position_scores, tree.position_row, tree.rows, len(tree.level_sizes))


def sum_positions(scores: Tensor, row: Tensor, rows: int, levels: int) -> Tensor:
    """Σ of each row's position scores, in the same order whatever the device: deterministic.

    ``index_add_`` would do, but on CUDA it adds with atomics in whatever order the threads come,
    so the same pair could get different last bits from run to run (and a resumed run different
    bytes). Positions come level by level, each level's rows ascending (:mod:`neural.prefix_tree`),
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

