"""Speed of ``mert optimize`` against Moses' ``extractor`` + ``mert`` on the real n-best list.

Usage: python -m benchmarks.mert_speed [--restarts 20] [--seed 1000] [--repeats 3] [--threads 1]

Runs ``mert optimize`` on ``fixtures/hansard-enfr/nbest/dev.nbest.gz`` (19,313 hypotheses,
200 sentences, 14 features) with the README's start point and ranges (``init.opt``),
``--restarts 20`` and ``--threads`` (default 1, as the Moses ``mert`` it is compared with), as
separate processes, end to end (reading the list, BLEU statistics, optimisation, printing), and
reports the best wall time of ``--repeats`` runs, the BLEU, and an in-process split between loading
and optimising.

If ``$MOSES_BIN_DIR`` holds ``extractor`` and ``mert``, it then runs them the way the fixture
README (section 7) does, in a temporary directory:

    extractor --sctype BLEU --scconfig case:true --scfile scores.dat --ffile features.dat -r REF -n dev.nbest
    mert -d 14 --sctype BLEU --scconfig case:true --scfile scores.dat --ffile features.dat \
         --ifile init.opt -n 20 -r 1000

and prints both times, their ratio and both BLEU values. Without Moses it prints the README's
figures for that machine (extractor 0.90 s + mert 10.0 s, BLEU 26.62) for reference.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.shared_data import shared_dir

REPO = Path(__file__).resolve().parents[1]
README_MOSES_SECONDS = 0.90 + 10.0
README_MOSES_BLEU = 26.62


def run_ours(nbest: Path, ref: Path, init: Path, restarts: int, seed: int, threads: int) -> tuple[float, float, str]:
    """Wall time and BLEU of one ``mert optimize`` process."""
    cmd = [sys.executable, "-m", "mert.cli", "optimize", str(nbest), "--ref", str(ref), "--init-opt", str(init),
           "--restarts", str(restarts), "--seed", str(seed), "--threads", str(threads)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - started
    match = re.search(r"^# BLEU (\S+)", proc.stdout, re.MULTILINE)
    if not match:
        raise RuntimeError(f"no BLEU line in the output of {' '.join(cmd)}:\n{proc.stdout}{proc.stderr}")
    return elapsed, float(match.group(1)), proc.stdout


def split_in_process(nbest: Path, ref: Path, init: Path, restarts: int, seed: int,
                     threads: int) -> tuple[float, float, int]:
    """Loading (parse + BLEU statistics) and optimisation times, and the total iterations."""
    from mert.nbest_set import load_tuning_set, read_init_opt
    from mert.optimizer import optimize_runs

    t0 = time.perf_counter()
    _, data = load_tuning_set([nbest], [ref])
    t1 = time.perf_counter()
    start, low, high = read_init_opt(init, data.num_features)
    result = optimize_runs(data, start, restarts=restarts, ranges=(low, high) if low is not None else None, seed=seed,
                           threads=threads)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, sum(r.iterations for r in result.runs)


def run_moses(
    bin_dir: Path, nbest: Path, ref: Path, init: Path, restarts: int, seed: int
) -> tuple[float, float, float]:
    """extractor and mert wall times and mert's BLEU (0..100), as in the fixture README."""
    with tempfile.TemporaryDirectory(prefix="mert-bench-") as tmp:
        work = Path(tmp)
        plain = work / "dev.nbest"
        plain.write_bytes(gzip.decompress(nbest.read_bytes()))
        shutil.copy(init, work / "init.opt")
        num_features = len(init.read_text().splitlines()[0].split())
        started = time.perf_counter()
        subprocess.run([str(bin_dir / "extractor"), "--sctype", "BLEU", "--scconfig", "case:true",
                        "--scfile", "scores.dat", "--ffile", "features.dat", "-r", str(ref), "-n", "dev.nbest"],
                       cwd=work, check=True, capture_output=True)
        extracted = time.perf_counter()
        proc = subprocess.run([str(bin_dir / "mert"), "-d", str(num_features), "--sctype", "BLEU",
                               "--scconfig", "case:true", "--scfile", "scores.dat", "--ffile", "features.dat",
                               "--ifile", "init.opt", "-n", str(restarts), "-r", str(seed)],
                              cwd=work, check=True, capture_output=True, text=True)
        done = time.perf_counter()
    match = re.search(r"Best point:.*=>\s*(\S+)", proc.stderr)
    if not match:
        raise RuntimeError(f"no 'Best point' line in mert's output:\n{proc.stderr}")
    return extracted - started, done - extracted, 100.0 * float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="mert optimize --threads (default 1, as Moses' mert here; the result is the same)")
    args = parser.parse_args()
    fixture = shared_dir() / "fixtures/hansard-enfr"
    nbest, ref, init = fixture / "nbest/dev.nbest.gz", fixture / "data/dev.tok.tc.fr", fixture / "nbest/init.opt"
    if not nbest.exists():
        sys.exit(f"fixture not found under {fixture} (set SHARED_DATA_DIR)")

    times = []
    bleu = 0.0
    for _ in range(args.repeats):
        elapsed, bleu, _ = run_ours(nbest, ref, init, args.restarts, args.seed, args.threads)
        times.append(elapsed)
    ours = min(times)
    load_s, opt_s, iterations = split_in_process(nbest, ref, init, args.restarts, args.seed, args.threads)
    print(f"mert optimize ({args.restarts} restarts + start point, --threads {args.threads}, {os.cpu_count()} CPUs): "
          f"best {ours:.2f} s of {args.repeats} runs ({' '.join(f'{t:.2f}' for t in times)}), BLEU {bleu:.2f}")
    print(f"  in process: load + BLEU statistics {load_s:.2f} s, optimisation {opt_s:.2f} s "
          f"({iterations} coordinate-ascent iterations, {1000 * opt_s / max(iterations, 1):.1f} ms each)")

    bin_dir = os.environ.get("MOSES_BIN_DIR")
    if bin_dir and all((Path(bin_dir) / b).exists() for b in ("extractor", "mert")):
        ext_s, mert_s, moses_bleu = run_moses(Path(bin_dir), nbest, ref, init, args.restarts, args.seed)
        moses = ext_s + mert_s
        print(f"Moses extractor + mert: {ext_s:.2f} s + {mert_s:.2f} s = {moses:.2f} s, BLEU {moses_bleu:.2f}")
    else:
        moses, moses_bleu = README_MOSES_SECONDS, README_MOSES_BLEU
        print(f"Moses (MOSES_BIN_DIR not set; README figures, 2-core machine): extractor 0.90 s + mert 10.0 s "
              f"= {moses:.2f} s, BLEU {moses_bleu:.2f}")
    print(f"time ratio ours/Moses: {ours / moses:.2f}; BLEU ours - Moses: {bleu - moses_bleu:+.2f}")


if __name__ == "__main__":
    main()
