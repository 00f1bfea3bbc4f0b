"""The model's own scoring speed per precision, and what each precision changes in the scores.

Usage: python -m benchmarks.precision [--table T] [--lines N|0] [--model M.pt] [--device cuda]
       [--precisions fp32,tf32,bf16] [--cpu-lines 20000] [--small-budget 8192] [--out scores.npz]

The table's chunks are parsed and planned first (groups and prefix trees, in worker processes,
exactly as ``rescore-phrase-table`` plans them), so the timed part is the scorer alone:
:meth:`rescorer.pipeline.scoring.PairScorer.score_plan` over every chunk, i.e. the model's pairs/s without
reading, parsing or writing. On a GPU an untimed pass over every chunk comes first (Triton compiles the
fused output kernel there; its time is printed too). For each precision it prints:

* pairs/s of the model, the matmul FLOPs it performs (each distinct source prefix and target
  prefix once) per second, and that as a fraction of the matmul peak measured in the same run
  (the bf16 peak for bf16, the TF32 peak for tf32, the fp32 peak for fp32);
* against fp32 (SPEC §1's exact equations): mean, 99th-percentile and maximum |Δ log p| over all
  pairs, and the share of sources (with two or more targets) whose best-scoring target changes.

Two more checks of the fp32 scores: the same pairs scored with a small token budget (other
groups and trees: a pair's score must not depend on the batch it lands in beyond fp32 rounding),
and the first ``--cpu-lines`` lines scored on the CPU (the GPU must compute what the CPU does).

Without ``--model`` the weights are random (paper size, ``--init-std`` 0.1, so that the
distributions are far from uniform); precision figures are only meaningful for a trained model.
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile
import time
from concurrent import futures
from pathlib import Path

import numpy as np
import torch

from benchmarks.machine_peak import matmul_peaks
from benchmarks.score_speed import SIZES, default_table
from neural.device import autocast_dtype, matmul_precision, select_device
from neural.vocab import Vocab
from rescorer.model.checkpoint import Checkpoint, load_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.flops import count_flops
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline.chunk_prep import PrepareTask, init_worker, prepare_chunk, send_planners
from rescorer.pipeline.columns.rnn import FORWARD, ForwardPlanner
from rescorer.pipeline.scoring import PairScorer, ScoringOptions, auto_token_budget
from rescorer.pipeline.scoring_plan import ScoringPlan
from rescorer.tables.chunks import LineChunk


def read_lines(table: Path, limit: int) -> list[bytes]:
    with gzip.open(table) as fh:
        lines = []
        for line in fh:
            lines.append(line.rstrip(b"\n"))
            if limit and len(lines) >= limit:
                break
    return lines


def plan_chunks(lines: list[bytes], ck: Checkpoint, token_budget: int, chunk_lines: int,
                workers: int) -> list[ScoringPlan]:
    """Every chunk's scoring plan, made in worker processes as the real pipeline makes them."""
    tasks = [
        PrepareTask(LineChunk.from_lines(start + 1, lines[start : start + chunk_lines]), "table", None, False, False,
                    token_budget)
        for start in range(0, len(lines), chunk_lines)
    ]
    planners = (ForwardPlanner.of_words(ck.src_vocab.words, ck.tgt_vocab.words),)
    with tempfile.TemporaryDirectory() as folder:
        send_planners(planners, folder)
        with futures.ProcessPoolExecutor(workers, initializer=init_worker, initargs=(folder,)) as pool:
            return [prep.plans[FORWARD] for prep in pool.map(prepare_chunk, tasks)]


def performed_flops(config: ModelConfig, plans: list[ScoringPlan]) -> float:
    """Matmul FLOPs of the scorer over the plans: each tree node is one encoder/decoder step."""
    total = 0.0
    for plan in plans:
        enc = sum(sum(tree.level_sizes) - tree.level_sizes[0] for _, tree in plan.encoder_groups)
        dec = sum(sum(tree.level_sizes) for _, _, tree in plan.decoder_groups)
        total += count_flops(config, encoder_steps=enc, summaries=len(plan.sources.offsets) - 1, decoder_steps=dec)
    return total


def score_all(scorer: PairScorer, plans: list[ScoringPlan]) -> tuple[np.ndarray, float, float | None]:
    """All scores in table order, the seconds the scorer took (device synchronised), and on a GPU
    the seconds of an untimed first pass over every chunk.

    The first pass on a GPU is not the scorer's speed: Triton compiles the fused output kernel for
    each specialisation of its arguments the chunks meet (GPU run 10: 0.81M pairs/s with an empty
    kernel cache, 1.21M once compiled, same model and budget), so the timed pass comes second. On
    the CPU one chunk warms up (nothing compiles there; a whole second pass would double a slow run).
    """
    cuda = scorer.device.type == "cuda"
    first = None
    started = time.perf_counter()
    for plan in plans if cuda else plans[:1]:
        scorer.score_plan(plan)
    if cuda:
        torch.cuda.synchronize()
        first = time.perf_counter() - started
    started = time.perf_counter()
    scores = [scorer.score_plan(plan) for plan in plans]
    if cuda:
        torch.cuda.synchronize()
    return np.concatenate(scores), time.perf_counter() - started, first


def profile_chunk(scorer: PairScorer, plan: ScoringPlan, top: int = 12) -> None:
    """Where one chunk's time goes on the GPU: the kernels with the most device time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        scorer.score_plan(plan)
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]  # kernels and copies
    device_total = sum(e.self_device_time_total for e in events)
    print(f"  profile of one chunk ({plan.rows} pairs): {wall * 1e3:.1f} ms wall (profiled), "
          f"{device_total / 1e3:.1f} ms of kernels")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:top]:
        print(f"    {e.self_device_time_total / 1e3:8.2f} ms {e.count:6d}x  {e.key[:160]}")


def source_keys(plans: list[ScoringPlan]) -> np.ndarray:
    """A key per row that is equal exactly for rows of the same source in the same chunk."""
    keys, offset = [], 0
    for plan in plans:
        keys.append(plan.source_of_row + offset)
        offset += len(plan.sources.offsets) - 1
    return np.concatenate(keys)


def best_target_changes(keys: np.ndarray, ref: np.ndarray, other: np.ndarray) -> tuple[int, int]:
    """(sources whose best-scoring target differs, sources with two or more targets)."""
    order = np.lexsort((np.arange(len(keys)), keys))
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    counts = np.diff(np.r_[starts, len(k)])

    def argmax_rows(values: np.ndarray) -> np.ndarray:
        v = values[order]
        best = np.maximum.reduceat(v, starts)
        is_best = v == np.repeat(best, counts)
        first = np.where(is_best, np.arange(len(v)), len(v))
        return np.minimum.reduceat(first, starts)

    multi = counts >= 2
    changed = argmax_rows(ref) != argmax_rows(other)
    return int(np.count_nonzero(changed & multi)), int(np.count_nonzero(multi))


def delta_line(name: str, ref: np.ndarray, other: np.ndarray, keys: np.ndarray) -> str:
    delta = np.abs(other - ref)
    changed, multi = best_target_changes(keys, ref, other)
    return (f"{name} vs fp32: |Δ log p| mean {delta.mean():.3g}, p99 {np.percentile(delta, 99):.3g}, "
            f"max {delta.max():.3g}; best target changed for {changed} of {multi} sources "
            f"({100 * changed / max(multi, 1):.3f}%)")


def model_origin(path: str | None, ck: Checkpoint) -> str:
    """How the log names the model: a file never trained (``random_checkpoint``, as the GPU suite
    writes) is random weights as much as the built-in one, and accuracy figures mean little for it."""
    if path is None:
        return "random weights (built in, V padded to the paper's 15,001)"
    return f"{'trained' if ck.train_state else 'random weights, never trained'}: {path}"


def load_model(args: argparse.Namespace, lines: list[bytes]) -> Checkpoint:
    if args.model:
        return load_checkpoint(args.model)
    from collections import Counter

    src_counts, tgt_counts = Counter(), Counter()
    for line in lines[:200_000]:
        src, tgt = line.split(b" ||| ")[:2]
        src_counts.update(src.decode().split())
        tgt_counts.update(tgt.decode().split())
    # The paper's 15,000-word shortlists (+ [UNK]), whatever this slice's vocabulary: the output
    # layer's size is most of the cost.
    src_vocab, tgt_vocab = (
        Vocab([*vocab.words, *(f"<pad{i}>" for i in range(15001 - len(vocab)))])
        for vocab in (Vocab.from_counts(src_counts, 15000), Vocab.from_counts(tgt_counts, 15000))
    )
    config = ModelConfig(src_vocab_size=15001, tgt_vocab_size=15001, init_std=args.init_std, **SIZES["paper"])
    torch.manual_seed(0)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, src_vocab, tgt_vocab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=default_table())
    parser.add_argument("--lines", type=int, default=200_000, help="0: the whole table")
    parser.add_argument("--model", help="a trained model (.pt); default: random paper-size weights")
    parser.add_argument("--init-std", type=float, default=0.1, help="of the random model")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precisions", default="fp32,tf32,bf16")
    parser.add_argument("--token-budget", type=int, default=None, help="default: automatic")
    parser.add_argument("--small-budget", type=int, default=8192, help="0: skip the batch-independence check")
    parser.add_argument("--cpu-lines", type=int, default=20_000, help="0: skip the CPU check")
    parser.add_argument("--chunk-lines", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", help="save every precision's scores here (.npz)")
    parser.add_argument("--profile", action="store_true", help="print each precision's top GPU kernels on one chunk")
    args = parser.parse_args()
    device = select_device(args.device)
    lines = read_lines(args.table, args.lines)
    ck = load_model(args, lines)
    config = ck.config
    budget = args.token_budget or auto_token_budget(device, config)
    started = time.perf_counter()
    plans = plan_chunks(lines, ck, budget, args.chunk_lines, args.workers)
    print(f"device: {device}; {len(lines)} lines of {args.table.name} in {len(plans)} chunks, planned in "
          f"{time.perf_counter() - started:.1f} s (token budget {budget}); model d={config.hidden}, "
          f"V={config.tgt_vocab_size}, {model_origin(args.model, ck)}")
    flops = performed_flops(config, plans)
    keys = source_keys(plans)
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(device)}")
    peaks = matmul_peaks(device, args.precisions.split(","))  # each precision's own, in its dtype
    print("matmul peaks measured (GFLOP/s): " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peaks.items()))
    results: dict[str, np.ndarray] = {}
    for name in args.precisions.split(","):
        scorer = PairScorer(ck.model, device, autocast_dtype(device, name), ScoringOptions(token_budget=budget), name)
        with matmul_precision(name):
            results[name], seconds, first = score_all(scorer, plans)
        compiled = "" if first is None else f"; the first pass, compiling kernels, {first:.2f} s"
        print(f"[{name}] model only: {len(lines) / seconds:,.0f} pairs/s ({seconds:.2f} s{compiled}); "
              f"{flops / len(lines) / 1e6:.1f} MFLOP/pair performed, {flops / seconds / 1e9:.1f} GFLOP/s = "
              f"{100 * flops / seconds / peaks[name]:.1f}% of the {name} matmul peak")
        if args.profile and device.type == "cuda":
            with matmul_precision(name):
                profile_chunk(scorer, plans[min(1, len(plans) - 1)])
    ref = results.get("fp32")
    if ref is not None:
        for name, scores in results.items():
            if name != "fp32":
                print(delta_line(name, ref, scores, keys))
        if args.small_budget:
            small_plans = plan_chunks(lines, ck, args.small_budget, args.chunk_lines, args.workers)
            scorer = PairScorer(ck.model, device, None, ScoringOptions(token_budget=args.small_budget))
            small, _, _ = score_all(scorer, small_plans)
            delta = np.abs(small - ref)
            print(f"batch independence (fp32, budget {args.small_budget} vs {budget}): |Δ log p| max "
                  f"{delta.max():.3g}, mean {delta.mean():.3g}; relative max {np.max(delta / np.abs(ref)):.3g}")
        if args.cpu_lines and device.type == "cuda":
            n = min(args.cpu_lines, len(lines))
            cpu_plans = plan_chunks(lines[:n], ck, 8192, args.chunk_lines, args.workers)
            scorer = PairScorer(ck.model, torch.device("cpu"), None, ScoringOptions(token_budget=8192))
            cpu, _, _ = score_all(scorer, cpu_plans)
            ck.model.to(device)
            delta = np.abs(cpu - ref[:n])
            print(f"GPU fp32 vs CPU fp32, first {n} lines: |Δ log p| max {delta.max():.3g}, mean {delta.mean():.3g}; "
                  f"relative max {np.max(delta / np.abs(cpu)):.3g}")
    if args.out:
        np.savez_compressed(args.out, keys=keys, **results)


if __name__ == "__main__":
    main()
