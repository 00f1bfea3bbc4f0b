"""Moore-Lewis / Axelrod data selection: the budget, the sample, the vocabulary, KenLM's output,
and (with Moses) that real news lines are picked out of a news + Hansard mix."""

from __future__ import annotations

import numpy as np
import pytest

from infrastructure.lines import text_lines
from shared_paths import moses_bin_dir, shared_file
from table1.data_selection import (
    OOV_TOKEN,
    choose_within_budget,
    in_domain_vocabulary,
    parse_query_totals,
    restrict,
    sample_mask,
    select_lines,
)
from table1.system_training import MosesInstall, MosesToolError
from table1.text_prep import tokenize_lines, write_text_lines


def test_budget_keeps_the_lowest_scores_until_the_next_line_would_not_fit():
    scores = np.array([0.5, -1.0, 0.2, -1.0, 3.0])
    words = np.array([2, 3, 4, 1, 1])
    # score order: line 1 (3 words), line 3 (tie, later: 1), line 2 (4), line 0 (2), line 4 (1)
    assert choose_within_budget(scores, words, 5).tolist() == [False, True, False, True, False]
    assert choose_within_budget(scores, words, 8).tolist() == [False, True, True, True, False]
    assert not choose_within_budget(scores, words, 2).any()  # the best line alone is too long
    assert choose_within_budget(scores, words, 11).all()


def test_budget_against_brute_force_on_random_lines():
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 30))
        scores, words = rng.normal(size=n).round(1), rng.integers(1, 9, size=n)
        budget = int(rng.integers(0, words.sum() + 2))
        keep = choose_within_budget(scores, words, budget)
        ranked = sorted(range(n), key=lambda i: (scores[i], i))
        expected, total = set(), 0
        for i in ranked:
            if total + words[i] > budget:
                break
            expected.add(i)
            total += words[i]
        assert set(np.flatnonzero(keep)) == expected


def test_sample_reaches_the_target_words_with_its_last_line_and_repeats_with_its_seed():
    words = np.arange(1, 101)
    mask = sample_mask(words, 500, seed=3)
    assert words[mask].sum() >= 500
    assert (sample_mask(words, 500, seed=3) == mask).all() and (sample_mask(words, 500, seed=4) != mask).any()
    assert words[mask].sum() - words[mask].max() < 500  # no more lines than needed (the last one taken crossed it)
    assert sample_mask(words, 10**9, seed=3).all()


def test_vocabulary_keeps_words_seen_twice_and_the_rest_become_oov():
    vocabulary = in_domain_vocabulary(["la crise de l' euro", "la crise\tgrecque", "l' euro"], min_count=2)
    assert vocabulary == {"la", "crise", "l'", "euro"}
    assert restrict("la  crise des  banques", vocabulary) == f"la crise {OOV_TOKEN} {OOV_TOKEN}"


def test_query_totals_are_read_one_per_sentence_and_the_summary_is_skipped():
    # KenLM query -v sentence on three lines (the second empty), as printed by a real build
    output = ["Total: -10.239116 OOV: 0", "Total: -2.0603197 OOV: 0", "Total: -10.841526 OOV: 2",
              "Perplexity including OOVs:\t780.9445098039174", "Perplexity excluding OOVs:\t184.4589354637074",
              "OOVs:\t2"]
    assert list(parse_query_totals(output)) == [-10.239116, -2.0603197, -10.841526]


def _tokenized(path, first: int, last: int, lang: str) -> list[str]:
    return list(tokenize_lines(text_lines(path, first=first, last=last), lang))


@pytest.mark.moses
def test_real_kenlm_selection_picks_the_news_out_of_a_news_and_hansard_bitext(tmp_path):
    """In-domain: 1,000 lines of newstest2012. Corpus: the 3,000 lines of newstest2013 interleaved
    with 3,000 Hansard lines. Kept with a budget of a fifth of the news' French words, chance
    would give half news; Moore-Lewis with these small models gives about 80%.

    (The corpus must be large beside the in-domain text: the general model is trained on a
    sample of the corpus the size of the in-domain text, and the lines it saw score as general.)"""
    bins = moses_bin_dir()
    install = MosesInstall(bins, bins.parent / "scripts")
    sides = {}
    for lang in ("en", "fr"):
        news = _tokenized(shared_file(f"data/newstest/newstest2013.{lang}"), 1, 3000, lang)
        hansard = _tokenized(shared_file(f"data/hansard/hansard.{lang}.gz"), 5001, 8000, lang)
        sides[lang] = [line for pair in zip(news, hansard, strict=True) for line in pair]  # news on even lines
        write_text_lines(tmp_path / f"corpus.{lang}", sides[lang])
        write_text_lines(tmp_path / f"dev.{lang}",
                         _tokenized(shared_file(f"data/newstest/newstest2012.{lang}"), 1, 1000, lang))
    budget = sum(len(line.split()) for line in sides["fr"][0::2]) // 5
    out = [tmp_path / "sel.en", tmp_path / "sel.fr"]
    result = select_lines(install, [tmp_path / "corpus.en", tmp_path / "corpus.fr"],
                          [tmp_path / "dev.en", tmp_path / "dev.fr"], out, budget, tmp_path / "work",
                          tmp_path / "log")
    pairs = list(zip(sides["en"], sides["fr"], strict=True))
    kept, at = [], 0
    for pair in zip(text_lines(out[0]), text_lines(out[1]), strict=True):
        at = pairs.index(pair, at) + 1  # each kept pair is an input pair, in the corpus' order
        kept.append(at - 1)
    assert len(kept) == result.lines_kept > 400 and result.lines_read == 6000
    assert budget - 100 < result.words_kept <= budget  # filled up to the last line that fits
    precision = sum(1 for i in kept if i % 2 == 0) / len(kept)
    assert precision > 0.7, precision
    assert not list((tmp_path / "work").glob("*.txt"))  # the models' training text is removed


@pytest.mark.moses
def test_sides_of_different_lengths_are_refused(tmp_path):
    bins = moses_bin_dir()
    install = MosesInstall(bins, bins.parent / "scripts")
    write_text_lines(tmp_path / "a", ["x y", "z"])
    write_text_lines(tmp_path / "b", ["x y"])
    with pytest.raises(MosesToolError, match="b: 1 lines, but .*a has 2"):
        select_lines(install, [tmp_path / "a", tmp_path / "b"], [tmp_path / "a", tmp_path / "b"],
                     [tmp_path / "o1", tmp_path / "o2"], 10, tmp_path / "w", tmp_path / "log", budget_side=0)
    assert not (tmp_path / "o1").exists()
