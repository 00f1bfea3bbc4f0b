"""Training states written by earlier code still load and resume.

``tests/data/old_checkpoints`` holds tiny RNN and CSLM trainings stopped half-way (``m.pt.last``) and
the same trainings run straight to their end (``straight.pt.last``), written by the code of the commit
that added them (its ``make.py`` says how). Resuming a stopped one with today's code must end where the
straight run ended: the same position, validations and weights, and a state of the same keys in the
same order, so that the files a resumed run writes are the files it always wrote.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from cslm.model import CSLMConfig
from cslm.model_file import load_cslm
from cslm.train import CSLMTrainConfig, prepare_corpus, train_cslm
from rescorer.model.checkpoint import load_checkpoint
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.training.train import train_on_phrase_table

STORED = Path(__file__).resolve().parents[1] / "data" / "old_checkpoints"
# What tests/data/old_checkpoints/make.py trained with.
RNN_SIZES = ModelSizes(hidden=6, embedding=4, maxout_units=4, output_rank=3, init_std=0.1)
CSLM_CONFIG = CSLMConfig(vocab_size=2, order=3, embedding=4, hidden=[6])
CSLM_TRAINING = CSLMTrainConfig(max_epochs=2, batch_size=32, epoch_size=256, checkpoint_every=0.0)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _same_tensors(a: object, b: object, where: str = "") -> None:
    """Equal structure, equal plain values, tensors equal to float rounding (another CPU may round otherwise)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape, where
        assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-7), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            _same_tensors(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_tensors(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6), where
    else:
        assert a == b, where


def _same_state(resumed: dict, straight: dict, *, moved: tuple[str, ...] = ()) -> None:
    """The resumed run's state is the straight run's, key for key in the same order; the clock
    differs (two runs), and so do the ``moved`` keys."""
    assert list(resumed) == list(straight)
    for key in straight:
        if key == "history":
            _same_tensors([{k: v for k, v in h.items() if k != "elapsed"} for h in resumed[key]],
                          [{k: v for k, v in h.items() if k != "elapsed"} for h in straight[key]], key)
        elif key not in ("elapsed", *moved):
            _same_tensors(resumed[key], straight[key], key)


def test_a_stored_rnn_run_resumes_to_where_the_straight_run_ended(tmp_path):
    for name in ("table.txt", "m.pt.last"):
        shutil.copy(STORED / "rnn" / name, tmp_path / name)
    stopped = load_checkpoint(tmp_path / "m.pt.last").train_state
    assert stopped is not None and stopped["step"] == 4
    result = train_on_phrase_table(
        str(tmp_path / "table.txt"), tmp_path / "m.pt", model_sizes=RNN_SIZES, shortlist=20, device="cpu",
        train_config=TrainConfig(max_steps=8, valid_every=2, patience=None, seed=7, batch_size=8), resume=True,
        progress=False)
    assert (result.steps, result.stopped_by) == (8, "max_steps")
    assert [v.step for v in result.history] == [0, 2, 4, 6, 8]
    straight, resumed = load_checkpoint(STORED / "rnn" / "straight.pt.last"), load_checkpoint(tmp_path / "m.pt.last")
    _same_state(resumed.train_state, straight.train_state)
    _same_tensors(resumed.model.state_dict(), straight.model.state_dict())
    _same_tensors(resumed.optimizer_state, straight.optimizer_state)
    assert load_checkpoint(tmp_path / "m.pt").train_state["step"] == 8  # the best: the likelihood still grows


def test_a_stored_cslm_run_resumes_to_where_the_straight_run_ended(tmp_path):
    corpus = tmp_path / "fr.txt"
    shutil.copy(STORED / "cslm" / "fr.txt", corpus)
    # A CSLM's data fingerprint holds the corpus's path and time, so a run cannot move: the stored one
    # is moved here by giving it the fingerprint a run on this copy computes; all else is as stored.
    stored = torch.load(STORED / "cslm" / "m.pt.last", weights_only=True)
    _, _, _, fingerprint = prepare_corpus(str(corpus), tmp_path / "m.pt.data", shortlist=30, order=3,
                                          vocab=load_cslm(STORED / "cslm" / "m.pt.last").vocab, progress=False)
    stored["train_state"]["data"] = fingerprint
    torch.save(stored, tmp_path / "m.pt.last")
    assert (stored["train_state"]["epoch"], stored["train_state"]["position"]) == (1, 0)
    result = train_cslm(str(corpus), tmp_path / "m.pt", model_config=CSLM_CONFIG, train_config=CSLM_TRAINING,
                        shortlist=30, device="cpu", resume=True, progress=False)
    assert (result.epochs, result.examples, result.stopped_by) == (2, 512, "max_epochs")
    straight, resumed = load_cslm(STORED / "cslm" / "straight.pt.last"), load_cslm(tmp_path / "m.pt.last")
    _same_state(resumed.train_state, straight.train_state, moved=("data",))
    assert resumed.train_config == straight.train_config
    _same_tensors(resumed.model.state_dict(), straight.model.state_dict())
    _same_tensors(resumed.optimizer_state, straight.optimizer_state)
