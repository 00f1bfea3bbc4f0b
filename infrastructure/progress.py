"""Progress bars: the one place every command makes them, so all of them behave alike.

Why a helper rather than plain ``tqdm``: tqdm redraws a bar up to ten times a second, and again at
every ``set_postfix`` and around every ``tqdm.write`` message. On a terminal that rewrites one line
in place; written to a file or a pipe (``make demo > log 2>&1``, a batch job's log, ``| tee``) every
redraw stays, and a run of an hour leaves tens of thousands of them. So when stderr is not a
terminal a bar is drawn as plain lines: its first state, then at most one line every
``NON_TERMINAL_INTERVAL`` seconds, then its last state. A log still says how far a long run got and
how fast, in a few lines, and the messages printed between them stay on lines of their own.

Bars always go to stderr, so that ``-`` as an output (stdout) never gets one, and ``show=False``
(``-q/--quiet``) draws nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")

# Seconds between two lines of a bar written to a file or a pipe.
NON_TERMINAL_INTERVAL = 30.0


class _LogBar(tqdm):
    """A bar for a log: each drawing is a line, drawn only when its interval has passed.

    tqdm's own redraws outside that interval are turned off: ``set_postfix``/``set_description``
    wait for the next timed drawing, and a message (``tqdm.write``) ends the bar's line instead of
    wiping it, without drawing the bar again after it.
    """

    @staticmethod
    def status_printer(file: TextIO) -> Callable[[str], None]:
        def print_status(s: str) -> None:
            if not s:  # tqdm wipes a terminal line by drawing '': a log has nothing to wipe
                return
            file.write(("\n" if print_status.open else "") + s.rstrip())
            file.flush()
            print_status.open = True

        print_status.open = False  # a drawing ends its line only when something follows it
        return print_status

    def clear(self, nolock: bool = False) -> None:
        sp = getattr(self, "sp", None)
        if getattr(sp, "open", False):
            self.fp.write("\n")
            sp.open = False
        self._after_message = True

    def refresh(self, nolock: bool = False, lock_args: Any = None) -> bool:
        if getattr(self, "_after_message", False):  # tqdm.write's redraw after its message
            self._after_message = False
            return False
        return super().refresh(nolock=nolock, lock_args=lock_args)

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        super().set_description(desc, refresh=False)

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        super().set_description_str(desc, refresh=False)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


def progress_bar(iterable: Iterable[T] | None = None, *, show: bool, **options: Any) -> tqdm:
    """A tqdm bar on stderr (``options`` are tqdm's): in place on a terminal, sparse lines elsewhere.

    ``maxinterval`` goes up with ``mininterval``: tqdm's monitor thread otherwise forces a drawing
    every ``maxinterval`` (10 s) whatever ``mininterval`` says.
    """
    if _stderr_is_terminal():
        return tqdm(iterable, disable=not show, file=sys.stderr, **options)
    interval = max(float(options.get("mininterval", 0.1)), NON_TERMINAL_INTERVAL)
    options.update(mininterval=interval, maxinterval=interval, dynamic_ncols=False)
    return _LogBar(iterable, disable=not show, file=sys.stderr, **options)
