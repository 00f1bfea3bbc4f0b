"""Training data: the unique (source, target) phrase pairs of a Moses table, as id sequences.

The paper trains on the *unique* pairs of the phrase table and deliberately ignores phrase
frequencies (SPEC §1), so each distinct pair is one example. The pairs are stored as an Arrow IPC
file of ``list<int32>`` columns and memory-mapped: sampling random minibatches then touches only
the rows drawn, and a table of hundreds of millions of pairs never becomes Python objects.
"""

from __future__ import annotations

import hashlib
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from infrastructure.errors import UserError
from infrastructure.files import atomic_path, open_input
from infrastructure.progress import progress_bar
from moses_integration.tokens import split_tokens_arrow
from neural.vocab import Vocab, build_vocab_from_corpus
from rescorer.tables.chunks import EOS_ID, FIELD_SEPARATOR, iter_line_chunks, parse_chunk, phrases_to_ids

PAIR_SCHEMA = pa.schema([("source", pa.string()), ("target", pa.string())])
ID_SCHEMA = pa.schema([("src", pa.list_(pa.int32())), ("tgt", pa.list_(pa.int32()))])


@dataclass
class PairCorpus:
    """Unique string pairs extracted from a table, with the word counts gathered on the way."""

    path: Path
    num_pairs: int
    src_counts: Counter
    tgt_counts: Counter


def extract_unique_pairs(
    table: str, out_path: Path, *, chunk_lines: int = 200_000, progress: bool = True
) -> PairCorpus:
    """Stream the table once: validate it, drop repeated pairs, count words for the shortlists.

    Moses writes its tables sorted as ``LC_ALL=C sort`` sorts the lines, i.e. by the bytes of
    ``source ||| target ||| ``, so a repeated pair is always next to its first occurrence and
    dropping adjacent repeats yields the unique pairs in one streaming pass. That order is checked
    on the way; a table that breaks it (hand-made, concatenated, sorted in another locale) is read
    again with repeats found in memory, which is exact whatever the order. Source words are counted
    once per distinct source phrase, target words once per pair.
    """
    try:
        return _extract_pairs(table, out_path, chunk_lines, progress, sorted_input=True)
    except _NotSorted as exc:
        sys.stderr.write(
            f"{table}:{exc.line_no}: the table is not sorted (LC_ALL=C sort order of 'source ||| target'); "
            "finding repeated pairs in memory instead\n"
        )
        return _extract_pairs(table, out_path, chunk_lines, progress, sorted_input=False)


class _NotSorted(Exception):
    def __init__(self, line_no: int) -> None:
        super().__init__(line_no)
        self.line_no = line_no


def _extract_pairs(table: str, out_path: Path, chunk_lines: int, progress: bool, *, sorted_input: bool) -> PairCorpus:
    src_counts: Counter = Counter()
    tgt_counts: Counter = Counter()
    num_pairs = 0
    num_scores: int | None = None
    prev_key: str | None = None
    prev_src: str | None = None
    seen_pairs: set[str] = set()
    seen_sources: set[str] = set()
    with atomic_path(out_path) as tmp, open_input(table) as fh, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(
        sink, PAIR_SCHEMA
    ) as writer, progress_bar(desc="reading pairs", unit=" lines", show=progress) as bar:
        for chunk in iter_line_chunks(fh, table, chunk_lines):
            parsed = parse_chunk(chunk, table, num_scores=num_scores)
            num_scores = parsed.num_scores
            src, tgt = parsed.source, parsed.target
            n = len(src)
            key = pc.binary_join_element_wise(src, tgt, pa.scalar(FIELD_SEPARATOR), pa.scalar(""), FIELD_SEPARATOR)
            if sorted_input:
                prev_k = pa.concat_arrays([pa.array([prev_key], pa.string()), key.slice(0, n - 1)])
                backwards = pc.fill_null(pc.less(key, prev_k), False).to_numpy(zero_copy_only=False)
                if backwards.any():
                    raise _NotSorted(chunk.first_line_no + int(np.argmax(backwards)))
                keep = pc.fill_null(pc.not_equal(key, prev_k), True)
                prev_s = pa.concat_arrays([pa.array([prev_src], pa.string()), src.slice(0, n - 1)])
                new_src = pc.fill_null(pc.not_equal(src, prev_s), True)
            else:
                keep = pa.array(_first_seen(key.to_pylist(), seen_pairs))
                new_src = pa.array(_first_seen(src.to_pylist(), seen_sources))
            src_k, tgt_k = pc.filter(src, keep), pc.filter(tgt, keep)
            writer.write_batch(pa.record_batch([src_k, tgt_k], schema=PAIR_SCHEMA))
            num_pairs += len(src_k)
            _count_words(pc.filter(src, new_src), src_counts)
            _count_words(tgt_k, tgt_counts)
            prev_key, prev_src = key[n - 1].as_py(), src[n - 1].as_py()
            bar.update(len(chunk.lines))
    return PairCorpus(out_path, num_pairs, src_counts, tgt_counts)


def _first_seen(values: list[str], seen: set[str]) -> list[bool]:
    """True where a value occurs for the first time (in ``values`` and in ``seen``, which grows)."""
    out = []
    for value in values:
        out.append(value not in seen)
        seen.add(value)
    return out


def _count_words(phrases: pa.Array, counts: Counter) -> None:
    words = pc.list_flatten(split_tokens_arrow(phrases))
    vc = pc.value_counts(words)
    counts.update(dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True)))


def encode_pairs(pairs_path: Path, out_path: Path, src_vocab: Vocab, tgt_vocab: Vocab, *, swap: bool = False) -> int:
    """Map the string pairs to shortlist ids and write the memory-mappable training file.

    With ``swap`` the table's targets are the model's sources (a reverse model, p(f|e)):
    ``src_vocab`` then encodes the table's target phrases and ``tgt_vocab`` its sources.
    """
    first, second = (1, 0) if swap else (0, 1)
    src_words = pa.array(src_vocab.words, pa.string())
    tgt_words = pa.array(tgt_vocab.words, pa.string())
    rows = 0
    with atomic_path(out_path) as tmp, pa.OSFile(str(pairs_path), "rb") as source, pa.ipc.open_stream(
        source
    ) as reader, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, ID_SCHEMA) as writer:
        for batch in reader:
            if batch.num_rows == 0:
                continue
            s = phrases_to_ids(batch.column(first), src_words)
            t = phrases_to_ids(batch.column(second), tgt_words)
            writer.write_batch(pa.record_batch([_as_list(s.offsets, s.ids), _as_list(t.offsets, t.ids)], ID_SCHEMA))
            rows += batch.num_rows
    return rows


def _as_list(offsets: np.ndarray, ids: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids, pa.int32()))


def build_vocabularies(
    corpus: PairCorpus,
    shortlist: int,
    src_corpus: str | None = None,
    tgt_corpus: str | None = None,
) -> tuple[Vocab, Vocab]:
    """Shortlists from monolingual corpora when given (as the paper did), else from the table."""
    if src_corpus:
        src = build_vocab_from_corpus(src_corpus, shortlist)
    else:
        src = Vocab.from_counts(corpus.src_counts, shortlist)
    if tgt_corpus:
        tgt = build_vocab_from_corpus(tgt_corpus, shortlist)
    else:
        tgt = Vocab.from_counts(corpus.tgt_counts, shortlist)
    return src, tgt


class PairData:
    """Memory-mapped id pairs with a fixed train/validation split.

    The split depends only on the number of pairs and the seed, so a resumed run sees exactly the
    same validation pairs without storing them.
    """

    def __init__(self, path: Path, *, valid_fraction: float = 0.001, min_valid: int = 500, seed: int = 1234,
                 source: str | None = None):
        """``source`` names the table the pairs came from in errors (a user knows it, not ``path``)."""
        self.path = Path(path)
        self.source = source or str(path)
        table = pa.ipc.open_file(pa.memory_map(str(self.path))).read_all().combine_chunks()
        self.src_offsets, self.src_ids = _ragged(table.column("src"))
        self.tgt_offsets, self.tgt_ids = _ragged(table.column("tgt"))
        n = len(self.src_offsets) - 1
        if n < 2:
            raise UserError(f"{source or path}: need at least 2 unique phrase pairs to train, found {n}")
        n_valid = min(max(min_valid, round(n * valid_fraction)), n // 10 if n >= 20 else 1)
        order = np.random.default_rng(seed).permutation(n)
        self.valid_idx = np.sort(order[:n_valid])
        self.train_idx = np.sort(order[n_valid:])

    @property
    def num_pairs(self) -> int:
        return len(self.src_offsets) - 1

    def fingerprint(self) -> str:
        """Identifies the data a checkpoint was trained on, so --resume refuses other data."""
        h = hashlib.sha1()
        for arr in (self.src_offsets[-1:], self.tgt_offsets[-1:], self.src_ids[:4096], self.tgt_ids[:4096]):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(str(self.num_pairs).encode())
        return h.hexdigest()

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """The training pairs in the random order of one epoch (cached: drawing it is O(n))."""
        key = (seed, epoch)
        if getattr(self, "_order_key", None) != key:
            self._order = np.random.default_rng([seed, epoch]).permutation(self.train_idx)
            self._order_key = key
        return self._order

    def target_lengths(self, idx: np.ndarray) -> np.ndarray:
        return self.tgt_offsets[idx + 1] - self.tgt_offsets[idx]

    def batch(self, idx: np.ndarray, device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        """Padded (src, src_len, tgt, tgt_len) tensors, each sequence closed by ``</s>``.

        Training takes them on the CPU and its step (``rescorer.training.step``) moves what it needs.
        """
        src, src_len = pad_with_eos(self.src_offsets, self.src_ids, idx)
        tgt, tgt_len = pad_with_eos(self.tgt_offsets, self.tgt_ids, idx)
        return tuple(torch.from_numpy(a).to(device) for a in (src, src_len, tgt, tgt_len))

    def iter_batches(self, idx: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
        for start in range(0, len(idx), batch_size):
            yield idx[start : start + batch_size]


def _ragged(column: pa.ChunkedArray | pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy()
    return offsets - offsets[0], values[offsets[0] : offsets[-1]]


def pad_with_eos(offsets: np.ndarray, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gather ragged rows into a [B, L] int64 matrix with ``</s>`` after each sequence.

    Padding uses the ``</s>`` id too; the model masks everything past each length, so the pad value
    never reaches a score.
    """
    starts = offsets[rows]
    lens = offsets[rows + 1] - starts
    width = int(lens.max()) + 1 if len(rows) else 1
    pos = np.arange(width)
    mask = pos[None, :] < lens[:, None]
    out = np.full((len(rows), width), EOS_ID, dtype=np.int64)
    out[mask] = ids[(starts[:, None] + pos[None, :])[mask]]
    return out, (lens + 1).astype(np.int64)
