"""The project's errors: :class:`UserError`, the one base of what a user must fix, and
:class:`FileLineError`, the shape shared by every file format (a file, a 1-based line and a reason).

A command prints a :class:`UserError` as one ``Error: ...`` line and exits 1
(:func:`infrastructure.cli_options.friendly_errors`); anything else is a bug in the project and shows
its traceback. That is why a library raises a :class:`UserError` (or a subclass) for bad input, a bad
file, a missing tool or a state the user must change, and a plain ``ValueError`` only for a caller's
mistake that no command line can cause.

On a 100M-line table or a 20k-line n-best list a user needs to know exactly which line to look at
(``zcat t.gz | sed -n 1234p``), so every format error prints as ``path:line: reason``.
"""

from __future__ import annotations

import os


class UserError(Exception):
    """What the user did wrong or must fix: bad input, a bad file, a missing tool, a state to change.

    Its message is complete on one line (the command adds ``Error: ``), names the file (and line)
    where there is one, and says what to do where that is not obvious.
    """


class FileLineError(UserError, ValueError):
    """Base of the format errors; ``str()`` is ``"{path}:{line_no}: {reason}"``.

    Still a ``ValueError`` too, as it was before :class:`UserError`: code and tests that read a bad
    field catch a format error as one (the other error classes are :class:`UserError` alone)."""

    def __init__(self, path: str | os.PathLike[str], line_no: int | None, reason: str) -> None:
        self.path = os.fspath(path)
        self.line_no = line_no
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        """``path:line: reason``, or ``path: reason`` for a whole-file problem (``line_no`` None)."""
        where = self.path if self.line_no is None else f"{self.path}:{self.line_no}"
        return f"{where}: {self.reason}"

    def __reduce__(self) -> tuple[type[FileLineError], tuple[str, int | None, str]]:
        # Keep the three attributes when the error crosses a process boundary (worker pools).
        return (type(self), (self.path, self.line_no, self.reason))
