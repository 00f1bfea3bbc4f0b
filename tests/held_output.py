"""Another process holding an output, as a second run of a command would find it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HOLDER = """
import sys
from infrastructure.files import exclusive_use
with exclusive_use(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def held_by_another_process(target: Path) -> Iterator[subprocess.Popen]:
    """A child process holds ``target`` (:func:`infrastructure.files.exclusive_use`) until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(target)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=60)
