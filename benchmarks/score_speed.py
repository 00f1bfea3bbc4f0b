"""Scoring throughput of ``rescore-phrase-table`` on the real fixture table.

Usage: python -m benchmarks.score_speed [--lines 20000] [--device auto] [--sizes paper,small] [--repeat 2] [--reverse]

For each model size it prints, end to end (gzip in, parse, score, format, gzip out):
* pairs/s;
* the FLOPs per pair the scorer performs (matmuls only: each distinct source prefix encoded and
  each distinct target prefix of a source decoded once per chunk) next to those of scoring each pair on its own,
  and the achieved fraction of this machine's fp32 matmul peak (performed FLOPs), measured here;
* the same run with source sharing and length sorting switched off, and the speed-up;
* with ``--reverse``, the same run with a reverse model's column too (``--reverse-model``), and what the
  reverse column costs on its own (the difference), against the forward column's cost; then the model
  time alone of the two columns, chunk by chunk from the same prepared plans, forward and reverse in
  turns (on a shared machine the steadier comparison).

Weights are random: the cost of scoring does not depend on their values. The first --lines lines of
``../shared/fixtures/hansard-enfr/model/phrase-table.gz`` (or --table) are used, so phrase lengths
and source-block sizes are those of a real Moses table.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from benchmarks.shared_data import shared_dir

# The output is compressed by spawned worker processes, which import this script again as
# ``__mp_main__``: the heavy imports are made only in the benchmark's own process, as the real
# command-line tool does, so the workers start in a fraction of a second and take no CPU from scoring.
if __name__ == "__main__":
    import torch

    from benchmarks.machine_peak import matmul_peak_flops
    from neural.device import select_device
    from neural.vocab import Vocab
    from rescorer.model.checkpoint import Checkpoint
    from rescorer.model.config import ModelConfig
    from rescorer.model.flops import count_flops, count_flops_per_pair
    from rescorer.model.network import RNNEncoderDecoder
    from rescorer.pipeline.rescore import RescoreOptions, rescore
    from rescorer.pipeline.scoring import ScoringOptions
    from rescorer.pipeline.train_or_load import Models

SIZES = {
    "paper": {"hidden": 1000, "embedding": 100, "maxout_units": 500, "output_rank": 100},
    "small": {"hidden": 256, "embedding": 64, "maxout_units": 128, "output_rank": 64},
}


def default_table() -> Path:
    return shared_dir() / "fixtures/hansard-enfr/model/phrase-table.gz"


def model_flops(config: ModelConfig, lines: list[bytes], chunk_lines: int,
                reverse: bool = False) -> tuple[float, float]:
    """Matmul FLOPs of the scorer and of scoring every pair on its own, padding-free.

    The scorer runs the encoder once per distinct source prefix of a chunk (``</s>`` included),
    computes what depends on c once per distinct source, and runs the decoder once per distinct
    (source, target prefix) node of the chunk. With ``reverse``, of a reverse model: the roles swapped.
    """
    performed = 0.0
    for start in range(0, len(lines), chunk_lines):
        sources: set[bytes] = set()
        source_prefixes: set[tuple[bytes, ...]] = set()
        nodes: set[tuple[bytes, tuple[bytes, ...]]] = set()
        for line in lines[start : start + chunk_lines]:
            src, tgt = line.split(b" ||| ")[:2][:: -1 if reverse else 1]
            if src not in sources:
                sources.add(src)
                read = (*src.split(), b"</s>")
                source_prefixes.update(read[:k] for k in range(1, len(read) + 1))
            words = tuple(tgt.split())
            nodes.update((src, words[:k]) for k in range(len(words) + 1))
        performed += count_flops(
            config, encoder_steps=len(source_prefixes), summaries=len(sources), decoder_steps=len(nodes)
        )
    per_pair = 0.0
    for line in lines:
        src, tgt = line.split(b" ||| ")[:2]
        per_pair += count_flops_per_pair(config, len(src.split()) + 1, len(tgt.split()) + 1)
    return performed, per_pair


def run(table: Path, ck: Checkpoint, device: str, workers: int, chunk_lines: int, scoring: ScoringOptions,
        reverse: Checkpoint | None = None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.gz"
        opts = RescoreOptions(chunk_lines=chunk_lines, workers=workers, progress=False, device=device, scoring=scoring)
        t0 = time.perf_counter()
        rescore(str(table), str(out), Models(ck, reverse), opts)
        return time.perf_counter() - t0


def model_seconds(lines: list[bytes], ck: Checkpoint, rev: Checkpoint, device: torch.device, chunk_lines: int,
                  token_budget: int | None, repeat: int) -> tuple[float, float]:
    """Seconds of the model alone for the forward and the reverse column of ``lines``, each the
    fastest of ``repeat`` passes over the same plans (prepared once, as the workers prepare them),
    the two directions timed in turns so that the machine's drift hits both alike."""
    from rescorer.pipeline.chunk_prep import PrepareTask, prepare_chunk
    from rescorer.pipeline.columns.reverse import REVERSE, ReversePlanner
    from rescorer.pipeline.columns.rnn import FORWARD, ForwardPlanner
    from rescorer.pipeline.scoring import PairScorer
    from rescorer.tables.chunks import LineChunk

    forward = PairScorer(ck.model, device, options=ScoringOptions(token_budget=token_budget))
    reverse = PairScorer(rev.model, device, options=ScoringOptions(token_budget=forward.token_budget))
    planners = (ForwardPlanner.of_words(ck.src_vocab.words, ck.tgt_vocab.words),
                ReversePlanner.of_words(rev.src_vocab.words, rev.tgt_vocab.words))
    plans = [prepare_chunk(PrepareTask(LineChunk.from_lines(start + 1, lines[start : start + chunk_lines]), "table",
                                       None, False, False, forward.token_budget), planners)
             for start in range(0, len(lines), chunk_lines)]
    best = [float("inf"), float("inf")]
    for _ in range(max(1, repeat)):
        for i, (scorer, which) in enumerate(((forward, FORWARD), (reverse, REVERSE))):
            t0 = time.perf_counter()
            for prepared in plans:
                scorer.score_plan(prepared.plans[which])
            best[i] = min(best[i], time.perf_counter() - t0)
    return best[0], best[1]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=default_table())
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--sizes", default="paper,small")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chunk-lines", type=int, default=100_000)
    parser.add_argument("--token-budget", type=int, default=None, help="default: automatic")
    parser.add_argument("--skip-baseline", action="store_true", help="no run without sharing/sorting")
    parser.add_argument("--reverse", action="store_true",
                        help="also time a run with a reverse model's column (--reverse-model)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of each variant, alternated; the fastest counts (default: 2)")
    return parser.parse_args()


def shortlist_vocabs(lines: list[bytes]) -> tuple[Vocab, Vocab]:
    """The slice's source and target words, padded to the paper's 15,000-word shortlists, so that
    the output layer has the paper's size whatever the slice's vocabulary."""
    src_counts, tgt_counts = Counter(), Counter()
    for line in lines:
        src, tgt = line.split(b" ||| ")[:2]
        src_counts.update(src.decode().split())
        tgt_counts.update(tgt.decode().split())
    src_vocab, tgt_vocab = Vocab.from_counts(src_counts, 15000), Vocab.from_counts(tgt_counts, 15000)
    src_words = src_vocab.words + [f"<pad{i}>" for i in range(15001 - len(src_vocab))]
    tgt_words = tgt_vocab.words + [f"<pad{i}>" for i in range(15001 - len(tgt_vocab))]
    return Vocab(src_words), Vocab(tgt_words)


def time_variants(args: argparse.Namespace, table: Path, ck: Checkpoint, rev: Checkpoint | None,
                  device: torch.device, peak: float) -> tuple[float, float, float, float]:
    """Fastest seconds of the optimised run, of the run without sharing and sorting, and of the run
    with the reverse column (inf when not run), and the best matmul peak seen meanwhile.

    Alternating the variants and keeping each one's fastest run makes the comparison fair on a
    shared machine, whose speed drifts by tens of percent from minute to minute."""
    fast = ScoringOptions(token_budget=args.token_budget)
    naive = ScoringOptions(token_budget=args.token_budget, share_sources=False, sort_by_length=False)
    seconds, slow, both = float("inf"), float("inf"), float("inf")
    for _ in range(max(1, args.repeat)):
        seconds = min(seconds, run(table, ck, str(device), args.workers, args.chunk_lines, fast))
        if not args.skip_baseline:
            slow = min(slow, run(table, ck, str(device), args.workers, args.chunk_lines, naive))
        if rev is not None:
            both = min(both, run(table, ck, str(device), args.workers, args.chunk_lines, fast, rev))
        peak = max(peak, matmul_peak_flops(device, seconds=1.0))
    return seconds, slow, both, peak


def report_size(args: argparse.Namespace, size: str, lines: list[bytes], table: Path, vocabs: tuple[Vocab, Vocab],
                device: torch.device, peak: float) -> float:
    """Time one model size's variants and print its figures; the best matmul peak seen so far."""
    src_vocab, tgt_vocab = vocabs
    config = ModelConfig(src_vocab_size=15001, tgt_vocab_size=15001, **SIZES[size])
    torch.manual_seed(0)
    ck = Checkpoint(RNNEncoderDecoder(config).eval(), config, src_vocab, tgt_vocab)
    reverse_config = replace(config, direction="reverse")
    rev = Checkpoint(RNNEncoderDecoder(reverse_config).eval(), reverse_config, tgt_vocab, src_vocab) \
        if args.reverse else None
    warm = table.with_name("warm.gz")
    with gzip.open(warm, "wb") as fh:
        fh.write(b"\n".join(lines[:2000]) + b"\n")
    run(warm, ck, str(device), 0, args.chunk_lines, ScoringOptions(token_budget=args.token_budget))
    seconds, slow, both, peak = time_variants(args, table, ck, rev, device, peak)
    flops, per_pair = model_flops(config, lines, args.chunk_lines)
    print(f"[{size}] d={config.hidden}: {len(lines) / seconds:.0f} pairs/s end to end "
          f"({seconds:.1f} s); {flops / len(lines) / 1e6:.1f} MFLOP/pair performed "
          f"({per_pair / len(lines) / 1e6:.1f} for each pair on its own); "
          f"{flops / seconds / 1e9:.1f} GFLOP/s = {100 * flops / seconds / peak:.1f}% of matmul peak "
          f"(best measured in this run: {peak / 1e9:.1f} GFLOP/s)")
    if not args.skip_baseline:
        print(f"[{size}] without source sharing and length sorting: {len(lines) / slow:.0f} pairs/s "
              f"({slow:.1f} s); speed-up from both: {slow / seconds:.2f}x")
    if rev is not None:
        rev_flops, _ = model_flops(reverse_config, lines, args.chunk_lines, reverse=True)
        print(f"[{size}] with the reverse column too: {len(lines) / both:.0f} pairs/s end to end "
              f"({both:.1f} s); "
              f"the reverse column alone {both - seconds:.1f} s ({(both - seconds) / seconds:.2f}x the "
              f"forward run), {rev_flops / len(lines) / 1e6:.1f} MFLOP/pair performed (forward: "
              f"{flops / len(lines) / 1e6:.1f}), {len({line.split(b' ||| ')[1] for line in lines})} "
              f"distinct targets")
        fwd_model, rev_model = model_seconds(lines, ck, rev, device, args.chunk_lines, args.token_budget,
                                             args.repeat)
        print(f"[{size}] the model alone: forward column {len(lines) / fwd_model:.0f} pairs/s "
              f"({fwd_model:.1f} s), reverse column {len(lines) / rev_model:.0f} pairs/s ({rev_model:.1f} s): "
              f"the reverse costs {rev_model / fwd_model:.2f}x the forward")
    return peak


def main() -> None:
    args = parse_args()
    if not args.table.exists():
        sys.exit(f"{args.table} not found: pass --table or set SHARED_DATA_DIR")
    device = select_device(args.device)
    with gzip.open(args.table) as fh:
        lines = [line.rstrip(b"\n") for line in itertools.islice(fh, args.lines)]
    vocabs = shortlist_vocabs(lines)
    peak = matmul_peak_flops(device)
    print(f"device: {device} ({torch.get_num_threads()} threads); "
          f"fp32 matmul peak (measured): {peak / 1e9:.1f} GFLOP/s")
    print(f"table: first {len(lines)} lines of {args.table.name}, "
          f"{len({line.split(b' ||| ')[0] for line in lines})} distinct sources")
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "in.gz"
        with gzip.open(table, "wb", compresslevel=1) as fh:
            fh.write(b"\n".join(lines) + b"\n")
        for size in args.sizes.split(","):
            peak = report_size(args, size, lines, table, vocabs, device, peak)


if __name__ == "__main__":
    main()
