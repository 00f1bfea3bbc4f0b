"""Progress bars: the one place every command makes them, so all of them behave alike.

Why a helper rather than plain ``tqdm``: tqdm redraws a bar up to ten times a second. On a
terminal that rewrites one line in place; written to a file or a pipe (``make demo > log 2>&1``, a
batch job's log, ``| tee``) every redraw stays, and a run of an hour leaves tens of thousands of
them. So when stderr is not a terminal a bar redraws at most once every ``NON_TERMINAL_INTERVAL``
seconds (its first and last states are always written): a log still says how far a long run got
and how fast, in a few lines. On a terminal tqdm's own settings apply.

Bars always go to stderr, so that ``-`` as an output (stdout) never gets one, and ``show=False``
(``-q/--quiet``) draws nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")

# Seconds between two redraws of a bar written to a file or a pipe.
NON_TERMINAL_INTERVAL = 30.0


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def progress_bar(iterable: Iterable[T] | None = None, *, show: bool, **options: Any) -> tqdm:
    """A tqdm bar on stderr (``options`` are tqdm's), sparse where stderr is not a terminal.

    ``maxinterval`` goes up with ``mininterval``: tqdm's monitor thread otherwise forces a redraw
    every ``maxinterval`` (10 s) seconds whatever ``mininterval`` says.
    """
    if not _stderr_is_terminal():
        interval = max(float(options.get("mininterval", 0.1)), NON_TERMINAL_INTERVAL)
        options.update(mininterval=interval, maxinterval=interval, dynamic_ncols=False)
    return tqdm(iterable, disable=not show, file=sys.stderr, **options)
