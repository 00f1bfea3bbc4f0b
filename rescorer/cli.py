"""Command line: ``rescore-phrase-table`` and the ``rescorer`` group. Parsing only; work is elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from infrastructure.cli_options import (
    Command,
    FiniteFloat,
    Group,
    IntRange,
    NumberList,
    OneLinePath,
    OutputPath,
    PhraseText,
    cap_workers,
    checkpoint_every_option,
    device_option,
    friendly_errors,
    quiet_option,
    resume_option,
    seed_option,
    threads_option,
)
from infrastructure.files import DEFAULT_MEMBER_LEVEL
from moses_integration.phrase_table import MAX_PHRASE_WORDS
from neural.config import CPU_BF16_PAYS_AT, MAX_BEAM, MAX_LAYER_SIZE, PRECISIONS, TRAIN_STEPS
from neural.training import MODEL_ALSO_WRITES
from rescorer.analysis import REPORT_FILES
from rescorer.model.config import (
    DEFAULT_SHORTLIST,
    DEFAULT_TRAIN_TIME,
    MAX_INIT_STD,
    MAX_SHORTLIST,
    ModelSizes,
    TrainConfig,
)
from rescorer.pipeline.columns import COLUMNS, column_kinds
from rescorer.pipeline.columns.base import Column
from rescorer.pipeline.option_rules import WHOLE_NUMBERS, WP_SIDES

#: The most targets drawn from the decoder for a source: they are drawn all at once, samples x shortlist
#: probabilities a step (600 MB at 10,000 with the paper's shortlist).
MAX_SAMPLES = 10_000
#: The files ``report`` writes into OUT_DIR, refused where one of them is MODEL or PHRASE_TABLE.
REPORT_WRITES = tuple(f"{{}}/{name}" for name in REPORT_FILES)


def _model_size_options(fn: Callable) -> Callable:
    """Model sizes (paper defaults), shared by every command that may build a model."""
    defaults = ModelSizes()
    for name, default, help_ in reversed([
        ("hidden", defaults.hidden, "GRU units d"),
        ("embedding", defaults.embedding, "word embedding size (rank of the input matrices)"),
        ("maxout-units", defaults.maxout_units, "maxout units of the deep output"),
        ("output-rank", defaults.output_rank, "rank of the output matrix G = G_l G_r"),
    ]):
        fn = click.option(f"--{name}", type=IntRange(min=1, max=MAX_LAYER_SIZE), default=default, show_default=True,
                          help=help_)(fn)
    fn = click.option("--shortlist", type=IntRange(min=1, max=MAX_SHORTLIST), default=DEFAULT_SHORTLIST,
                      show_default=True,
                      help="words per language kept in the model vocabulary ([UNK] included)")(fn)
    fn = click.option("--init-std", type=FiniteFloat(min=0, min_open=True, max=MAX_INIT_STD),
                      default=defaults.init_std,
                      show_default=True,
                      help="std of the N(0, s²) initial weights (recurrent ones stay orthogonal). The paper's "
                      "0.01 leaves small models ignoring the source for a long time: watch the 'source gain'")(fn)
    return fn



def _run_options(fn: Callable) -> Callable:
    """Where and how a long run computes, shared by the commands that run the model at length."""
    options = [
        device_option(),
        click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
                     help="auto: fp32 scores (exact) on every device; bf16 matmuls for training on a GPU, and on "
                     f"a CPU where its bf16 matmuls measure {CPU_BF16_PAYS_AT:g}x fp32's at the model's width, else "
                     "fp32 (the precision used, and why, is printed and saved with the model). "
                     "tf32: TF32 matmuls on a GPU (faster; docs/gpu.md says by how much and what it changes)"),
        threads_option(),
        quiet_option("no progress bar"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _column_weight_options(kinds: list[type[Column]]) -> Callable[[Callable], Callable]:
    """The start weights, in the moses.ini a command writes, of the columns it can append (``kinds``):
    each column's option (:class:`~rescorer.pipeline.columns.base.StartWeight`), 0 by default."""
    def add(fn: Callable) -> Callable:
        for kind in reversed(kinds):
            weight = kind.start_weight
            fn = click.option(f"--{weight.option}", weight.parameter, type=FiniteFloat(), default=0.0,
                              show_default=True, help=f"initial weight of {weight.weighs} (0: the untuned system "
                              "decodes as the original)")(fn)
        return fn
    return add


def _start_weights(kinds: list[type[Column]], given: Mapping[str, float]) -> tuple[float, ...]:
    """The start weights of the columns a run appends (``kinds``, in order) from the command's ``given``
    weight options; one given for a column the run does not append is refused, not dropped."""
    ctx = click.get_current_context()
    wanted = {kind.start_weight.parameter for kind in kinds}
    for kind in COLUMNS:
        weight = kind.start_weight
        if weight.parameter in given and weight.parameter not in wanted and \
                ctx.get_parameter_source(weight.parameter) is ParameterSource.COMMANDLINE:
            raise click.UsageError(f"--{weight.option} weighs {weight.weighs}, which this run does not append")
    return tuple(given[kind.start_weight.parameter] for kind in kinds)


def _train_step_option(fn: Callable) -> Callable:
    """How a training update runs: for the commands that train (``train`` and ``rescore-phrase-table``)."""
    return click.option(
        "--train-step", type=click.Choice(TRAIN_STEPS), default="auto", show_default=True,
        help="how a training update runs: eager (ragged batches, least arithmetic), static (fixed shapes per "
        "length bucket), captured (static, each bucket's update one CUDA graph, checked against eager); auto: "
        "captured on CUDA (eager with fp16), eager elsewhere (docs/training-speed.md). The same updates to ~1e-6")(fn)


def _model_sizes(hidden: int, embedding: int, maxout_units: int, output_rank: int, init_std: float) -> ModelSizes:
    return ModelSizes(hidden=hidden, embedding=embedding, maxout_units=maxout_units, output_rank=output_rank,
                      init_std=init_std)


@click.group(cls=Group)
def main() -> None:
    """RNN Encoder–Decoder phrase scoring for Moses (Cho et al. 2014)."""


@main.command("train")
@click.argument("phrase_table", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("model_out", type=OutputPath(path_type=Path, also_writes=MODEL_ALSO_WRITES))
@click.option("--vocab-corpus-src", type=OneLinePath(exists=True, dir_okay=False),
              help="text (plain or .gz) whose words make the source shortlist")
@click.option("--vocab-corpus-tgt", type=OneLinePath(exists=True, dir_okay=False),
              help="text (plain or .gz) whose words make the target shortlist")
@_model_size_options
@click.option("--reverse", is_flag=True,
              help="learn p(f|e): the table's targets are the model's sources and the other way round "
              "(shortlists too), for rescore-phrase-table --reverse-model; saved with the model")
@click.option("--max-steps", type=IntRange(min=1), help="stop after this many updates")
@click.option("--max-time", type=FiniteFloat(min=0, min_open=True), help="stop after this many seconds of training")
@click.option("--patience", type=IntRange(min=1), default=TrainConfig.patience, show_default=True,
              help="stop after this many validations without improvement")
@click.option("--valid-every", type=IntRange(min=1), default=TrainConfig.valid_every, show_default=True,
              help="updates between validations")
@click.option("--batch-size", type=IntRange(min=1), default=TrainConfig.batch_size, show_default=True,
              help="phrase pairs per update (the paper's 64)")
@seed_option()
@resume_option("continue the run saved in MODEL_OUT")
@checkpoint_every_option(TrainConfig.checkpoint_every)
@_train_step_option
@_run_options
@friendly_errors()
def train_command(phrase_table, model_out, vocab_corpus_src, vocab_corpus_tgt, shortlist, hidden, embedding,
                  maxout_units, output_rank, init_std, max_steps, max_time, patience, valid_every, batch_size, seed,
                  resume, checkpoint_every, device, precision, train_step, threads, quiet, reverse) -> None:
    """Train on the unique phrase pairs of PHRASE_TABLE and write the model to MODEL_OUT."""
    from rescorer.training.train import train_on_phrase_table

    train_config = TrainConfig(batch_size=batch_size, seed=seed, valid_every=valid_every, max_steps=max_steps,
                               max_time=max_time, patience=patience, train_step=train_step,
                               checkpoint_every=checkpoint_every)
    sizes = _model_sizes(hidden, embedding, maxout_units, output_rank, init_std)
    result = train_on_phrase_table(
        phrase_table, model_out, model_sizes=replace(sizes, direction="reverse") if reverse else sizes,
        train_config=train_config, src_corpus=vocab_corpus_src, tgt_corpus=vocab_corpus_tgt, shortlist=shortlist,
        device=device, precision=precision, resume=resume, progress=not quiet,
    )
    best = result.best
    click.echo(
        f"trained {result.steps} steps in {result.elapsed:.0f} s (stopped by {result.stopped_by}); "
        f"best validation perplexity {best.perplexity:.2f} at step {best.step}; model: {model_out}",
        err=True,
    )


# ------------------------------------------------------------------ looking inside a model



def _load(model_path: str, device: str = "cpu"):
    from neural.device import select_device
    from rescorer.model.checkpoint import load_checkpoint

    return load_checkpoint(model_path, map_location=select_device(device))


@main.command("sample")
@click.argument("model_path", metavar="MODEL", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("source", type=PhraseText())
@click.option("-n", "--samples", type=IntRange(min=0, max=MAX_SAMPLES), default=50, show_default=True,
              help="targets drawn from the decoder")
@click.option("--beam", type=IntRange(min=0, max=MAX_BEAM), default=5, show_default=True,
              help="beam width; its best targets are listed too")
@seed_option()
@click.option("--max-words", type=IntRange(min=1, max=MAX_PHRASE_WORDS), default=30, show_default=True,
              help="a target still going after this many words is cut")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a Markdown table")
@device_option()
@threads_option()
@friendly_errors()
def sample_command(model_path, source, samples, beam, seed, max_words, as_json, device, threads) -> None:
    """Targets the model generates for SOURCE: samples and beam search, by score (paper Table 3)."""
    import json

    from rescorer.analysis.sampling import format_sample_result, sample_and_search

    if samples == 0 and beam == 0:
        raise click.UsageError("-n 0 and --beam 0: nothing to generate; give -n or --beam")
    checkpoint = _load(model_path, device)
    result = sample_and_search(checkpoint.model, checkpoint.src_vocab, source, n=samples, beam=beam, seed=seed,
                               max_words=max_words)
    if as_json:
        click.echo(json.dumps({"source": result.source, "samples": result.n_samples, "beam": result.beam,
                               "seed": result.seed,
                               "targets": [g.to_dict(checkpoint.tgt_vocab) for g in result.candidates]},
                              ensure_ascii=False, indent=1))
    else:
        click.echo(format_sample_result(result, checkpoint.tgt_vocab, checkpoint.src_vocab))


@main.command("compare")
@click.argument("model_path", metavar="MODEL", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("phrase_table", type=OneLinePath(exists=True, dir_okay=False))
@click.option("--min-src-words", type=IntRange(min=1), default=4, show_default=True,
              help="a long source phrase has at least this many words")
@click.option("--frequent/--rare", default=True, show_default=True,
              help="the most frequent or the rarest long source phrases (count from the counts field)")
@click.option("--sources", type=IntRange(min=1), default=10, show_default=True, help="long source phrases listed")
@click.option("--top", type=IntRange(min=1), default=3, show_default=True,
              help="targets of each source in each list (the table's, the RNN's)")
@click.option("--min-targets", type=IntRange(min=1), default=2, show_default=True,
              help="only sources with at least this many targets in the table")
@click.option("--column", type=IntRange(min=1), default=3, show_default=True,
              help="the table's score column to rank by (3 = direct φ(e|f) in Moses tables)")
@seed_option("breaks ties among rare sources")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of Markdown")
@quiet_option("no progress bar")
@device_option()
@threads_option()
@friendly_errors()
def compare_command(model_path, phrase_table, min_src_words, frequent, sources, top, min_targets, column, seed,
                    as_json, quiet, device, threads) -> None:
    """Top targets of long source phrases by the table and by the RNN, side by side (paper Table 2)."""
    from rescorer.analysis.compare import compare_table, format_json, format_markdown

    table = compare_table(_load(model_path, device), phrase_table, min_src_words=min_src_words, frequent=frequent,
                          sources=sources, top=top, min_targets=min_targets, column=column - 1, seed=seed,
                          progress=not quiet)
    click.echo(format_json(table.rows) if as_json else format_markdown(table.rows, frequency=table.frequency))


@main.command("plot-scores")
@click.argument("scores_parquet", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("out_png", type=OutputPath())
@click.option("--column", type=IntRange(min=1), default=3, show_default=True,
              help="the table's score column on the x axis (3 = direct φ(e|f) in Moses tables)")
@friendly_errors()
def plot_scores_command(scores_parquet, out_png, column) -> None:
    """RNN log p against the table's log φ(e|f), from rescore-phrase-table --scores-parquet (paper Fig. 3)."""
    from rescorer.analysis.plots import plot_scores, read_scores_parquet

    click.echo(f"reading {scores_parquet}", err=True)
    description = plot_scores(read_scores_parquet(scores_parquet, column=column - 1), out_png)
    click.echo(f"wrote {out_png}: {description}", err=True)


@main.command("map-words")
@click.argument("model_path", metavar="MODEL", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("out_png", type=OutputPath())
@click.option("--words", type=IntRange(min=5), default=1000, show_default=True,
              help="the most frequent source words to map")
@click.option("--labels", type=IntRange(min=0), default=150, show_default=True, help="at most this many labels")
@seed_option()
@friendly_errors()
def map_words_command(model_path, out_png, words, labels, seed) -> None:
    """2-D t-SNE map of the source word embeddings (paper Fig. 4)."""
    from rescorer.analysis.plots import map_words

    checkpoint = _load(model_path)
    click.echo(f"t-SNE of up to {words} word embeddings", err=True)
    click.echo(f"wrote {out_png}: {map_words(checkpoint, out_png, words=words, seed=seed, max_labels=labels)}",
               err=True)


@main.command("map-phrases")
@click.argument("model_path", metavar="MODEL", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("phrases", metavar="PHRASES", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("out_png", type=OutputPath())
@click.option("--max-phrases", type=IntRange(min=5), default=1000, show_default=True,
              help="a seeded random sample of this many distinct phrases is mapped")
@click.option("--min-words", type=IntRange(min=1), default=1, show_default=True,
              help="only phrases of at least this many words")
@click.option("--labels", type=IntRange(min=0), default=150, show_default=True, help="at most this many labels")
@seed_option()
@device_option()
@threads_option()
@friendly_errors()
def map_phrases_command(model_path, phrases, out_png, max_phrases, min_words, labels, seed, device, threads) -> None:
    """2-D t-SNE map of the summaries c of PHRASES (paper Fig. 5).

    PHRASES is a text file with one phrase per line, or a Moses phrase table (its source phrases).
    """
    from infrastructure.errors import UserError
    from rescorer.analysis.plots import MIN_MAP_POINTS, map_phrases, read_phrases

    checkpoint = _load(model_path, device)
    chosen = read_phrases(phrases, max_phrases=max_phrases, min_words=min_words, seed=seed)
    if len(chosen) < MIN_MAP_POINTS:
        hint = " (a lower --min-words keeps more)" if min_words > 1 else ""
        raise UserError(f"{phrases}: {len(chosen)} distinct phrases of at least {min_words} word(s); a map needs at "
                        f"least {MIN_MAP_POINTS}{hint}")
    click.echo(f"t-SNE of {len(chosen)} phrase summaries", err=True)
    click.echo(f"wrote {out_png}: {map_phrases(checkpoint, chosen, out_png, seed=seed, max_labels=labels)}",
               err=True)


@main.command("report")
@click.argument("model_path", metavar="MODEL", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("phrase_table", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("out_dir", type=OutputPath(folder=True, also_writes=REPORT_WRITES))
@click.option("--sources", type=IntRange(min=1), default=8, show_default=True,
              help="frequent and rare long sources in the top-target tables")
@click.option("--min-src-words", type=IntRange(min=1), default=4, show_default=True,
              help="a long source phrase has at least this many words")
@click.option("--sample-sources", type=IntRange(min=0), default=4, show_default=True,
              help="sources whose samples are shown")
@click.option("-n", "--samples", type=IntRange(min=0, max=MAX_SAMPLES), default=50, show_default=True,
              help="targets drawn from the decoder for each of those sources")
@click.option("--beam", type=IntRange(min=0, max=MAX_BEAM), default=5, show_default=True,
              help="beam width for each of those sources; its best targets are listed too")
@click.option("--score-sources", type=IntRange(min=0), default=5000, show_default=True,
              help="random source phrases whose lines are scored for the score scatter and phrase map")
@click.option("--map-words", "map_words_", type=IntRange(min=5), default=1000, show_default=True,
              help="the most frequent source words on the word map (t-SNE)")
@click.option("--map-phrases", "map_phrases_", type=IntRange(min=5), default=1000, show_default=True,
              help="at most this many of the scored sources on the phrase map (t-SNE)")
@seed_option()
@click.option("--screenshot", type=OutputPath(),
              help="also render the page with headless Chromium into this PNG")
@quiet_option("no progress messages")
@device_option()
@threads_option()
@friendly_errors()
def report_command(model_path, phrase_table, out_dir, sources, min_src_words, sample_sources, samples, beam,
                   score_sources, map_words_, map_phrases_, seed, screenshot, quiet, device, threads) -> None:
    """One self-contained HTML page (OUT_DIR/report.html) to judge MODEL on PHRASE_TABLE."""
    from rescorer.analysis.report import ReportOptions, build_report, require_browser
    from rescorer.analysis.report import screenshot as take_screenshot

    if sample_sources and not samples and not beam:
        raise click.UsageError("-n 0 and --beam 0: nothing to show for --sample-sources; give -n or --beam, "
                               "or --sample-sources 0")
    browser = require_browser() if screenshot else None  # before the work, not after it
    options = ReportOptions(compare_sources=sources, min_src_words=min_src_words, sample_sources=sample_sources,
                            samples=samples, beam=beam, score_sources=score_sources, map_words=map_words_,
                            map_phrases=map_phrases_, seed=seed, device=device, progress=not quiet)
    page = build_report(model_path, phrase_table, out_dir, options)
    click.echo(f"wrote {page}", err=True)
    if screenshot:
        take_screenshot(page, screenshot, browser=browser)
        click.echo(f"wrote {screenshot}", err=True)


def _written_beside_the_table(output_table: str, params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What ``rescore-phrase-table`` writes besides OUTPUT_TABLE, so that none of it is an input: its
    partial, rejects and progress files, and without ``--model`` or ``--save-model`` the model it trains."""
    from infrastructure.files import streamed_output
    from rescorer.pipeline.partial_output import OutputFiles, default_model_path

    beside = [] if streamed_output(output_table) else OutputFiles.beside(output_table).written()
    files = [("written with OUTPUT_TABLE", str(path)) for path in beside]
    if params.get("model_path") is None and params.get("save_model") is None:
        model = default_model_path(output_table)
        files += [("--save-model's default", model)]
        files += [("written with --save-model's default", pattern.format(model)) for pattern in MODEL_ALSO_WRITES]
    return files


def _rescore_number(field: str) -> IntRange:
    """The click type of a ``RescoreOptions`` number: its one rule (:mod:`rescorer.pipeline.option_rules`),
    applied while parsing, so a bad value is refused before ``-j`` is cut to the CPUs."""
    rule = WHOLE_NUMBERS[field]
    return IntRange(min=rule.minimum, max=rule.maximum)


@click.command("rescore-phrase-table", cls=Command)
# INPUT_TABLE must exist and be readable, OUTPUT_TABLE must not be a folder: both refused while parsing,
# before any training or scoring, in one line.
@click.argument("input_table", type=OneLinePath(exists=True, dir_okay=False, allow_dash=True))
@click.argument("output_table", type=OutputPath(allow_dash=True, also_writes=(_written_beside_the_table,)))
@click.option("--model", "model_path", type=OneLinePath(exists=True, dir_okay=False),
              help="trained model; without it a model is trained on INPUT_TABLE's unique pairs first")
@click.option("--reverse-model", type=OneLinePath(exists=True, dir_okay=False),
              help="a model of p(f|e) (rescorer train --reverse): its probability is one more column, after the "
              "unknown-word column, and one more feature in the written moses.ini")
@click.option("--save-model", type=OutputPath(also_writes=MODEL_ALSO_WRITES),
              help="where the model trained without --model goes [default: OUTPUT_TABLE.model.pt]")
@click.option("--train-time", type=FiniteFloat(min=0, min_open=True),
              help=f"training budget in seconds without --model [default: {DEFAULT_TRAIN_TIME:.0f} unless "
              "--train-steps is given]")
@click.option("--train-steps", type=IntRange(min=1), help="training budget in updates without --model")
@_model_size_options
@click.option("--moses-ini", type=OneLinePath(exists=True, dir_okay=False), help="moses.ini of the system")
@click.option("--moses-ini-out", type=OutputPath(),
              help="write a moses.ini that uses OUTPUT_TABLE, with 2 more features and weights "
              "(3 with --reverse-model)")
@click.option("--table", "table_name", help="which phrase table of --moses-ini (its name=, e.g. TranslationModel0) "
              "INPUT_TABLE is; needed when the ini has several")
@_column_weight_options(column_kinds(reverse=True, flags=False))
@click.option("--cslm", type=OneLinePath(exists=True, dir_okay=False),
              help="NPLM model (from `cslm export-nplm`) to add to the written moses.ini as Moses' "
              "in-decoder NeuralLM feature")
@click.option("--cslm-name", default="CSLM0", show_default=True,
              help="moses.ini name of the --cslm feature (letters and digits: '_' makes it sparse to MERT)")
@click.option("--cslm-weight", type=FiniteFloat(), default=0.0, show_default=True,
              help="initial weight of the --cslm feature (0: the untuned system is the original one)")
@click.option("--wp-side", type=click.Choice(WP_SIDES), default="target", show_default=True,
              help="which side's words outside the shortlist the penalty counts")
@click.option("-j", "--workers", type=_rescore_number("workers"), default=None, callback=cap_workers,
              help="worker processes that parse chunks, build their prefix trees, format and compress them "
              "(0 or 1: all in this process) [default: --threads]")
@click.option("--chunk-lines", type=_rescore_number("chunk_lines"), default=100_000, show_default=True,
              help="lines per chunk read, scored and written at a time (what --resume continues from)")
@click.option("--compress-level", type=_rescore_number("compress_level"),
              default=DEFAULT_MEMBER_LEVEL, show_default=True,
              help="gzip level of a .gz OUTPUT_TABLE, as gzip's -1 .. -9 (0 stores uncompressed)")
@click.option("--token-budget", type=_rescore_number("token_budget"),
              help="padded tokens per batch [default: 8192 on CPU, from free memory on GPU; halved on OOM]")
@click.option("--skip-bad-lines", is_flag=True,
              help="move malformed lines to OUTPUT_TABLE.rejects (as they are) instead of stopping")
@click.option("--shard", metavar="K/N", help="score only slice K of N (1-based), cut at source-phrase boundaries")
@resume_option("continue a killed run from its last completed chunk")
@click.option("--scores-parquet", type=OutputPath(), help="also write the scores to Parquet")
@click.option("-v", "--verbose", is_flag=True, help="after the summary, where the time went: each phase's time "
              "since the command started, and what the main thread spent per chunk")
@seed_option("seed of the training without --model (initial weights, batch order)")
@_train_step_option
@_run_options
@friendly_errors()
def rescore_phrase_table_command(input_table, output_table, model_path, save_model, train_time, train_steps,
                                 shortlist, hidden, embedding, maxout_units, output_rank, init_std, moses_ini,
                                 moses_ini_out, table_name, cslm, cslm_name, cslm_weight,
                                 wp_side, workers, chunk_lines, compress_level, token_budget, skip_bad_lines, shard,
                                 resume, scores_parquet, verbose, seed, device, precision, train_step, threads, quiet,
                                 reverse_model, **weights: float) -> None:
    """Append p_RNN(target|source) and exp(-#unknown words) to every line of a Moses phrase table
    (and p_RNN(source|target) with --reverse-model).

    INPUT_TABLE and OUTPUT_TABLE may be plain or .gz, or - for stdin/stdout.
    """
    from rescorer.pipeline.moses_config import check_moses_ini, check_table_path_for_ini, write_moses_ini
    from rescorer.pipeline.rescore import RescoreOptions, rescore
    from rescorer.pipeline.scoring import ScoringOptions
    from rescorer.pipeline.shards import parse_shard
    from rescorer.pipeline.timeline import Timeline
    from rescorer.pipeline.train_or_load import Models, TrainingWithoutModel

    if bool(moses_ini) != bool(moses_ini_out):
        raise click.UsageError("--moses-ini and --moses-ini-out go together")
    if table_name and not moses_ini:
        raise click.UsageError("--table names a phrase table of --moses-ini")
    if cslm and not moses_ini:
        raise click.UsageError("--cslm adds a feature to the written moses.ini: it needs --moses-ini, --moses-ini-out")
    if model_path is None and input_table == "-":
        raise click.UsageError("training without --model needs INPUT_TABLE as a file, not stdin")
    if moses_ini_out:
        check_table_path_for_ini(output_table, moses_ini_out)
    # Everything Moses will check is checked now, before hours of training and scoring.
    start = _start_weights(column_kinds(reverse=reverse_model is not None, flags=False), weights)
    num_scores = check_moses_ini(moses_ini, input_table, output_table, ini_out=moses_ini_out,
                                 table_name=table_name, new_columns=len(start), cslm=cslm, cslm_name=cslm_name,
                                 cslm_weight=cslm_weight) if moses_ini else None
    options = RescoreOptions(
        chunk_lines=chunk_lines, compress_level=compress_level, wp_side=wp_side, skip_bad_lines=skip_bad_lines,
        shard=parse_shard(shard) if shard else None, resume=resume, scores_parquet=scores_parquet,
        progress=not quiet, device=device, precision=precision, scoring=ScoringOptions(token_budget=token_budget),
        num_scores=num_scores, workers=workers if workers is not None else threads,
        timeline=Timeline.since_process_start() if verbose else None,
    )
    training = TrainingWithoutModel(
        save_model=save_model, max_steps=train_steps, max_time=train_time, shortlist=shortlist, seed=seed,
        sizes=_model_sizes(hidden, embedding, maxout_units, output_rank, init_std), train_step=train_step,
    )
    summary = rescore(input_table, output_table, Models(model_path, reverse_model, training), options)
    click.echo(summary.report(), err=True)
    if verbose and summary.finished_already is None:
        click.echo(options.timeline.report(), err=True)
    empty = summary.lines == 0 and summary.finished_already is None
    if empty and shard:
        click.echo(f"warning: shard {shard} holds no line of {input_table} (a shard starts at a source "
                   f"block's first line, and this table has too few blocks for so many shards), so "
                   f"{output_table} is empty (0 bytes)", err=True)
    elif empty:
        click.echo(f"warning: {input_table} holds no phrase-table lines, so {output_table} is empty too", err=True)
    if moses_ini:
        neural_lm = write_moses_ini(moses_ini, moses_ini_out, output_table, start, table_name,
                                    cslm=cslm, cslm_name=cslm_name, cslm_weight=cslm_weight)
        extra = f", NeuralLM {neural_lm.name} (order {neural_lm.args['order']})" if neural_lm else ""
        click.echo(f"wrote {moses_ini_out}: phrase table {output_table}, {len(start)} more features{extra}",
                   err=True)


def _lex_beside(table_param: str, which: int) -> Callable[[Mapping[str, Any]], str | None]:
    """The word table (0: lex.e2f, 1: lex.f2e) that ``propose`` and ``rerank-weights`` read beside the phrase
    table ``table_param`` when ``--lex-e2f``/``--lex-f2e`` is not given, so that no output replaces it."""
    def default(params: Mapping[str, Any]) -> str | None:
        from rescorer.proposals.propose import lex_paths

        table = params.get(table_param)
        return None if table is None else lex_paths(table)[which]

    return default


@main.command("propose")
@click.argument("input_table", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("output_table", type=OutputPath())
@click.option("--model", "model_path", required=True, type=OneLinePath(exists=True, dir_okay=False),
              help="the trained RNN Encoder-Decoder of this table")
@click.option("--for-text", type=OneLinePath(exists=True, dir_okay=False),
              help="propose only for this tokenised text's n-grams that the table lacks or covers thinly "
              "[default: every source of the table]")
@click.option("--thin-below", type=IntRange(min=1), default=3, show_default=True,
              help="with --for-text: an n-gram with fewer targets than this in the table is thin")
@click.option("--max-source-words", type=IntRange(min=1, max=MAX_PHRASE_WORDS),
              help="with --for-text: the longest n-gram [default: the table's longest source]")
@click.option("--beam", type=IntRange(min=1, max=MAX_BEAM),
              help="beam width per source [default: 10, 40 with --reverse-model]")
@click.option("--per-source", type=IntRange(min=1), default=5, show_default=True,
              help="proposals kept per source: the beam's best targets the table does not hold (with "
              "--reverse-model: the best by the reranking)")
@click.option("--reverse-model", "reverse_path", type=OneLinePath(exists=True, dir_okay=False),
              help="an RNN Encoder-Decoder of p(source|target) on this table (sources and targets swapped): "
              "rerank the beam's candidates by both directions and a length prior, and fill the proposed lines' "
              "phrase probabilities from the two models [default: the beam's best, constant phrase probabilities]")
@click.option("--rerank-reverse-weight", type=FiniteFloat(), default=None,
              help="with --reverse-model: the weight of log p(source|target) in the reranking [default: 0.5]")
@click.option("--rerank-length-weight", type=FiniteFloat(), default=None,
              help="with --reverse-model: the weight of the table's log P(target length | source length) in the "
              "reranking [default: 0]")
@click.option("--max-target-words", type=IntRange(min=1, max=MAX_PHRASE_WORDS),
              help="longest proposed target [default: the table's longest target]")
@click.option("--lex-e2f", type=OneLinePath(dir_okay=False, default_file=_lex_beside("input_table", 0)),
              help="Moses' word table lex.e2f [default: beside INPUT_TABLE]")
@click.option("--lex-f2e", type=OneLinePath(dir_okay=False, default_file=_lex_beside("input_table", 1)),
              help="Moses' word table lex.f2e [default: beside INPUT_TABLE]")
@click.option("--list", "list_path", type=OutputPath(),
              help="also write the proposals as TSV: kind, source, target, log p(target|source)")
@click.option("--moses-ini", type=OneLinePath(exists=True, dir_okay=False), help="moses.ini of the system")
@click.option("--moses-ini-out", type=OutputPath(),
              help="write a moses.ini that uses OUTPUT_TABLE, with 3 more features and weights (4 with "
              "--reverse-model)")
@click.option("--table", "table_name", help="which phrase table of --moses-ini INPUT_TABLE is (its name=)")
@_column_weight_options(column_kinds(reverse=True, flags=True))
@click.option("--rows-per-step", type=IntRange(min=1),
              help="hypotheses per decoder step of the search [default: 4096 on CPU, 16384 on GPU]")
@click.option("-j", "--workers", type=_rescore_number("workers"), default=None, callback=cap_workers,
              help="worker processes of the rescoring pipeline [default: --threads]")
@click.option("--token-budget", type=_rescore_number("token_budget"), help="padded tokens per scoring batch")
@resume_option("continue a killed or failed run from its work folder .OUTPUT_TABLE.propose/ (same inputs and "
               "options)")
@_run_options
@friendly_errors()
def propose_command(input_table, output_table, model_path, for_text, thin_below, max_source_words, beam, per_source,
                    reverse_path, rerank_reverse_weight, rerank_length_weight, max_target_words, lex_e2f, lex_f2e,
                    list_path, moses_ini, moses_ini_out, table_name, rows_per_step, workers, token_budget, resume,
                    device, precision, threads, quiet, **weights: float) -> None:
    """Complete a Moses phrase table with the targets the RNN proposes (the paper's future work).

    Writes INPUT_TABLE's lines byte for byte and the proposed pairs, in sorted order, each with
    p_RNN, exp(-#unknown words), with --reverse-model p_RNN(source|target), and an indicator column
    (2.71828 for a proposed pair, 1 otherwise) appended. docs/proposals.md says how a proposed
    line's columns are filled.
    """
    from rescorer.pipeline.moses_config import check_moses_ini, write_moses_ini
    from rescorer.pipeline.rescore import RescoreOptions
    from rescorer.pipeline.scoring import ScoringOptions
    from rescorer.proposals.propose import ProposeOptions, check_propose_paths, propose
    from rescorer.proposals.rerank import DEFAULT_WEIGHTS, RERANK_BEAM, RerankWeights

    if bool(moses_ini) != bool(moses_ini_out):
        raise click.UsageError("--moses-ini and --moses-ini-out go together")
    if reverse_path is None and (rerank_reverse_weight is not None or rerank_length_weight is not None):
        raise click.UsageError("--rerank-reverse-weight and --rerank-length-weight need --reverse-model")
    ctx = click.get_current_context()
    if for_text is None and (max_source_words is not None
                             or ctx.get_parameter_source("thin_below") is ParameterSource.COMMANDLINE):
        raise click.UsageError("--thin-below and --max-source-words need --for-text (without it every source of "
                               "the table is proposed for)")
    start = _start_weights(column_kinds(reverse=reverse_path is not None, flags=True), weights)
    rerank = RerankWeights(DEFAULT_WEIGHTS.reverse if rerank_reverse_weight is None else rerank_reverse_weight,
                           DEFAULT_WEIGHTS.length if rerank_length_weight is None else rerank_length_weight)
    if beam is None:
        beam = 10 if reverse_path is None else RERANK_BEAM
    options = ProposeOptions(
        for_text=for_text, thin_below=thin_below, max_source_words=max_source_words, beam=beam,
        per_source=per_source, max_target_words=max_target_words, lex_e2f=lex_e2f, lex_f2e=lex_f2e,
        list_path=list_path, rows_per_step=rows_per_step, resume=resume, rerank=rerank,
        rescore=RescoreOptions(progress=not quiet, device=device, precision=precision,
                               scoring=ScoringOptions(token_budget=token_budget),
                               workers=workers if workers is not None else threads),
    )
    check_propose_paths(input_table, output_table, options)
    if moses_ini:
        check_moses_ini(moses_ini, input_table, output_table, ini_out=moses_ini_out, table_name=table_name,
                        new_columns=len(start))
    reverse = _load(reverse_path) if reverse_path is not None else None
    summary = propose(input_table, output_table, _load(model_path), options, reverse)
    click.echo(summary.report(), err=True)
    if moses_ini:
        write_moses_ini(moses_ini, moses_ini_out, output_table, start, table_name)
        click.echo(f"wrote {moses_ini_out}: phrase table {output_table}, {len(start)} more features", err=True)


@main.command("rerank-weights")
@click.argument("phrase_table", type=OneLinePath(exists=True, dir_okay=False))
@click.option("--model", "model_path", required=True, type=OneLinePath(exists=True, dir_okay=False),
              help="the trained RNN Encoder-Decoder of this table, p(target|source)")
@click.option("--reverse-model", "reverse_path", required=True, type=OneLinePath(exists=True, dir_okay=False),
              help="the RNN of p(source|target) on this table (rescorer train --reverse)")
@click.option("--text", required=True, type=OneLinePath(exists=True, dir_okay=False),
              help="tokenised source text to propose for, as propose --for-text (dev: the weights are chosen on it)")
@click.option("--reference", required=True, type=OneLinePath(exists=True, dir_okay=False),
              help="its tokenised reference translation, one line per line of --text")
@click.option("--sentences", type=IntRange(min=1), default=None, help="only the texts' first N lines [all]")
@click.option("--reverse-grid", type=NumberList(FiniteFloat()),
              help="the values of λ, the weight of log p(source|target) [default: 0,0.25,0.5,1,1.5]")
@click.option("--length-grid", type=NumberList(FiniteFloat()),
              help="the values of μ, the weight of the table's log P(target length | source length) "
              "[default: 0,0.5,1,2]")
@click.option("--thin-below", type=IntRange(min=1), default=3, show_default=True,
              help="an n-gram with fewer targets than this in the table is thin (as propose --thin-below)")
@click.option("--per-source", type=IntRange(min=1), default=5, show_default=True,
              help="proposals kept per source (as propose --per-source)")
@click.option("--beam", type=IntRange(min=1, max=MAX_BEAM), help="the collecting beam's width [default: propose's with "
              "--reverse-model, 40]")
@click.option("--plain-beam", type=IntRange(min=1, max=MAX_BEAM),
              help="also measure the proposals of a plain beam this wide without the reverse model")
@click.option("--measure", is_flag=True, help="print the figures and choose nothing (text other than dev, e.g. test)")
@click.option("--lex-e2f", type=OneLinePath(dir_okay=False, default_file=_lex_beside("phrase_table", 0)),
              help="Moses' word table lex.e2f [default: beside PHRASE_TABLE]")
@click.option("--lex-f2e", type=OneLinePath(dir_okay=False, default_file=_lex_beside("phrase_table", 1)),
              help="Moses' word table lex.f2e [default: beside PHRASE_TABLE]")
@device_option()
@threads_option()
@friendly_errors()
def rerank_weights_command(phrase_table, model_path, reverse_path, text, reference, sentences, reverse_grid,
                           length_grid, thin_below, per_source, beam, plain_beam, measure, lex_e2f, lex_f2e, device,
                           threads) -> None:  # threads: applied by its option
    """Choose propose --reverse-model's rerank weights on dev text, for a system's own two RNNs.

    For the n-grams of --text that propose --for-text fills, the search and the reverse model run
    once; for each (λ, μ) of the grid the proposals' length against the table's pairs of the same
    source lengths and the share of missing sources' targets found in the reference are printed on
    stdout, then the choice: the most in the reference within 20% of that length
    (docs/proposals.md). Give the weights to propose as --rerank-reverse-weight and
    --rerank-length-weight.
    """
    from rescorer.pipeline.train_or_load import check_directions
    from rescorer.proposals.propose import check_beam_keeps, lex_paths
    from rescorer.proposals.rerank import RERANK_BEAM
    from rescorer.proposals.weights import ChoiceInputs, RerankGrid, check_parallel, choose_point, grid_figures

    check_beam_keeps(per_source, beam or RERANK_BEAM)
    if plain_beam:
        check_beam_keeps(per_source, plain_beam, "--plain-beam")
    check_parallel(text, reference)
    e2f, f2e = lex_paths(phrase_table, lex_e2f, lex_f2e)
    forward, reverse = _load(model_path, device), _load(reverse_path, device)
    check_directions(forward, reverse)
    inputs = ChoiceInputs(Path(phrase_table), Path(e2f), Path(f2e), per_source, thin_below)
    grid = replace(RerankGrid(sentences), **{name: tuple(values) for name, values in
                                             (("reverse", reverse_grid), ("length", length_grid)) if values})
    points = grid_figures(forward, reverse, inputs, Path(text), Path(reference), grid, click.echo, beam, plain_beam)
    if not measure:
        click.echo(choose_point(points)[1])


main.add_command(rescore_phrase_table_command, "rescore")  # `rescorer rescore …` = `rescore-phrase-table …`


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
