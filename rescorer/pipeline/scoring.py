"""Batched scoring of phrase pairs, computing nothing twice: source and target prefix trees.

This is the compute core of ``rescore-phrase-table``. Savings on real tables (SPEC §3), all exact:

* a Moses table lists each source phrase next to its extensions, and the encoder reads left to
  right, so the distinct sources of a chunk are encoded as prefix trees (each distinct source
  prefix once);
* a source has two or more targets on average, so its summary c, and everything that depends on c
  alone, is computed once;
* the targets of a source often begin alike, so each distinct (source, target prefix) is decoded
  once (:mod:`neural.prefix_tree`).

Trees need no padding. Groups of sources are cut by a token budget; with ``sort_by_length``,
sources whose targets are equally long go together. With ``share_sources`` off, every pair is
encoded and decoded on its own in padded batches (length-sorted or not): the naive cost, kept so
the benchmark can measure the savings.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from neural.device import autocast, is_out_of_memory
from neural.prefix_tree import TreeArrays
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.tree_scoring import encode_prefix_tree, score_prefix_tree
from rescorer.pipeline.scoring_plan import (
    ScoringPlan,
    decoder_tree,
    encoder_groups,
    encoder_tree,
    plan_scoring,
)
from rescorer.tables.chunks import TokenIds, with_end_of_phrase
from rescorer.training.data import pad_with_eos


@dataclass
class ScoringOptions:
    """Knobs of the batched scorer; none of them changes a score beyond float rounding."""

    token_budget: int | None = None  # tokens per batch or tree group; None = auto_token_budget()
    max_batch: int = 4096  # pairs per batch, whatever their length
    share_sources: bool = True  # prefix trees: each distinct source / target prefix once per chunk
    sort_by_length: bool = True  # group sources of equally long targets (and, unshared, sort by length)


class PairScorer:
    """Scores chunks of pairs with a trained model on one device.

    On CUDA an out-of-memory error halves the token budget and retries the same batch, so a
    budget that is too ambitious costs time once and never loses a line.
    """

    def __init__(
        self,
        model: RNNEncoderDecoder,
        device: torch.device,
        amp_dtype: torch.dtype | None = None,
        options: ScoringOptions | None = None,
        precision: str = "fp32",
    ) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.amp_dtype = amp_dtype
        self.precision = precision  # as resolved (neural.device.scoring_precision): for the resume record
        self.options = options or ScoringOptions()
        self.token_budget = self.options.token_budget or auto_token_budget(device, model.config)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def _batches(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Row groups whose padded size fits the token budget, in length order when sorting."""
        n = len(lengths)
        order = np.argsort(lengths, kind="stable") if self.options.sort_by_length else np.arange(n)
        batches: list[np.ndarray] = []
        start = 0
        while start < n:
            width = 0
            end = start
            while end < n:
                w = max(width, int(lengths[order[end]]))
                if (end - start + 1) * w > self.token_budget and end > start:
                    break
                if end - start + 1 > self.options.max_batch:
                    break
                width = w
                end += 1
            batches.append(order[start:end])
            start = end
        return batches

    def _run(self, fn, rows: np.ndarray, prepared=None) -> torch.Tensor:
        """Apply ``fn`` to ``rows``, splitting the rows in half on CUDA out-of-memory.

        ``prepared`` is what a :class:`ScoringPlan` built for exactly these rows (a tree); the
        halves of a split build their own.
        """
        try:
            with torch.inference_mode(), autocast(self.device, self.amp_dtype):
                return fn(rows) if prepared is None else fn(rows, prepared)
        except (RuntimeError, MemoryError) as exc:
            if not is_out_of_memory(exc) or len(rows) == 1:
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.token_budget = max(1, self.token_budget // 2)
            half = len(rows) // 2
            return torch.cat([self._run(fn, rows[:half]), self._run(fn, rows[half:])])

    def encode_sources(self, sources: TokenIds) -> torch.Tensor:
        """Summary vectors c [n, d] (fp32) for ragged source id sequences.

        Shared prefixes are encoded once (a prefix tree per group of consecutive sources, which in
        a Moses table are sorted, so phrases and their extensions sit together).
        """
        if not self.options.share_sources:
            return self._encode_padded(sources)
        groups = [(rows, None) for rows in encoder_groups(with_end_of_phrase(sources), self.token_budget)]
        return self._encode_groups(sources, groups)

    def _encode_groups(self, sources: TokenIds, groups: list[tuple[np.ndarray, TreeArrays | None]]) -> torch.Tensor:
        """Summaries of the sources, group by group, from the groups' trees (built here if None)."""
        n = len(sources.offsets) - 1
        out = torch.empty((n, self.model.config.hidden), dtype=torch.float32, device=self.device)
        sequences = with_end_of_phrase(sources)

        def encode_tree(rows: np.ndarray, tree: TreeArrays | None = None) -> torch.Tensor:
            tree = tree if tree is not None else encoder_tree(sequences, rows)
            return encode_prefix_tree(self.model, tree.tensors().to(self.device, non_blocking=True)).float()

        for rows, tree in groups:
            out[torch.from_numpy(rows).to(self.device)] = self._run(encode_tree, rows, tree)
        return out

    def _encode_padded(self, sources: TokenIds) -> torch.Tensor:
        """Summaries from padded batches, one source at a time (the unshared baseline)."""
        n = len(sources.offsets) - 1
        out = torch.empty((n, self.model.config.hidden), dtype=torch.float32, device=self.device)

        def encode(rows: np.ndarray) -> torch.Tensor:
            src, src_len = pad_with_eos(sources.offsets, sources.ids, rows)
            return self.model.encode(self._to_device(src), self._to_device(src_len)).float()

        for rows in self._batches(sources.lengths + 1):
            out[torch.from_numpy(rows).to(self.device)] = self._run(encode, rows)
        return out

    def plan(self, sources: TokenIds, source_of_row: np.ndarray, targets: TokenIds) -> ScoringPlan:
        """The groups and trees :meth:`score_plan` runs, for this scorer's budget and options."""
        return plan_scoring(sources, source_of_row, targets, self.token_budget,
                            share_sources=self.options.share_sources, sort_by_length=self.options.sort_by_length)

    def score(self, sources: TokenIds, source_of_row: np.ndarray, targets: TokenIds) -> np.ndarray:
        """log p(target_i | source_{source_of_row[i]}) for every row, as float64."""
        return self.score_plan(self.plan(sources, source_of_row, targets))

    def score_plan(self, plan: ScoringPlan) -> np.ndarray:
        """Scores of a chunk whose groups and trees were built beforehand (e.g. in a worker process).

        A plan made for a larger budget than this scorer now has (an out-of-memory error halved
        it after the plan was sent) is made again here, rather than running out of memory again.
        """
        if plan.token_budget > self.token_budget and self.options.share_sources:
            plan = self.plan(plan.sources, plan.source_of_row, plan.targets)
        sources, source_of_row, targets = plan.sources, plan.source_of_row, plan.targets
        if not len(source_of_row):
            return np.empty(0, dtype=np.float64)
        if not self.options.share_sources:
            return self._score_unshared(sources, source_of_row, targets)
        summaries = self._encode_groups(sources, plan.encoder_groups)
        result = np.empty(len(source_of_row), dtype=np.float64)

        def decode_tree(rows: np.ndarray, prepared: tuple[np.ndarray, TreeArrays] | None = None) -> torch.Tensor:
            used, tree = prepared if prepared is not None else decoder_tree(source_of_row, targets, rows)
            c = summaries[torch.from_numpy(used).to(self.device)]
            return score_prefix_tree(self.model, c, tree.tensors().to(self.device, non_blocking=True)).float()

        for rows, used, tree in plan.decoder_groups:
            result[rows] = self._run(decode_tree, rows, (used, tree)).double().cpu().numpy()
        return result

    def _score_unshared(self, sources: TokenIds, source_of_row: np.ndarray, targets: TokenIds) -> np.ndarray:
        """One encoding and one padded decoding per row: the naive cost, kept for the benchmark."""
        summaries = self._encode_padded(_expand(sources, source_of_row))
        result = np.empty(len(source_of_row), dtype=np.float64)

        def decode(rows: np.ndarray) -> torch.Tensor:
            tgt, tgt_len = pad_with_eos(targets.offsets, targets.ids, rows)
            c = summaries[torch.from_numpy(rows).to(self.device)]
            return self.model.score_targets(c, self._to_device(tgt), self._to_device(tgt_len)).float()

        for rows in self._batches(targets.lengths + 1):
            result[rows] = self._run(decode, rows).double().cpu().numpy()
        return result


CPU_TOKEN_BUDGET = 8192  # measured best of 2k–64k on a 2-core CPU: larger batches fall out of cache


def auto_token_budget(device: torch.device, config) -> int:
    """Batch size in tokens: fixed on CPU, grown with free memory on a GPU.

    On a GPU the dominant memory per token is one row of fp32 logits and its log-sum-exp
    temporary (2 V floats: the fp32 output layer runs in one block there; the fused kernel of
    TF32/bf16 scoring needs none) plus a few d-sized decoder activations; half the free memory
    is used, and an out-of-memory error still halves the budget safely.

    The figure is rounded down to a power of two. The budget decides the groups, so the shapes of
    every matmul, whose kernels may round differently; free memory differs by some megabytes
    from one run to the next, and without the rounding two runs of the same command on the same
    GPU would group, and so print, differently.
    """
    if device.type != "cuda":
        return CPU_TOKEN_BUDGET
    free, _ = torch.cuda.mem_get_info(device)
    per_token = 4 * (2 * config.tgt_vocab_size + 12 * config.hidden)
    budget = int(max(CPU_TOKEN_BUDGET, min(1 << 20, free // 2 // per_token)))
    return 1 << (budget.bit_length() - 1)


def _expand(sources: TokenIds, index: np.ndarray) -> TokenIds:
    """Ragged sequences sources[index[i]] for every i (duplicates materialised)."""
    lengths = sources.lengths[index]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    starts = sources.offsets[index]
    gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return TokenIds(offsets, sources.ids[gather], sources.n_unk[index])
