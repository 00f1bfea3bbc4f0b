"""Command line: the ``cslm`` group (train, score, nbest, export-nplm). Parsing only; work is elsewhere.

Library imports happen inside the commands so that ``cslm --help`` answers without loading torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from infrastructure.cli_options import (
    FiniteFloat,
    Group,
    IntRange,
    NumberList,
    OneLinePath,
    OutputPath,
    checkpoint_every_option,
    device_option,
    friendly_errors,
    learning_rate_type,
    quiet_option,
    resume_option,
    seed_option,
    threads_option,
)
from neural.config import CHECKPOINT_EVERY, MAX_LAYER_SIZE, PRECISIONS, TRAIN_STEPS, TRAINING_PRECISION_HELP
from neural.training import MODEL_ALSO_WRITES


@click.group("cslm", cls=Group)
def main() -> None:
    """Schwenk's CSLM (SPEC §5): a 7-gram neural LM, in the decoder (export-nplm) or on n-best lists."""


#: The largest n: 4 times the paper's 7; the history is embedded word by word (``(order - 1) x
#: --embedding`` inputs), and ``--order 100000`` trained for minutes on 300 lines of histories of padding.
MAX_ORDER = 32
#: The largest shortlist: more words than any target language's corpus holds in practice (the output layer
#: is shortlist x last hidden layer), as ``rescorer``'s.
MAX_SHORTLIST = 1_000_000

RAW_HELP = ("unnormalised scores, each word floored at -100: what Moses' NeuralLM adds for the model's "
            "export-nplm file [default: exact log-probabilities]")


@main.command("train", short_help="Train a CSLM on tokenized target text.")
@click.argument("corpus", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("model_out", type=OutputPath(path_type=Path, also_writes=MODEL_ALSO_WRITES))
@click.option("--valid", type=OneLinePath(exists=True, dir_okay=False),
              help="validation text [default: a random 0.1% of CORPUS's lines, at least 500, at most a tenth]")
@click.option("--order", type=IntRange(min=2, max=MAX_ORDER), default=7, show_default=True,
              help="n of the n-gram model")
@click.option("--shortlist", type=IntRange(min=1, max=MAX_SHORTLIST), default=15000, show_default=True,
              help="output words, [UNK] included")
@click.option("--embedding", type=IntRange(min=1, max=MAX_LAYER_SIZE), default=512, show_default=True,
              help="embedding size of each history word")
@click.option("--hidden", type=NumberList(IntRange(min=1, max=MAX_LAYER_SIZE)), default="1536,1024",
              show_default=True, help=f"ReLU hidden layer sizes, comma-separated (each 1 to {MAX_LAYER_SIZE})")
@click.option("--max-time", type=FiniteFloat(min=0, min_open=True), help="stop after this many seconds of training")
@click.option("--max-epochs", type=IntRange(min=1), help="stop after this many epochs")
@click.option("--patience", type=IntRange(min=1), default=10, show_default=True,
              help="stop after this many epochs without validation improvement")
@click.option("--epoch-size", type=IntRange(min=1), help="n-grams per epoch, resampled each epoch [default: all]")
@click.option("--batch-size", type=IntRange(min=1), default=128, show_default=True, help="n-grams per update")
@click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True,
              help="Adam, or the CSLM toolkit's SGD with its decaying learning rate (docs/cslm.md)")
@click.option("--lr", type=learning_rate_type(),
              help="learning rate [default: 1e-3 for adam, 0.02 for sgd]")
@click.option("--self-normalize", type=FiniteFloat(min=0), default=0.0, show_default=True, metavar="ALPHA",
              help="add ALPHA*(log Z)^2 to the loss (Devlin et al. 2014; 0.1 is usual), so that the raw scores "
                   "Moses' NeuralLM adds are log-probabilities; needed for export-nplm")
@seed_option()
@resume_option("continue the run saved in MODEL_OUT(.last)")
@checkpoint_every_option(CHECKPOINT_EVERY)
@device_option()
@click.option("--precision", type=click.Choice([p for p in PRECISIONS if p != "tf32"]), default="auto",
              show_default=True, help=TRAINING_PRECISION_HELP)
@click.option("--train-step", type=click.Choice(TRAIN_STEPS), default="auto", show_default=True,
              help="how an update runs: eager, static (every minibatch filled up to --batch-size), captured "
              "(static, one CUDA graph, checked against eager; Adam only); auto: captured on a GPU with Adam, "
              "else eager. The same updates to ~1e-6")
@threads_option()
@quiet_option()
@friendly_errors()
def cslm_train_command(corpus, model_out, valid, order, shortlist, embedding, hidden, max_time, max_epochs, patience,
                       epoch_size, batch_size, optimizer, lr, self_normalize, seed, resume, checkpoint_every, device,
                       precision,
                       train_step, threads, quiet):
    """Train a CSLM on tokenized target-language text CORPUS (plain or .gz) into MODEL_OUT."""
    from cslm.model import CSLMConfig
    from cslm.train import CSLMTrainConfig, train_cslm

    result = train_cslm(
        corpus, model_out,
        model_config=CSLMConfig(vocab_size=2, order=order, embedding=embedding, hidden=hidden),
        train_config=CSLMTrainConfig(batch_size=batch_size, optimizer=optimizer, lr=lr, epoch_size=epoch_size,
                                     max_epochs=max_epochs, max_time=max_time, patience=patience, seed=seed,
                                     self_normalize=self_normalize, train_step=train_step,
                                     checkpoint_every=checkpoint_every),
        shortlist=shortlist, valid=valid, device=device, precision=precision, resume=resume, progress=not quiet,
    )
    best = result.best
    log_z = f", log Z mean {best.log_z_mean:.3f} std {best.log_z_std:.3f}" if best.log_z_mean is not None else ""
    click.echo(f"stopped by {result.stopped_by} after {result.examples} n-grams in {result.elapsed:.0f} s; "
               f"best valid perplexity {best.perplexity:.2f}{log_z} (epoch {best.epoch}) in {model_out}", err=True)


@main.command("score", short_help="Print the natural-log probability of each sentence.")
@click.argument("model", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("text", default="-",
                type=OneLinePath(exists=True, dir_okay=False, allow_dash=True))
@click.option("--raw", is_flag=True, help=RAW_HELP)
@device_option()
@threads_option()
@quiet_option("no perplexity line on stderr")
@friendly_errors()
def cslm_score_command(model, text, raw, device, threads, quiet):
    """One natural-log sentence probability per line of TEXT on stdout; perplexity on stderr."""
    from cslm.model_file import load_cslm
    from cslm.scoring import ScoreStats, score_lines
    from infrastructure.files import display_name
    from infrastructure.lines import text_lines

    loaded = load_cslm(model, device)
    stats = ScoreStats()
    out = sys.stdout
    for value in score_lines(loaded.model, loaded.vocab, text_lines(text), normalize=not raw, stats=stats):
        out.write(f"{value:.6f}\n")
    if not quiet and not stats.sentences:
        click.echo(f"{display_name(text)} holds no sentence: no perplexity", err=True)
    elif not quiet:
        click.echo(f"{stats.sentences} sentences, {stats.tokens} tokens (</s> included): "
                   f"perplexity {stats.perplexity:.2f}", err=True)


@main.command("nbest", short_help="Append CSLM0= to each line of a Moses n-best list.")
@click.argument("model", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("nbest_in", default="-",
                type=OneLinePath(exists=True, dir_okay=False, allow_dash=True))
@click.argument("nbest_out", default="-", type=OutputPath(allow_dash=True))
@click.option("--name", default="CSLM0", show_default=True, help="feature name (letters and digits, no '_')")
@click.option("--raw", is_flag=True, help=RAW_HELP)
@device_option()
@threads_option()
@quiet_option("no summary line on stderr (as mert-moses.pl's --transform-decoded-file)")
@friendly_errors()
def cslm_nbest_command(model, nbest_in, nbest_out, name, raw, device, threads, quiet):
    """Append NAME= log p(hypothesis) to each line of a Moses n-best list, every other byte kept.

    Usable as mert-moses.pl's --transform-decoded-file (with --batch-mira).
    """
    from cslm.model_file import load_cslm
    from cslm.nbest import add_cslm_to_nbest, dense_feature_name
    from cslm.scoring import ScoreStats

    loaded = load_cslm(model, device)
    stats = ScoreStats()
    lines = add_cslm_to_nbest(loaded.model, loaded.vocab, nbest_in, nbest_out, name=dense_feature_name(name),
                              normalize=not raw, stats=stats)
    if not quiet:
        click.echo(f"{lines} hypotheses, {stats.tokens} tokens, distinct histories {stats.history_share:.1%} "
                   f"of tokens", err=True)


@main.command("export-nplm", short_help="Write the model in NPLM's format, for Moses' NeuralLM.")
@click.argument("model", type=OneLinePath(exists=True, dir_okay=False))
@click.argument("out", type=OutputPath(allow_dash=True))
@friendly_errors()
def cslm_export_nplm_command(model, out):
    """Write MODEL in NPLM's text format as OUT (- for stdout), for Moses' NeuralLM feature.

    In moses.ini: NeuralLM factor=0 name=CSLM0 order=7 path=OUT (rescore-phrase-table --cslm OUT adds
    it). Moses adds the raw scores, so train the model with --self-normalize.
    """
    from cslm.export import LOG_Z_TOLERANCE, cslm_to_nplm, self_normalization, validation_log_z
    from cslm.model_file import load_cslm
    from moses_integration.nplm import write_nplm

    loaded = load_cslm(model, "cpu")
    nplm = cslm_to_nplm(loaded.model, loaded.vocab)
    write_nplm(out, nplm)
    alpha = self_normalization(loaded)
    click.echo(f"{out}: {nplm.config.ngram_size}-gram, {len(nplm.vocab)} words, hidden layers "
               f"{','.join(map(str, loaded.model.config.hidden))}; moses.ini: NeuralLM factor=0 name=CSLM0 "
               f"order={nplm.config.ngram_size} path={out}", err=True)
    log_z = validation_log_z(loaded)
    if log_z is not None and abs(log_z) > LOG_Z_TOLERANCE:
        cure = "with --self-normalize 0.1" if not alpha else f"longer, or with more than --self-normalize {alpha:g}"
        click.echo(f"warning: {model}'s log Z averages {log_z:.2f} on its validation text, not near 0: the raw "
                   f"scores Moses adds are the log-probabilities {log_z:+.2f} per word; train it {cure}", err=True)
    elif not alpha:
        click.echo(f"warning: {model} was trained without --self-normalize: Moses adds its raw scores, which "
                   "are log-probabilities only up to each history's log Z", err=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
