"""Command line: ``table1 STEP…``, the Table 1 experiment (``make table1`` calls ``table1 … all``).

Parsing only: the steps and their order are :mod:`table1.experiment`'s (:data:`table1.experiment.STEPS`).
Every finished step is stamped in the work folder and skipped, so a killed run continues where it
stopped when the same command is run again.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from infrastructure.cli_options import (
    Command,
    IntRange,
    OneLinePath,
    OutputPath,
    device_option,
    friendly_errors,
    threads_option,
)
from table1 import experiment as ex
from table1.beside import read_beside
from table1.report import REPORT_FILES
from table1.reranking_report import REPORT_FILES as RERANKING_FILES
from table1.settings import MAX_RUNS, RUN_SEED_BASE, SCALES, select_configurations
from table1.workspace import TIMINGS_FILE, new_experiment

#: What the report and reranking steps write into ``--results``: refused where one is an input (``--beside``).
RESULTS_FILES = tuple(f"{{}}/{name}" for name in (*REPORT_FILES, TIMINGS_FILE, *RERANKING_FILES))


@click.command("table1", cls=Command)
@click.argument("steps", nargs=-1, required=True, type=click.Choice([*ex.STEPS, *ex.RERANKING_STEPS, "all"]))
@click.option("--work", required=True, type=OutputPath(folder=True, path_type=Path),
              help="work folder (outside the source tree); every step's outputs and stamps")
@click.option("--scale", type=click.Choice(list(SCALES)), default="small", show_default=True,
              help="settings: table1/settings.py")
@click.option("--data", type=OneLinePath(file_okay=False, path_type=Path),
              help="raw text folder (SCALE=small: the shared data folder with hansard/ and newstest/)")
@click.option("--moses-bin-dir", type=OneLinePath(file_okay=False, path_type=Path),
              help="Moses binaries (default: $MOSES_BIN_DIR, else MOSES_HOME/bin)")
@click.option("--moses-home", type=OneLinePath(file_okay=False, path_type=Path),
              help="Moses tree with scripts/ (default: $MOSES_HOME, else BIN/../scripts)")
@threads_option("processes and decoder threads [default: the CPUs this process may use]")
@device_option("auto, cpu, cuda or cuda:N (model training)")
@click.option("--config", "configs", multiple=True,
              help="a configuration to run; repeatable: --config baseline --config rnn (default: the paper's four; "
                   "rnn-wp tunes the unknown-word column beside the RNN; cslm-nbest-rnn and "
                   "cslm-nbest-rnn-wp rescore n-best lists with the CSLM instead; rnn-proposals decodes with "
                   "the table the RNN completed; rnn-both tunes a reverse model's p(f|e) column too; rnn-both-prop "
                   "both, with proposals reranked by both directions; nmt-nbest and nmt-both-nbest add the "
                   "reranking's NMT model, p(e|f) or both directions, as an n-best feature in the tuning loop)")
@click.option("--runs", type=IntRange(1, MAX_RUNS), default=3, show_default=True,
              help=f"tuning runs per configuration (run k: mert tune --seed {RUN_SEED_BASE - 1}+k)")
@click.option("--aligner", type=click.Choice(["auto", "giza", "eflomal"]), default="auto", show_default=True,
              help="auto: GIZA++/mgiza where Moses has them, else eflomal")
@click.option("--results", type=OutputPath(folder=True, path_type=Path, also_writes=RESULTS_FILES),
              default=Path("results"), show_default=True, help="where the report step writes table1.{md,json,png}")
@click.option("--beside", "beside_paths", multiple=True, type=OneLinePath(exists=True, dir_okay=False, path_type=Path),
              help="another run's table1.json (e.g. results/table1.json of SCALE=small); repeatable: the report "
                   "puts its rows' test scores beside this run's")
@click.option("--mirror", default="https://www.statmt.org/", show_default=True,
              help="data step: where the WMT'14 training and LM archives that DATA lacks are fetched from")
@friendly_errors(keeps_progress=True)  # finished steps are stamped and kept
def main(steps: tuple[str, ...], work: Path, scale: str, data: Path | None, moses_bin_dir: Path | None,
         moses_home: Path | None, threads: int, device: str, configs: tuple[str, ...], runs: int, aligner: str,
         results: Path, beside_paths: tuple[Path, ...], mirror: str) -> None:
    """Run STEPS of the Table 1 experiment in WORK (``all``: every step in order); finished steps are
    skipped, so rerun freely.

    data, prepare, baseline, rnn, proposals, cslm, speed, tune, eval, report; and, named on their own,
    reranking-models (the reranking experiment's models) and reranking (Baseline's runs rerank their
    n-best lists with every trained model: RESULTS/reranking.md; see docs/table1.md).
    """
    command = (f"make table1 SCALE={scale} RUNS={runs}" + (f" CONFIGS='{' '.join(configs)}'" if configs else "")
               + (f" STEPS='{' '.join(steps)}'" if steps != ("all",) else "")
               + (f" RESULTS={results}" if results != Path("results") else "")
               + (f" BESIDE='{' '.join(map(str, beside_paths))}'" if beside_paths else ""))
    beside = tuple(read_beside(path) for path in beside_paths)  # a bad one is one line before any step
    options = ex.StepOptions(select_configurations(list(configs)), runs, aligner, mirror, results, command, beside)
    exp = new_experiment(work, scale, data=data, moses_bin_dir=moses_bin_dir, moses_home=moses_home,
                         jobs=threads, device=device)
    for path in ex.run_steps(exp, ex.expand_steps(steps), options):
        click.echo(f"wrote {path}", err=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
