"""The CPU side of ``rescore-phrase-table``: how fast the pipeline around the model can go.

Usage: python -m benchmarks.pipeline_speed [--table T] [--lines N] [--workers 1,2] [--chunk-lines 100000]

A GPU scores hundreds of thousands of pairs per second; then reading, parsing, prefix-tree
building, formatting and compression bound the run. This runs the real pipeline
(:func:`rescorer.pipeline.rescore.rescore`: the same reader, worker processes, trees, writer,
progress record and gzip output as ``rescore-phrase-table``) on the whole fixture phrase table,
with the model replaced by a constant scorer, once per ``-j`` given. It prints, for each run:

* end to end: lines/s (wall clock), and the CPU seconds of all its processes;
* each stage's rate per core, from the CPU time the pipeline itself records where the stage runs
  (thread CPU time, so other processes on a shared machine do not inflate it):
  gunzip (ISA-L, a thread of the reader process), read (finding the lines), align (sync points,
  chunks at content-fixed places, spool writes; with -j 1, read does all three),
  parse (validation, parsing, id mapping),
  trees (groups and prefix trees, as the scorer uses them), format (formatting + the gzip member);
* how the format stage splits into formatting and compression (measured apart on the first chunks);
* what the main process costs per line (with workers it never touches a line: it hands chunk names
  to the workers, takes scores and compressed chunks, writes), and the reader process' rate, the two
  stages that do not scale with ``-j``;
* the rate that C cores could sustain: the serial parts on their own cores, the parallel stages
  shared by the others;
* the run's timeline (:mod:`rescorer.pipeline.timeline`): when each phase was reached, from the
  run's start (its worker processes' start-up is in "first chunk prepared"), and the main and
  writing threads' seconds per chunk;
* the start-up of the real command with a paper-size checkpoint.

The shortlists are the 15,000 most frequent words of each side of the table's first 200,000
lines (what a model trained on the table would have). The load average is printed with the
figures: above 1 per core they were taken while other work shared the machine.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Spawned worker processes import this script again as ``__mp_main__``: heavy imports only here.
if __name__ == "__main__":
    from benchmarks.random_checkpoint import shortlists, write_random_checkpoint
    from benchmarks.score_speed import default_table
    from infrastructure.files import DEFAULT_MEMBER_LEVEL, compress_member
    from infrastructure.threads import available_cpus
    from rescorer.pipeline.columns.base import ScoringModel
    from rescorer.pipeline.columns.rnn import probability_column
    from rescorer.pipeline.columns.unknown import unknown_column
    from rescorer.pipeline.output_chunks import format_chunk
    from rescorer.pipeline.rescore import RescoreOptions, RescoreSummary, rescore
    from rescorer.pipeline.scoring import CPU_TOKEN_BUDGET, ScoringOptions
    from rescorer.pipeline.scoring_plan import ScoringPlan
    from rescorer.pipeline.timeline import Timeline
    from rescorer.pipeline.train_or_load import Models
    from rescorer.tables.chunks import iter_line_chunks

PARALLEL_STAGES = ("parse", "trees", "format")


class ConstantScorer:
    """A scorer that gives every pair log p = -2 at no cost: the pipeline alone is measured.

    Trees are still planned with the CPU scorer's token budget, so tree building costs what it
    costs in a real run.
    """

    def __init__(self) -> None:
        self.token_budget = CPU_TOKEN_BUDGET
        self.options = ScoringOptions()

    def score_plan(self, plan: ScoringPlan) -> np.ndarray:
        return np.full(plan.rows, -2.0)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(table: Path, workers: int, chunk_lines: int, vocab: tuple[list[str], list[str]],
        ) -> tuple[RescoreSummary, float, float, float, Timeline]:
    """One run: the summary, wall seconds, CPU seconds of this process and of its workers, and its
    timeline (where the main thread's time went, chunk by chunk)."""
    with tempfile.TemporaryDirectory() as tmp:
        timeline = Timeline()
        opts = RescoreOptions(chunk_lines=chunk_lines, workers=workers, progress=False, timeline=timeline)
        wall, cpu, child = time.perf_counter(), time.process_time(), children_cpu()
        constant = ScoringModel(ConstantScorer(), *vocab, None)
        summary = rescore(str(table), str(Path(tmp) / "out.gz"), Models(constant), opts)
        return (summary, time.perf_counter() - wall, time.process_time() - cpu, children_cpu() - child, timeline)


def format_and_gzip_apart(table: Path, chunk_lines: int, chunks: int = 3) -> tuple[float, float]:
    """Lines/s per core of formatting alone and of the gzip member alone, on the table's first chunks."""
    lines = fmt = gz = 0.0
    with gzip.open(table) as fh:
        for chunk in itertools.islice(iter_line_chunks(fh, str(table), chunk_lines), chunks):
            log_p, n_unk = np.full(len(chunk), -2.0), np.zeros(len(chunk), dtype=np.int64)
            started = time.thread_time()
            text = format_chunk(chunk, [(probability_column, log_p), (unknown_column, n_unk)], None)
            formatted = time.thread_time()
            compress_member(text)
            fmt, gz, lines = fmt + formatted - started, gz + time.thread_time() - formatted, lines + len(chunk)
    return lines / fmt, lines / gz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=default_table())
    parser.add_argument("--lines", type=int, default=0, help="only the first N lines (default: the whole table)")
    parser.add_argument("--workers", default="1,2", help="-j values to run, comma-separated")
    parser.add_argument("--chunk-lines", type=int, default=100_000)
    parser.add_argument("--cores", type=int, default=16, help="the machine to project the rate for")
    args = parser.parse_args()
    if not args.table.exists():
        sys.exit(f"{args.table} not found: pass --table or set SHARED_DATA_DIR")
    vocab = shortlists(args.table)
    with tempfile.TemporaryDirectory() as tmp:
        table = args.table
        if args.lines:
            table = Path(tmp) / "in.gz"
            with gzip.open(args.table) as src, gzip.open(table, "wb") as dst:
                dst.writelines(itertools.islice(src, args.lines))
        print(f"table: {table.name if not args.lines else f'first {args.lines} lines of {args.table.name}'}; "
              f"constant scorer; chunks of {args.chunk_lines} lines; {available_cpus()} CPUs")
        for workers in (int(w) for w in args.workers.split(",")):
            load = os.getloadavg()[0]
            summary, wall, cpu, child, timeline = run(table, workers, args.chunk_lines, vocab)
            report(summary, workers, wall, cpu, child, load, args.cores)
            for line in timeline.report().splitlines():  # the phases (the run's fixed cost), then per chunk
                print("  " + line)
        fmt, gz = format_and_gzip_apart(table, args.chunk_lines)
        print(f"format stage apart, per core: formatting {fmt / 1e3:,.0f}k lines/s, "
              f"gzip member (zlib level {DEFAULT_MEMBER_LEVEL}) {gz / 1e3:,.0f}k lines/s")
        startup(table)


def report(summary: RescoreSummary, workers: int, wall: float, cpu: float, child: float, load: float,
           cores: int) -> None:
    n = summary.lines
    stage = summary.stage_seconds
    rate = {name: n / seconds for name, seconds in stage.items() if seconds > 0}
    load = max(load, os.getloadavg()[0])
    busy = f"; load average {load:.1f}" + (" (taken under contention: the machine was shared)" if load > 1 else "")
    print(f"-j {workers}: {n} lines in {wall:.1f} s = {n / wall:,.0f} lines/s end to end; "
          f"CPU {cpu:.1f} s main process + {child:.1f} s reader and workers{busy}")
    per_core = ", ".join(f"{name} {rate[name] / 1e3:,.0f}k" for name in ("gunzip", "read", "align", *PARALLEL_STAGES)
                         if name in rate)
    print(f"  per core, lines/s: {per_core}")
    if workers > 1:
        # With workers, reading runs in a process of its own (gunzip in a thread of it, without the
        # GIL): the main process' CPU is its own work (handing chunk names to the workers, plans and
        # compressed chunks back, writing, fsync).
        main_cost = cpu - stage.get("score", 0.0)
        parallel = sum(stage.get(name, 0.0) for name in PARALLEL_STAGES) / n
        serial = [stage.get("read", 0.0), stage.get("align", 0.0), stage.get("gunzip", 0.0), main_cost]
        serial_cores = sum(1 for seconds in serial if seconds > 0)
        threads = ", ".join(f"{name} {rate[name] / 1e6:,.2f}M" for name in ("gunzip", "read", "align") if name in rate)
        print(f"  main process (never touches a line): {n / main_cost / 1e6:,.2f}M lines/s; reader process' "
              f"threads: {threads} lines/s"
              + f"; parallel stages together: {1 / parallel / 1e3:,.0f}k lines/s per core")
        print(f"  projected for {cores} cores (the reader's threads and the main process on one core each, "
              f"{cores - serial_cores} workers): {min(n / max(serial), (cores - serial_cores) / parallel) / 1e6:.2f}M "
              "lines/s")


def startup(table: Path) -> None:
    """Wall seconds of ``rescore-phrase-table`` with a paper-size checkpoint on 200 lines: from the
    command's start to its exit, so an upper bound of the time to the first chunk handed to the model."""
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        model = write_random_checkpoint(table, Path(tmp) / "paper.pt", "paper")
        small = Path(tmp) / "in.gz"
        with gzip.open(table) as fh, gzip.open(small, "wb") as out:
            out.writelines(itertools.islice(fh, 200))
        command = [str(Path(sys.executable).parent / "rescore-phrase-table"), str(small), str(Path(tmp) / "out.gz"),
                   "--model", str(model), "-q", "--threads", "1", "--device", "cpu"]
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        print(f"start-up: rescore-phrase-table with a paper-size checkpoint ({model.stat().st_size / 1e6:.0f} MB) "
              f"on 200 lines, start to exit: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
