"""BLEU statistics: hand-checked cases, sacrebleu parity to 1e-6, Moses extractor parity."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from mert.bleu import (
    HYP_LEN,
    REF_LEN,
    ReferenceFileError,
    References,
    bleu_from_strings,
    bleu_stats,
    bleu_stats_batch,
    closest_ref_length,
    corpus_bleu,
    read_references,
)
from moses_integration.nbest import load_nbest_arrays
from shared_paths import shared_file


def _lines(relative: str) -> list[str]:
    return shared_file(relative).read_text(encoding="utf-8").splitlines()


def _sacrebleu(hyps: list[str], refs: list[list[str]], smooth: str = "exp") -> float:
    return sacrebleu.corpus_bleu(hyps, refs, tokenize="none", force=True, smooth_method=smooth).score


def _ours(hyps: list[str], refs: list[list[str]], smooth: str = "none") -> float:
    references = References.from_lines(refs)
    stats = bleu_stats_batch([h.split() for h in hyps], np.arange(len(hyps)), references)
    return float(corpus_bleu(stats.sum(axis=0), smooth))  # type: ignore[arg-type]


def test_hand_checked_statistics() -> None:
    hyp = ["the", "the", "the", "cat", "sat"]
    refs = [["the", "cat", "sat", "on", "the", "mat"], ["a", "cat", "sat"]]
    stats = bleu_stats(hyp, refs)
    # unigrams: "the" clipped to 2 (max over refs), "cat", "sat" -> 4 of 5
    # bigrams: "the cat", "cat sat" -> 2 of 4; trigrams: "the cat sat" -> 1 of 3; 4-grams: 0 of 2
    assert stats.tolist() == [4, 5, 2, 4, 1, 3, 0, 2, 5, 6]
    assert corpus_bleu(stats) == 0.0  # Moses: no 4-gram match, no smoothing


def test_closest_reference_length_ties_go_to_the_shorter() -> None:
    assert closest_ref_length(5, [3, 7]) == 3
    assert closest_ref_length(5, [7, 3]) == 3
    assert closest_ref_length(5, [6, 3, 9]) == 6
    stats = bleu_stats(["a", "b", "c", "d", "e"], [["a", "b", "c"], ["a", "b", "c", "d", "e", "f", "g"]])
    assert stats[REF_LEN] == 3 and stats[HYP_LEN] == 5


def test_corpus_bleu_formula_and_vectorised_rows() -> None:
    stats = np.array([10, 12, 8, 11, 6, 10, 4, 9, 12, 14])
    expected = 100 * np.exp(np.mean(np.log([10 / 12, 8 / 11, 6 / 10, 4 / 9])) + (1 - 14 / 12))
    assert corpus_bleu(stats) == pytest.approx(expected, rel=1e-12)
    rows = np.stack([stats, stats * 2, np.zeros(10, dtype=int)])
    assert np.allclose(corpus_bleu(rows), [expected, expected, 0.0])


def test_batch_equals_reference_implementation_on_random_text() -> None:
    rng = np.random.default_rng(7)
    vocab = [f"w{i}" for i in range(12)]  # tiny vocabulary: many repeated n-grams to clip
    refs = [[list(rng.choice(vocab, rng.integers(0, 15))) for _ in range(3)] for _ in range(30)]
    sent = rng.integers(0, 30, 400)
    hyps = [list(rng.choice(vocab, rng.integers(0, 15))) for _ in range(400)]
    batch = bleu_stats_batch(hyps, sent, References(refs))
    single = np.array([bleu_stats(h, refs[s]) for h, s in zip(hyps, sent, strict=True)])
    np.testing.assert_array_equal(batch, single)


def test_sacrebleu_parity_on_fixture_one_best() -> None:
    hyps = _lines("fixtures/hansard-enfr/nbest/dev.1best")
    refs = [_lines("fixtures/hansard-enfr/data/dev.tok.tc.fr")]
    ours = _ours(hyps, refs)
    assert ours == pytest.approx(24.0541, abs=5e-5)  # the README's 24.05 (mert/evaluator)
    assert abs(ours - _sacrebleu(hyps, refs)) < 1e-6
    assert abs(ours - _sacrebleu(hyps, refs, "none")) < 1e-6
    assert abs(bleu_from_strings(hyps, refs) - ours) < 1e-12
    tuned = _lines("fixtures/hansard-enfr/tuning/dev.tuned.1best")
    assert abs(_ours(tuned, refs) - _sacrebleu(tuned, refs)) < 1e-6


def test_sacrebleu_parity_on_random_subsets_with_exp_smoothing() -> None:
    hyps = _lines("fixtures/hansard-enfr/nbest/dev.1best")
    ref = _lines("fixtures/hansard-enfr/data/dev.tok.tc.fr")
    rng = np.random.default_rng(3)
    saw_zero_matches = False
    for size in [1, 1, 2, 2, 3, 4, 5, 8, 13, 21, 34, 55, 89, 144]:
        idx = rng.choice(len(hyps), size, replace=False)
        sub_h, sub_r = [hyps[i] for i in idx], [[ref[i] for i in idx]]
        stats = bleu_stats_batch([h.split() for h in sub_h], np.arange(size), References.from_lines(sub_r))
        saw_zero_matches |= bool(np.any(stats.sum(axis=0)[0:8:2] == 0))
        assert abs(_ours(sub_h, sub_r, "exp") - _sacrebleu(sub_h, sub_r, "exp")) < 1e-6
        assert abs(_ours(sub_h, sub_r, "none") - _sacrebleu(sub_h, sub_r, "none")) < 1e-6
    assert saw_zero_matches  # the smoothing branch was exercised


def test_sacrebleu_parity_with_two_references() -> None:
    hyps = _lines("fixtures/hansard-enfr/nbest/dev.1best")
    # A second, real "reference" of the same sentences: the tuned system's output.
    refs = [_lines("fixtures/hansard-enfr/data/dev.tok.tc.fr"), _lines("fixtures/hansard-enfr/tuning/dev.tuned.1best")]
    assert abs(_ours(hyps, refs) - _sacrebleu(hyps, refs)) < 1e-6
    assert _ours(hyps, refs) > _ours(hyps, refs[:1])


def test_statistics_match_moses_extractor_for_every_hypothesis() -> None:
    """scores.dat from Moses' extractor: m1 t1 … m4 t4 ref_len per hypothesis.

    The extractor drops hypotheses whose features and statistics both repeat an earlier one of
    the same sentence (36 of 19,313 here), so blocks are compared as multisets after that.
    """
    arrays = load_nbest_arrays(shared_file("fixtures/hansard-enfr/nbest/dev.nbest.gz"))
    refs = read_references([shared_file("fixtures/hansard-enfr/data/dev.tok.tc.fr")], expected_sentences=200)
    stats = bleu_stats_batch([h.split() for h in arrays.hypotheses], arrays.sent_ids, refs)
    text = gzip.decompress(shared_file("fixtures/hansard-enfr/nbest/scores.dat.gz").read_bytes()).decode()
    blocks: list[list[tuple[int, ...]]] = []
    for line in text.splitlines():
        if line.startswith("SCORES_TXT_BEGIN"):
            blocks.append([])
        elif not line.startswith("SCORES_TXT_END"):
            blocks[-1].append(tuple(int(v) for v in line.split()))
    assert len(blocks) == 200
    offsets = arrays.offsets
    for s in range(200):
        seen: set[tuple[bytes, bytes]] = set()
        ours = []
        for h in range(offsets[s], offsets[s + 1]):
            key = (arrays.features[h].tobytes(), stats[h].tobytes())
            if key not in seen:
                seen.add(key)
                ours.append((*stats[h, :8].tolist(), int(stats[h, REF_LEN])))
        assert sorted(ours) == sorted(blocks[s]), f"sentence {s}"


def test_reference_count_mismatch_names_file_and_line(tmp_path: Path) -> None:
    short = tmp_path / "short.ref"
    short.write_text("a b\nc d\n", encoding="utf-8")
    long = tmp_path / "long.ref"
    long.write_text("a b\nc d\ne f\ng\n", encoding="utf-8")
    with pytest.raises(ReferenceFileError, match=r"short.ref:3: reference file ends after 2 lines but nb has 3"):
        read_references([short], expected_sentences=3, expected_from="nb")
    with pytest.raises(ReferenceFileError, match=r"long.ref:4: reference file has 4 lines but nb has only 3"):
        read_references([long], expected_sentences=3, expected_from="nb")
    with pytest.raises(ReferenceFileError, match=r"long.ref:3: .*short.ref has only 2 sentences"):
        read_references([short, long])
    refs = read_references([short, short])
    assert len(refs) == 2 and refs.tokens[1] == [["c", "d"], ["c", "d"]]


def test_crlf_references_read_like_lf(tmp_path) -> None:
    from mert.bleu import read_reference_lines

    lf, crlf = tmp_path / "ref.lf", tmp_path / "ref.crlf"
    lf.write_bytes("le chat .\nla\u00a0maison\n".encode())
    crlf.write_bytes("le chat .\r\nla\u00a0maison\r\n".encode())
    assert read_reference_lines(crlf) == read_reference_lines(lf) == ["le chat .", "la\u00a0maison"]
