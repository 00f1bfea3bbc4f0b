"""Command line: the ``nmt`` group (train, translate, score, nbest). Parsing only; work is elsewhere.

Library imports happen inside the commands so that ``nmt --help`` answers without loading torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from infrastructure.cli_options import (
    FiniteFloat,
    Group,
    IntRange,
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
from neural.config import CHECKPOINT_EVERY, MAX_BEAM, MAX_LAYER_SIZE, PRECISIONS, TRAINING_PRECISION_HELP
from neural.training import MODEL_ALSO_WRITES

INPUT = OneLinePath(exists=True, dir_okay=False)
INPUT_OR_STDIN = OneLinePath(exists=True, dir_okay=False, allow_dash=True)


@click.group("nmt", cls=Group)
def main() -> None:
    """The attention encoder-decoder of Bahdanau et al. 2015 (SPEC §7): train, translate, score n-best lists."""


@main.command("train", short_help="Train a model on a tokenised bitext.")
@click.argument("src", type=INPUT)
@click.argument("tgt", type=INPUT)
@click.argument("model_out", type=OutputPath(path_type=Path, also_writes=MODEL_ALSO_WRITES))
@click.option("--valid-src", type=INPUT, help="held-out source text [default: --valid-lines pairs of the bitext]")
@click.option("--valid-tgt", type=INPUT, help="its targets (with --valid-src)")
@click.option("--valid-lines", type=IntRange(min=1), default=1000, show_default=True,
              help="pairs held out of the bitext (at most a tenth of it) without --valid-src")
@click.option("--vocab-size", type=IntRange(min=300), default=8000, show_default=True,
              help="sentencepiece units per side, at most (256 of them are bytes)")
@click.option("--embedding", type=IntRange(min=1, max=MAX_LAYER_SIZE), default=256, show_default=True,
              help="R, each side's embeddings")
@click.option("--hidden", type=IntRange(min=1, max=MAX_LAYER_SIZE), default=256, show_default=True,
              help="H, each encoder direction's and the decoder's state")
@click.option("--alignment", type=IntRange(min=1, max=MAX_LAYER_SIZE), default=256, show_default=True,
              help="N, the attention MLP's")
@click.option("--maxout", type=IntRange(min=1, max=MAX_LAYER_SIZE), default=256, show_default=True,
              help="L, the maxout units")
@click.option("--batch-size", type=IntRange(min=1), default=64, show_default=True, help="sentence pairs per update")
@click.option("--lr", type=learning_rate_type(), default=5e-4, show_default=True,
              help="Adam's learning rate")
@click.option("--valid-every", type=IntRange(min=1), default=1000, show_default=True,
              help="updates between validations")
@click.option("--bleu-sentences", type=IntRange(min=0), default=100, show_default=True,
              help="held-out sentences greedily translated for BLEU at each validation (0: none)")
@click.option("--max-steps", type=IntRange(min=1), help="stop after this many updates")
@click.option("--max-epochs", type=IntRange(min=1), help="stop after this many epochs")
@click.option("--max-time", type=FiniteFloat(min=0, min_open=True), help="stop after this many seconds of training")
@click.option("--patience", type=IntRange(min=1), default=10, show_default=True,
              help="stop after this many validations without a better perplexity")
@seed_option()
@resume_option("continue the run saved in MODEL_OUT(.last), with its subwords; the sizes and the recipe must be "
               "the run's; the stops (--max-*, --patience), --valid-every, --bleu-sentences and --checkpoint-every "
               "may change")
@checkpoint_every_option(CHECKPOINT_EVERY)
@device_option()
@click.option("--precision", type=click.Choice([p for p in PRECISIONS if p != "tf32"]), default="auto",
              show_default=True, help=TRAINING_PRECISION_HELP)
@threads_option()
@quiet_option()
@friendly_errors()
def nmt_train_command(src, tgt, model_out, valid_src, valid_tgt, valid_lines, vocab_size, embedding, hidden,
                      alignment, maxout, batch_size, lr, valid_every, bleu_sentences, max_steps, max_epochs, max_time,
                      patience, seed, resume, checkpoint_every, device, precision, threads, quiet):
    """Train p(TGT | SRC) on a tokenised bitext (one sentence per line, plain or .gz) into MODEL_OUT.

    The reverse model p(SRC | TGT), for a second n-best column, is the same command on the swapped bitext.
    """
    if (valid_src is None) != (valid_tgt is None):
        raise click.UsageError("--valid-src and --valid-tgt go together")
    from nmt.model import NMTConfig
    from nmt.train import NMTTrainConfig, train_nmt

    result = train_nmt(
        src, tgt, model_out,
        model_config=NMTConfig(src_vocab=8, tgt_vocab=8, embedding=embedding, hidden=hidden, alignment=alignment,
                               maxout=maxout),
        train_config=NMTTrainConfig(vocab_size=vocab_size, batch_size=batch_size, lr=lr, valid_every=valid_every,
                                    max_steps=max_steps, max_epochs=max_epochs, max_time=max_time, patience=patience,
                                    seed=seed, valid_lines=valid_lines, bleu_sentences=bleu_sentences,
                                    checkpoint_every=checkpoint_every),
        valid_src=valid_src, valid_tgt=valid_tgt, device=device, precision=precision,
        resume=resume, progress=not quiet,
    )
    best = result.best
    bleu = f", greedy BLEU {best.bleu:.2f}" if best.bleu is not None else ""
    click.echo(f"stopped by {result.stopped_by} after {result.steps} updates ({result.target_tokens} target units) "
               f"in {result.elapsed:.0f} s; best valid perplexity {best.perplexity:.2f}{bleu} (update {best.step}) "
               f"in {model_out}", err=True)


@main.command("translate", short_help="Translate by beam search: one translation or n-best list per line.")
@click.argument("model", type=INPUT)
@click.argument("text", default="-", type=INPUT_OR_STDIN)
@click.argument("out", default="-", type=OutputPath(allow_dash=True))
@click.option("--beam", type=IntRange(min=1, max=MAX_BEAM), default=5, show_default=True, help="beam width")
@click.option("--nbest", type=IntRange(min=1), help="write the N best in Moses' n-best format (at most --beam)")
@click.option("--normalize", is_flag=True, help="choose by log-probability per target unit, not in total")
@click.option("--batch-size", type=IntRange(min=1), default=32, show_default=True, help="sentences searched at once")
@device_option()
@threads_option()
@quiet_option("no summary line on stderr")
@friendly_errors()
def nmt_translate_command(model, text, out, beam, nbest, normalize, batch_size, device, threads, quiet):
    """Translate tokenised TEXT (- for stdin) into OUT (- for stdout), one line per line."""
    from infrastructure.lines import checked_text_lines
    from nmt.model_file import load_nmt
    from nmt.translate import write_translations

    loaded = load_nmt(model, _device(device))
    if nbest is not None and nbest > beam:
        raise click.UsageError(f"--nbest {nbest} is more than --beam {beam} can find")
    count = write_translations(loaded, checked_text_lines(text), out, beam=beam, nbest=nbest, normalize=normalize,
                               batch_size=batch_size)
    if not quiet:
        click.echo(f"{count} sentences translated", err=True)


@main.command("score", short_help="Print log p(target | source) of each line pair.")
@click.argument("model", type=INPUT)
@click.argument("src", type=INPUT)
@click.argument("tgt", type=INPUT_OR_STDIN)
@click.option("--normalize", is_flag=True, help="per target unit (end of sentence counted)")
@click.option("--reverse-model", type=INPUT, help="p(source | target)'s model: a second column")
@device_option()
@threads_option()
@friendly_errors()
def nmt_score_command(model, src, tgt, normalize, reverse_model, device, threads):
    """One natural-log probability log p(TGT line | SRC line) per line on stdout (two with --reverse-model)."""
    from nmt.data import read_bitext
    from nmt.model_file import load_nmt
    from nmt.scoring import score_pairs

    sources, targets = read_bitext(src, tgt, allow_empty=True)
    forward = load_nmt(model, _device(device))
    columns = [score_pairs(forward.model, forward.src_subwords.encode(sources), forward.tgt_subwords.encode(targets),
                           normalize=normalize)]
    if reverse_model:
        reverse = load_nmt(reverse_model, _device(device))
        columns.append(score_pairs(reverse.model, reverse.src_subwords.encode(targets),
                                   reverse.tgt_subwords.encode(sources), normalize=normalize))
    for values in zip(*columns, strict=True):
        sys.stdout.write("\t".join(f"{v:.6f}" for v in values) + "\n")


@main.command("nbest", short_help="Append NMT0= log p(e|f) [log p(f|e)] to each line of an n-best list.")
@click.argument("model", type=INPUT)
@click.argument("source", type=INPUT)
@click.argument("nbest_in", default="-", type=INPUT_OR_STDIN)
@click.argument("nbest_out", default="-", type=OutputPath(allow_dash=True))
@click.option("--reverse-model", type=INPUT, help="p(source | hypothesis)'s model: a second value")
@click.option("--name", default="NMT0", show_default=True, help="feature name (letters and digits, no '_')")
@click.option("--normalize", is_flag=True, help="per target unit (end of sentence counted)")
@device_option()
@threads_option()
@quiet_option("no summary line on stderr")
@friendly_errors()
def nmt_nbest_command(model, source, nbest_in, nbest_out, reverse_model, name, normalize, device, threads, quiet):
    """Append NAME= log p(hypothesis | SOURCE line) to each line of a Moses n-best list, every other byte kept."""
    from nmt.model_file import load_nmt
    from nmt.nbest import NBestScorer, add_nmt_to_nbest, feature_name

    name = feature_name(name)
    scorer = NBestScorer(load_nmt(model, _device(device)),
                         load_nmt(reverse_model, _device(device)) if reverse_model else None, normalize=normalize)
    lines = add_nmt_to_nbest(scorer, source, nbest_in, nbest_out, name=name)
    if not quiet:
        click.echo(f"{lines} hypotheses scored", err=True)


def _device(name: str):
    from neural.device import select_device

    return select_device(name)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
