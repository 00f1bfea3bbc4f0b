"""Formatting and compressing finished chunks; runs in worker processes, so it imports no torch.

Each chunk becomes an independent gzip member. Concatenated members are one valid gzip stream
for Moses, zcat and Python (SPEC §3), which lets several processes compress in parallel and lets
``--resume`` cut the output back to a chunk boundary. ``mtime=0`` makes the bytes depend on the
content only, so a resumed run is byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import gzip

import numpy as np

from moses_integration.phrase_table import append_score_columns_bulk, format_log_probability


def format_chunk(
    lines: list[bytes],
    log_probs: np.ndarray,
    n_unknown: np.ndarray,
    compresslevel: int | None,
) -> bytes:
    """Lines with the two new columns; every line is scored (rejected lines never get here).

    Column 1 is exp(log p) floored at exp(-100); column 2 is exp(-n_unk), which Moses reads back
    as -n_unk. ``compresslevel=None`` returns plain text.
    """
    columns = [
        f"{format_log_probability(lp)} {format_log_probability(-n)}".encode("ascii")
        for lp, n in zip(log_probs.tolist(), n_unknown.tolist(), strict=True)
    ]
    out = append_score_columns_bulk(lines, columns)
    data = b"\n".join(out) + b"\n" if out else b""
    if compresslevel is None:
        return data
    return gzip.compress(data, compresslevel=compresslevel, mtime=0)
