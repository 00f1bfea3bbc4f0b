"""Proposals reranked by both directions: the length prior, the order, and the columns."""

from __future__ import annotations

import csv
import gzip
import math
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from rescore_runs import assert_same_output

from moses_integration.moses_ini import MosesIni
from moses_integration.tokens import split_tokens
from neural.vocab import UNK_ID
from proposal_system import (
    EXAMPLE_INI,
    example_system,
    pair_log_p,
    propose_options,
    write_model,
    write_reverse_model,
)
from rescorer.cli import main
from rescorer.model.checkpoint import load_checkpoint
from rescorer.proposals.beam import search_sources
from rescorer.proposals.lexical import lexical_scores, read_word_table
from rescorer.proposals.propose import propose
from rescorer.proposals.rerank import Candidate, LengthPrior, RerankWeights, best_candidates, preselect
from rescorer.proposals.sources import table_statistics

SEP = " ||| "


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> Path:
    """The example table, its word tables, a forward model and a reverse one (``rescorer train --reverse``)."""
    folder = tmp_path_factory.mktemp("rerank")
    example_system(folder)
    write_reverse_model(folder / "phrase-table.gz", folder / "reverse.pt")
    return folder


def _write_table(path: Path, pairs: list[tuple[str, str]]) -> Path:
    lines = sorted(f"{s}{SEP}{t}{SEP}0.5 0.5 0.5 0.5{SEP}0-0".encode() for s, t in pairs)
    path.write_bytes(gzip.compress(b"".join(line + b"\n" for line in lines)))
    return path


def test_the_length_prior_is_the_tables_own_target_lengths_per_source_length_add_one_smoothed(tmp_path) -> None:
    # Two-word sources have 3-word targets three times and a 1-word target once; one-word sources 1 or 2 words.
    table = _write_table(tmp_path / "t.gz", [("a b", "x y z"), ("a c", "x y y"), ("b c", "z z z"), ("c b", "y"),
                                             ("a", "x"), ("b", "x y")])
    vocab = load_checkpoint(write_model(table, tmp_path / "m.pt")).src_vocab
    scan = table_statistics(table, vocab, vocab)
    prior = LengthPrior(scan.length_counts(), scan.max_target_words)  # M = 3 target lengths
    assert prior(2, 3) == pytest.approx(math.log((3 + 1) / (4 + 3)))
    assert prior(2, 1) == pytest.approx(math.log((1 + 1) / (4 + 3)))
    assert prior(2, 2) == pytest.approx(math.log((0 + 1) / (4 + 3)))
    assert prior(1, 2) == pytest.approx(math.log((1 + 1) / (2 + 3)))
    assert prior(5, 2) == pytest.approx(math.log(1 / 3))  # a source length the table lacks: uniform
    assert prior(2, 4) == -math.inf  # longer than the search allows


def test_the_rerank_order_on_a_hand_computed_example() -> None:
    import numpy as np

    counts = np.zeros((3, 4))
    counts[2] = [0, 1, 2, 5]  # 2-word sources: 1, 2 or 3 target words, 1, 2 and 5 times
    prior = LengthPrior(counts, 3)  # log P(m | 2) = log((c + 1) / 11): m=1 ln(2/11), m=2 ln(3/11), m=3 ln(6/11)
    de = Candidate("de", -1.0, -12.0, 0.0)
    over = Candidate("par dessus", -3.0, -5.0, 0.0)
    jump = Candidate("sauter par dessus", -4.5, -3.0, 0.0)
    weights = RerankWeights(reverse=0.5, length=1.0)
    # de: -1 - 6 + ln(2/11) = -8.705; par dessus: -3 - 2.5 + ln(3/11) = -6.799; sauter par dessus:
    # -4.5 - 1.5 + ln(6/11) = -6.606.
    assert [c.target for c in best_candidates([de, over, jump], 2, prior, weights, 3)] == [
        "sauter par dessus", "par dessus", "de"]
    assert [c.target for c in best_candidates([de, over, jump], 2, prior, weights, 2)] == [
        "sauter par dessus", "par dessus"]
    # Without the reverse model's word the length prior alone: de -1 + ln(2/11) = -2.705 beats
    # par dessus -3 + ln(3/11) = -4.299 and sauter par dessus -4.5 + ln(6/11) = -5.106.
    assert [c.target for c in best_candidates([jump, over, de], 2, prior, RerankWeights(0.0, 1.0), 3)] == [
        "de", "par dessus", "sauter par dessus"]
    # Without the prior: de -7, par dessus -5.5, sauter par dessus -6.
    assert [c.target for c in best_candidates([de, over, jump], 2, prior, RerankWeights(0.5, 0.0), 3)] == [
        "par dessus", "sauter par dessus", "de"]
    # What the reverse model gets to score: the 2 best by log p(e|f) + μ log P(m | n), μ = 1 (de
    # -2.705, par dessus -4.299, sauter par dessus -5.106); with μ = 3: de -1 + 3 ln(2/11) = -6.114, par
    # dessus -3 + 3 ln(3/11) = -6.898, sauter par dessus -4.5 + 3 ln(6/11) = -6.318.
    assert [c.target for c in preselect([jump, over, de], 2, prior, weights, 2)] == ["de", "par dessus"]
    assert [c.target for c in preselect([jump, over, de], 2, prior, RerankWeights(0.5, 3.0), 2)] == [
        "de", "sauter par dessus"]



def test_reranked_proposals_are_the_best_by_both_directions_and_their_columns_the_two_models(system, tmp_path):
    table, out, listing = system / "phrase-table.gz", tmp_path / "completed.gz", tmp_path / "proposals.tsv"
    forward, reverse = load_checkpoint(system / "model.pt"), load_checkpoint(system / "reverse.pt")
    weights = RerankWeights(reverse=0.7, length=0.4)
    summary = propose(str(table), str(out), forward,
                      propose_options(beam=4, per_source=2, list_path=str(listing), rerank=weights), reverse)
    assert summary.reranked == weights and summary.proposals > 10

    # What the reranking must give, computed here from the models and the table, pair by pair.
    targets: dict[str, set[str]] = {}
    lengths: Counter = Counter()
    for line in gzip.decompress(table.read_bytes()).decode().splitlines():
        source, target = line.split(SEP)[:2]
        targets.setdefault(source, set()).add(target)
        lengths[len(source.split()), len(target.split())] += 1
    longest = max(m for _, m in lengths)
    per_n = Counter()
    for (n, _), k in lengths.items():
        per_n[n] += k
    f2e, e2f = read_word_table(system / "lex.f2e"), read_word_table(system / "lex.e2f")
    sources = sorted(targets, key=lambda s: s.encode() + b" ||| ")
    expected: dict[tuple[str, str], tuple[float, float]] = {}
    # The collecting search: 4 live hypotheses to the longest target, every finished one a candidate.
    found = search_sources(forward.model, [forward.src_vocab.encode(split_tokens(s)) for s in sources], 4,
                           max_words=longest, collect=True)
    several = 0
    for source, hypotheses in zip(sources, found, strict=True):
        assert all(h.finished for h in hypotheses)
        log_z = math.log(sum(math.exp(h.log_p) for h in hypotheses))
        candidates = []
        for h in hypotheses:
            target = " ".join(forward.tgt_vocab.decode(h.ids))
            if (not h.ids or UNK_ID in h.ids or target in targets[source]
                    or not lexical_scores(split_tokens(source), target.split(), f2e, e2f).alignment):
                continue
            n, m = len(source.split()), len(target.split())
            log_prior = math.log((lengths[n, m] + 1) / (per_n[n] + longest))
            candidates.append((-(h.log_p + 0.4 * log_prior), target, h.log_p, log_prior, h.log_p - log_z))
        several += len(candidates) > 4
        scored = []
        for _, target, log_p, log_prior, log_share in sorted(candidates)[:4]:  # the 4 the reverse model scores
            log_reverse = pair_log_p(reverse, target, source)
            scored.append((-(log_p + 0.7 * log_reverse + 0.4 * log_prior), target, log_reverse, log_share))
        for _, target, log_reverse, log_share in sorted(scored)[:2]:
            expected[source, target] = (math.exp(log_reverse), math.exp(log_share))
    assert several >= 3  # the collecting search finds more candidates than its width

    with open(listing, encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert {(s, t) for _, s, t, *_ in rows} == set(expected)
    proposed = [line for line in gzip.decompress(out.read_bytes()).decode().splitlines()
                if line.split(SEP)[2].endswith(" 2.71828")]
    assert len(proposed) == len(expected)
    for line in proposed:
        source, target, scores = line.split(SEP)[:3]
        p_fe, _, p_ef = (float(v) for v in scores.split()[:3])
        # p(f|e): the reverse model's probability; p(e|f): the forward one's share of the beam's finished targets.
        assert (p_fe, p_ef) == pytest.approx(expected[source, target], rel=1e-4)
    shares = Counter()
    for source, _ in expected:
        shares[source] += 1
    assert max(shares.values()) <= 2


def _cli(system: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, ["propose", str(system / "phrase-table.gz"), str(out), "--model",
                                     str(system / "model.pt"), "--per-source", "1", "--device", "cpu",
                                     "--threads", "1", "-q", *extra])


def test_the_cli_reranks_with_a_reverse_model_and_refuses_a_forward_one_given_as_reverse(system, tmp_path) -> None:
    result = _cli(system, tmp_path / "out.gz", "--reverse-model", str(system / "reverse.pt"), "--beam", "4",
                  "--rerank-reverse-weight", "0.5", "--rerank-length-weight", "2")
    assert result.exit_code == 0, result.output
    assert "reranked by log p(e|f) + 0.5 log p(f|e) + 2 log P(target length | source length)" in result.output

    result = _cli(system, tmp_path / "other.gz", "--reverse-model", str(system / "model.pt"), "--beam", "4")
    assert result.exit_code == 1
    assert "model.pt: a forward model (it scores p(e|f)): --reverse-model needs one trained with rescorer train " \
        "--reverse" in result.output  # the direction saved with the model says so, before any search
    assert not (tmp_path / "other.gz").exists()

    for option in ("--rerank-length-weight", "--rerank-reverse-weight", "--reverse-weight"):
        result = _cli(system, tmp_path / "third.gz", option, "2")
        assert result.exit_code == 1 and result.output.count("\n") == 1, (option, result.output)
        assert "need --reverse-model" in result.output if option != "--reverse-weight" else \
            "--reverse-weight weighs the --reverse-model column, p_RNN(source|target), which this run does not " \
            "append" in result.output, (option, result.output)


def test_with_a_reverse_model_the_table_carries_the_rnn_both_ways_and_the_ini_four_more_features(
        system, tmp_path) -> None:
    """The + RNN both directions + proposals system: every line, the table's and the proposed ones,
    gets p_RNN(f|e) after U, as rescore-phrase-table --reverse-model writes it, then the indicator."""
    ini = tmp_path / "moses.ini"
    ini.write_bytes(EXAMPLE_INI.read_bytes())
    out = tmp_path / "out.gz"
    result = _cli(system, out, "--reverse-model", str(system / "reverse.pt"), "--beam", "4", "--moses-ini", str(ini),
                  "--moses-ini-out", str(tmp_path / "new.ini"), "--reverse-weight", "0.05", "--proposed-weight", "0.1")
    assert result.exit_code == 0, result.output
    assert "4 more features" in result.output
    new = MosesIni.read(tmp_path / "new.ini")
    (table,) = new.phrase_tables()
    assert table.num_features == 8
    assert new.weights()["TranslationModel0"] == [0.2, 0.2, 0.2, 0.2, 0.0, 0.0, 0.05, 0.1]

    forward, reverse = load_checkpoint(system / "model.pt"), load_checkpoint(system / "reverse.pt")
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    proposed = [line for line in lines if line.split(SEP)[2].endswith(" 2.71828")]
    assert proposed and len(lines) > len(proposed)
    for line in lines[::7] + proposed:
        source, target, scores = line.split(SEP)[:3]
        values = [float(v) for v in scores.split()]
        assert len(values) == 8 and values[7] in (1.0, 2.71828)
        assert math.log(values[4]) == pytest.approx(pair_log_p(forward, source, target), abs=1e-4)
        assert math.log(values[6]) == pytest.approx(pair_log_p(reverse, target, source), abs=1e-4)
        if values[7] != 1.0:  # a proposal's p(f|e) is the same reverse model's probability
            assert values[0] == pytest.approx(values[6], rel=1e-4)


def test_a_reranked_run_stopped_mid_search_resumes_byte_identical_and_other_weights_are_refused(
        system, tmp_path, monkeypatch) -> None:
    import rescorer.proposals.propose as module
    from rescorer.pipeline.errors import RescoreError

    table, forward, reverse = str(system / "phrase-table.gz"), load_checkpoint(system / "model.pt"), \
        load_checkpoint(system / "reverse.pt")
    options = {"beam": 4, "per_source": 2, "rows_per_step": 40}  # 10 sources a batch
    (tmp_path / "reference").mkdir()
    propose(table, str(tmp_path / "reference" / "out.gz"), forward,
            propose_options(list_path=str(tmp_path / "reference" / "list.tsv"), **options), reverse)
    out, listing = tmp_path / "out.gz", tmp_path / "list.tsv"
    real, calls = module.reverse_log_probs, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise OSError("disk full")
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(module, "reverse_log_probs", failing)
        with pytest.raises(OSError, match="disk full"):
            propose(table, str(out), forward, propose_options(list_path=str(listing), **options), reverse)
    with pytest.raises(RescoreError, match=r"cannot --resume: .*progress.json was made with --rerank "):
        propose(table, str(out), forward, propose_options(list_path=str(listing), resume=True,
                                                   rerank=RerankWeights(0.25, 1.0), **options), reverse)
    propose(table, str(out), forward, propose_options(list_path=str(listing), resume=True, **options), reverse)
    assert_same_output(out, tmp_path / "reference" / "out.gz")
    assert_same_output(listing, tmp_path / "reference" / "list.tsv")
    assert len(listing.read_text().splitlines()[0].split("\t")) == 6  # log p(e|f), log p(f|e), ln of the p(e|f) column
