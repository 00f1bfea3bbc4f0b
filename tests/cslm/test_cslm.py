"""The CSLM: normalisation, sentence scores against one-n-gram-at-a-time brute force, training,
model files, and the n-best filter on the fixture's real 100-best list."""

from __future__ import annotations

import gzip
import itertools
import math
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cslm.cli import main
from cslm.model import CSLM, CSLMConfig, CSLMError
from cslm.model_file import load_cslm, save_cslm
from cslm.nbest import add_cslm_to_nbest
from cslm.scoring import ScoreStats, sentence_log_probs
from cslm.train import CSLMTrainConfig, train_cslm
from held_output import held_by_another_process
from infrastructure.interrupts import Interrupted
from moses_integration.nbest import read_nbest
from moses_integration.tokens import split_tokens
from neural.device import cpu_bf16_speedup, training_precision
from neural.vocab import Vocab
from shared_paths import moses_bin_dir, shared_file

NBEST = "fixtures/hansard-enfr/nbest/dev.nbest.gz"

WORDS = ["le", "la", "les", "de", "du", "des", "et", "à", "un", "une", "chat", "chien", "maison", "rouge", "noir",
         "voit", "mange"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_model(order: int = 4, seed: int = 0, init_range: float = 0.5) -> tuple[CSLM, Vocab]:
    """A random CSLM over a few French words; the wide init makes probabilities far from uniform."""
    vocab = Vocab.from_counts({w: 100 - i for i, w in enumerate(WORDS)}, shortlist=12)  # some words are [UNK]
    torch.manual_seed(seed)
    model = CSLM(CSLMConfig(vocab_size=len(vocab), order=order, embedding=6, hidden=[10, 7], init_range=init_range))
    return model.eval(), vocab


def brute_force(model: CSLM, vocab: Vocab, tokens: list[str]) -> float:
    """The sentence's log-probability computed one n-gram at a time with the full softmax."""
    ctx = model.config.context
    ids = vocab.encode(tokens) + [vocab.eos_id]
    padded = [model.config.bos_id] * ctx + ids
    total = 0.0
    for i, word in enumerate(ids):
        hist = torch.tensor([padded[i : i + ctx]])
        with torch.no_grad():
            total += float(model.log_probs(hist)[0, word])
    return total


def test_probabilities_over_the_output_vocabulary_sum_to_one() -> None:
    model, _ = small_model()
    paper = CSLM(CSLMConfig(vocab_size=15001))  # the paper's sizes: 7-gram, 512, 1536-1024
    for m in (model, paper):
        cfg = m.config
        hist = torch.randint(0, cfg.vocab_size + 1, (20, cfg.context))  # <s> (= vocab_size) included
        with torch.no_grad():
            sums = m.log_probs(hist).double().exp().sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-5)
    assert paper.embed.weight.shape == (15002, 512) and paper.output.weight.shape == (15001, 1024)
    assert float(paper.output.weight.detach().abs().max()) <= 0.01


def test_sentence_score_is_the_sum_of_its_ngram_log_probs_in_any_batch() -> None:
    model, vocab = small_model()
    rng = np.random.default_rng(3)
    pool = [*WORDS, "inconnu", "mot\u00a0insécable"]  # out-of-shortlist words, one with a no-break space
    sentences = [[pool[i] for i in rng.integers(0, len(pool), n)] for n in (0, 1, 2, 3, 5, 8, 3, 3, 12)]
    sentences.append(list(sentences[3]))  # a repeated hypothesis, as in an n-best list
    truth = np.array([brute_force(model, vocab, s) for s in sentences])
    for share, batch in itertools.product((True, False), (1, 7, 100000)):
        got = sentence_log_probs(model, vocab, sentences, share_histories=share, batch_tokens=batch)
        np.testing.assert_allclose(got, truth, rtol=0, atol=1e-4)
    alone = [sentence_log_probs(model, vocab, [s])[0] for s in sentences]
    np.testing.assert_allclose(alone, truth, rtol=0, atol=1e-4)
    reordered = sentence_log_probs(model, vocab, sentences[::-1])
    np.testing.assert_allclose(reordered[::-1], truth, rtol=0, atol=1e-4)
    # A no-break space is inside a token (Moses' split), so this "word" is one [UNK], not two words.
    assert split_tokens("mot\u00a0insécable") == ["mot\u00a0insécable"]


def test_history_sharing_counts_each_distinct_history_once() -> None:
    model, vocab = small_model(order=3)
    stats = ScoreStats()
    sentences = [["le", "chat"], ["le", "chat"], ["le", "chien"]]
    sentence_log_probs(model, vocab, sentences, stats=stats)
    # Histories (2 previous words): <s><s>, <s>le, le chat, le chien -> 4 distinct of 9 tokens.
    assert (stats.tokens, stats.distinct_histories) == (9, 4)


def test_model_file_round_trip_and_bad_files(tmp_path: Path) -> None:
    model, vocab = small_model()
    path = save_cslm(tmp_path / "m.pt", model, vocab)
    loaded = load_cslm(path)
    assert loaded.vocab == vocab and loaded.model.config == model.config
    sents = [["le", "chat", "voit", "la", "maison"]]
    assert sentence_log_probs(loaded.model, loaded.vocab, sents)[0] == pytest.approx(
        sentence_log_probs(model, vocab, sents)[0], abs=1e-6)
    (tmp_path / "bad.pt").write_bytes(b"not a model")
    with pytest.raises(CSLMError, match="bad.pt: not a CSLM model file"):
        load_cslm(tmp_path / "bad.pt")
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(CSLMError, match="no 'moses-rnn-rescorer-cslm' marker"):
        load_cslm(tmp_path / "other.pt")


def _french_lines(n: int) -> list[str]:
    with gzip.open(shared_file("data/hansard/hansard.fr.gz"), "rt", encoding="utf-8") as fh:
        return [line for line in itertools.islice(fh, 20000, 20000 + n)]


@pytest.mark.slow
def test_training_on_real_french_lowers_validation_perplexity_and_resumes(tmp_path: Path) -> None:
    lines = _french_lines(3000)
    corpus = tmp_path / "fr.txt.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as fh:
        fh.writelines(lines)
    model_out = tmp_path / "cslm.pt"
    cfg = CSLMConfig(vocab_size=2, order=5, embedding=32, hidden=[64])
    result = train_cslm(str(corpus), model_out, model_config=cfg, shortlist=2000, progress=False,
                        train_config=CSLMTrainConfig(max_epochs=2, batch_size=128, epoch_size=12800))
    first, last = result.history[0].perplexity, result.best.perplexity
    assert first > 1500  # untrained: about uniform over the 2,001 outputs
    assert last < first / 5, [v.perplexity for v in result.history]
    loaded = load_cslm(model_out)
    assert loaded.model.config.vocab_size == 2001 and loaded.train_state["epoch"] == 2
    # --resume continues from MODEL.last: one more epoch on the same held-out split.
    more = train_cslm(str(corpus), model_out, model_config=cfg, shortlist=2000, progress=False, resume=True,
                      train_config=CSLMTrainConfig(max_epochs=3, batch_size=128, epoch_size=12800))
    assert more.epochs == 3 and [v.perplexity for v in more.history[:3]] == [v.perplexity for v in result.history]
    # The held-out lines are 0.1% of the corpus but at least 500.
    valid_tokens = sum(len(split_tokens(x)) + 1 for x in lines)
    assert 500 < len(np.load(tmp_path / "cslm.pt.data/valid/tokens.npy", mmap_mode="r")) < valid_tokens / 5


def test_a_resumed_training_ends_with_the_model_of_an_uninterrupted_one(tmp_path: Path, capsys) -> None:
    """Stop after epoch 1, resume to epoch 2: the same weights as two epochs in one go (the epoch
    order is a pure function of seed and epoch, and the optimizer state is saved). Every save of
    MODEL.last says on stderr how far the run is."""
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(800)), encoding="utf-8")
    cfg = CSLMConfig(vocab_size=2, order=4, embedding=16, hidden=[32])

    def run(out: Path, epochs: int, resume: bool = False):
        return train_cslm(str(corpus), out, model_config=cfg, shortlist=500, progress=False, resume=resume,
                          train_config=CSLMTrainConfig(max_epochs=epochs, batch_size=64, epoch_size=2048,
                                                       checkpoint_every=0.0, self_normalize=0.1))

    straight = run(tmp_path / "straight.pt", 2)
    saves = [line for line in capsys.readouterr().err.splitlines() if line.startswith("saved ")]
    assert len(saves) == 2 * (2048 // 64 - 1)  # checkpoint_every=0: after every minibatch but an epoch's last,
    # which the validation's own save follows
    assert saves[0].startswith(f"saved {tmp_path / 'straight.pt.last'}: epoch 1, 64 of 2,048 n-grams, 64 in ")
    assert saves[-1].startswith(f"saved {tmp_path / 'straight.pt.last'}: epoch 2, 1,984 of 2,048 n-grams, 4,032 in ")
    # Each line gives the training perplexity over the n-grams since the save before: about the
    # number of outputs at first (the untrained net is near uniform), lower by a fifth at the end.
    train_ppl = [float(re.search(r"training perplexity ([0-9.]+), mean \(log Z\)² [0-9.]+ since the last save$",
                                 line).group(1)) for line in saves]
    outputs = load_cslm(tmp_path / "straight.pt").model.config.vocab_size
    assert 0.8 * outputs < train_ppl[0] < 1.2 * outputs, (train_ppl[0], outputs)
    assert np.mean(train_ppl[-8:]) < 0.8 * np.mean(train_ppl[:8]), train_ppl
    run(tmp_path / "split.pt", 1)
    resumed = run(tmp_path / "split.pt", 2, resume=True)
    assert resumed.examples == straight.examples == 2 * 2048 and resumed.stopped_by == "max_epochs"
    a = load_cslm(tmp_path / "straight.pt.last").model.state_dict()
    b = load_cslm(tmp_path / "split.pt.last").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [v.perplexity for v in resumed.history] == [v.perplexity for v in straight.history]


def test_ctrl_c_mid_epoch_keeps_the_state_and_resume_ends_with_the_uninterrupted_model(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """Ctrl-C in the middle of an epoch saves MODEL.last and says where; --resume picks up at that
    n-gram and ends with the weights and the validations of a run never stopped."""
    from cslm import train as cslm_train

    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(800)), encoding="utf-8")
    cfg = CSLMConfig(vocab_size=2, order=4, embedding=16, hidden=[32])

    def run(out: Path, resume: bool = False):
        return train_cslm(str(corpus), out, model_config=cfg, shortlist=500, progress=False, resume=resume,
                          train_config=CSLMTrainConfig(max_epochs=2, batch_size=64, epoch_size=1024))

    straight = run(tmp_path / "straight.pt")
    step = cslm_train._CSLMTraining.step
    calls = itertools.count(1)

    def interrupted_at_the_21st(self, rows):
        if next(calls) == 21:  # the 5th minibatch of epoch 2
            raise KeyboardInterrupt
        return step(self, rows)

    monkeypatch.setattr(cslm_train._CSLMTraining, "step", interrupted_at_the_21st)
    with pytest.raises(Interrupted) as caught:
        run(tmp_path / "split.pt")
    assert caught.value.kept == (f"training state at 1280 n-grams (epoch 2) kept in {tmp_path / 'split.pt.last'}, "
                                 f"the best model so far in {tmp_path / 'split.pt'} (run again with --resume to "
                                 "continue)")
    kept = load_cslm(tmp_path / "split.pt.last").train_state
    assert kept is not None and (kept["epoch"], kept["position"], kept["examples"]) == (1, 256, 1280)
    monkeypatch.setattr(cslm_train._CSLMTraining, "step", step)
    resumed = run(tmp_path / "split.pt", resume=True)
    assert resumed.examples == straight.examples == 2 * 1024 and resumed.stopped_by == "max_epochs"
    a = load_cslm(tmp_path / "straight.pt.last").model.state_dict()
    b = load_cslm(tmp_path / "split.pt.last").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [v.perplexity for v in resumed.history] == [v.perplexity for v in straight.history]


def test_the_cslm_stops_for_time_in_mid_epoch_and_for_patience_after_an_epoch(tmp_path: Path, capsys) -> None:
    """``max_time`` ends a run inside its epoch, validated there and saying how far it got;
    patience ends it after an epoch that did not improve (an update too small to change a weight)."""
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(800)), encoding="utf-8")
    cfg = CSLMConfig(vocab_size=2, order=4, embedding=16, hidden=[32])

    def run(out: Path, **train):
        return train_cslm(str(corpus), out, model_config=cfg, shortlist=500, progress=False,
                          train_config=CSLMTrainConfig(batch_size=64, **train))

    timed = run(tmp_path / "timed.pt", max_time=0.05)
    assert timed.stopped_by == "max_time" and timed.epochs == 0 and timed.examples > 0
    assert f"(stopped {timed.examples} n-grams into epoch 1)" in capsys.readouterr().err
    kept = load_cslm(tmp_path / "timed.pt.last").train_state
    assert kept is not None and kept["position"] == timed.examples
    stuck = run(tmp_path / "stuck.pt", lr=1e-30, patience=1, epoch_size=512, max_epochs=5)
    assert stuck.stopped_by == "early_stopping" and stuck.epochs == 1 and len(stuck.history) == 2
    err = capsys.readouterr().err
    assert "epoch 1: valid perplexity" in err and "into epoch" not in err


def test_a_stop_for_time_closes_the_bar_before_its_lines(tmp_path: Path, capsys) -> None:
    """The validation that says where the run stopped, and the stop line after it, come after the bar,
    which is closed first: not under a bar redrawn after them (a terminal) or drawn once more (a log)."""
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(800)), encoding="utf-8")
    timed = train_cslm(str(corpus), tmp_path / "timed.pt", shortlist=500, progress=True,
                       model_config=CSLMConfig(vocab_size=2, order=4, embedding=16, hidden=[32]),
                       train_config=CSLMTrainConfig(batch_size=64, max_time=0.05))
    assert timed.stopped_by == "max_time" and timed.epochs == 0
    lines = capsys.readouterr().err.splitlines()
    stopped = next(i for i, line in enumerate(lines) if "(stopped " in line)
    bars = [i for i, line in enumerate(lines) if line.startswith("epoch 1:")]  # the bar of the epoch it stopped in
    assert bars and max(bars) < stopped, lines


def test_cli_train_score_and_nbest(tmp_path: Path) -> None:
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(700)), encoding="utf-8")
    model = tmp_path / "m.pt"
    runner = CliRunner()
    res = runner.invoke(main, ["train", str(corpus), str(model), "--max-epochs", "1", "--embedding", "8",
                               "--hidden", "16,8", "--shortlist", "300", "--threads", "1", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "epoch 1: valid perplexity" in res.stderr
    text = "le président .\nmonsieur le président , je\n"
    res = runner.invoke(main, ["score", str(model), "-"], input=text)
    assert res.exit_code == 0, res.output
    loaded = load_cslm(model)
    expected = sentence_log_probs(loaded.model, loaded.vocab, [s.split() for s in text.splitlines()])
    got = [float(x) for x in res.stdout.split()]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    res = runner.invoke(main, ["nbest", str(model), "-", "-", "--name", "CSLM_0"], input="")
    assert res.exit_code != 0 and "sparse feature" in res.output
    res = runner.invoke(main, ["score", str(tmp_path / "missing.pt")])
    assert res.exit_code != 0


def _nbest_head(tmp_path: Path, sentences: int) -> Path:
    raw = gzip.decompress(shared_file(NBEST).read_bytes())
    keep = [line for line in raw.splitlines(keepends=True) if int(line.split(b" ||| ", 1)[0]) < sentences]
    path = tmp_path / "head.nbest"
    path.write_bytes(b"".join(keep))
    return path


def test_nbest_filter_keeps_every_other_byte_of_a_real_list(tmp_path: Path) -> None:
    model, vocab = small_model()
    src = _nbest_head(tmp_path, 5)
    out = tmp_path / "out.nbest.gz"
    stats = ScoreStats()
    n = add_cslm_to_nbest(model, vocab, src, out, stats=stats, chunk_lines=150)
    before = src.read_bytes().splitlines(keepends=True)
    after = gzip.decompress(out.read_bytes()).splitlines(keepends=True)
    assert n == len(before) == len(after)
    entries = list(read_nbest(src))
    truth = sentence_log_probs(model, vocab, [split_tokens(e.hypothesis) for e in entries])
    for line_in, line_out, value in zip(before, after, truth, strict=True):
        f_in, f_out = line_in.split(b" ||| "), line_out.split(b" ||| ")
        added = f" CSLM0= {value:.6g}".encode()
        assert f_out[2] == f_in[2] + added  # Moses' field has no trailing space before " ||| "
        assert f_out[:2] == f_in[:2] and f_out[3:] == f_in[3:]
    assert 0 < stats.history_share < 0.6  # a 100-best list shares most histories
    with pytest.raises(ValueError, match=r"already has feature\(s\) CSLM0"):
        add_cslm_to_nbest(model, vocab, out, tmp_path / "again.nbest", chunk_lines=150)
    assert not (tmp_path / "again.nbest").exists()
    broken = tmp_path / "broken.nbest"
    broken.write_bytes(before[0] + b"0 ||| no features here\n")
    with pytest.raises(ValueError, match=r"broken.nbest:2: expected 'id \|\|\| hypothesis"):
        add_cslm_to_nbest(model, vocab, broken, tmp_path / "x.nbest")


@pytest.mark.moses
def test_moses_extractor_reads_the_extended_list(tmp_path: Path) -> None:
    bin_dir = moses_bin_dir()
    extractor = bin_dir / "extractor"
    if not extractor.exists():
        pytest.skip(f"no extractor in {bin_dir}")
    model, vocab = small_model()
    src = _nbest_head(tmp_path, 3)
    ref = tmp_path / "ref.fr"
    ref.write_text("".join(shared_file("fixtures/hansard-enfr/data/dev.tok.tc.fr").read_text(
        encoding="utf-8").splitlines(keepends=True)[:3]), encoding="utf-8")
    out = tmp_path / "cslm.nbest"
    add_cslm_to_nbest(model, vocab, src, out)
    heads = []
    for name, nbest in (("plain", src), ("cslm", out)):
        subprocess.run([str(extractor), "--sctype", "BLEU", "--scconfig", "case:true", "--scfile",
                        str(tmp_path / f"{name}.scores.dat"), "--ffile", str(tmp_path / f"{name}.features.dat"),
                        "-r", str(ref), "-n", str(nbest)], check=True, capture_output=True, cwd=tmp_path)
        heads.append((tmp_path / f"{name}.features.dat").read_text().splitlines()[0])
    plain, cslm = (h.split() for h in heads)
    # FEATURES_TXT_BEGIN_0 <sentence> <hypotheses> <number of features> <names...>
    assert int(cslm[3]) == int(plain[3]) + 1 and cslm[-1] == "CSLM0_0" and cslm[4:-1] == plain[4:]


def test_cslm_feature_through_the_mert_spec(tmp_path: Path) -> None:
    from mert.features import FeatureError, absolute_spec_path, load_feature

    model, vocab = small_model()
    path = save_cslm(tmp_path / "m.pt", model, vocab)
    feature = load_feature(f"CSLM:{path}")
    assert feature.name == "CSLM0" and feature.num_values == 1
    entries = list(read_nbest(_nbest_head(tmp_path, 2)))
    values = feature.score([], entries)
    truth = sentence_log_probs(model, vocab, [split_tokens(e.hypothesis) for e in entries])
    np.testing.assert_allclose(values[:, 0], truth, atol=1e-6)
    assert load_feature(f"CSLM:{path},name=CSLM1").name == "CSLM1"
    assert absolute_spec_path("CSLM:m.pt,name=CSLM1") == f"CSLM:{Path('m.pt').resolve()},name=CSLM1"
    assert absolute_spec_path("LengthRatio:1.1") == "LengthRatio:1.1"
    with pytest.raises(FeatureError, match="CSLM needs a model file"):
        load_feature("CSLM")
    assert math.isfinite(float(values.sum()))


def test_training_into_a_held_model_stops_and_keeps_the_model(tmp_path: Path) -> None:
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(50)), encoding="utf-8")
    model = tmp_path / "m.pt"
    model.write_bytes(b"the model of the run that holds it")
    with held_by_another_process(model) as holder:
        res = CliRunner().invoke(main, ["train", str(corpus), str(model), "--max-epochs", "1", "--resume", "-q"])
    assert res.exit_code == 1 and f"Error: {model} is in use by pid {holder.pid} " in res.output
    assert model.read_bytes() == b"the model of the run that holds it"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr.txt", "m.pt"]


def test_a_resume_with_another_recipe_is_refused_naming_it_and_the_stops_may_differ(tmp_path: Path) -> None:
    """A resume went on with the options given to it: one with another --lr made the rest of the training
    another recipe's, spliced onto the first. Only the stops (and how an update runs) may change."""
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(300)), encoding="utf-8")
    model = tmp_path / "m.pt"
    args = ["train", str(corpus), str(model), "--order", "3", "--embedding", "8", "--hidden", "16", "--shortlist",
            "200", "--epoch-size", "512", "--batch-size", "64", "-q", "--device", "cpu", "--threads", "1"]
    assert CliRunner().invoke(main, [*args, "--max-epochs", "1"]).exit_code == 0
    res = CliRunner().invoke(main, [*args, "--max-epochs", "2", "--resume", "--lr", "0.01", "--batch-size", "32"])
    _one_error_line(res, f"cannot --resume: {model}.last was made with --batch-size 64, now 32; with --lr none, now "
                         "0.01; resume with the same options, or train into another MODEL")
    res = CliRunner().invoke(main, [*args, "--max-epochs", "2", "--resume", "--patience", "3"])
    assert res.exit_code == 0, res.output
    assert load_cslm(model.with_name("m.pt.last")).train_state["epoch"] == 2


def test_a_resume_with_other_sizes_or_data_is_refused_naming_them_before_the_corpus_is_read(
        tmp_path: Path, monkeypatch) -> None:
    """``--resume --hidden 32`` (or ``--order 4``) went on with the file's sizes and said nothing; another
    corpus, --shortlist or --valid was refused only after the corpus was counted and encoded again (the
    prepared data overwritten for it), as "trained on other data (or other settings)"."""
    corpus, valid = tmp_path / "fr.txt", tmp_path / "valid.txt"
    corpus.write_text("".join(_french_lines(300)), encoding="utf-8")
    valid.write_text("".join(_french_lines(20)), encoding="utf-8")
    model = tmp_path / "m.pt"
    args = ["--embedding", "8", "--shortlist", "200", "--epoch-size", "512", "-q", "--device", "cpu", "--threads", "1"]
    first = ["train", str(corpus), str(model), "--order", "3", "--hidden", "16", "--valid", str(valid), *args]
    assert CliRunner().invoke(main, [*first, "--max-epochs", "1"]).exit_code == 0
    prepared = {p: p.read_bytes() for p in sorted((tmp_path / "m.pt.data").rglob("*")) if p.is_file()}
    import cslm.train
    monkeypatch.setattr(cslm.train, "count_corpus", lambda *a: pytest.fail("the corpus was read"))
    other = tmp_path / "other.txt"
    other.write_bytes(corpus.read_bytes())
    again = [*first, "--max-epochs", "2", "--resume"]
    for call, message in (
            ([*again, "--hidden", "32"], "--hidden [16], now [32]; resume with the same sizes"),
            ([*again, "--order", "4"], "--order 3, now 4; resume with the same sizes"),
            ([*again, "--shortlist", "150"], "--shortlist 200, now 150; resume on the same data"),
            ([*again, "--valid", str(corpus)], f"--valid {valid} ("),
            (["train", str(other), *again[2:]], f"CORPUS {corpus} ("),
    ):
        res = CliRunner().invoke(main, call)
        _one_error_line(res, f"cannot --resume: {model}.last was made with {message}")
    assert {p: p.read_bytes() for p in sorted((tmp_path / "m.pt.data").rglob("*")) if p.is_file()} == prepared
    link = tmp_path / "link.txt"  # the same corpus by another name is the same data
    link.symlink_to(corpus)
    res = CliRunner().invoke(main, ["train", str(link), *again[2:]])
    assert res.exit_code == 0, res.output


def test_a_training_stopped_while_it_encodes_the_corpus_leaves_no_partial_ids(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C or SIGTERM while the corpus was being encoded left ``MODEL.data/train/tokens.npy.tmp`` (20 MB
    for a 576k-line corpus), which no later run removed."""
    import cslm.train

    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(300)), encoding="utf-8")
    calls = {"n": 0}
    real_split = cslm.train.split_tokens

    def split_then_stop(line: str) -> list[str]:
        calls["n"] += 1
        if calls["n"] == 300 + 100:  # the counting pass read every line; 100 lines into the encoding
            raise KeyboardInterrupt
        return real_split(line)

    monkeypatch.setattr(cslm.train, "split_tokens", split_then_stop)
    res = CliRunner().invoke(main, ["train", str(corpus), str(tmp_path / "m.pt"), "--order", "3", "--embedding",
                                    "8", "--hidden", "16", "--max-epochs", "1", "-q", "--device", "cpu"])
    assert res.exit_code != 0 and calls["n"] == 400, res.output
    assert [p.name for p in tmp_path.rglob("*") if "tmp" in p.name or "tokens" in p.name] == []


def test_an_empty_validation_text_is_refused(tmp_path: Path) -> None:
    """It trained, and said "valid perplexity 1.00" at every epoch: early stopping and the best model meant nothing."""
    corpus, empty = tmp_path / "fr.txt", tmp_path / "empty.txt"
    corpus.write_text("".join(_french_lines(50)), encoding="utf-8")
    empty.write_text("")
    res = CliRunner().invoke(main, ["train", str(corpus), str(tmp_path / "m.pt"), "--valid", str(empty), "--order", "3",
                                    "--embedding", "8", "--hidden", "16", "--max-epochs", "1", "-q", "--device", "cpu"])
    _one_error_line(res, f"{empty}: the validation text is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "fr.txt"]


@pytest.mark.parametrize("piped", ["corpus", "valid"])
def test_a_piped_corpus_is_refused_before_it_is_counted(tmp_path: Path, piped: str) -> None:
    """``cslm train <(zcat fr.gz) m.pt`` counted the whole corpus, then found the pipe empty and said it had
    "changed while it was being read"."""
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(50)), encoding="utf-8")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, corpus.read_bytes())
        os.close(write_end)
        pipe = f"/dev/fd/{read_end}"
        args = [pipe, str(tmp_path / "m.pt")] if piped == "corpus" else [str(corpus), str(tmp_path / "m.pt"),
                                                                        "--valid", pipe]
        res = CliRunner().invoke(main, ["train", *args, "--order", "3", "--embedding", "8", "--hidden", "16",
                                        "--max-epochs", "1", "-q", "--device", "cpu"])
    finally:
        os.close(read_end)
    _one_error_line(res, f"{pipe}: ", "is read twice (counted, then encoded), which a pipe cannot be")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr.txt"]

def test_training_again_without_resume_keeps_the_trained_model(tmp_path: Path) -> None:
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(50)), encoding="utf-8")
    model = tmp_path / "m.pt"
    model.with_name("m.pt.last").write_bytes(b"the latest state of a long run")
    res = CliRunner().invoke(main, ["train", str(corpus), str(model), "--max-epochs", "1", "-q"])
    assert res.exit_code == 1
    assert res.output == f"Error: {model}.last already exists: pass --resume to continue that training, " \
                         "or remove it to train from scratch\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr.txt", "m.pt.last"]


# ------------------------------------------------------------------ bad input, bad places: one line, nothing left


def _one_error_line(res, *names: str) -> None:
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and all(n in lines[0] for n in names), res.output


@pytest.mark.parametrize("command", ["score", "nbest", "export-nplm"])
def test_a_model_file_of_random_bytes_is_one_line(tmp_path: Path, command: str) -> None:
    """One line naming the file, not six lines of torch's advice to load it with weights_only=False."""
    model = tmp_path / "model.pt"
    model.write_bytes(np.random.default_rng(0).bytes(4000))
    args = [command, str(model), *(["-"] if command != "export-nplm" else [str(tmp_path / "new" / "m.nplm")])]
    res = CliRunner().invoke(main, args, input="le chat\n")
    _one_error_line(res, str(model), "not a CSLM model file of this tool")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_score_names_the_file_and_line_of_a_byte_that_is_not_utf8(tmp_path: Path) -> None:
    model, vocab = small_model()
    save_cslm(tmp_path / "m.pt", model, vocab)
    text = tmp_path / "text.fr"
    text.write_bytes(b"le chat\nla maison \xe9tait rouge\n")
    res = CliRunner().invoke(main, ["score", "-q", str(tmp_path / "m.pt"), str(text)])
    assert res.exit_code == 1 and f"{text}:2: not valid UTF-8" in res.stderr, res.output
    assert len(res.stdout.splitlines()) <= 1  # the first line may have been scored: nothing after the bad one


def test_score_and_nbest_are_quiet_with_q(tmp_path: Path) -> None:
    model, vocab = small_model()
    save_cslm(tmp_path / "m.pt", model, vocab)
    for quiet in ([], ["-q"]):
        res = CliRunner().invoke(main, ["score", *quiet, str(tmp_path / "m.pt"), "-"], input="le chat\n")
        assert res.exit_code == 0 and len(res.stdout.splitlines()) == 1
        assert ("perplexity" in res.stderr) is not bool(quiet)


def test_score_of_an_empty_text_prints_nothing_and_says_so(tmp_path: Path) -> None:
    """It printed "0 sentences, 0 tokens (</s> included): perplexity nan"."""
    model, vocab = small_model()
    save_cslm(tmp_path / "m.pt", model, vocab)
    res = CliRunner().invoke(main, ["score", str(tmp_path / "m.pt"), "-"], input="")
    assert res.exit_code == 0 and res.stdout == ""
    assert res.stderr.strip() == "<stdin> holds no sentence: no perplexity"


def test_export_into_a_folder_not_made_yet_makes_it(tmp_path: Path) -> None:
    model, vocab = small_model()
    save_cslm(tmp_path / "m.pt", model, vocab)
    res = CliRunner().invoke(main, ["export-nplm", str(tmp_path / "m.pt"), str(tmp_path / "new" / "m.nplm")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "new" / "m.nplm").read_text().startswith("\\config")


def test_export_into_an_unwritable_folder_names_the_users_path(tmp_path: Path, unwritable_folder: Path) -> None:
    """The user's path, not a hidden temporary file's (missing folder) nor a 44-line traceback (read-only)."""
    model, vocab = small_model()
    save_cslm(tmp_path / "m.pt", model, vocab)
    out = unwritable_folder / "m.nplm"
    res = CliRunner().invoke(main, ["export-nplm", str(tmp_path / "m.pt"), str(out)])
    _one_error_line(res, "'OUT'", str(out))
    assert ".tmp" not in res.output


@pytest.mark.parametrize("model_out", ["m.pt", "models/new/m.pt"])
def test_training_on_an_empty_corpus_leaves_nothing_behind(tmp_path: Path, model_out: str) -> None:
    """The error was right, but an empty MODEL.data/ (and the folders made for MODEL) stayed."""
    (tmp_path / "empty.txt").write_text("")
    res = CliRunner().invoke(main, ["train", str(tmp_path / "empty.txt"), str(tmp_path / model_out), "-q",
                                    "--max-epochs", "1", "--threads", "1"])
    _one_error_line(res, "the corpus is empty")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["empty.txt"]


@pytest.mark.parametrize("option, value", [
    ("--hidden", "1000000,1000000"),  # asked torch for 4 TB: an allocation traceback, and MODEL.data/ left
    ("--hidden", "512,9000"),
    ("--embedding", "10000000"),
    ("--order", "100000"),  # trained minutes on histories of padding
    ("--shortlist", str(10**11)),
])
def test_sizes_beyond_their_limits_are_one_line_before_any_work(tmp_path: Path, option: str, value: str) -> None:
    (tmp_path / "fr.txt").write_text("le chat\n")
    res = CliRunner().invoke(main, ["train", str(tmp_path / "fr.txt"), str(tmp_path / "m.pt"), "-q",
                                    "--max-epochs", "1", "--threads", "1", option, value])
    _one_error_line(res, f"'{option}'", "is not in the range")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fr.txt"]


def test_auto_trains_the_cslm_as_the_cpu_measure_says_and_bf16_when_named(tmp_path: Path, capsys) -> None:
    """As the RNN's training, ``auto`` on a CPU is bf16 only where this CPU's bf16 matmuls at the model's
    width pay (docs/training-speed.md); the run says so, records it, and computes exactly what naming
    that precision computes. ``bf16`` named runs in bf16, says and records it, and still saves fp32 weights."""
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(300)), encoding="utf-8")
    cfg = CSLMConfig(vocab_size=2, order=4, embedding=16, hidden=[32])

    def run(out: Path, chosen: str) -> str:
        train_cslm(str(corpus), out, model_config=cfg, shortlist=300, progress=False, precision=chosen,
                   device="cpu", train_config=CSLMTrainConfig(max_epochs=1, batch_size=64, epoch_size=640))
        return capsys.readouterr().err

    err = run(tmp_path / "auto.pt", "auto")
    chosen = training_precision(torch.device("cpu"), "auto", 32)  # measured once per process
    native = cpu_bf16_speedup(32) > 0  # without native bf16 (AVX2 only) nothing is measured
    assert f"training on cpu in {chosen} (auto: " + ("this CPU's bf16 matmuls at width 32 run " if native else
                                                     "this CPU has no native bf16 matmuls)") in err
    run(tmp_path / "named.pt", chosen)
    assert "training on cpu in bf16: matmuls in bf16" in run(tmp_path / "bf16.pt", "bf16")
    auto, named, bf16 = (load_cslm(tmp_path / f"{name}.pt") for name in ("auto", "named", "bf16"))
    assert (auto.train_state["precision"], bf16.train_state["precision"]) == (chosen, "bf16")
    for name, value in auto.model.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, named.model.state_dict()[name]), name
        assert bf16.model.state_dict()[name].dtype == torch.float32, name
    assert any(not torch.equal(value, bf16.model.state_dict()[name]) for name, value in auto.model.state_dict().items())
