"""Training throughput of the paper-size model: pairs/s and the fraction of measured matmul peak.

Usage: python benchmarks/train_speed.py [--steps 10] [--device auto] [--hidden 1000 ...]

Phrase lengths come from the real fixture table (../shared) when present, else from a synthetic
distribution like a Moses table's (1–7 words). FLOPs per trained pair are taken as 3× the forward
matmul FLOPs (forward + two backward matmuls), the usual convention.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_peak import matmul_peak_flops  # noqa: E402

from rescorer.config import ModelConfig  # noqa: E402
from rescorer.device import autocast, autocast_dtype, select_device  # noqa: E402
from rescorer.model import RNNEncoderDecoder, count_flops_per_pair  # noqa: E402


def phrase_lengths(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) word counts: from the real table when available."""
    shared = Path(os.environ.get("SHARED_DATA_DIR", Path(__file__).resolve().parents[2] / "shared"))
    sample = shared / "fixtures/hansard-enfr/phrase-table.sample.gz"
    if sample.exists():
        import gzip

        with gzip.open(sample) as fh:
            pairs = [line.split(b" ||| ")[:2] for line in fh]
        src = np.array([len(p[0].split()) for p in pairs])
        tgt = np.array([len(p[1].split()) for p in pairs])
        pick = rng.integers(0, len(pairs), n)
        return src[pick], tgt[pick]
    return rng.integers(1, 8, n), rng.integers(1, 9, n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--hidden", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=15001)
    args = parser.parse_args()
    device = select_device(args.device)
    amp = autocast_dtype(device)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    config = ModelConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, hidden=args.hidden)
    model = RNNEncoderDecoder(config).to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-6)
    peak = matmul_peak_flops(device)

    batches = []
    for _ in range(args.steps + 2):
        s_len, t_len = phrase_lengths(args.batch_size, rng)
        s_len, t_len = s_len + 1, t_len + 1  # </s>
        src = torch.from_numpy(rng.integers(2, args.vocab, (args.batch_size, s_len.max())))
        tgt = torch.from_numpy(rng.integers(2, args.vocab, (args.batch_size, t_len.max())))
        flops = sum(3 * count_flops_per_pair(config, int(a), int(b)) for a, b in zip(s_len, t_len, strict=True))
        batches.append((src.to(device), torch.from_numpy(s_len).to(device), tgt.to(device),
                        torch.from_numpy(t_len).to(device), flops))

    def step(batch) -> None:
        src, sl, tgt, tl, _ = batch
        with autocast(device, amp):
            loss = -model(src, sl, tgt, tl).float().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for b in batches[:2]:
        step(b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for b in batches[2:]:
        step(b)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    pairs = args.steps * args.batch_size
    flops = sum(b[4] for b in batches[2:])
    print(f"device: {device} ({torch.get_num_threads()} threads), model d={args.hidden}, vocab {args.vocab}")
    print(f"fp32 matmul peak (measured): {peak / 1e9:.1f} GFLOP/s")
    print(f"training: {pairs / elapsed:.1f} pairs/s, {args.steps / elapsed:.2f} updates/s "
          f"(batch {args.batch_size})")
    print(f"achieved: {flops / elapsed / 1e9:.1f} GFLOP/s = {100 * flops / elapsed / peak:.1f}% of matmul peak")


if __name__ == "__main__":
    main()
