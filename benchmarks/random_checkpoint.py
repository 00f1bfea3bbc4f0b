"""A checkpoint with random weights for a table: speed does not depend on the weights' values.

Usage: python -m benchmarks.random_checkpoint TABLE OUT.pt [--size paper|small|tiny] [--seed 0]

The shortlists are the 15,000 most frequent words of each side of the table's first 200,000 lines
(what a model trained on the table would have), so the scorer sees the table's real share of
unknown words. Used by ``benchmarks/pipeline_speed.py`` (start-up) and ``benchmarks/gpu_suite.sh``.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
from collections import Counter
from pathlib import Path

SIZES = {
    "paper": {"hidden": 1000, "embedding": 100, "maxout_units": 500, "output_rank": 100},
    "small": {"hidden": 256, "embedding": 64, "maxout_units": 128, "output_rank": 64},
    "tiny": {"hidden": 16, "embedding": 8, "maxout_units": 8, "output_rank": 8},
}


def shortlists(table: Path, lines: int = 200_000, size: int = 15000) -> tuple[list[str], list[str]]:
    """The ``size`` most frequent words of each side of the table's first ``lines`` lines, as Vocab words."""
    from neural.vocab import Vocab

    src, tgt = Counter(), Counter()
    with gzip.open(table) as fh:
        for line in itertools.islice(fh, lines):
            fields = line.split(b" ||| ")
            src.update(fields[0].decode().split())
            tgt.update(fields[1].decode().split())
    return Vocab.from_counts(src, size).words, Vocab.from_counts(tgt, size).words


def write_random_checkpoint(table: Path, out: Path, size: str = "paper", seed: int = 0) -> Path:
    import torch

    from neural.vocab import Vocab
    from rescorer.model.checkpoint import save_checkpoint
    from rescorer.model.config import ModelConfig
    from rescorer.model.network import RNNEncoderDecoder

    src, tgt = (Vocab(words) for words in shortlists(table))
    config = ModelConfig(src_vocab_size=len(src), tgt_vocab_size=len(tgt), **SIZES[size])
    torch.manual_seed(seed)
    return save_checkpoint(out, model=RNNEncoderDecoder(config), config=config, src_vocab=src, tgt_vocab=tgt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("table", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="paper")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_random_checkpoint(args.table, args.out, args.size, args.seed)
    print(f"wrote {args.out} ({args.size} size, random weights, seed {args.seed})")


if __name__ == "__main__":
    main()
