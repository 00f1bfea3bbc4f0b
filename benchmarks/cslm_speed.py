"""CSLM speed at paper size: n-best rescoring (hypotheses/s, tokens/s) and training (n-grams/s).

Usage: python -m benchmarks.cslm_speed [--model cslm.pt] [--sentences 200] [--train-steps 20]
       [--device auto] [--threads N] [--embedding 512 --hidden 1536,1024 --vocab 15001]
       [--train-step eager,static,captured] [--precision fp32,bf16]

Rescores the fixture's real 100-best list (../shared/fixtures/hansard-enfr/nbest/dev.nbest.gz)
with a trained model (``--model``) or, without one, a randomly initialised model of the given
sizes over the list's own most frequent words (the speed does not depend on the weights). Prints
hypotheses/s, tokens/s (words + ``</s>``), distinct histories as a share of tokens, and the
fraction of this machine's fp32 matmul peak, measured in the same run by benchmarks/machine_peak.py.
FLOPs count the matmuls actually run: hidden layers and the full softmax once per distinct
history, one output row per token; training counts 3× the forward matmuls of every n-gram.
Training is timed for each ``--train-step`` mode of ``cslm train`` (cslm.step) from the same
weights on the same minibatches, with the loss difference between modes (on a GPU:
``--device cuda --train-step eager,captured``).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from benchmarks.machine_peak import matmul_peaks
from benchmarks.shared_data import shared_path
from cslm.model import CSLM, CSLMConfig
from cslm.model_file import load_cslm
from cslm.scoring import ScoreStats, sentence_log_probs
from cslm.step import make_cslm_step
from moses_integration.nbest import read_nbest
from moses_integration.tokens import split_tokens
from neural.config import PRECISIONS
from neural.device import autocast_dtype, select_device, training_precision
from neural.vocab import Vocab


def nbest_path() -> Path:
    return shared_path("fixtures/hansard-enfr/nbest/dev.nbest.gz", "the fixture's n-best list")


def hidden_flops(cfg: CSLMConfig) -> int:
    """Multiply-adds ×2 of the hidden layers for one history."""
    widths = [cfg.context * cfg.embedding, *cfg.hidden]
    return sum(2 * a * b for a, b in zip(widths, widths[1:], strict=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a trained CSLM (default: random weights at the sizes below)")
    parser.add_argument("--sentences", type=int, default=200, help="n-best sentences to rescore")
    parser.add_argument("--unshared-sentences", type=int, default=0,
                        help="also time the first N sentences with and without history sharing")
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--embedding", type=int, default=512)
    parser.add_argument("--hidden", default="1536,1024")
    parser.add_argument("--vocab", type=int, default=15001)
    parser.add_argument("--train-step", default="auto", help="comma-separated modes of cslm train --train-step")
    parser.add_argument("--precision", default="auto",
                        help="of training, comma-separated (e.g. fp32,bf16 side by side); rescoring is fp32")
    args = parser.parse_args()
    choices = [p for p in PRECISIONS if p != "tf32"]
    if any(p not in choices for p in args.precision.split(",")):
        parser.error(f"--precision: each of {', '.join(choices)}, got {args.precision!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = select_device(args.device)
    entries = [e for e in read_nbest(nbest_path()) if e.sent_id < args.sentences]
    sentences = [split_tokens(e.hypothesis) for e in entries]
    if args.model:
        loaded = load_cslm(args.model, device)
        model, vocab = loaded.model, loaded.vocab
    else:
        counts = Counter(w for s in sentences for w in s)
        vocab = Vocab.from_counts(counts, args.vocab - 1)
        torch.manual_seed(0)
        cfg = CSLMConfig(vocab_size=args.vocab, embedding=args.embedding,
                         hidden=[int(h) for h in args.hidden.split(",")])
        model = CSLM(cfg).to(device).eval()
    cfg = model.config
    width = max(cfg.hidden, default=cfg.embedding)  # as cslm train resolves auto
    precisions = [training_precision(device, p, width) for p in args.precision.split(",")]
    peaks = matmul_peaks(device, ["fp32", *precisions])
    peak = peaks["fp32"]
    print(f"device {device}, {torch.get_num_threads()} threads; matmul peaks "
          + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items()))
    print(f"model: {cfg.order}-gram, embedding {cfg.embedding}, hidden {cfg.hidden}, {cfg.vocab_size} outputs")

    sentence_log_probs(model, vocab, sentences[:200])  # warm-up
    stats = ScoreStats()
    t0 = time.perf_counter()
    sentence_log_probs(model, vocab, sentences, stats=stats)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    out_flops = 2 * cfg.hidden[-1] * cfg.vocab_size
    flops = stats.distinct_histories * (hidden_flops(cfg) + out_flops) + stats.tokens * 2 * cfg.hidden[-1]
    print(f"n-best rescoring: {len(entries)} hypotheses ({args.sentences} sentences), {stats.tokens} tokens "
          f"in {elapsed:.2f} s: {len(entries) / elapsed:.0f} hypotheses/s, {stats.tokens / elapsed:.0f} tokens/s")
    print(f"  distinct histories: {stats.distinct_histories} = {stats.history_share:.1%} of tokens; "
          f"{flops / elapsed / 1e9:.1f} GFLOP/s = {flops / elapsed / peak:.0%} of peak")

    if args.unshared_sentences:
        first = [s for e, s in zip(entries, sentences, strict=True) if e.sent_id < args.unshared_sentences]
        times = {}
        for share in (True, False):
            t0 = time.perf_counter()
            sentence_log_probs(model, vocab, first, share_histories=share)
            times[share] = time.perf_counter() - t0
        print(f"  first {args.unshared_sentences} sentences ({len(first)} hypotheses): {times[True]:.2f} s with "
              f"history sharing, {times[False]:.2f} s without ({times[False] / times[True]:.1f}x)")

    rates = {p: time_training(model, args, device, p, peaks[p], 3 * (hidden_flops(cfg) + out_flops))
             for p in precisions}
    for p in precisions[1:]:
        print(f"training {p} / {precisions[0]} n-grams/s: " + ", ".join(
            f"{mode} {rates[p][mode] / rates[precisions[0]][mode]:.2f}×" for mode in rates[p]))


def time_training(model: CSLM, args: argparse.Namespace, device: torch.device, precision: str, peak: float,
                  flops_per_ngram: int) -> dict[str, float]:
    """Each ``--train-step`` mode (cslm.step) from the same weights on the same minibatches, in
    ``precision``, as a share of that precision's own matmul peak: n-grams/s of each mode."""
    cfg, n = model.config, args.batch_size
    rng = np.random.default_rng(0)
    batches = [(torch.from_numpy(rng.integers(0, cfg.vocab_size + 1, (n, cfg.context))),
                torch.from_numpy(rng.integers(0, cfg.vocab_size, n))) for _ in range(3 + args.train_steps)]
    start = copy.deepcopy(model.state_dict())
    modes = args.train_step.split(",")
    reference = None
    rates: dict[str, float] = {}
    for mode in modes:
        model.load_state_dict(start)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        step = make_cslm_step(mode, model, opt, self_normalize=0.0, batch_size=n, optimizer_name="adam",
                              device=device, amp_dtype=autocast_dtype(device, precision))
        losses = [step(*b) for b in batches[:3]]  # warm-up (a captured step: its warm-up and capture)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses += [step(*b) for b in batches[3:]]
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        ngrams = args.train_steps * n
        flops = ngrams * flops_per_ngram
        rates[mode] = ngrams / elapsed
        print(f"training {mode} in {precision} (Adam, batch {n}): {ngrams / elapsed:.0f} n-grams/s, "
              f"{args.train_steps / elapsed:.1f} updates/s; {flops / elapsed / 1e9:.1f} GFLOP/s = "
              f"{flops / elapsed / peak:.0%} of the {precision} peak")
        values = [float(v[0]) for v in losses]
        if reference is None:
            reference = values
        else:
            diff = max(abs(a - b) / abs(b) for a, b in zip(values, reference, strict=True))
            print(f"  losses of {len(values)} updates: max relative difference from {modes[0]}: {diff:.2e}")
    return rates


if __name__ == "__main__":
    main()
