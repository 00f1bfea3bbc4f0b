"""Command line: the ``mert`` group. Parsing and printing only; the work is in the library.

``mert optimize`` is the counterpart of Moses' ``extractor`` + ``mert`` pair: it reads n-best
lists directly (merging them, as ``mert-moses.pl`` does over iterations), scores them against
the references and prints optimised weights in ``moses.ini`` ``[weight]`` syntax.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from moses_integration.nbest import NBestError
from moses_integration.phrase_table import PhraseTableError


def _friendly_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Known input problems print as one clear line (file:line: reason) and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (NBestError, PhraseTableError, ValueError, FileNotFoundError, UnicodeDecodeError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def _parse_range(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected MIN,MAX, got {text!r}", param_hint="--ranges") from None
    if low > high:
        raise click.BadParameter("MIN must not exceed MAX", param_hint="--ranges")
    return low, high


@click.group()
def main() -> None:
    """Minimum-error-rate training for Moses, compatible with its n-best lists and weights."""


@main.command("optimize")
@click.argument("nbest", nargs=-1, required=True)
@click.option("--ref", "refs", multiple=True, required=True, help="reference file (repeat for several references)")
@click.option(
    "--init",
    "init_paths",
    multiple=True,
    help="start weights: 'Name= v …' lines (moses.ini, -show-weights, a previous run) or numbers; repeat "
    "for several start points (e.g. the decoder's and the previous iteration's weights)",
)
@click.option("--init-opt", "init_opt", help="Moses init.opt: start weights, then restart minima and maxima")
@click.option("--restarts", type=int, default=20, show_default=True, help="random restarts (Moses -n)")
@click.option("--seed", type=int, default=None, help="seed of the random restarts (default: fresh randomness)")
@click.option("--ranges", help="random-restart range MIN,MAX for every feature (default 0,1 or init.opt)")
@click.option("--fixed", multiple=True, help="feature (all its columns) or column (LM0_0) to keep fixed")
@click.option("--epsilon", type=float, default=0.01, show_default=True, help="stop when BLEU gains ≤ this")
@click.option("--random-directions", type=int, default=0, show_default=True, help="extra random directions")
@_friendly_errors
def optimize_command(
    nbest: tuple[str, ...],
    refs: tuple[str, ...],
    init_paths: tuple[str, ...],
    init_opt: str | None,
    restarts: int,
    seed: int | None,
    ranges: str | None,
    fixed: tuple[str, ...],
    epsilon: float,
    random_directions: int,
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
    range_arg = _parse_range(ranges)
    result = optimize_runs(
        data,
        starts,
        restarts=restarts,
        ranges=range_arg if range_arg is not None else init_ranges,
        fixed=fixed_mask(names, fixed),
        seed=seed,
        epsilon=epsilon,
        random_directions=random_directions,
    )
    for line in format_weights(result.weights, names):
        click.echo(line)
    click.echo(
        f"# BLEU {result.bleu:.4f} (start {result.runs[0].start_bleu:.4f}; best of {len(result.runs)} runs; "
        f"{len(nbest_set.hypotheses)} hypotheses, {nbest_set.duplicates_removed} repeats dropped; "
        f"{time.perf_counter() - started:.1f} s)"
    )
    sys.stdout.flush()


if __name__ == "__main__":  # python -m mert.cli, for environments without the console script
    main()
