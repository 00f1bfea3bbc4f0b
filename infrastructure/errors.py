"""The one error shape shared by every file format: a file, a 1-based line and a reason.

On a 100M-line table or a 20k-line n-best list a user needs to know exactly which line to look at
(``zcat t.gz | sed -n 1234p``), so every format error prints as ``path:line: reason``.
"""

from __future__ import annotations

import os


class FileLineError(ValueError):
    """Base of the format errors; ``str()`` is ``"{path}:{line_no}: {reason}"``."""

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
