"""BLEU sufficient statistics and corpus BLEU, as MERT needs them.

MERT never computes BLEU from strings inside its loop: it sums per-hypothesis *sufficient
statistics* over the chosen hypotheses and turns the sum into a score. One row of statistics is

    [m1, t1, m2, t2, m3, t3, m4, t4, hyp_len, ref_len]        (``NUM_STATS`` = 10, int64)

with ``m_n`` the clipped n-gram matches (clipped by the maximum count over all references, as
Papineni et al. and Moses do), ``t_n`` the number of hypothesis n-grams, and ``ref_len`` the
length of the reference closest in length to the hypothesis (ties go to the shorter one, as in
Moses' ``Reference::CalcClosest`` and sacrebleu). Moses' BleuScorer stores the same numbers minus
``hyp_len`` (which equals ``t1``); keeping it explicit makes the layout self-describing.

Tokens are whitespace-separated and case-sensitive: MERT scores tokenized, truecased text
exactly as Moses' ``mert``/``extractor`` with ``case:true`` do.

Scores are on sacrebleu's 0..100 scale throughout this package (Moses' ``mert`` prints 0..1).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import numpy as np

from infrastructure.errors import FileLineError, UserError
from infrastructure.files import PathArg, display_name
from infrastructure.lines import read_text_lines

NGRAM_ORDER = 4
NUM_STATS = 2 * NGRAM_ORDER + 2
HYP_LEN = 2 * NGRAM_ORDER
REF_LEN = 2 * NGRAM_ORDER + 1

Smoothing = Literal["none", "exp"]


class ReferenceFileError(FileLineError):
    """A reference file that does not fit the n-best list, located by file and 1-based line.

    Reference/n-best misalignment is the classic silent MERT failure (every sentence scored
    against its neighbour's reference), so it is always an error naming the file.
    """


# --------------------------------------------------------------------------------------------
# Single hypothesis (reference implementation)


def _ngram_counts(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def closest_ref_length(hyp_len: int, ref_lens: Sequence[int]) -> int:
    """The reference length closest to ``hyp_len``; on a tie the shorter (Moses, sacrebleu)."""
    return min(ref_lens, key=lambda r: (abs(r - hyp_len), r))


def bleu_stats(hyp_tokens: Sequence[str], refs_tokens: Sequence[Sequence[str]]) -> np.ndarray:
    """Sufficient statistics ``[10]`` of one tokenized hypothesis against its references.

    Straightforward Counter-based code: the clear definition that the vectorised
    :func:`bleu_stats_batch` is tested against.
    """
    if not refs_tokens:
        raise ValueError("at least one reference is needed")
    stats = np.zeros(NUM_STATS, dtype=np.int64)
    for n in range(1, NGRAM_ORDER + 1):
        hyp_counts = _ngram_counts(hyp_tokens, n)
        max_ref: Counter[tuple[str, ...]] = Counter()
        for ref in refs_tokens:
            max_ref |= _ngram_counts(ref, n)  # | keeps the maximum count per n-gram
        stats[2 * (n - 1)] = sum(min(c, max_ref[g]) for g, c in hyp_counts.items())
        stats[2 * (n - 1) + 1] = max(len(hyp_tokens) - n + 1, 0)
    stats[HYP_LEN] = len(hyp_tokens)
    stats[REF_LEN] = closest_ref_length(len(hyp_tokens), [len(r) for r in refs_tokens])
    return stats


# --------------------------------------------------------------------------------------------
# Many hypotheses at once


class References:
    """Tokenized references of a test set: ``tokens[s][r]`` is reference ``r`` of sentence ``s``.

    Every sentence has the same number of references (one per reference file), as in Moses.
    """

    def __init__(self, tokens: Sequence[Sequence[Sequence[str]]]) -> None:
        if any(len(refs) == 0 for refs in tokens):
            raise ValueError("every sentence needs at least one reference")
        self.tokens: list[list[list[str]]] = [[list(r) for r in refs] for refs in tokens]

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_lines(cls, streams: Sequence[Sequence[str]]) -> References:
        """From one list of lines per reference file (all of equal length)."""
        if not streams:
            raise UserError("at least one reference stream is needed")
        lengths = {len(s) for s in streams}
        if len(lengths) != 1:
            raise UserError(f"reference streams differ in length: {sorted(lengths)}")
        return cls([[stream[i].split() for stream in streams] for i in range(len(streams[0]))])


def read_reference_lines(path: PathArg) -> list[str]:
    """All lines of a reference file (plain or gzip), without newlines, decoded as UTF-8."""
    return read_text_lines(path, error=ReferenceFileError)


def read_references(
    paths: Sequence[PathArg], *, expected_sentences: int | None = None, expected_from: str = "the n-best list"
) -> References:
    """Read one or more reference files (one reference per file per sentence).

    Each file must have exactly ``expected_sentences`` lines when given (the sentence count of
    ``expected_from``, named in the message), and all files must have the same number of
    lines; otherwise :class:`ReferenceFileError` names the file and the first line that is
    missing or extra.
    """
    if not paths:
        raise ValueError("at least one reference file is needed")
    streams: list[list[str]] = []
    for path in paths:
        lines = read_reference_lines(path)
        name = display_name(path)
        if expected_sentences is not None:
            want, source = expected_sentences, expected_from
        elif streams:
            want, source = len(streams[0]), display_name(paths[0])
        else:
            want, source = len(lines), ""
        if len(lines) < want:
            raise ReferenceFileError(
                name, len(lines) + 1, f"reference file ends after {len(lines)} lines but {source} has {want} sentences"
            )
        if len(lines) > want:
            raise ReferenceFileError(
                name, want + 1, f"reference file has {len(lines)} lines but {source} has only {want} sentences"
            )
        streams.append(lines)
    return References.from_lines(streams)


def _encode(token_lists: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of all documents concatenated, and each document's length.

    Built with C-level ``map``/``dict`` calls: a Python loop per token was most of the time.
    """
    flat = list(itertools.chain.from_iterable(token_lists))
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(flat))}
    ids = np.fromiter(map(vocab.__getitem__, flat), dtype=np.int64, count=len(flat))
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
    return ids, lengths


def bleu_stats_batch(
    hypotheses: Sequence[Sequence[str]], sent_index: Sequence[int] | np.ndarray, references: References
) -> np.ndarray:
    """Statistics ``[H, 10]`` for tokenized hypotheses; ``sent_index[h]`` names each one's sentence.

    Vectorised with NumPy so that a merged n-best list of 10^5 hypotheses takes well under a
    second: all hypotheses and references share one token-id space; n-grams of order n get
    compact ids from (id of the (n-1)-gram prefix, next token) via ``np.unique``, so ids stay
    exact whatever the vocabulary size (no hashing, no collisions); per-document counts and the
    per-sentence maximum over references are then sorted-array look-ups.
    """
    sent_index = np.asarray(sent_index, dtype=np.int64)
    num_hyps = len(hypotheses)
    if sent_index.shape != (num_hyps,):
        raise ValueError("sent_index must have one entry per hypothesis")
    if num_hyps and (sent_index.min() < 0 or sent_index.max() >= len(references)):
        raise ValueError("sent_index refers to a sentence without references")
    num_refs = len(references.tokens[0]) if len(references) else 0
    ref_docs = [r for refs in references.tokens for r in refs]
    ids, lengths = _encode([*hypotheses, *ref_docs])
    num_docs = len(lengths)
    ref_sent = np.repeat(np.arange(len(references), dtype=np.int64), [len(r) for r in references.tokens])
    # Sentence of each document: hypotheses by sent_index, references by position.
    doc_sent = np.concatenate([sent_index, ref_sent])
    is_hyp_doc = np.arange(num_docs) < num_hyps
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    doc_of_token = np.repeat(np.arange(num_docs, dtype=np.int64), lengths)
    pos_in_doc = np.arange(len(ids), dtype=np.int64) - starts[doc_of_token]
    remaining = lengths[doc_of_token] - pos_in_doc  # tokens from here to the end of the document

    stats = np.zeros((num_hyps, NUM_STATS), dtype=np.int64)
    hyp_lens = lengths[:num_hyps]
    gram_id = ids.copy()  # id of the n-gram starting at each token (valid where remaining >= n)
    for n in range(1, NGRAM_ORDER + 1):
        if n > 1:
            valid_prev = remaining >= n
            nxt = np.zeros_like(ids)
            nxt[: -(n - 1)] = ids[n - 1 :]  # last token of the n-gram starting here
            pair = np.where(valid_prev, gram_id * (int(ids.max(initial=0)) + 1) + nxt, -1)
            _, inverse = np.unique(pair, return_inverse=True)
            gram_id = inverse.reshape(-1).astype(np.int64)
        valid = remaining >= n
        docs = doc_of_token[valid]
        grams = gram_id[valid]
        num_grams = int(gram_id.max(initial=0)) + 1
        keys = docs * num_grams + grams
        ukeys, counts = np.unique(keys, return_counts=True)
        udocs = ukeys // num_grams
        ugrams = ukeys % num_grams
        hyp_mask = is_hyp_doc[udocs]
        # Maximum count of each n-gram over the references of each sentence.
        rkeys = doc_sent[udocs[~hyp_mask]] * num_grams + ugrams[~hyp_mask]
        rcounts = counts[~hyp_mask]
        order = np.lexsort((rcounts, rkeys))  # by key, then count: the last of a run is the max
        rkeys, rcounts = rkeys[order], rcounts[order]
        last = np.ones(len(rkeys), dtype=bool)
        last[:-1] = rkeys[1:] != rkeys[:-1]
        rkeys, rcounts = rkeys[last], rcounts[last]
        # Clip each hypothesis n-gram count by the reference maximum.
        hdocs = udocs[hyp_mask]
        hkeys = doc_sent[hdocs] * num_grams + ugrams[hyp_mask]
        where = np.searchsorted(rkeys, hkeys)
        where_c = np.minimum(where, max(len(rkeys) - 1, 0))
        found = (where < len(rkeys)) & (rkeys[where_c] == hkeys) if len(rkeys) else np.zeros(len(hkeys), bool)
        ref_count = np.where(found, rcounts[where_c] if len(rkeys) else 0, 0)
        clipped = np.minimum(counts[hyp_mask], ref_count)
        stats[:, 2 * (n - 1)] = np.bincount(hdocs, weights=clipped, minlength=num_hyps)[:num_hyps].astype(np.int64)
        stats[:, 2 * (n - 1) + 1] = np.maximum(hyp_lens - n + 1, 0)
    stats[:, HYP_LEN] = hyp_lens
    # Closest reference length, ties to the shorter: minimise (|diff|, length) lexicographically.
    ref_lens = lengths[num_hyps:].reshape(len(references), num_refs) if num_refs else np.zeros((0, 0), np.int64)
    cand = ref_lens[sent_index]  # [H, R]
    diff = np.abs(cand - hyp_lens[:, None])
    key = diff * (int(cand.max(initial=0)) + 1) + cand
    stats[:, REF_LEN] = np.take_along_axis(cand, key.argmin(axis=1)[:, None], axis=1)[:, 0] if num_hyps else 0
    return stats


# --------------------------------------------------------------------------------------------
# Scores


def corpus_bleu(stats: np.ndarray, smooth: Smoothing = "none") -> float | np.ndarray:
    """Corpus BLEU (0..100) from summed statistics ``[..., 10]``; a float for a single row.

    ``smooth="none"`` is Moses' ``mert``: the score is 0 as soon as one n-gram order has no
    match. ``smooth="exp"`` reproduces sacrebleu's default (the NIST/mteval "exp" smoothing:
    the k-th order without matches gets precision 1/(2^k · total)); the two agree whenever all
    match counts are positive, which is always the case on a real dev set. In both, an order
    with no hypothesis n-grams at all (every hypothesis shorter than n) gives 0, and the
    brevity penalty is exp(1 − ref/hyp) when hyp < ref (0 for an empty output).
    """
    s = np.asarray(stats, dtype=np.float64)
    if s.shape[-1] != NUM_STATS:
        raise ValueError(f"statistics must have {NUM_STATS} columns, got shape {s.shape}")
    matches = s[..., 0 : 2 * NGRAM_ORDER : 2]
    totals = s[..., 1 : 2 * NGRAM_ORDER : 2]
    hyp_len = s[..., HYP_LEN]
    ref_len = s[..., REF_LEN]
    with np.errstate(divide="ignore", invalid="ignore"):
        if smooth == "none":
            log_prec = np.log(matches) - np.log(totals)
        elif smooth == "exp":
            zero = matches == 0
            k = np.cumsum(zero, axis=-1)  # how many zero-match orders up to and including n
            smoothed = np.where(zero, 1.0 / (np.power(2.0, k) * totals), matches / totals)
            log_prec = np.log(smoothed)
        else:
            raise ValueError(f"unknown smoothing {smooth!r}")
        ok = np.all(matches > 0, axis=-1) if smooth == "none" else np.all(totals > 0, axis=-1)
        ok &= np.any(matches > 0, axis=-1) & (hyp_len > 0)
        log_bp = np.minimum(0.0, 1.0 - ref_len / hyp_len)
        score = np.exp(np.mean(np.where(ok[..., None], log_prec, 0.0), axis=-1) + np.where(ok, log_bp, 0.0))
    result = np.where(ok, 100.0 * score, 0.0)
    if result.ndim == 0:
        return float(result)
    return result


def bleu_from_strings(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU (0..100) of whitespace-tokenized strings; ``references[r][i]`` as sacrebleu.

    A convenience for checks and tests; MERT itself works on statistics.
    """
    refs = References.from_lines(references)
    stats = bleu_stats_batch([h.split() for h in hypotheses], np.arange(len(hypotheses)), refs)
    return float(corpus_bleu(stats.sum(axis=0)))


__all__ = [
    "HYP_LEN",
    "NGRAM_ORDER",
    "NUM_STATS",
    "REF_LEN",
    "ReferenceFileError",
    "References",
    "bleu_from_strings",
    "bleu_stats",
    "bleu_stats_batch",
    "closest_ref_length",
    "corpus_bleu",
    "read_reference_lines",
    "read_references",
]
