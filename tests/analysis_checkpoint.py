"""A small random-weight checkpoint over a real table's words, for the analysis commands' tests.

The analysis commands read whatever model they are given; a trained one is not needed to check
that they compute the right things (the tests compare them with direct computations), and
training in every test run would cost minutes on two cores.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import torch

from moses_integration.tokens import split_tokens
from neural.vocab import Vocab
from rescorer.model.checkpoint import save_checkpoint
from rescorer.model.config import ModelConfig, TrainConfig
from rescorer.model.network import RNNEncoderDecoder

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TABLE = REPO_ROOT / "examples" / "phrase-table.en-fr.gz"


def table_vocabularies(table: Path, shortlist: int = 3000) -> tuple[Vocab, Vocab]:
    source, target = Vocab.count_tokens([]), Vocab.count_tokens([])
    with gzip.open(table, "rt", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split(" ||| ")
            source.update(split_tokens(fields[0]))
            target.update(split_tokens(fields[1]))
    return Vocab.from_counts(source, shortlist), Vocab.from_counts(target, shortlist)


def write_random_checkpoint(table: Path, out: Path, *, seed: int = 5, history: list[dict] | None = None,
                            direction: str = "forward") -> Path:
    """Save a seeded random model (hidden 16) whose shortlists hold the table's words.

    ``direction``: "reverse" saves it as ``rescorer train --reverse`` would, for the commands that must refuse it.

    ``history`` goes into the train state as the trainer writes it (step, log-likelihood,
    perplexity per validation), for the report's training curve.
    """
    src_vocab, tgt_vocab = table_vocabularies(table)
    torch.manual_seed(seed)
    config = ModelConfig(src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab), hidden=16, embedding=8,
                         maxout_units=8, output_rank=8, init_std=0.3, direction=direction)
    model = RNNEncoderDecoder(config)
    state = {"step": history[-1]["step"], "history": history} if history else None
    return save_checkpoint(out, model=model, config=config, src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                           train_config=TrainConfig(), train_state=state)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])
