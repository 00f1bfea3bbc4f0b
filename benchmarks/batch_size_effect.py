"""What a larger ``--batch-size`` does to validation perplexity per wall-clock second.

Usage: python -m benchmarks.batch_size_effect [--batch-sizes 64,128,256] [--max-time 120] [--threads 1]
       [--table ../shared/fixtures/hansard-enfr/phrase-table.sample.gz] [--size small] [--device cpu]

Trains the same model (``--size``: SCALE=small's RNN, or ``tiny``) on the unique pairs of
``--table`` once per batch size, for ``--max-time`` seconds each, from the same seed, as
``rescorer train`` does (Adadelta, clipping, the default ``--train-step``). Validation runs every
``--valid-pairs`` training pairs (so equally often per pair seen whatever the batch size) and its
time counts, as in a real run. Prints, per batch size, updates and pairs per second, the
validation perplexity reached by given wall-clock times, and the best one with when it came.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.shared_data import shared_path
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.training.train import Validation, train_on_phrase_table
from table1.settings import SMALL

SIZES = {
    "small": {"hidden": SMALL.rnn.hidden, "embedding": SMALL.rnn.embedding,
              "maxout_units": SMALL.rnn.maxout_units, "output_rank": SMALL.rnn.output_rank},
    "tiny": {"hidden": 64, "embedding": 32, "maxout_units": 32, "output_rank": 32},
}


def perplexity_by(history: list[Validation], seconds: float) -> float | None:
    """The validation perplexity of the last validation taken within ``seconds`` of training."""
    reached = [v for v in history if v.elapsed is not None and v.elapsed <= seconds]
    return reached[-1].perplexity if reached else None


def perplexity_after(history: list[Validation], pairs: int, batch: int) -> float | None:
    """The validation perplexity of the last validation taken within ``pairs`` training pairs."""
    reached = [v for v in history if v.step * batch <= pairs]
    return reached[-1].perplexity if reached else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-sizes", default="64,128,256")
    parser.add_argument("--max-time", type=float, default=120.0, help="seconds of training per batch size")
    parser.add_argument("--valid-pairs", type=int, default=6400, help="training pairs between validations")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--table", help="phrase table [default: the fixture's sample table]")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    table = args.table or str(shared_path("fixtures/hansard-enfr/phrase-table.sample.gz", "the fixture's sample table"))
    config = ModelSizes(**SIZES[args.size])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{table}; model {args.size} {SIZES[args.size]}; {args.threads} thread(s) on {args.device}; "
          f"{args.max_time:.0f} s per batch size; load average at start {load:.1f}")
    checkpoints = [t for t in (5, 10, 20, 30, 60, 120, 240, 480) if t <= args.max_time]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            cfg = TrainConfig(batch_size=batch, max_time=args.max_time, patience=None, seed=args.seed,
                              valid_every=max(1, args.valid_pairs // batch))
            t0 = time.monotonic()
            result = train_on_phrase_table(table, Path(tmp) / f"b{batch}.pt", model_sizes=config, train_config=cfg,
                                           device=args.device, progress=False)
            wall = time.monotonic() - t0
            best = result.best
            assert best is not None and best.elapsed is not None
            rows.append((batch, result, best))
            print(f"batch {batch}: {result.steps} updates = {result.steps * batch} pairs in {result.elapsed:.0f} s "
                  f"({result.steps / result.elapsed:.1f} updates/s, {result.steps * batch / result.elapsed:.0f} "
                  f"pairs/s with validations; {wall:.0f} s with data preparation); best validation perplexity "
                  f"{best.perplexity:.2f} at {best.elapsed:.0f} s (update {best.step})", flush=True)
    print("\nvalidation perplexity reached by wall-clock time (s):")
    print("batch | " + " | ".join(f"{t:>7}" for t in checkpoints) + " |    best | at (s)")
    for batch, result, best in rows:
        values = [perplexity_by(result.history, t) for t in checkpoints]
        cells = " | ".join(f"{v:7.1f}" if v is not None else "      -" for v in values)
        print(f"{batch:5d} | {cells} | {best.perplexity:7.1f} | {best.elapsed:6.0f}")
    # The same runs by pairs seen, which the machine's load does not move: what a batch size does
    # per pair, apart from how fast it goes.
    marks = [k * args.valid_pairs for k in (1, 2, 4, 8, 16, 24)]
    print("\nvalidation perplexity reached by training pairs seen:")
    print("batch | " + " | ".join(f"{m:>7}" for m in marks) + " |")
    for batch, result, _ in rows:
        values = [perplexity_after(result.history, m, batch) for m in marks]
        print(f"{batch:5d} | " + " | ".join(f"{v:7.1f}" if v is not None else "      -" for v in values) + " |")


if __name__ == "__main__":
    main()
