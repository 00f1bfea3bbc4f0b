"""The scales and configurations of Table 1: which columns each row tunes, the sizes, the run seeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from infrastructure.errors import UserError
from infrastructure.lines import text_lines
from mert.tune import DEFAULT_MAX_ITERATIONS, SEED_STRIDE
from shared_paths import shared_file
from table1.settings import (
    CONFIGURATIONS_BY_KEY,
    MAX_RUNS,
    MEDIUM,
    NEWS_PARALLEL,
    SCALES,
    SMALL,
    SMALL_NEWS,
    RunPlan,
    ScaleSettings,
    select_configurations,
)


@pytest.mark.parametrize(
    ("key", "fixed", "features"),
    [
        ("baseline", ["TranslationModel0_4", "TranslationModel0_5"], []),
        ("rnn", ["TranslationModel0_5"], []),
        ("rnn-wp", [], []),  # the unknown-word column's own row
        ("cslm-rnn", ["TranslationModel0_5"], []),  # the CSLM is in the decoder: no n-best feature
        ("cslm-rnn-wp", [], []),
        ("cslm-nbest-rnn", ["TranslationModel0_5"], ["CSLM:/m.pt"]),
        ("cslm-nbest-rnn-wp", [], ["CSLM:/m.pt"]),
    ],
)
def test_each_configuration_fixes_the_columns_it_does_not_use(key, fixed, features):
    config = CONFIGURATIONS_BY_KEY[key]
    assert config.fixed_columns("TranslationModel0", 6) == fixed
    assert config.feature_specs("/m.pt") == features


def test_the_proposals_row_tunes_the_indicator_and_fixes_the_unknown_word_column():
    """Its table has 7 columns (Moses' 4, p_RNN, U, then propose's indicator): U is _5 there too."""
    config = CONFIGURATIONS_BY_KEY["rnn-proposals"]
    assert config.fixed_columns("TranslationModel0", 7) == ["TranslationModel0_5"]
    assert config.compare_with == ("rnn",) and config.paper_test is None


def test_the_both_directions_row_tunes_both_rnn_columns_and_fixes_the_unknown_word_column():
    """Its table has 7 columns (Moses' 4, p_RNN, U, then the reverse model's p_RNN(f|e))."""
    config = CONFIGURATIONS_BY_KEY["rnn-both"]
    assert config.appended_columns() == 3 and config.reverse and config.rnn and not config.proposals
    assert config.fixed_columns("TranslationModel0", 7) == ["TranslationModel0_5"]
    assert config.compare_with == ("rnn",) and config.paper_test is None
    assert [c.key for c in select_configurations("rnn-both baseline rnn")] == ["baseline", "rnn", "rnn-both"]


def test_select_configurations_keeps_table_order_and_rejects_unknown_names():
    assert [c.key for c in select_configurations("rnn, baseline")] == ["baseline", "rnn"]
    assert [c.key for c in select_configurations("")] == ["baseline", "rnn", "cslm-rnn", "cslm-rnn-wp"]
    assert [c.key for c in select_configurations("cslm-nbest-rnn cslm-rnn")] == ["cslm-rnn", "cslm-nbest-rnn"]
    assert [c.key for c in select_configurations("rnn-proposals baseline rnn")] == ["baseline", "rnn", "rnn-proposals"]
    assert [c.key for c in select_configurations("cslm-nbest-rnn-wp rnn-wp rnn baseline")] == [
        "baseline", "rnn", "rnn-wp", "cslm-nbest-rnn-wp"]
    with pytest.raises(UserError, match="unknown configuration"):
        select_configurations("baseline cslm")


def test_small_scale_meets_the_issue_sizes():
    dev_lines = sum(s.last - s.first + 1 for s in SMALL.dev)  # type: ignore[operator]
    assert dev_lines >= 400 and {Path(s.path).name for s in SMALL.dev} == {"newstest2012.{lang}", "newstest2013.{lang}"}
    assert SMALL.test.last - SMALL.test.first + 1 >= 1000 and "newstest2014" in SMALL.test.path  # type: ignore[operator]
    assert SMALL.train[0].last == 40_000


def test_no_two_runs_share_an_iterations_restart_points():
    """mert tune seeds iteration n with seed + 1000 n: run seeds 1000 k made run 2's iteration n
    draw run 1's iteration n + 1 restarts. Every (run, iteration) must get its own seed."""
    config = CONFIGURATIONS_BY_KEY["baseline"]
    seeds = [RunPlan(config, k).seed + SEED_STRIDE * n
             for k in range(1, MAX_RUNS + 1) for n in range(1, DEFAULT_MAX_ITERATIONS + 1)]
    assert len(set(seeds)) == len(seeds)
    assert RunPlan(config, 1).seed == 1000 and RunPlan(CONFIGURATIONS_BY_KEY["rnn"], 2).seed == 1001
    with pytest.raises(UserError, match="1..999"):
        RunPlan(config, MAX_RUNS + 1).seed  # noqa: B018


@pytest.mark.parametrize("scale", [MEDIUM, SMALL_NEWS], ids=lambda s: s.name)
def test_news_domain_scales_never_train_on_what_they_tune_test_or_validate_on(scale: ScaleSettings):
    """Selected Hansard plus the earlier news sets; dev, test and the CSLM's held-out
    newstest2011 are none of the training or LM text."""
    assert scale.train == [MEDIUM.train[0]] and scale.train[0].first == 1 and scale.train[0].last is None
    assert scale.train_in_domain == NEWS_PARALLEL and scale.selection is not None
    assert scale.selection.lm_words is None  # the LM text is used whole
    held_out = {p.path for p in [*scale.dev, scale.test, scale.lm_valid]}
    trained = {p.path for p in [*scale.train, *scale.train_in_domain, *scale.lm]}
    assert not held_out & trained and {"newstest/newstest2011.{lang}"} == {scale.lm_valid.path}
    assert set(NEWS_PARALLEL) <= set(scale.lm)


def test_medium_tunes_on_1000_news_sentences_and_tests_on_all_of_newstest2014():
    assert sum(s.last - s.first + 1 for s in MEDIUM.dev) == 1000  # type: ignore[operator]
    assert MEDIUM.test.path == "newstest/newstest2014.{lang}" and MEDIUM.test.last is None


def test_the_domain_check_is_small_but_for_its_text():
    """small-news differs from SMALL only in what it trains on, so its Baseline against SMALL's
    measures the domain's effect alone; its selection budget is SMALL's 40k pairs' French words."""
    text_fields = {"name", "train", "train_in_domain", "lm", "selection"}
    for field in ScaleSettings.__dataclass_fields__:
        if field not in text_fields:
            assert getattr(SMALL_NEWS, field) == getattr(SMALL, field), field
    assert SMALL_NEWS.selection is not None and 780_000 <= SMALL_NEWS.selection.train_words <= 820_000
    assert SCALES["small-news"] is SMALL_NEWS


def test_the_news_sets_are_the_7567_pairs_the_issue_names():
    data = shared_file("data")
    counts = [sum(1 for _ in text_lines(data / s.path.format(lang=lang)))
              for s in NEWS_PARALLEL for lang in ("en", "fr")]
    assert counts[0::2] == counts[1::2] and sum(counts[0::2]) == 7567


def test_in_domain_text_needs_a_selection_to_be_added_to():
    import dataclasses

    with pytest.raises(ValueError, match="train_in_domain"):
        dataclasses.replace(SMALL, train_in_domain=NEWS_PARALLEL)
