"""Fixtures of the pipeline tests: the tiny model (tests/tiny_rescore.py), its file, and a guard that no work starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_rescore import WORDS

from neural.vocab import EOS, UNK, Vocab
from rescorer.model.checkpoint import Checkpoint, save_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder


@pytest.fixture(scope="module")
def tiny_checkpoint() -> Checkpoint:
    vocab = Vocab([EOS, UNK, *WORDS])
    config = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), hidden=8, embedding=4,
                         maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, vocab, vocab)


@pytest.fixture
def model_file(tmp_path_factory, tiny_checkpoint) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.pt"
    ck = tiny_checkpoint
    save_checkpoint(path, model=ck.model, config=ck.config, src_vocab=ck.src_vocab, tgt_vocab=ck.tgt_vocab)
    return path


@pytest.fixture
def no_work(monkeypatch) -> None:
    """Training, scoring or reading the table fails the test (and cannot hang on a bad value)."""

    def started(*_a, **_k):
        raise AssertionError("work started before the bad value was refused")

    monkeypatch.setattr("rescorer.pipeline.train_or_load.train_on_phrase_table", started)
    monkeypatch.setattr("rescorer.pipeline.train_or_load.Models.load", started)
    monkeypatch.setattr("rescorer.pipeline.reader.iter_line_chunks", started)
