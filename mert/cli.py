"""Command line: the ``mert`` group. Parsing and printing only; the work is in the library.

``mert optimize`` is the counterpart of Moses' ``extractor`` + ``mert`` pair: it reads n-best
lists directly (merging them, as ``mert-moses.pl`` does over iterations), scores them against
the references and prints optimised weights in ``moses.ini`` ``[weight]`` syntax.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from infrastructure.cli_options import (
    FiniteFloat,
    Group,
    IntRange,
    NumberList,
    OneLinePath,
    OutputPath,
    friendly_errors,
    quiet_option,
    resume_option,
    seed_option,
    threads_option,
)

#: Caps on the counts that size an array up front (one row per start point, per extra direction, per
#: resample of the test set), so a mistyped count is one line as the command line is read, not a
#: terabyte allocation traceback. Far above use: Moses' own defaults are 20 restarts and 1000 resamples.
MAX_RESTARTS = 10_000
MAX_RANDOM_DIRECTIONS = 10_000
MAX_BOOTSTRAP_SAMPLES = 10_000


@click.group(cls=Group)
def main() -> None:
    """Minimum-error-rate training for Moses, compatible with its n-best lists and weights."""


class WeightsOrFile(OneLinePath):
    """``--init``: a file of weights, or the weights themselves (numbers, or ``Name= v …``)."""

    name = "weights"

    def __init__(self) -> None:
        super().__init__(exists=True, dir_okay=False)

    def convert(self, value, param, ctx):
        from mert.nbest_set import InlineWeights

        inline = InlineWeights.parse(value) if isinstance(value, str) and not os.path.exists(value) else None
        return inline if inline is not None else super().convert(value, param, ctx)


@main.command("optimize")
@click.argument("nbest", nargs=-1, required=True, type=OneLinePath(exists=True, dir_okay=False))
@click.option("--ref", "refs", multiple=True, required=True, type=OneLinePath(exists=True, dir_okay=False),
              help="reference file (repeat for several references)")
@click.option(
    "--init",
    "init_paths",
    multiple=True,
    type=WeightsOrFile(),
    help="start weights: a file of 'Name= v …' lines (moses.ini, -show-weights, a previous run) or of numbers, "
    "or the weights themselves ('0.1 0.2 …' or 'LM0= 0.5 …'); repeat for several start points (e.g. the "
    "decoder's and the previous iteration's weights)",
)
@click.option("--init-opt", "init_opt", type=OneLinePath(exists=True, dir_okay=False),
              help="Moses init.opt: start weights, then restart minima and maxima")
@click.option("--restarts", type=IntRange(min=0, max=MAX_RESTARTS), default=20, show_default=True,
              help="random restarts (Moses -n)")
@seed_option("seed of the random restarts")
@click.option("--ranges", type=NumberList(FiniteFloat(), count=2, ascending=True), metavar="MIN,MAX",
              help="random-restart range MIN,MAX for every feature (default 0,1 or init.opt)")
@click.option("--fixed", multiple=True, help="feature or column (LM0_0) to keep fixed (held at 0: absent)")
@click.option("--epsilon", type=FiniteFloat(min=0), default=0.01, show_default=True, help="stop when BLEU gains ≤ this")
@click.option("--random-directions", type=IntRange(min=0, max=MAX_RANDOM_DIRECTIONS), default=0, show_default=True,
              help="extra random directions")
@threads_option("threads optimising the start points at once (the same result; without --random-directions) "
                "[default: the CPUs this process may use]")
@friendly_errors()
def optimize_command(
    nbest: tuple[str, ...],
    refs: tuple[str, ...],
    init_paths: tuple[str, ...],
    init_opt: str | None,
    restarts: int,
    seed: int | None,
    ranges: list[float] | None,
    fixed: tuple[str, ...],
    epsilon: float,
    random_directions: int,
    threads: int,
) -> None:
    """Optimise weights on NBEST list(s) (merged, repeats dropped) against --ref.

    Start points: --init-opt's first line and every --init (all ones if none), plus --restarts
    random points in the --ranges (else init.opt's lines 2-3, else [0, 1]). Prints the weights as
    moses.ini [weight] lines, then '# BLEU …' (0..100, case-sensitive, tokenised text, closest
    reference length, no smoothing: as Moses' mert).
    """
    from mert.nbest_set import fixed_mask, format_weights, load_tuning_set, start_points
    from mert.optimizer import optimize_runs

    started = time.perf_counter()
    nbest_set, data = load_tuning_set(nbest, refs)
    names = nbest_set.feature_names
    starts, init_ranges = start_points(names, init_opt=init_opt, init_paths=init_paths)
    range_arg = (ranges[0], ranges[1]) if ranges else None
    result = optimize_runs(
        data,
        starts,
        restarts=restarts,
        ranges=range_arg if range_arg is not None else init_ranges,
        fixed=fixed_mask(names, fixed),
        seed=seed,
        epsilon=epsilon,
        random_directions=random_directions,
        threads=threads,
    )
    for line in format_weights(result.weights, names):
        click.echo(line)
    click.echo(
        f"# BLEU {result.bleu:.4f} (start {result.runs[0].start_bleu:.4f}; best of {len(result.runs)} runs; "
        f"{len(nbest_set.hypotheses)} hypotheses, {nbest_set.duplicates_removed} repeats dropped; "
        f"{time.perf_counter() - started:.1f} s)"
    )
    sys.stdout.flush()



@main.command("tune")
@click.option("--moses-ini", "ini", required=True, type=OneLinePath(exists=True, dir_okay=False, path_type=Path),
              help="the system to tune (its weights are the start point)")
@click.option("--src", "source", required=True, type=OneLinePath(exists=True, dir_okay=False, path_type=Path),
              help="dev source, as the decoder reads it (tokenized, truecased)")
@click.option("--ref", "refs", multiple=True, required=True, type=OneLinePath(exists=True, path_type=Path),
              help="dev reference, tokenized like the output (repeat for several references)")
@click.option("--work-dir", default="work", show_default=True,
              type=OutputPath(folder=True, path_type=Path, also_writes=("{}/moses.ini",)),
              help="where every iteration's ini, n-best list, weights and the log are kept")
@click.option("--moses-ini-out", "--output-ini", "output_ini", type=OutputPath(path_type=Path),
              help="also write the tuned moses.ini here (besides WORK_DIR/moses.ini)")
@click.option("--moses-bin-dir", type=OneLinePath(file_okay=False, path_type=Path),
              help="folder with the moses binary (default: $MOSES_BIN_DIR)")
@threads_option("decoder threads (moses -threads), and the threads of MERT's optimisation (start points at once; "
                "the same result) [default: the CPUs this process may use]")
@click.option("--nbest-size", type=IntRange(min=1), default=100, show_default=True, help="n-best list size (distinct)")
@click.option("--max-iterations", type=IntRange(min=1), default=25, show_default=True,
              help="stop after this many iterations (decode, then optimise), unless the weights converge or the "
                   "n-best lists bring no new hypotheses first")
@click.option("--restarts", type=IntRange(min=0, max=MAX_RESTARTS), default=20, show_default=True,
              help="random restarts per optimisation")
@seed_option("iteration n seeds its restarts with SEED + 1000 n (as --predictable-seeds); "
                   "independent runs need seeds that differ modulo 1000")
@click.option("--random-seeds", is_flag=True, help="fresh randomness each run (not reproducible)")
@click.option("--min-weight-change", type=FiniteFloat(min=0), default=1e-5, show_default=True,
              help="stop when no weight moves by more than this")
@click.option("--fixed", multiple=True, help="feature or column (LM0_0) to keep fixed (held at 0: absent)")
@click.option("--feature", "features", multiple=True,
              help="extra n-best feature: a built-in (WordCount, LengthRatio[:ratio]), one an installed "
                   "package registers (this project's CSLM:model.pt), or module:Class[:arg]")
@click.option("--decoder-flags", default="", help="extra moses arguments, e.g. '-distortion-limit 6'")
@click.option("--decoder-cwd", type=OneLinePath(file_okay=False, exists=True, path_type=Path),
              help="folder the ini's relative model paths refer to, where moses runs (default: the ini's folder)")
@resume_option("continue the run in --work-dir after its last iteration", "--continue")
@click.option("--engine", type=click.Choice(["builtin", "moses"]), default="builtin", show_default=True,
              help="moses: delegate to Moses' scripts/training/mert-moses.pl instead")
@click.option("--moses-scripts-dir", type=OneLinePath(file_okay=False, path_type=Path),
              help="Moses' scripts/ folder for --engine moses (default: $MOSES_SCRIPTS_DIR, or BIN/../scripts)")
@quiet_option("no progress lines on stderr (each iteration's BLEU and weights are still in WORK_DIR)")
@friendly_errors()
def tune_command(
    ini: Path,
    source: Path,
    refs: tuple[Path, ...],
    work_dir: Path,
    output_ini: Path | None,
    moses_bin_dir: Path | None,
    threads: int,
    nbest_size: int,
    max_iterations: int,
    restarts: int,
    seed: int,
    random_seeds: bool,
    min_weight_change: float,
    fixed: tuple[str, ...],
    features: tuple[str, ...],
    decoder_flags: str,
    decoder_cwd: Path | None,
    resume: bool,
    engine: str,
    moses_scripts_dir: Path | None,
    quiet: bool,
) -> None:
    """Tune the weights of a Moses system with MERT on a dev set, decoding with the real moses.

    Each iteration decodes --src (100-best distinct), adds the --feature scores, merges the
    list with the earlier ones, optimises (previous weights + --restarts random starts) and
    writes the weights. Stops when no weight moves by more than --min-weight-change, when no
    new hypotheses appear, or after --max-iterations. The tuned config is WORK_DIR/moses.ini
    (model paths made absolute); extra-feature weights go to moses.ini.extra-features.
    """
    import shlex

    if engine == "moses":
        _refuse_what_mert_moses_ignores()
    from mert.features import absolute_spec_path
    from mert.mert_moses import tune_with_mert_moses
    from mert.tune import TuneOptions, format_weight_lines, log_to_stderr, tune

    options = TuneOptions(
        ini=ini,
        source=source,
        references=list(refs),
        work_dir=work_dir,
        moses_bin_dir=moses_bin_dir,
        feature_specs=[absolute_spec_path(f) for f in features],
        nbest_size=nbest_size,
        threads=threads,
        max_iterations=max_iterations,
        restarts=restarts,
        seed=None if random_seeds else seed,
        min_weight_change=min_weight_change,
        fixed=list(fixed),
        output_ini=output_ini,
        decoder_flags=shlex.split(decoder_flags),
        resume=resume,
        decoder_cwd=decoder_cwd,
    )
    log = (lambda _message: None) if quiet else log_to_stderr
    if engine == "moses":
        final = tune_with_mert_moses(options, scripts_dir=moses_scripts_dir, log=log)
        click.echo(f"tuned config: {final}")
        return
    result = tune(options, log=log)
    for line in format_weight_lines(result.weights):
        click.echo(line)
    best = result.best_optimised_bleu
    click.echo(
        f"# {len(result.iterations)} iteration(s), stopped: {result.stop_reason}; optimised dev BLEU "
        f"{'-' if best is None else f'{best:.2f}'}; config {result.ini}"
        + (f" (+ {result.sidecar.name})" if result.sidecar else "")
    )


def _refuse_what_mert_moses_ignores() -> None:
    """``mert-moses.pl`` seeds iteration n with 1000 n and stops at its own weight change (1e-5): a --seed or
    --min-weight-change given with --engine moses would be dropped in silence, and the run not be the one asked for."""
    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in ("seed", "min_weight_change")
             if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(f"--engine moses has no counterpart for {' and '.join(given)} (mert-moses.pl seeds "
                               "iteration n with 1000 n and stops at a weight change of 1e-5); use the default engine")


@main.command("evaluate")
@click.option("--ref", "refs", multiple=True, required=True, type=OneLinePath(exists=True, path_type=Path),
              help="raw (detokenized) reference, scored with sacrebleu's default tokenizer; repeatable")
@click.option("--tok-ref", "tok_refs", multiple=True, type=OneLinePath(exists=True, path_type=Path),
              help="tokenized reference for BLEU on tokenized text (tokenize=none); repeatable")
@click.option("--lang", default="fr", show_default=True, help="target language (detokenizer rules)")
@click.option("--hyp", "hyps", multiple=True, type=OneLinePath(exists=True, path_type=Path),
              help="already decoded output (tokenized Moses output), one per tuning run; repeatable")
@click.option("--moses-ini", "inis", multiple=True, type=OneLinePath(exists=True, dir_okay=False, path_type=Path),
              help="tuned config to decode --src with (one per tuning run); repeatable")
@click.option("--baseline", "baselines", multiple=True, type=OneLinePath(exists=True, path_type=Path),
              help="baseline output(s) to compare with by paired bootstrap; repeatable")
@click.option("--baseline-ini", "baseline_inis", multiple=True,
              type=OneLinePath(exists=True, dir_okay=False, path_type=Path), help="baseline config(s) to decode")
@click.option("--src", "source", type=OneLinePath(exists=True, dir_okay=False, path_type=Path),
              help="test source for decoding (tokenized, truecased)")
@click.option("--output-dir", type=OutputPath(folder=True, path_type=Path),
              help="where decoded and post-processed outputs are written (with --moses-ini/--baseline-ini) "
                   "[default: eval]")
@click.option("--moses-bin-dir", type=OneLinePath(file_okay=False, path_type=Path),
              help="folder with the moses binary (default: $MOSES_BIN_DIR)")
@threads_option("decoder threads (moses -threads) [default: the CPUs this process may use]")
@click.option("--decoder-cwd", type=OneLinePath(file_okay=False, exists=True, path_type=Path),
              help="run moses here (default: each ini's folder; Moses resolves relative model paths against it)")
@click.option("--nbest-size", type=IntRange(min=1), default=100, show_default=True,
              help="n-best size when extra features rescore the output")
@click.option("--bootstrap-samples", type=IntRange(min=1, max=MAX_BOOTSTRAP_SAMPLES), default=1000, show_default=True,
              help="resamples of the test set for --baseline's paired bootstrap")
@click.option("--detokenized", is_flag=True, help="the hypotheses are already detokenized: no post-processing")
@click.option("--report", "json_path", type=OutputPath(path_type=Path),
              help="also write the report as JSON here")
@resume_option("keep the decodes an earlier run finished in --output-dir from the same ini, extra features "
               "and --src (each LABEL.runK.tok.json says what); decode the rest")
@quiet_option("no progress lines on stderr")
@friendly_errors()
def evaluate_command(
    refs: tuple[Path, ...],
    tok_refs: tuple[Path, ...],
    lang: str,
    hyps: tuple[Path, ...],
    inis: tuple[Path, ...],
    baselines: tuple[Path, ...],
    baseline_inis: tuple[Path, ...],
    source: Path | None,
    output_dir: Path | None,
    moses_bin_dir: Path | None,
    threads: int,
    decoder_cwd: Path | None,
    nbest_size: int,
    bootstrap_samples: int,
    detokenized: bool,
    json_path: Path | None,
    resume: bool,
    quiet: bool,
) -> None:
    """BLEU of a system on a test set: sacrebleu on detokenized text, with its signature.

    Outputs come from --hyp files or are decoded from --src with each --moses-ini (extra
    n-best features in a moses.ini.extra-features file are applied by n-best rescoring).
    Post-processing: detruecase, detokenize and unescape (sacremoses). Several runs give
    mean ± std; --baseline/--baseline-ini add paired bootstrap resampling (sacrebleu).
    """

    from infrastructure.files import write_json
    from mert.evaluate import Decodes, evaluate_test_set

    if not hyps and not inis:
        raise click.UsageError("give --hyp FILE or --moses-ini INI --src SRC")
    if (inis or baseline_inis) and source is None:
        raise click.UsageError("--moses-ini/--baseline-ini need --src (the test source)")
    if detokenized and tok_refs:  # the tokenized BLEU line was left out in silence
        raise click.UsageError("--tok-ref scores tokenized hypotheses, and --detokenized ones have none: drop one")
    decodes = None if source is None or not (inis or baseline_inis) else Decodes(
        source, inis, baseline_inis, output_dir or Path("eval"), moses_bin_dir=moses_bin_dir, threads=threads,
        decoder_cwd=decoder_cwd, nbest_size=nbest_size, resume=resume)
    report = evaluate_test_set(hyps, refs, lang=lang, tokenized_references=tok_refs, baselines=baselines,
                               decodes=decodes, already_detokenized=detokenized, bootstrap_samples=bootstrap_samples,
                               say=(lambda _: None) if quiet else (lambda message: click.echo(message, err=True)))
    for line in report.lines():
        click.echo(line)
    if json_path is not None:
        write_json(json_path, report.to_json())


if __name__ == "__main__":  # python -m mert.cli, for environments without the console script
    main()
