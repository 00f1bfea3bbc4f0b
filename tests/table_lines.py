"""Hand-made phrase-table lines and the two ways tests write them, shared by the file and table tests."""

from __future__ import annotations

import gzip
from pathlib import Path

GOOD = [
    b"a ||| un ||| 0.5 0.4 0.3 0.2 ||| 0-0 ||| 2 2 1 ||| |||",
    b"a house ||| une maison ||| 1 0.2 0.5 0.1 ||| 0-0 1-1 ||| 1 2 1 ||| |||",
    b"the ||| la ||| 0.25 1 0.3 2.718 ||| 0-0 ||| 4 3 1 ||| |||",
]


def write_lines(fh, lines: list[bytes]) -> int:
    """Lines without their newline, written as a table (the product writes whole chunks)."""
    fh.write(b"".join(line + b"\n" for line in lines))
    return len(lines)


def write_bytes(path: Path, lines: list[bytes], *, gz: bool = False) -> Path:
    data = b"".join(line + b"\n" for line in lines)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path
