"""Training: perplexity falls on real pairs, and a killed run resumes to the same model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from held_output import held_by_another_process
from infrastructure.errors import UserError
from infrastructure.files import InUseError
from rescorer.model.checkpoint import load_checkpoint
from rescorer.model.config import ModelConfig, ModelSizes, TrainConfig
from rescorer.training.train import train_on_phrase_table
from shared_paths import shared_file

SMALL = ModelSizes(hidden=48, embedding=24, maxout_units=24, output_rank=24)


def run(table: str, out: Path, steps: int, resume: bool = False, **kw):
    cfg = TrainConfig(max_steps=steps, valid_every=kw.pop("valid_every", 4), patience=None, seed=7,
                      batch_size=kw.pop("batch_size", 64), checkpoint_every=kw.pop("checkpoint_every", 600.0))
    return train_on_phrase_table(table, out, model_sizes=SMALL, train_config=cfg, shortlist=kw.pop("shortlist", 300),
                                 device="cpu", resume=resume, progress=False, **kw)


@pytest.mark.slow
def test_validation_perplexity_falls_on_real_pairs(tmp_path):
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    result = run(table, tmp_path / "m.pt", 120, valid_every=40, shortlist=2000)
    first, best = result.history[0], result.best
    assert best.step > 0
    assert best.perplexity < 0.7 * first.perplexity, [v.perplexity for v in result.history]
    last = load_checkpoint(tmp_path / "m.pt.last")
    assert last.train_state["step"] == 120
    best = load_checkpoint(tmp_path / "m.pt")  # the model file holds the best validation point
    assert best.train_state["step"] == result.best.step
    assert len(best.src_vocab) == best.config.src_vocab_size <= 2001


def test_resume_continues_to_the_same_model(tmp_path):
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    run(table, tmp_path / "straight.pt", 8)
    run(table, tmp_path / "killed.pt", 4)
    run(table, tmp_path / "killed.pt", 8, resume=True)
    a = load_checkpoint(tmp_path / "straight.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "killed.pt").model.state_dict()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_resume_refuses_another_recipe_by_name_and_takes_other_stops(tmp_path):
    """The updates after a resume with another --batch-size would be another training's, spliced on."""
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    run(table, tmp_path / "m.pt", 2)
    with pytest.raises(UserError) as refused:
        run(table, tmp_path / "m.pt", 4, resume=True, batch_size=32)
    assert str(refused.value) == (f"cannot --resume: {tmp_path / 'm.pt.last'} was made with --batch-size 64, now 32; "
                                  "resume with the same options, or train into another MODEL")
    with pytest.raises(UserError) as refused:
        train_on_phrase_table(table, tmp_path / "m.pt", model_sizes=replace(SMALL, hidden=32),
                              train_config=TrainConfig(max_steps=4, valid_every=4, patience=None, seed=7),
                              shortlist=300, device="cpu", resume=True, progress=False)
    assert str(refused.value) == (f"cannot --resume: {tmp_path / 'm.pt.last'} was made with --hidden 48, now 32; "
                                  "resume with the same sizes, or train into another MODEL")
    # How often it validates may differ: rescore-phrase-table's --train-steps sets it (TrainConfig.for_budget).
    assert run(table, tmp_path / "m.pt", 4, resume=True, checkpoint_every=0, valid_every=2).steps == 4


def test_resume_refuses_other_data(tmp_path):
    table = shared_file("fixtures/hansard-enfr/phrase-table.sample.gz")
    run(str(table), tmp_path / "m.pt", 2)
    other = tmp_path / "other.txt"
    other.write_text("a ||| b ||| 1 1 1 1\n" * 3 + "c d ||| e ||| 1 1 1 1\n" * 30 + "".join(
        f"w{i} ||| v{i} ||| 1 1 1 1\n" for i in range(40)))
    with pytest.raises(UserError) as refused:
        run(str(other), tmp_path / "m.pt", 4, resume=True)
    # it named m.pt.data/pairs.ids.arrow, a file of the run's own, not the table the user gave
    assert str(refused.value) == f"{tmp_path / 'm.pt.last'}: trained on other data (or other settings) than {other}; " \
        "cannot resume"


def test_resume_of_a_finished_timed_run_trains_no_more(tmp_path):
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    cfg = TrainConfig(max_time=0.2, valid_every=1000, patience=None, seed=7)
    kw = dict(model_sizes=SMALL, train_config=cfg, shortlist=300, device="cpu", progress=False)
    first = train_on_phrase_table(table, tmp_path / "m.pt", **kw)
    saved = {p.name: p.read_bytes() for p in (tmp_path / "m.pt", tmp_path / "m.pt.last")}
    again = train_on_phrase_table(table, tmp_path / "m.pt", resume=True, **kw)
    assert again.steps == first.steps and again.stopped_by == "max_time"
    assert {p.name: p.read_bytes() for p in (tmp_path / "m.pt", tmp_path / "m.pt.last")} == saved


def test_training_without_gradient_clipping(tmp_path):
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    cfg = TrainConfig(max_steps=3, valid_every=3, patience=None, seed=7, clip_norm=None)
    result = train_on_phrase_table(table, tmp_path / "m.pt", model_sizes=SMALL, train_config=cfg, shortlist=300,
                                   device="cpu", progress=False)
    assert result.steps == 3 and load_checkpoint(tmp_path / "m.pt").train_config.clip_norm is None


def test_source_gain_equals_brute_force_and_is_zero_for_a_source_blind_model(tmp_path):
    """The validation 'source gain' is mean log p(Y|X) − log p(Y|X') with X' the next pair's source."""
    from rescorer.model.network import RNNEncoderDecoder
    from rescorer.training.data import PairData
    from rescorer.training.train import evaluate, prepare_data

    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    ids_path, src_vocab, tgt_vocab = prepare_data(table, tmp_path / "data", shortlist=300, progress=False)
    data = PairData(ids_path, seed=3)
    config = ModelConfig(src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab), hidden=16, embedding=8,
                         maxout_units=8, output_rank=8, init_std=0.3)
    torch.manual_seed(0)
    model = RNNEncoderDecoder(config).double()
    idx = data.valid_idx[:40]
    ll, _, gain = evaluate(model, data, idx, torch.device("cpu"), batch_size=16)

    order = idx[np.argsort(data.target_lengths(idx), kind="stable")]
    own, other = [], []
    for start in range(0, len(order), 16):  # brute force: each pair on its own
        rows = order[start:start + 16]
        for k, row in enumerate(rows):
            src, src_len, tgt, tgt_len = data.batch(np.array([row]))
            osrc, osrc_len, _, _ = data.batch(np.array([rows[k - 1]]))  # roll by one: the previous row's source
            with torch.no_grad():
                own.append(float(model(src, src_len, tgt, tgt_len)))
                other.append(float(model(osrc, osrc_len, tgt, tgt_len)))
    assert ll == pytest.approx(np.mean(own), abs=1e-9)
    assert gain == pytest.approx(np.mean(own) - np.mean(other), abs=1e-9)
    assert abs(gain) > 1e-3  # this random model does depend on the source

    with torch.no_grad():  # cut every path from c to the output: the gain must vanish
        for layer in (model.dec_init, model.dec_context, model.out_context):
            layer.weight.zero_()
    assert evaluate(model, data, idx, torch.device("cpu"), batch_size=16)[2] == pytest.approx(0.0, abs=1e-9)


def test_training_into_a_held_model_stops_before_touching_its_files(tmp_path):
    """A second ``rescorer train --resume`` while the first still trains: its model, state and data stay."""
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    run(table, tmp_path / "m.pt", 2)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with held_by_another_process(tmp_path / "m.pt") as holder, \
            pytest.raises(InUseError, match=f"m.pt is in use by pid {holder.pid} "):
        run(table, tmp_path / "m.pt", 4, resume=True)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_training_again_without_resume_keeps_the_trained_model(tmp_path):
    """Forgetting --resume must not overwrite hours of training at the new run's first save."""
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    run(table, tmp_path / "m.pt", 2)
    before = (tmp_path / "m.pt").read_bytes()
    with pytest.raises(UserError, match=r"m\.pt already exists: pass --resume to continue that training"):
        run(table, tmp_path / "m.pt", 4)
    assert (tmp_path / "m.pt").read_bytes() == before
    assert load_checkpoint(tmp_path / "m.pt.last").train_state["step"] == 2


def test_reverse_model_trains_on_the_swapped_pairs_with_swapped_shortlists(tmp_path):
    """`rescorer train --reverse` reads every unique pair target-first: its data are the forward
    model's, sides exchanged, id for id, and its shortlists are the forward ones exchanged."""
    from dataclasses import replace

    from rescorer.training.data import PairData

    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    run(table, tmp_path / "fwd.pt", 2)
    cfg = TrainConfig(max_steps=2, valid_every=4, patience=None, seed=7)
    train_on_phrase_table(table, tmp_path / "rev.pt", model_sizes=replace(SMALL, direction="reverse"),
                          train_config=cfg, shortlist=300, device="cpu", progress=False)
    fwd, rev = load_checkpoint(tmp_path / "fwd.pt"), load_checkpoint(tmp_path / "rev.pt")
    assert (fwd.config.direction, rev.config.direction) == ("forward", "reverse")
    assert rev.src_vocab.words == fwd.tgt_vocab.words and rev.tgt_vocab.words == fwd.src_vocab.words
    assert (rev.config.src_vocab_size, rev.config.tgt_vocab_size) == (fwd.config.tgt_vocab_size,
                                                                       fwd.config.src_vocab_size)
    f = PairData(tmp_path / "fwd.pt.data" / "pairs.ids.arrow")
    r = PairData(tmp_path / "rev.pt.data" / "pairs.ids.arrow")
    assert f.num_pairs == r.num_pairs > 1000
    assert np.array_equal(r.src_offsets, f.tgt_offsets) and np.array_equal(r.src_ids, f.tgt_ids)
    assert np.array_equal(r.tgt_offsets, f.src_offsets) and np.array_equal(r.tgt_ids, f.src_ids)
    with pytest.raises(UserError, match="trains a reverse model; resume it with --reverse"):
        run(table, tmp_path / "rev.pt", 4, resume=True)


def test_rescorer_train_reverse_saves_the_direction_with_the_model(tmp_path):
    from click.testing import CliRunner

    from rescorer.cli import main

    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    res = CliRunner().invoke(main, ["train", table, str(tmp_path / "rev.pt"), "--reverse", "--max-steps", "1",
                                    "--valid-every", "1", "--hidden", "16", "--embedding", "8", "--maxout-units", "8",
                                    "--output-rank", "8", "--shortlist", "200", "--device", "cpu", "--quiet"])
    assert res.exit_code == 0, res.output
    assert load_checkpoint(tmp_path / "rev.pt").config.direction == "reverse"


@pytest.mark.parametrize("stop", [BrokenPipeError(32, "Broken pipe"), KeyboardInterrupt()])
def test_a_resume_stopped_while_it_prepares_the_data_leaves_no_text_pairs(tmp_path, monkeypatch, stop):
    """A ``--resume`` whose stderr pipe breaks (or that is stopped) while it encodes the pairs: the
    text pairs (``MODEL.data/pairs.text.arrow``, ~7 MB for a filtered table) go, though the folder
    stays for the next resume; left there, each later resume on a nearly full disk failed on them."""
    import os

    from rescorer.training import data

    table = str(tmp_path / "table.gz")
    Path(table).write_bytes(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz").read_bytes())
    run(table, tmp_path / "m.pt", 2)
    os.utime(table, (1e9, 1e9))  # not the table the ids were made from, as far as a resume can tell: read again

    def encoding_stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr(data, "encode_pairs", encoding_stopped)
    with pytest.raises(type(stop)):
        run(table, tmp_path / "m.pt", 4, resume=True)
    assert sorted(p.name for p in (tmp_path / "m.pt.data").iterdir()) == ["pairs.ids.arrow"]
    monkeypatch.undo()
    assert run(table, tmp_path / "m.pt", 4, resume=True).history[-1].step == 4


def test_resume_reuses_the_encoded_pairs_of_the_same_table(tmp_path, monkeypatch, capsys):
    """Extracting a real table's pairs takes minutes on every resume: the same table (path, size, time) is
    not read again, and the training goes on to the same model; a table changed since is read again, and
    refused as other data."""
    import rescorer.training.data as data

    table = tmp_path / "table.gz"
    table.write_bytes(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz").read_bytes())
    run(str(table), tmp_path / "straight.pt", 8)
    run(str(table), tmp_path / "killed.pt", 4)

    def no_extraction(*args, **kwargs):
        raise AssertionError("the table was read again")

    with monkeypatch.context() as patched:
        patched.setattr(data, "extract_unique_pairs", no_extraction)
        train_on_phrase_table(str(table), tmp_path / "killed.pt", model_sizes=SMALL,
                              train_config=TrainConfig(max_steps=8, valid_every=4, patience=None, seed=7,
                                                       batch_size=64), shortlist=300, device="cpu", resume=True)
    assert "pairs, encoded by an earlier run" in capsys.readouterr().err
    a = load_checkpoint(tmp_path / "straight.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "killed.pt").model.state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    table.write_text("a ||| b ||| 1 1 1 1\n" * 3 + "c d ||| e ||| 1 1 1 1\n" * 30)
    with pytest.raises(UserError, match="trained on other data"):
        run(str(table), tmp_path / "killed.pt", 12, resume=True)
