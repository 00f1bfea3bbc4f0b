"""Decoding speed with the CSLM inside Moses (NeuralLM), against the same system without it.

Usage: MOSES_BIN_DIR=… python -m benchmarks.cslm_decoder_speed [--sentences 50] [--threads 1]
       [--sizes small,paper] [--weight 0.1] [--model cslm.pt]

Decodes the first ``--sentences`` of the fixture's dev set (../shared/fixtures/hansard-enfr) with the
fixture system as it is, then with ``NeuralLM`` added for each CSLM size: ``small`` is SCALE=small's former
shape (embedding 128, layers 512 and 256), ``paper`` the paper's (512; 1536 and 1024), and
``small-one-layer`` (SCALE=small's shape now) and ``paper-one-layer`` the same without their second
hidden layer; all are 7-grams
over a 15,000-word shortlist (the most frequent target words of the fixture's phrase table), with
random weights unless ``--model`` is given: the decoder's cost does not depend on the weights' values,
only on how many distinct n-grams the search asks for. Each configuration is also run on an empty input,
so that model loading (NPLM premultiplies the first layer at load time) is reported apart from
decoding. Prints wall seconds, and the decoder's CPU seconds (user + system, from the kernel's
accounting of the child process: on a shared machine the steadier figure), sentences per CPU-second
and the slowdown against the plain system.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from benchmarks.shared_data import shared_path
from cslm.export import cslm_to_nplm
from cslm.model import CSLM, CSLMConfig
from cslm.model_file import load_cslm
from moses_integration.decoder import decode, find_moses_bin_dir
from moses_integration.moses_ini import MosesIni
from moses_integration.nplm import neural_lm_feature_line, write_nplm
from moses_integration.phrase_table import read_phrase_table
from moses_integration.tokens import split_tokens
from neural.vocab import Vocab

# name: (embedding, hidden layers). The one-layer shapes keep the first layer, which NPLM
# premultiplies into the embeddings at load time, and drop the second, whose matrix-vector product
# is the main cost of a lookup (docs/moses-nplm.md, "Speed").
SIZES = {"small": (128, [512, 256]), "paper": (512, [1536, 1024]),
         "small-one-layer": (128, [512]), "paper-one-layer": (512, [1536])}


def fixture() -> Path:
    return shared_path("fixtures/hansard-enfr", "the fixture system")


def target_vocab(table: Path, shortlist: int) -> Vocab:
    counts: Counter = Counter()
    for entry in read_phrase_table(table):
        counts.update(split_tokens(entry.target))
    return Vocab.from_counts(counts, shortlist)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_decode(bin_dir: Path, ini: Path, source: Path, out: Path, threads: int) -> tuple[float, float]:
    """Wall and CPU seconds of one decode."""
    started, cpu = time.perf_counter(), children_cpu()
    decode(bin_dir, ini, source, out, threads=threads)
    return time.perf_counter() - started, children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="decoder threads")
    parser.add_argument("--sizes", default="small,paper")
    parser.add_argument("--weight", type=float, default=0.1, help="CSLM0 weight in moses.ini")
    parser.add_argument("--model", help="a trained CSLM instead of random weights (one size: its own)")
    args = parser.parse_args()
    bin_dir = find_moses_bin_dir()
    system = fixture() / "filtered"
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        source = tmp / "dev.en"
        lines = (fixture() / "data/dev.tok.tc.en").read_text(encoding="utf-8").splitlines(keepends=True)
        source.write_text("".join(lines[: args.sentences]), encoding="utf-8")
        empty = tmp / "empty.en"
        empty.write_text("", encoding="utf-8")
        base_ini = MosesIni.read(system / "moses.ini")
        base_ini.absolutize_paths(system)
        base_ini.write(tmp / "plain.ini")
        systems = {"plain": tmp / "plain.ini"}
        models: dict[str, tuple[CSLM, Vocab]] = {}
        if args.model:
            loaded = load_cslm(args.model)
            models["trained"] = (loaded.model, loaded.vocab)
        else:
            vocab = target_vocab(system / "phrase-table.0-0.1.1.gz", 15_000)
            for name in args.sizes.split(","):
                embedding, hidden = SIZES[name]
                torch.manual_seed(0)
                models[name] = (CSLM(CSLMConfig(vocab_size=len(vocab), embedding=embedding, hidden=hidden)), vocab)
        for name, (cslm, words) in models.items():
            nplm = tmp / f"{name}.nplm"
            write_nplm(nplm, cslm_to_nplm(cslm, words))
            ini = MosesIni.read(tmp / "plain.ini")
            ini.add_feature(neural_lm_feature_line(nplm, "CSLM0"), [args.weight])
            ini.write(tmp / f"{name}.ini")
            systems[f"CSLM {name}"] = tmp / f"{name}.ini"
        print(f"moses: {bin_dir}; {args.sentences} dev sentences, {args.threads} decoder thread(s)")
        print("| system | load s (CPU s) | decode s (CPU s) | sentences per CPU-s | slowdown (CPU) |")
        print("|---|---|---|---|---|")
        plain_rate = None
        for label, ini_path in systems.items():
            load, load_cpu = timed_decode(bin_dir, ini_path, empty, tmp / "empty.out", args.threads)
            total, total_cpu = timed_decode(bin_dir, ini_path, source, tmp / "out", args.threads)
            seconds, cpu = max(total - load, 1e-9), max(total_cpu - load_cpu, 1e-9)
            rate = args.sentences / cpu
            plain_rate = plain_rate or rate
            print(f"| {label} | {load:.1f} ({load_cpu:.1f}) | {seconds:.1f} ({cpu:.1f}) | {rate:.3f} | "
                  f"{plain_rate / rate:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
