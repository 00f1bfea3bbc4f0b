"""Samples and beam search from the model's own decoder step (the paper's Table 3)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from infrastructure.errors import UserError
from neural.vocab import EOS_ID, Vocab
from rescorer.analysis.sampling import beam_search, sample_and_search, sample_targets, summary_of
from rescorer.model.config import ModelConfig
from rescorer.model.generation import next_word_log_probs, start_decoding
from rescorer.model.network import RNNEncoderDecoder

TGT_WORDS = ["la", "maison", "bleue", "rouge"]


def _tiny_model(seed: int = 7, eos_bias: float = 1.0) -> RNNEncoderDecoder:
    """A random float64 model over 6 target ids with peaked, short-ending distributions."""
    torch.manual_seed(seed)
    config = ModelConfig(src_vocab_size=5, tgt_vocab_size=2 + len(TGT_WORDS), hidden=8, embedding=4,
                         maxout_units=4, output_rank=3, init_std=0.8)
    model = RNNEncoderDecoder(config).double().eval()
    with torch.no_grad():
        model.out_vocab.bias[EOS_ID] = eos_bias
    return model


def _score(model: RNNEncoderDecoder, c: torch.Tensor, ids: tuple[int, ...]) -> float:
    """log p(Y | X) by the scoring path (the padded batch code, not the generation step)."""
    tgt = torch.tensor([[*ids, EOS_ID]])
    with torch.no_grad():
        return float(model.score_targets(c, tgt, torch.tensor([len(ids) + 1])))


def test_step_by_step_distributions_equal_the_scoring_paths() -> None:
    model = _tiny_model()
    c = summary_of(model, [2, 3])
    tgt = torch.tensor([[3, 2, 5, EOS_ID]])
    vocab = model.config.tgt_vocab_size
    with torch.no_grad():
        start = start_decoding(model, c)
        h, prev = start.state, None
        for t in range(4):
            h, log_probs = next_word_log_probs(model, start, torch.zeros(1, dtype=torch.long), h, prev)
            # The whole distribution at step t by the scoring path: tgt with every word at t.
            variants = tgt.repeat(vocab, 1)
            variants[:, t] = torch.arange(vocab)
            expected = model.token_logprobs(c.expand(vocab, -1), variants, torch.full((vocab,), 4))[:, t]
            torch.testing.assert_close(log_probs[0], expected, rtol=0, atol=1e-12)
            prev = tgt[:, t]


def test_samples_are_valid_targets_whose_scores_are_the_models() -> None:
    model = _tiny_model()
    c = summary_of(model, [2, 4, 3])
    samples = sample_targets(model, c, 200, seed=3)
    assert len(samples) == 200
    assert all(s.finished for s in samples)  # the EOS bias ends every sample well before 30 words
    for s in samples[:50]:
        assert all(1 <= i < model.config.tgt_vocab_size for i in s.ids)  # never </s> inside
        assert s.log_p == pytest.approx(_score(model, c, s.ids), abs=1e-9)


def test_same_seed_same_samples_other_seed_other_samples() -> None:
    model = _tiny_model()
    c = summary_of(model, [2])
    first = [s.ids for s in sample_targets(model, c, 100, seed=11)]
    assert first == [s.ids for s in sample_targets(model, c, 100, seed=11)]
    assert first != [s.ids for s in sample_targets(model, c, 100, seed=12)]


def test_sampling_frequencies_approach_the_models_probabilities() -> None:
    model = _tiny_model(eos_bias=2.0)
    c = summary_of(model, [3, 2])
    n = 20_000
    counts = Counter(s.ids for s in sample_targets(model, c, n, seed=1234))
    # Every target of up to three words, with its probability from the scoring path.
    words = range(1, model.config.tgt_vocab_size)
    targets = [()] + [t for k in (1, 2, 3) for t in itertools.product(words, repeat=k)]
    probs = {t: math.exp(_score(model, c, t)) for t in targets}
    assert sum(probs.values()) > 0.9  # these short targets carry most of the mass
    for target, p in probs.items():
        if p < 0.005:
            continue
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(counts[target] / n - p) < 5 * sd, (target, counts[target] / n, p)
    # Total variation between sampled and model frequencies over these targets is small.
    tv = 0.5 * sum(abs(counts[t] / n - p) for t, p in probs.items())
    assert tv < 0.03


def test_beam_best_score_is_the_models_and_search_is_exact_on_a_tiny_vocabulary() -> None:
    model = _tiny_model(eos_bias=1.5)
    c = summary_of(model, [4, 2])
    found = beam_search(model, c, 200)
    assert [g.beam_rank for g in found] == list(range(1, len(found) + 1))
    assert found[0].finished
    assert found[0].log_p == pytest.approx(_score(model, c, found[0].ids), abs=1e-9)
    assert [g.log_p for g in found] == sorted((g.log_p for g in found), reverse=True)
    # With a beam wider than every expansion up to 3 words, those targets are found exactly.
    words = range(1, model.config.tgt_vocab_size)
    short = [()] + [t for k in (1, 2, 3) for t in itertools.product(words, repeat=k)]
    brute = sorted(short, key=lambda t: -_score(model, c, t))[:5]
    by_ids = {g.ids: g.log_p for g in found}
    for target in brute:
        assert by_ids[target] == pytest.approx(_score(model, c, target), abs=1e-9)
    assert [g.ids for g in found if len(g.ids) <= 3][:5] == brute


def test_sample_and_search_merges_distinct_targets_sorted_by_score() -> None:
    model = _tiny_model()
    src_vocab = Vocab(["</s>", "[UNK]", "the", "blue", "house"])
    result = sample_and_search(model, src_vocab, "the  blue\thouse", n=60, beam=3, seed=5)
    assert result.source_ids == [2, 3, 4]
    ids = [g.ids for g in result.candidates]
    assert len(ids) == len(set(ids))
    assert sum(g.samples for g in result.candidates) == 60
    assert sorted(g.beam_rank for g in result.candidates if g.beam_rank) == [1, 2, 3]
    scores = [g.log_p for g in result.candidates]
    assert scores == sorted(scores, reverse=True)
    with pytest.raises(UserError, match="empty"):
        sample_and_search(model, src_vocab, "  ", n=5, beam=1)


def test_cli_lists_distinct_targets_as_markdown_or_json(tmp_path) -> None:
    import json

    from click.testing import CliRunner

    from analysis_checkpoint import EXAMPLE_TABLE, write_random_checkpoint
    from rescorer.cli import main
    from rescorer.model.checkpoint import load_checkpoint

    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    runner = CliRunner()
    args = ["sample", str(model), "all canadians", "-n", "20", "--beam", "2", "--seed", "9", "--device", "cpu"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "as the model reads it: all canadians </s>" in result.output
    assert result.output.count("</s> |") + result.output.count("(cut) |") >= 2
    result = runner.invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    assert sum(t["samples"] for t in listing["targets"]) == 20
    checkpoint = load_checkpoint(model)
    best = next(t for t in listing["targets"] if t["beam_rank"] == 1)
    src = checkpoint.src_vocab.encode("all canadians", add_eos=True)
    tgt = checkpoint.tgt_vocab.encode(best["target"], add_eos=True)
    with torch.no_grad():
        c = checkpoint.model.encode(torch.tensor([src]), torch.tensor([len(src)]))
        steps = checkpoint.model.token_logprobs(c, torch.tensor([tgt]), torch.tensor([len(tgt)]))[0]
    # A target cut at --max-words has no </s> yet: its score is that of its words alone.
    direct = float(steps.sum() if best["finished"] else steps[:-1].sum())
    assert best["log_p"] == pytest.approx(direct, abs=1e-4)


def test_cli_refuses_a_source_not_in_utf8_a_blank_one_and_nothing_to_generate(tmp_path) -> None:
    """``sample MODEL $'caf\\xe9'`` sampled for unknown words and ``--json`` wrote invalid UTF-8; ``-n 0 --beam 0``
    printed an empty table."""
    from click.testing import CliRunner

    from analysis_checkpoint import EXAMPLE_TABLE, write_random_checkpoint
    from rescorer.cli import main

    model = str(write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt"))
    latin1 = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python passes such an argument on
    for args, message in (([model, latin1], "Invalid value for 'SOURCE': b'caf\\xe9' is not valid UTF-8."),
                          ([model, "  "], "Invalid value for 'SOURCE': the phrase is empty."),
                          ([model, "all canadians", "-n", "0", "--beam", "0"],
                           "-n 0 and --beam 0: nothing to generate; give -n or --beam")):
        result = CliRunner().invoke(main, ["sample", *args, "--json", "--device", "cpu"])
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(f"Error: {message}"), result.output
