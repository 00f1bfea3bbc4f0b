"""Speed of ``rescorer propose``'s batched beam search, in source phrases per second.

Usage: python -m benchmarks.propose_speed [--model MODEL.pt] [--sources 500] [--beam 10]
       [--max-words 8] [--threads 1] [--device cpu] [--single 100] [--precision fp32,bf16]

The sources are the real, randomly drawn source phrases of
``../shared/fixtures/hansard-enfr/phrase-table.sample.gz`` (or --table), in table order. It prints
sources/s of the batched search, the decoder rows it ran per source (hypotheses × steps: the cost
driver) and the FLOPs they perform (``rescorer.model.flops``: encoder steps, one summary per source,
each row's decoder step and full output layer) as a share of the matmul peak of the same precision
measured in the same run, the same search one source at a time (the search ``rescorer sample`` ran before) on the
first --single sources, and what proposing for every distinct source of the fixture's full table
(1,468,693) would take at the measured rate.

``--precision fp32,bf16`` runs the batched search in each precision on the same sources
(``search_sources(amp_dtype=...)``) and prints each one's sources/s, the ratio to the first, and
how many sources' best target and target lists the second finds as the first does.

With --model the search runs the given trained model. Without it the weights are random at the
``small`` size of Table 1 (d 256, 15,000-word shortlists): a random decoder seldom chooses ``</s>``,
so its hypotheses run to --max-words and the figure is a pessimistic bound, not the typical speed.
"""

from __future__ import annotations

import argparse
import gzip
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.shared_data import shared_path

if TYPE_CHECKING:
    import torch

    from neural.vocab import Vocab
    from rescorer.model.network import RNNEncoderDecoder

PRECISIONS = ("fp32", "bf16")
FULL_TABLE_SOURCES = 1_468_693  # distinct sources of fixtures/hansard-enfr/model/phrase-table.gz (its README)


def read_sources(table: Path, limit: int) -> list[str]:
    """The first ``limit`` distinct sources of a table, in order."""
    sources: list[str] = []
    with gzip.open(table, "rt", encoding="utf-8") as fh:
        for line in fh:
            source = line.split(" ||| ", 1)[0]
            if not sources or sources[-1] != source:
                if len(sources) == limit:
                    break
                sources.append(source)
    return sources


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a trained checkpoint [default: random weights, small size]")
    parser.add_argument("--table", type=Path, help="phrase table whose sources are searched")
    parser.add_argument("--sources", type=int, default=500)
    parser.add_argument("--beam", type=int, default=10)
    parser.add_argument("--max-words", type=int, default=8)
    parser.add_argument("--rows-per-step", type=int, default=None)
    parser.add_argument("--single", type=int, default=100, help="sources searched one at a time for comparison")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", help="comma-separated: fp32, bf16 (the search's matmuls)")
    args = parser.parse_args()
    args.precisions = args.precision.split(",")
    if any(p not in PRECISIONS for p in args.precisions):
        parser.error(f"--precision: fp32 or bf16, got {args.precision!r}")
    return args


def search_model(model_path: str | None, table: Path) -> tuple[RNNEncoderDecoder, Vocab, str]:
    """The model searched, its source vocabulary and how the output names it: the given checkpoint,
    or random weights at Table 1's small size with the table's words as the source vocabulary."""
    import torch

    from moses_integration.tokens import split_tokens
    from neural.vocab import Vocab
    from rescorer.model.checkpoint import load_checkpoint
    from rescorer.model.config import ModelConfig
    from rescorer.model.network import RNNEncoderDecoder

    if model_path:
        checkpoint = load_checkpoint(model_path)
        return checkpoint.model, checkpoint.src_vocab, f"model {model_path}"
    torch.manual_seed(1)
    words = sorted({w for s in read_sources(table, 10**9) for w in split_tokens(s)})
    src_vocab = Vocab(["</s>", "[UNK]", *words[:14_999]])
    config = ModelConfig(src_vocab_size=len(src_vocab), tgt_vocab_size=15_001, hidden=256, embedding=64,
                         maxout_units=128, output_rank=64)
    return RNNEncoderDecoder(config), src_vocab, "random weights, small size (pessimistic: few targets end)"


@dataclass
class RowCounter:
    """Counts the decoder rows (hypotheses × steps) the beam search runs: the search's cost driver,
    and with the sources' encoder steps what its performed FLOPs are counted from."""

    rows: int = 0

    def __enter__(self) -> RowCounter:
        from rescorer.proposals import beam as beam_module

        self.original = beam_module.next_word_top_k

        def counting_step(model, start, src, h, prev, k):
            self.rows += len(src)
            return self.original(model, start, src, h, prev, k)

        beam_module.next_word_top_k = counting_step
        return self

    def __exit__(self, *exc: object) -> None:
        from rescorer.proposals import beam as beam_module

        beam_module.next_word_top_k = self.original


def time_batched(model: RNNEncoderDecoder, ids: list[list[int]], args: argparse.Namespace, precision: str,
                 device: torch.device) -> tuple[float, list]:
    """The batched search in ``precision`` on every source (after a warm-up on 10): prints its
    sources/s, its decoder rows per source and its FLOP/s as a share of the same precision's
    matmul peak, measured right after it; returns the rate and what it found."""
    import torch

    from benchmarks.machine_peak import matmul_peak_flops
    from rescorer.model.flops import count_flops
    from rescorer.proposals import beam as beam_module

    amp = torch.bfloat16 if precision == "bf16" else None
    with torch.inference_mode(), RowCounter() as counter:
        list(beam_module.search_sources(model, ids[:10], args.beam, max_words=args.max_words, amp_dtype=amp))
        counter.rows = 0
        started = time.perf_counter()
        found = list(beam_module.search_sources(model, ids, args.beam, max_words=args.max_words,
                                                rows_per_step=args.rows_per_step, amp_dtype=amp))
        seconds = time.perf_counter() - started
    flops = count_flops(model.config, encoder_steps=sum(len(i) + 1 for i in ids), summaries=len(ids),
                        decoder_steps=counter.rows)
    peak = matmul_peak_flops(device, dtype=torch.bfloat16 if amp else torch.float32)
    rate = len(ids) / seconds
    finished = sum(h.finished for f in found for h in f) / len(found)
    lengths = [len(h.ids) for f in found for h in f if h.finished]
    mean_length = sum(lengths) / max(1, len(lengths))
    print(f"batched, {precision}: {rate:.1f} sources/s ({seconds:.1f} s), {counter.rows / len(ids):.0f} "
          f"decoder rows per source, {finished:.1f} finished targets per source (mean {mean_length:.2f} words); "
          f"{flops / seconds / 1e9:.2f} GFLOP/s performed = {100 * flops / seconds / peak:.1f}% of the {precision} "
          f"matmul peak measured in this run ({peak / 1e9:.1f} GFLOP/s)")
    return rate, found


def compare_precisions(results: dict[str, tuple[float, list]], beam: int) -> None:
    """Each later precision against the first: speed ratio and how many sources it searched alike."""
    first_name, (first_rate, first) = next(iter(results.items()))
    for precision, (rate, found) in list(results.items())[1:]:
        same_best = sum(bool(a) and bool(b) and a[0].ids == b[0].ids for a, b in zip(first, found, strict=True))
        same_list = sum([h.ids for h in a] == [h.ids for h in b] for a, b in zip(first, found, strict=True))
        print(f"{precision} / {first_name}: {rate / first_rate:.2f}× sources/s; the same best target for "
              f"{same_best} of {len(found)} sources, the same {beam} targets in the same order for {same_list}")


def time_single(model: RNNEncoderDecoder, ids: list[list[int]], args: argparse.Namespace, batched_rate: float) -> None:
    """The same search one source at a time on the first ``--single`` sources."""
    import torch

    from rescorer.proposals import beam as beam_module

    subset = ids[: args.single]
    started = time.perf_counter()
    with torch.inference_mode():
        for one in subset:
            list(beam_module.search_sources(model, [one], args.beam, max_words=args.max_words))
    single_rate = len(subset) / (time.perf_counter() - started)
    print(f"one source at a time: {single_rate:.1f} sources/s; batching gains {batched_rate / single_rate:.1f}x")


def main() -> None:
    args = parse_args()
    import torch

    from moses_integration.tokens import split_tokens
    from neural.device import select_device

    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    table = args.table or shared_path("fixtures/hansard-enfr/phrase-table.sample.gz", "real source phrases")
    sources = read_sources(table, args.sources)
    model, src_vocab, what = search_model(args.model, table)
    model.to(device).eval()
    ids = [src_vocab.encode(split_tokens(s)) for s in sources]
    print(f"{len(sources)} sources of {table}; {what}; beam {args.beam}, max {args.max_words} words, "
          f"{args.threads} thread(s), {device}")
    results = {precision: time_batched(model, ids, args, precision, device) for precision in args.precisions}
    compare_precisions(results, args.beam)
    batched_rate = results[args.precisions[0]][0]
    if args.single:
        time_single(model, ids, args, batched_rate)
    hours = FULL_TABLE_SOURCES / batched_rate / 3600
    print(f"every distinct source of the fixture's full table ({FULL_TABLE_SOURCES:,}): {hours:.1f} h at this rate "
          f"on {args.threads} thread(s)")


if __name__ == "__main__":
    main()
