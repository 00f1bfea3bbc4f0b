"""Speed of ``rescorer propose``'s batched beam search, in source phrases per second.

Usage: python -m benchmarks.propose_speed [--model MODEL.pt] [--sources 500] [--beam 10]
       [--max-words 8] [--threads 1] [--device cpu] [--single 100] [--precision fp32,bf16]

The sources are the real, randomly drawn source phrases of
``../shared/fixtures/hansard-enfr/phrase-table.sample.gz`` (or --table), in table order. It prints
sources/s of the batched search, the decoder rows it ran per source (hypotheses × steps: the cost
driver), the same search one source at a time (the search ``rescorer sample`` ran before) on the
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
from pathlib import Path

from benchmarks.shared_data import shared_path

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


def main() -> None:
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

    import torch

    from moses_integration.tokens import split_tokens
    from neural.device import select_device
    from neural.vocab import Vocab
    from rescorer.model.checkpoint import load_checkpoint
    from rescorer.model.config import ModelConfig
    from rescorer.model.network import RNNEncoderDecoder
    from rescorer.proposals import beam as beam_module

    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    table = args.table or shared_path("fixtures/hansard-enfr/phrase-table.sample.gz", "real source phrases")
    sources = read_sources(table, args.sources)
    if args.model:
        checkpoint = load_checkpoint(args.model)
        model, src_vocab, what = checkpoint.model, checkpoint.src_vocab, f"model {args.model}"
    else:
        torch.manual_seed(1)
        words = sorted({w for s in read_sources(table, 10**9) for w in split_tokens(s)})
        src_vocab = Vocab(["</s>", "[UNK]", *words[:14_999]])
        config = ModelConfig(src_vocab_size=len(src_vocab), tgt_vocab_size=15_001, hidden=256, embedding=64,
                             maxout_units=128, output_rank=64)
        model, what = RNNEncoderDecoder(config), "random weights, small size (pessimistic: few targets end)"
    model.to(device).eval()
    ids = [src_vocab.encode(split_tokens(s)) for s in sources]
    print(f"{len(sources)} sources of {table}; {what}; beam {args.beam}, max {args.max_words} words, "
          f"{args.threads} thread(s), {device}")

    rows = 0
    original_step = beam_module.next_word_top_k

    def counting_step(model, start, src, h, prev, k):
        nonlocal rows
        rows += len(src)
        return original_step(model, start, src, h, prev, k)

    beam_module.next_word_top_k = counting_step
    precisions = args.precision.split(",")
    if any(p not in ("fp32", "bf16") for p in precisions):
        parser.error(f"--precision: fp32 or bf16, got {args.precision!r}")
    results: dict[str, tuple[float, list]] = {}
    for precision in precisions:
        amp = torch.bfloat16 if precision == "bf16" else None
        with torch.inference_mode():
            list(beam_module.search_sources(model, ids[:10], args.beam, max_words=args.max_words,
                                            amp_dtype=amp))  # warm-up
            rows = 0
            started = time.perf_counter()
            found = list(beam_module.search_sources(model, ids, args.beam, max_words=args.max_words,
                                                    rows_per_step=args.rows_per_step, amp_dtype=amp))
            seconds = time.perf_counter() - started
        batched_rate = len(sources) / seconds
        results[precision] = (batched_rate, found)
        finished = sum(h.finished for f in found for h in f) / len(found)
        lengths = [len(h.ids) for f in found for h in f if h.finished]
        mean_length = sum(lengths) / max(1, len(lengths))
        print(f"batched, {precision}: {batched_rate:.1f} sources/s ({seconds:.1f} s), {rows / len(sources):.0f} "
              f"decoder rows per source, {finished:.1f} finished targets per source (mean {mean_length:.2f} words)")
    first_rate, first = results[precisions[0]]
    for precision in precisions[1:]:
        rate, found = results[precision]
        same_best = sum(bool(a) and bool(b) and a[0].ids == b[0].ids for a, b in zip(first, found, strict=True))
        same_list = sum([h.ids for h in a] == [h.ids for h in b] for a, b in zip(first, found, strict=True))
        print(f"{precision} / {precisions[0]}: {rate / first_rate:.2f}× sources/s; the same best target for "
              f"{same_best} of {len(found)} sources, the same {args.beam} targets in the same order for {same_list}")
    batched_rate = first_rate
    if args.single:
        subset = ids[: args.single]
        started = time.perf_counter()
        with torch.inference_mode():
            for one in subset:
                list(beam_module.search_sources(model, [one], args.beam, max_words=args.max_words))
        single_rate = len(subset) / (time.perf_counter() - started)
        print(f"one source at a time: {single_rate:.1f} sources/s; batching gains {batched_rate / single_rate:.1f}x")
    hours = FULL_TABLE_SOURCES / batched_rate / 3600
    print(f"every distinct source of the fixture's full table ({FULL_TABLE_SOURCES:,}): {hours:.1f} h at this rate "
          f"on {args.threads} thread(s)")


if __name__ == "__main__":
    main()
