"""How the stored checkpoints here were made: tiny RNN and CSLM trainings, run with the code of the
commit that added this folder, so that later code is tested against files it did not write.

    python tests/data/old_checkpoints/make.py   (from the repository root, SHARED_DATA_DIR set)

``rnn/``: the RNN's latest state after 4 steps (``m.pt.last``) and, for comparison, after 8 steps
in one go (``straight.pt.last``) on ``table.txt``. ``cslm/``: the CSLM's after 1 epoch (``m.pt.last``)
and after 2 epochs in one go (``straight.pt.last``) on ``fr.txt``. Each file is some 12-40 KB: the
smallest models the trainings take, most of the bytes torch's archive around each tensor.
"""

from __future__ import annotations

import gzip
import itertools
import shutil
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from cslm.model import CSLMConfig  # noqa: E402
from cslm.train import CSLMTrainConfig, train_cslm  # noqa: E402
from rescorer.model.config import ModelSizes, TrainConfig  # noqa: E402
from rescorer.training.train import train_on_phrase_table  # noqa: E402
from shared_paths import shared_file  # noqa: E402

RNN_SIZES = ModelSizes(hidden=6, embedding=4, maxout_units=4, output_rank=3, init_std=0.1)
CSLM_CONFIG = CSLMConfig(vocab_size=2, order=3, embedding=4, hidden=[6])


def rnn_config(steps: int) -> TrainConfig:
    return TrainConfig(max_steps=steps, valid_every=2, patience=None, seed=7, batch_size=8)


def cslm_config(epochs: int) -> CSLMTrainConfig:
    return CSLMTrainConfig(max_epochs=epochs, batch_size=32, epoch_size=256, checkpoint_every=0.0)


def make_rnn(work: Path) -> None:
    out = HERE / "rnn"
    out.mkdir(exist_ok=True)
    with gzip.open(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"), "rt", encoding="utf-8") as fh:
        lines = [" ||| ".join(line.split(" ||| ")[:3]) + "\n" for line in itertools.islice(fh, 0, None, 60)]
    (out / "table.txt").write_text("".join(lines), encoding="utf-8")
    kw = dict(model_sizes=RNN_SIZES, shortlist=20, device="cpu", progress=False)
    train_on_phrase_table(str(out / "table.txt"), work / "straight.pt", train_config=rnn_config(8), **kw)
    train_on_phrase_table(str(out / "table.txt"), work / "m.pt", train_config=rnn_config(4), **kw)
    for name in ("straight.pt.last", "m.pt.last"):
        shutil.copy(work / name, out / name)


def make_cslm(work: Path) -> None:
    out = HERE / "cslm"
    out.mkdir(exist_ok=True)
    with gzip.open(shared_file("data/hansard/hansard.fr.gz"), "rt", encoding="utf-8") as fh:
        lines = list(itertools.islice(fh, 20000, 20080))
    corpus = work / "fr.txt"
    corpus.write_text("".join(lines), encoding="utf-8")
    shutil.copy(corpus, out / "fr.txt")
    kw = dict(model_config=CSLM_CONFIG, shortlist=30, device="cpu", progress=False)
    train_cslm(str(corpus), work / "straight.pt", train_config=cslm_config(2), **kw)
    train_cslm(str(corpus), work / "m.pt", train_config=cslm_config(1), **kw)
    for name in ("straight.pt.last", "m.pt.last"):
        shutil.copy(work / name, out / name)


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "rnn").mkdir()
        (Path(tmp) / "cslm").mkdir()
        make_rnn(Path(tmp) / "rnn")
        make_cslm(Path(tmp) / "cslm")


if __name__ == "__main__":
    main()
