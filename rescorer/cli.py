"""Command line: ``rescore-phrase-table`` and the ``rescorer`` group. Parsing only; work is elsewhere."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

import click

from moses_integration.phrase_table import PhraseTableError
from rescorer.config import ModelConfig, TrainConfig

DEFAULT_TRAIN_TIME = 1800.0


def _model_size_options(fn: Callable) -> Callable:
    """Model sizes (paper defaults), shared by every command that may build a model."""
    defaults = ModelConfig(src_vocab_size=1, tgt_vocab_size=1)
    for name, default, help_ in reversed([
        ("hidden", defaults.hidden, "GRU units d"),
        ("embedding", defaults.embedding, "word embedding size (rank of the input matrices)"),
        ("maxout-units", defaults.maxout_units, "maxout units of the deep output"),
        ("output-rank", defaults.output_rank, "rank of the output matrix G = G_l G_r"),
    ]):
        fn = click.option(f"--{name}", type=int, default=default, show_default=True, help=help_)(fn)
    fn = click.option("--shortlist", type=int, default=15000, show_default=True,
                      help="words per language kept in the model vocabulary ([UNK] included)")(fn)
    return fn


def _friendly_errors(fn: Callable) -> Callable:
    """Known input problems print as one clear line and exit 1, never as a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from moses_integration.moses_ini import MosesIniError
        from rescorer.rescore import RescoreError

        try:
            return fn(*args, **kwargs)
        except (PhraseTableError, RescoreError, MosesIniError, ValueError, FileNotFoundError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def _model_config(hidden: int, embedding: int, maxout_units: int, output_rank: int) -> ModelConfig:
    return ModelConfig(src_vocab_size=1, tgt_vocab_size=1, hidden=hidden, embedding=embedding,
                       maxout_units=maxout_units, output_rank=output_rank)


@click.group()
def main() -> None:
    """RNN Encoder–Decoder phrase scoring for Moses (Cho et al. 2014)."""


@main.command("train")
@click.argument("phrase_table")
@click.argument("model_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--vocab-corpus-src", help="text (plain or .gz) whose words make the source shortlist")
@click.option("--vocab-corpus-tgt", help="text (plain or .gz) whose words make the target shortlist")
@_model_size_options
@click.option("--max-steps", type=int, help="stop after this many updates")
@click.option("--max-time", type=float, help="stop after this many seconds of training")
@click.option("--patience", type=int, default=10, show_default=True,
              help="stop after this many validations without improvement")
@click.option("--valid-every", type=int, default=500, show_default=True, help="updates between validations")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--seed", type=int, default=1234, show_default=True)
@click.option("--resume", is_flag=True, help="continue the run saved in MODEL_OUT")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True)
@click.option("--quiet", is_flag=True, help="no progress bar")
@_friendly_errors
def train_command(phrase_table, model_out, vocab_corpus_src, vocab_corpus_tgt, shortlist, hidden, embedding,
                  maxout_units, output_rank, max_steps, max_time, patience, valid_every, batch_size, seed,
                  resume, device, precision, quiet) -> None:
    """Train on the unique phrase pairs of PHRASE_TABLE and write the model to MODEL_OUT."""
    from rescorer.train import train_on_phrase_table

    if max_steps is None and max_time is None and patience is None:
        raise click.UsageError("give --max-steps, --max-time or --patience, or training never stops")
    train_config = TrainConfig(batch_size=batch_size, seed=seed, valid_every=valid_every, max_steps=max_steps,
                               max_time=max_time, patience=patience)
    result = train_on_phrase_table(
        phrase_table, model_out, model_config=_model_config(hidden, embedding, maxout_units, output_rank),
        train_config=train_config, src_corpus=vocab_corpus_src, tgt_corpus=vocab_corpus_tgt, shortlist=shortlist,
        device=device, precision=precision, resume=resume, progress=not quiet,
    )
    best = result.best
    click.echo(
        f"trained {result.steps} steps in {result.elapsed:.0f} s (stopped by {result.stopped_by}); "
        f"best validation perplexity {best.perplexity:.2f} at step {best.step}; model: {model_out}",
        err=True,
    )


@click.command("rescore-phrase-table")
@click.argument("input_table")
@click.argument("output_table")
@click.option("--model", "model_path", type=click.Path(exists=True, dir_okay=False),
              help="trained model; without it a model is trained on INPUT_TABLE's unique pairs first")
@click.option("--save-model", type=click.Path(dir_okay=False),
              help="where the model trained without --model goes [default: OUTPUT_TABLE.model.pt]")
@click.option("--train-time", type=float, help=f"training budget in seconds without --model [default: "
              f"{DEFAULT_TRAIN_TIME:.0f} unless --train-steps is given]")
@click.option("--train-steps", type=int, help="training budget in updates without --model")
@_model_size_options
@click.option("--moses-ini", type=click.Path(exists=True, dir_okay=False), help="moses.ini of the system")
@click.option("--moses-ini-out", type=click.Path(dir_okay=False),
              help="write a moses.ini that uses OUTPUT_TABLE, with 2 more features and weights")
# Start weights 0: the untuned system then decodes exactly as before (a weight of 0.2 on log p_RNN,
# about ten times the table's log-probabilities in size, dropped the fixture's dev BLEU from 24.05
# to 19.44), and MERT's random restarts explore the new columns from there.
@click.option("--rnn-weight", type=float, default=0.0, show_default=True,
              help="initial weight of the RNN column (0: the untuned system is the original one)")
@click.option("--wp-weight", type=float, default=0.0, show_default=True,
              help="initial weight of the unknown-word column (0: the untuned system is the original one)")
@click.option("--wp-side", type=click.Choice(["target", "source", "both"]), default="target", show_default=True,
              help="which side's words outside the shortlist the penalty counts")
@click.option("-j", "--workers", type=int, default=None, help="compression processes [default: all cores]")
@click.option("--chunk-lines", type=int, default=100_000, show_default=True)
@click.option("--token-budget", type=int,
              help="padded tokens per batch [default: 8192 on CPU, from free memory on GPU; halved on OOM]")
@click.option("--skip-bad-lines", is_flag=True, help="copy malformed lines through unscored instead of stopping")
@click.option("--shard", help="score only slice K/N (1-based), cut at source-phrase boundaries")
@click.option("--resume", is_flag=True, help="continue a killed run from its last completed chunk")
@click.option("--scores-parquet", type=click.Path(dir_okay=False), help="also write the scores to Parquet")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True)
@click.option("--quiet", is_flag=True, help="no progress bar")
@_friendly_errors
def rescore_phrase_table_command(input_table, output_table, model_path, save_model, train_time, train_steps,
                                 shortlist, hidden, embedding, maxout_units, output_rank, moses_ini, moses_ini_out,
                                 rnn_weight, wp_weight, wp_side, workers, chunk_lines, token_budget, skip_bad_lines,
                                 shard, resume, scores_parquet, device, precision, quiet) -> None:
    """Append p_RNN(target|source) and exp(-#unknown words) to every line of a Moses phrase table.

    INPUT_TABLE and OUTPUT_TABLE may be plain or .gz, or - for stdin/stdout.
    """
    from rescorer.checkpoint import load_checkpoint
    from rescorer.rescore import RescoreOptions, parse_shard, rescore_phrase_table, write_moses_ini
    from rescorer.scoring import ScoringOptions
    from rescorer.train import train_on_phrase_table

    if bool(moses_ini) != bool(moses_ini_out):
        raise click.UsageError("--moses-ini and --moses-ini-out go together")
    options = RescoreOptions(
        chunk_lines=chunk_lines, wp_side=wp_side, skip_bad_lines=skip_bad_lines,
        shard=parse_shard(shard) if shard else None, resume=resume, scores_parquet=scores_parquet,
        progress=not quiet, device=device, precision=precision, scoring=ScoringOptions(token_budget=token_budget),
    )
    if workers is not None:
        options.workers = workers
    if model_path is None:
        if input_table == "-":
            raise click.UsageError("training without --model needs INPUT_TABLE as a file, not stdin")
        model_path = save_model or (output_table + ".model.pt" if output_table != "-" else "rescorer.model.pt")
        if train_time is None and train_steps is None:
            train_time = DEFAULT_TRAIN_TIME
        click.echo(f"no --model: training on the unique pairs of {input_table} into {model_path}", err=True)
        train_on_phrase_table(
            input_table, Path(model_path), model_config=_model_config(hidden, embedding, maxout_units, output_rank),
            train_config=TrainConfig(max_steps=train_steps, max_time=train_time, patience=None,
                                     valid_every=max(50, min(500, (train_steps or 500) // 4))),
            shortlist=shortlist, device=device, precision=precision, resume=resume, progress=not quiet,
        )
    checkpoint = load_checkpoint(model_path)
    summary = rescore_phrase_table(input_table, output_table, checkpoint, options)
    click.echo(summary.report(), err=True)
    if moses_ini:
        write_moses_ini(moses_ini, moses_ini_out, output_table, (rnn_weight, wp_weight))
        click.echo(f"wrote {moses_ini_out}: phrase table {output_table}, 2 more features", err=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
