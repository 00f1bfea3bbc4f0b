"""``nmt train/translate/score/nbest`` and the MERT feature, on a slice of the real Hansard bitext:
what a user sees, bad input in one line, a resumed training equal to an uninterrupted one."""

from __future__ import annotations

import gzip
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import nmt.train as nmt_train
from infrastructure.errors import UserError
from infrastructure.interrupts import Interrupted
from mert.features import load_feature
from moses_integration.nbest import read_nbest
from neural.model_files import write_model_file
from neural.training import DivergedError
from nmt.cli import main
from nmt.model import NMTConfig
from nmt.model_file import load_nmt
from nmt.scoring import score_pairs
from nmt.search import beam_search
from nmt.train import NMTTrainConfig, train_nmt
from shared_paths import shared_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["--vocab-size", "400", "--embedding", "8", "--hidden", "8", "--alignment", "8", "--maxout", "8"]


def _hansard(n: int, first: int = 30000) -> tuple[list[str], list[str]]:
    sides = []
    for lang in ("fr", "en"):
        with gzip.open(shared_file(f"data/hansard/hansard.{lang}.gz"), "rt", encoding="utf-8") as fh:
            sides.append(list(itertools.islice(fh, first, first + n * 3)))
    pairs = [(f, e) for f, e in zip(*sides, strict=True)
             if f.strip() and e.strip() and len(f.split()) <= 12 and len(e.split()) <= 12][:n]
    return [f for f, _ in pairs], [e for _, e in pairs]


@pytest.fixture(scope="module")
def bitext(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("bitext")
    fr, en = _hansard(120)
    (folder / "train.fr").write_text("".join(fr), encoding="utf-8")
    (folder / "train.en").write_text("".join(en), encoding="utf-8")
    return folder / "train.fr", folder / "train.en"


@pytest.fixture(scope="module")
def models(bitext, tmp_path_factory) -> tuple[Path, Path]:
    """p(en|fr) and, trained by the same command on the swapped bitext, p(fr|en)."""
    folder = tmp_path_factory.mktemp("models")
    fr, en = bitext
    out = []
    for name, (src, tgt) in (("fr-en.pt", (fr, en)), ("en-fr.pt", (en, fr))):
        result = CliRunner().invoke(main, ["train", str(src), str(tgt), str(folder / name), *TINY, "--max-steps", "8",
                                           "--valid-every", "4", "--valid-lines", "10", "--bleu-sentences", "3",
                                           "--batch-size", "16", "--lr", "0.01", "-q", "--threads", "1"])
        assert result.exit_code == 0, result.output
        out.append(folder / name)
    return out[0], out[1]


def test_training_lowers_the_held_out_perplexity_and_says_so(models):
    loaded = load_nmt(models[0])
    history = loaded.train_state["history"]
    assert [v["step"] for v in history] == [0, 4, 8]
    assert history[-1]["perplexity"] < history[0]["perplexity"] * 0.8
    assert history[0]["perplexity"] > 100  # untrained: about uniform over ~300 units
    assert loaded.model.config.hidden == 8 and len(loaded.tgt_subwords) == loaded.model.config.tgt_vocab


def _tiny_run(bitext, out: Path, steps: int, resume: bool = False, **options):
    config = NMTConfig(src_vocab=8, tgt_vocab=8, embedding=8, hidden=8, alignment=8, maxout=8)
    cfg = NMTTrainConfig(**{"vocab_size": 400, "batch_size": 16, "lr": 0.01, "valid_every": 3, "max_steps": steps,
                            "valid_lines": 10, "bleu_sentences": 2, **options})
    return train_nmt(str(bitext[0]), str(bitext[1]), out, model_config=config, train_config=cfg,
                     progress=False, resume=resume)


@pytest.mark.slow
def test_a_training_stopped_by_ctrl_c_and_resumed_ends_with_the_uninterrupted_model(bitext, tmp_path, monkeypatch):
    straight = _tiny_run(bitext, tmp_path / "straight.pt", 10)  # 81 pairs in 6 batches: two epochs
    update = nmt_train.update_step
    calls = itertools.count(1)

    def interrupted_at_the_8th(*args, **kwargs):
        if next(calls) == 8:  # the 2nd update of epoch 2
            raise KeyboardInterrupt
        return update(*args, **kwargs)

    monkeypatch.setattr(nmt_train, "update_step", interrupted_at_the_8th)
    with pytest.raises(Interrupted) as caught:
        _tiny_run(bitext, tmp_path / "split.pt", 10)
    assert caught.value.kept == (f"training state at update 7 (epoch 2) kept in {tmp_path / 'split.pt.last'}, the "
                                 f"best model so far in {tmp_path / 'split.pt'} (run again with --resume to continue)")
    kept = load_nmt(tmp_path / "split.pt.last").train_state
    assert (kept["step"], kept["epoch"], kept["position"]) == (7, 1, 1)
    monkeypatch.setattr(nmt_train, "update_step", update)
    with pytest.raises(UserError) as refused:  # another recipe would splice another training onto this one
        _tiny_run(bitext, tmp_path / "split.pt", 10, resume=True, vocab_size=8000, batch_size=99)
    assert str(refused.value) == (f"cannot --resume: {tmp_path / 'split.pt.last'} was made with --batch-size 16, now "
                                  "99; with --vocab-size 400, now 8000; resume with the same options, or train into "
                                  "another MODEL")
    resumed = _tiny_run(bitext, tmp_path / "split.pt", 10, resume=True, checkpoint_every=0)  # the stops may differ
    assert resumed.steps == straight.steps == 10 and resumed.stopped_by == "max_steps"
    a = load_nmt(tmp_path / "straight.pt.last").model.state_dict()
    b = load_nmt(tmp_path / "split.pt.last").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [(v.step, v.perplexity) for v in resumed.history] == [(v.step, v.perplexity) for v in straight.history]
    assert [v.step for v in straight.history] == [0, 3, 6, 9, 10]


def test_a_run_killed_between_validations_resumes_from_its_last_checkpoint(bitext, tmp_path, monkeypatch):
    """SIGKILL (the end of a session) runs no handler: what survives is the last save. With
    --checkpoint-every passed, MODEL.last holds the update before the kill, not the last validation's."""
    update = nmt_train.update_step
    calls = itertools.count(1)

    def killed_at_the_8th(*args, **kwargs):
        if next(calls) == 8:
            raise SystemExit(137)  # unwinds like a kill: no save on the way out
        return update(*args, **kwargs)

    monkeypatch.setattr(nmt_train, "update_step", killed_at_the_8th)
    with pytest.raises(SystemExit):
        _tiny_run(bitext, tmp_path / "m.pt", 10, checkpoint_every=0)
    assert load_nmt(tmp_path / "m.pt.last").train_state["step"] == 7  # validations came at 3 and 6
    monkeypatch.setattr(nmt_train, "update_step", update)
    _tiny_run(bitext, tmp_path / "m.pt", 10, resume=True)
    _tiny_run(bitext, tmp_path / "straight.pt", 10)
    a = load_nmt(tmp_path / "straight.pt.last").model.state_dict()
    b = load_nmt(tmp_path / "m.pt.last").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_with_other_sizes_is_refused_in_one_line(models, bitext, tmp_path):
    model = tmp_path / "m.pt"
    model.write_bytes(models[0].read_bytes())
    args = ["train", str(bitext[0]), str(bitext[1]), str(model), *TINY, "--max-steps", "8", "--valid-every", "4",
            "--valid-lines", "10", "--bleu-sentences", "3", "--batch-size", "16", "--lr", "0.01", "-q",
            "--threads", "1", "--resume"]
    result = CliRunner().invoke(main, [*args, "--hidden", "16"])
    assert result.exit_code == 1
    assert result.output == (f"Error: cannot --resume: {model} was made with --hidden 8, now 16; resume with the same "
                             "sizes, or train into another MODEL\n")
    assert model.read_bytes() == models[0].read_bytes()
    assert CliRunner().invoke(main, [*args, "--max-steps", "9"]).exit_code == 0  # a stop may change


def test_a_nan_loss_stops_the_training_in_one_line_and_keeps_the_last_finite_model(bitext, tmp_path, monkeypatch):
    """A weight that turns NaN before the 5th update makes its loss NaN: the run stops there, naming the
    update and the option to lower, and the model files are those of the save at update 3."""
    update = nmt_train.update_step
    calls = itertools.count(1)

    def poisoned_at_the_5th(model, *args, **kwargs):
        if next(calls) == 5:
            with torch.no_grad():
                next(model.parameters()).fill_(math.nan)
        return update(model, *args, **kwargs)

    monkeypatch.setattr(nmt_train, "update_step", poisoned_at_the_5th)
    with pytest.raises(DivergedError) as caught:
        _tiny_run(bitext, tmp_path / "m.pt", 10)
    assert str(caught.value) == (f"the training loss became nan at update 5: the model diverged; {tmp_path / 'm.pt'} "
                                 f"and {tmp_path / 'm.pt.last'} keep the last finite state; train again with a "
                                 "smaller --lr")
    for name in ("m.pt", "m.pt.last"):
        kept = load_nmt(tmp_path / name)
        assert kept.train_state["step"] == 3
        assert all(torch.isfinite(w).all() for w in kept.model.state_dict().values())


def test_training_stops_for_time(bitext, tmp_path):
    result = _tiny_run(bitext, tmp_path / "m.pt", None, max_time=1e-6)
    assert result.stopped_by == "max_time" and result.steps == 1
    assert [v.step for v in result.history] == [0, 1]  # validated where time ran out


def test_translate_writes_the_beam_search_and_moses_nbest_lines(models, bitext, tmp_path):
    fr = bitext[0].read_text(encoding="utf-8").splitlines()[:4]
    runner = CliRunner()
    result = runner.invoke(main, ["translate", str(models[0]), "-", "-", "--beam", "3", "-q"],
                           input="\n".join(fr) + "\n")
    assert result.exit_code == 0, result.output
    loaded = load_nmt(models[0])
    expected = beam_search(loaded.model, loaded.src_subwords.encode(fr), 3)
    assert result.output.splitlines() == loaded.tgt_subwords.decode([h[0].ids for h in expected])
    (tmp_path / "in.fr").write_text("\n".join(fr) + "\n", encoding="utf-8")
    result = runner.invoke(main, ["translate", str(models[0]), str(tmp_path / "in.fr"), str(tmp_path / "nbest"),
                                  "--beam", "3", "--nbest", "2", "-q"])
    assert result.exit_code == 0, result.output
    entries = list(read_nbest(tmp_path / "nbest", expected_sentences=4))
    assert [e.sent_id for e in entries] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [e.features[0][1][0] for e in entries[::2]] == pytest.approx([h[0].log_prob for h in expected], rel=1e-5)


def test_score_and_nbest_give_log_p_in_both_directions(models, bitext, tmp_path):
    fr = bitext[0].read_text(encoding="utf-8").splitlines()[:3]
    en = bitext[1].read_text(encoding="utf-8").splitlines()[:3]
    (tmp_path / "src").write_text("\n".join(fr) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(en) + "\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(main, ["score", str(models[0]), str(tmp_path / "src"), str(tmp_path / "tgt"),
                                  "--reverse-model", str(models[1])])
    assert result.exit_code == 0, result.output
    values = np.array([[float(v) for v in line.split("\t")] for line in result.output.splitlines()])
    forward, reverse = load_nmt(models[0]), load_nmt(models[1])
    expected_forward = score_pairs(forward.model, forward.src_subwords.encode(fr), forward.tgt_subwords.encode(en))
    expected_reverse = score_pairs(reverse.model, reverse.src_subwords.encode(en), reverse.tgt_subwords.encode(fr))
    assert values[:, 0] == pytest.approx(expected_forward, abs=1e-5)
    assert values[:, 1] == pytest.approx(expected_reverse, abs=1e-5)
    # An n-best list of the references (and one other hypothesis) for sentences 0 and 1.
    lines = [f"0 ||| {en[0]} ||| LM0= -1 ||| -1", f"0 ||| {en[2]} ||| LM0= -2 ||| -2",
             f"1 ||| {en[1]} ||| LM0= -3 ||| -3"]
    (tmp_path / "nbest").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = runner.invoke(main, ["nbest", str(models[0]), str(tmp_path / "src"), str(tmp_path / "nbest"),
                                  str(tmp_path / "out"), "--reverse-model", str(models[1]), "-q"])
    assert result.exit_code == 0, result.output
    scored = [dict(e.features)["NMT0"] for e in read_nbest(tmp_path / "out")]
    assert scored[0] == pytest.approx(list(values[0]), rel=1e-5)  # Moses' 6 digits
    assert scored[2] == pytest.approx(list(values[1]), rel=1e-5)
    # The MERT feature registered in pyproject.toml computes the same two columns.
    feature = load_feature(f"NMT:{models[0]},reverse={models[1]}")
    assert feature.name == "NMT0" and feature.num_values == 2
    from_mert = feature.score(fr, list(read_nbest(tmp_path / "nbest")))
    assert from_mert == pytest.approx(np.array(scored), rel=1e-5)


@pytest.mark.parametrize(("src", "tgt", "message"), [
    ("a b\nc d\n", "x y\n", "src:2: line 2 has no counterpart: tgt has 1 lines, src 2"),
    ("a b\nc d\n", "x y\n \n", "tgt:2: empty line: every line of a bitext must be a sentence"),
    ("a b\n" + "c " * 251 + "\n", "x y\nz\n", "src:2: 251 words: a training sentence has at most 250 (clean the "
     "bitext: Moses' clean-corpus-n.perl … 1 80)"),
])
def test_a_bad_bitext_is_one_line_with_file_and_line(tmp_path, src, tgt, message):
    (tmp_path / "src").write_text(src, encoding="utf-8")
    (tmp_path / "tgt").write_text(tgt, encoding="utf-8")
    result = CliRunner().invoke(main, ["train", str(tmp_path / "src"), str(tmp_path / "tgt"),
                                       str(tmp_path / "m.pt"), *TINY])
    assert result.exit_code == 1
    assert result.output.strip().replace(f"{tmp_path}/", "") == f"Error: {message}"
    assert not (tmp_path / "m.pt").exists()


def test_a_vocabulary_too_small_for_a_sides_characters_names_that_file(tmp_path):
    chars = [chr(0x4E00 + i) for i in range(200)]
    (tmp_path / "zh").write_text("".join(" ".join(chars[i::25]) + "\n" for i in range(25)), encoding="utf-8")
    (tmp_path / "en").write_text("the cat\n" * 25, encoding="utf-8")
    result = CliRunner().invoke(main, ["train", str(tmp_path / "en"), str(tmp_path / "zh"), str(tmp_path / "m.pt"),
                                       *TINY])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"--vocab-size 400 is too small for {tmp_path / 'zh'}: its " in result.output  # the held-out lines' aside


@pytest.mark.parametrize("option", ["--embedding", "--hidden", "--alignment", "--maxout"])
def test_a_size_beyond_its_limit_is_one_line_before_any_work(tmp_path, option):
    (tmp_path / "src").write_text("a b\n" * 20, encoding="utf-8")
    (tmp_path / "tgt").write_text("x y\n" * 20, encoding="utf-8")
    result = CliRunner().invoke(main, ["train", str(tmp_path / "src"), str(tmp_path / "tgt"),
                                       str(tmp_path / "m.pt"), option, "1000000"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"'{option}'" in result.output and "is not in the range" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "tgt"]


def test_a_model_file_of_another_kind_is_one_line(tmp_path):
    other = tmp_path / "cslm.pt"
    write_model_file(other, "moses-rnn-rescorer-cslm", 1, {"config": {}})
    (tmp_path / "in").write_text("a b\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["translate", str(other), str(tmp_path / "in"), "-"])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {other}: not a NMT model file (no 'moses-rnn-rescorer-nmt' marker)"


@pytest.mark.parametrize(("nbest", "sources", "message"), [
    ("0 ||| a ||| LM0= -1 ||| -1\n2 ||| b ||| LM0= -1 ||| -1\n", "x\ny\nz\n",
     "nbest:2: sentence id 2 follows id 0: sentence id 1 is missing"),
    ("0 ||| a ||| LM0= -1 ||| -1\n1 ||| b ||| LM0= -1 ||| -1\n", "x\n",
     "nbest:2: sentence id 1 but the source src has 1 lines"),
])
def test_a_bad_nbest_list_is_one_line_with_file_and_line(models, tmp_path, nbest, sources, message):
    (tmp_path / "nbest").write_text(nbest, encoding="utf-8")
    (tmp_path / "src").write_text(sources, encoding="utf-8")
    result = CliRunner().invoke(main, ["nbest", str(models[0]), str(tmp_path / "src"), str(tmp_path / "nbest"),
                                       str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.strip().replace(f"{tmp_path}/", "") == f"Error: {message}"
    assert not (tmp_path / "out").exists()


def test_a_resume_on_moved_data_names_the_file_before_the_bitext_is_read(bitext, tmp_path, monkeypatch):
    """It said "trained on other data (or other settings) than SRC and TGT", after the bitext was read and
    encoded; now the file that differs is named, before it is read. A state written before the record was
    kept (its digest only) is still told from other data, and resumes on the same."""
    src, tgt = tmp_path / "train.fr", tmp_path / "train.en"
    src.write_bytes(bitext[0].read_bytes())
    tgt.write_bytes(bitext[1].read_bytes())
    _tiny_run((src, tgt), tmp_path / "m.pt", 3)
    moved = tmp_path / "moved.en"
    tgt.rename(moved)
    monkeypatch.setattr(nmt_train, "read_bitext", lambda *args: pytest.fail("the bitext was read"))
    with pytest.raises(UserError) as refused:
        _tiny_run((src, moved), tmp_path / "m.pt", 6, resume=True)
    assert str(refused.value).startswith(f"cannot --resume: {tmp_path / 'm.pt.last'} was made with TGT {tgt} (")
    assert str(refused.value).endswith("; resume on the same data, or train into another MODEL (a copied or touched "
                                       "file counts as other data)")
    moved.rename(tgt)
    monkeypatch.undo()
    assert _tiny_run((src, tgt), tmp_path / "m.pt", 6, resume=True).steps == 6
    state = load_nmt(tmp_path / "m.pt.last").train_state
    assert state["data_record"]["tgt"]["path"] == str(tgt)


def test_translate_refuses_a_beam_wider_than_any_model_needs_in_one_line(models, tmp_path):
    """--beam 100000 ran for minutes on one short line before anyone could tell why (and asks a shortlist of
    8,000 units for 800M candidates a step); it is now refused as the command line is read."""
    result = CliRunner().invoke(main, ["translate", str(models[0]), "-", str(tmp_path / "out"), "--beam", "100000"],
                                input="bonjour\n")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "Invalid value for '--beam': 100000 is not in the range 1<=x<=1000." in result.output
    assert not (tmp_path / "out").exists()
