"""Cases a Moses user hits in the first week: tokenisation, early checks, loadable output.

Each test here reproduces a defect found by trying the tool on real tables (issue 8) with a tiny
hand-built model, so the checks run in seconds.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest
import torch

from rescorer.checkpoint import Checkpoint
from rescorer.config import ModelConfig
from rescorer.model import RNNEncoderDecoder
from rescorer.rescore import RescoreOptions, rescore_phrase_table
from rescorer.scoring import ScoringOptions
from rescorer.vocab import EOS, UNK, Vocab

NBSP = "\u00a0"
WORDS = ["la", "maison", "the", "house", "a", "b", "c"]


@pytest.fixture(scope="module")
def tiny_checkpoint() -> Checkpoint:
    vocab = Vocab([EOS, UNK, *WORDS])
    config = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), hidden=8, embedding=4,
                         maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, vocab, vocab)


def run(inp: Path, out: Path, ck: Checkpoint, **kw):
    opts = RescoreOptions(progress=False, device="cpu", workers=0, scoring=ScoringOptions(token_budget=512), **kw)
    return rescore_phrase_table(str(inp), str(out), ck, opts)


def added_columns(path: Path) -> list[list[float]]:
    lines = gzip.decompress(path.read_bytes()).decode().splitlines() if path.suffix == ".gz" else \
        path.read_text(encoding="utf-8").splitlines()
    return [[float(x) for x in line.split(" ||| ")[2].split(" ")[-2:]] for line in lines]


def test_no_break_space_makes_one_unknown_token_in_the_penalty(tmp_path: Path, tiny_checkpoint) -> None:
    table = tmp_path / "pt.txt"
    table.write_text(
        f"the house ||| la{NBSP}maison ||| 0.5 0.5 0.5 0.5\n"  # one token, unknown to the model
        "the house ||| la maison ||| 0.5 0.5 0.5 0.5\n"  # two known tokens
        "the\thouse ||| la\t\tmaison  ||| 0.5 0.5 0.5 0.5\n",  # tab and repeated spaces separate
        encoding="utf-8",
    )
    out = tmp_path / "out.txt"
    run(table, out, tiny_checkpoint)
    penalty = [cols[1] for cols in added_columns(out)]
    assert penalty[0] == pytest.approx(math.exp(-1), rel=1e-5)
    assert penalty[1] == 1.0 and penalty[2] == 1.0
