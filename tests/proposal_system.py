"""A small system for ``rescorer propose``'s tests: Moses-style word tables and a model that ends targets."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from pathlib import Path

import torch

from analysis_checkpoint import EXAMPLE_TABLE, write_random_checkpoint
from moses_integration.tokens import split_tokens
from neural.vocab import EOS_ID, UNK_ID
from rescorer.model.checkpoint import load_checkpoint, save_checkpoint
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.pipeline.rescore import RescoreOptions
from rescorer.proposals.propose import ProposeOptions
from rescorer.training.train import train_on_phrase_table

#: The moses.ini beside the example table.
EXAMPLE_INI = EXAMPLE_TABLE.parent / "moses.ini"


def write_word_tables(table: Path, folder: Path) -> None:
    """lex.f2e / lex.e2f as train-model.perl estimates them, here from the table's aligned words."""
    joint: Counter = Counter()
    with gzip.open(table, "rt", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split(" ||| ")
            src, tgt = split_tokens(fields[0]), split_tokens(fields[1])
            for link in fields[3].split():
                j, i = map(int, link.split("-"))
                joint[src[j], tgt[i]] += 1
    by_f, by_e = Counter(), Counter()
    for (f, e), n in joint.items():
        by_f[f] += n
        by_e[e] += n
    (folder / "lex.f2e").write_text("".join(f"{e} {f} {n / by_f[f]:.7f}\n" for (f, e), n in joint.items()))
    (folder / "lex.e2f").write_text("".join(f"{f} {e} {n / by_e[e]:.7f}\n" for (f, e), n in joint.items()))


def write_model(table: Path, out: Path) -> Path:
    """A seeded random model over the table's words whose targets end within a few words."""
    write_random_checkpoint(table, out)
    checkpoint = load_checkpoint(out)
    with torch.no_grad():
        checkpoint.model.out_vocab.bias[EOS_ID] += 2.0
        checkpoint.model.out_vocab.bias[UNK_ID] -= 20.0
    return save_checkpoint(out, model=checkpoint.model, config=checkpoint.config, src_vocab=checkpoint.src_vocab,
                           tgt_vocab=checkpoint.tgt_vocab)


def example_system(folder: Path) -> Path:
    """``folder`` with the example table, its word tables and a forward model (``model.pt``) beside it."""
    shutil.copy(EXAMPLE_TABLE, folder / "phrase-table.gz")
    write_word_tables(folder / "phrase-table.gz", folder)
    write_model(folder / "phrase-table.gz", folder / "model.pt")
    return folder


def propose_options(**kwargs) -> ProposeOptions:
    """The tests' options: on the CPU, in this process, quiet."""
    return ProposeOptions(rescore=RescoreOptions(progress=False, device="cpu", workers=0), **kwargs)


def pair_log_p(checkpoint, source: str, target: str) -> float:
    """log p(target | source) by the model's own scoring, one pair at a time: the reference the
    proposals' scores are checked against."""
    src = checkpoint.src_vocab.encode(split_tokens(source), add_eos=True)
    tgt = checkpoint.tgt_vocab.encode(split_tokens(target), add_eos=True)
    with torch.no_grad():
        c = checkpoint.model.encode(torch.tensor([src]), torch.tensor([len(src)]))
        return float(checkpoint.model.score_targets(c, torch.tensor([tgt]), torch.tensor([len(tgt)])))


def write_reverse_model(table: Path, out: Path) -> Path:
    """A tiny reverse model (p(source|target), ``rescorer train --reverse``) trained 20 updates on the
    table: enough that its scores differ between targets, which a random one's hardly do."""
    sizes = ModelSizes(hidden=16, embedding=8, maxout_units=8, output_rank=8, init_std=0.3, direction="reverse")
    train_on_phrase_table(str(table), out, model_sizes=sizes, shortlist=3000, device="cpu", progress=False,
                          train_config=TrainConfig(max_steps=20, valid_every=10, patience=None, seed=7))
    return out
