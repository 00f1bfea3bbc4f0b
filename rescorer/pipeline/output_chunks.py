"""Formatting and compressing finished chunks; runs in worker processes, so it imports no torch.

Each chunk becomes an independent gzip member. Concatenated members are one valid gzip stream
for Moses, zcat and Python (SPEC §3), which lets several processes compress in parallel and lets
``--resume`` cut the output back to a chunk boundary. ``mtime=0`` makes the bytes depend on the
content only, so a resumed run is byte-identical to an uninterrupted one.

Formatting is columnar (Arrow), not line by line: on a GPU machine this stage and gzip are what
bounds the pipeline, so each line costs one float format and a few bulk copies. Lines whose
scores field does not end in a plain character (a stray ``\\r`` or blank before the next field)
take the per-line path of :func:`moses_integration.phrase_table.append_score_columns_bulk`, which
gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infrastructure.files import compress_member
from moses_integration.phrase_table import SEPARATOR, append_score_columns_bulk
from rescorer.pipeline.spool import SpooledChunk, lines_of
from rescorer.tables.aligned import grid_rows
from rescorer.tables.chunks import LineChunk

NEWLINE = ord("\n")


#: A column's values and the function that writes them (:attr:`rescorer.pipeline.columns.base.Column.format`).
ColumnValues = tuple[Callable[[np.ndarray], pa.Array], np.ndarray]


def score_columns(columns: Sequence[ColumnValues]) -> pa.Array:
    """``"C1 C2 …"`` per line: each column's text of its values, in order, as Moses reads them."""
    return pc.binary_join_element_wise(*(write(values) for write, values in columns), " ")


def format_chunk(
    lines: LineChunk,
    columns: Sequence[ColumnValues],
    compress_level: int | None,
    members: np.ndarray | None = None,
) -> bytes:
    """Lines with the new columns; every line is scored (rejected lines never get here).

    ``compress_level=None`` returns plain text; else one gzip member, or with ``members`` (the
    increasing rows, after the first, where a new member starts) one member per stretch.
    """
    if any(len(values) != len(lines) for _, values in columns):
        raise ValueError(f"{len(lines)} lines but {[len(values) for _, values in columns]} scores")
    if not len(lines):  # no member for no lines: a shard's skipped chunks add no bytes to the output
        return b""
    data = _append_columns(lines, score_columns(columns))
    if compress_level is None:
        return bytes(data)
    if members is None or not len(members):
        return compress_member(data, compress_level)
    line_ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == NEWLINE) + 1
    cuts = [0, *line_ends[np.asarray(members) - 1].tolist(), len(data)]
    view = memoryview(data)
    return b"".join(compress_member(view[a:b], compress_level) for a, b in zip(cuts, cuts[1:], strict=False))


def _append_columns(lines: LineChunk, columns: pa.Array) -> bytes | memoryview:
    """The chunk's text with `` COLUMNS`` inserted where each line's scores field ends.

    Line i is cut in two at the end of its third field, head_i and rest_i (rest_i holds what
    follows and the newline); the output is head_0 ␣cols_0 rest_0 head_1 … — one gather of three
    Arrow arrays whose concatenated values are the output.
    """
    text = lines.arrow()
    parts = pc.split_pattern(text, SEPARATOR.decode(), max_splits=3)
    counts = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    firsts = parts.offsets.to_numpy()[:-1] - parts.offsets[0].as_py()
    field_len = pc.binary_length(parts.values).to_numpy(zero_copy_only=False)[parts.offsets[0].as_py():]
    if counts.min() < 3:
        return _append_per_line(lines, columns)
    scores_end = field_len[firsts] + field_len[firsts + 1] + field_len[firsts + 2] + 2 * len(SEPARATOR)
    starts = lines.offsets[:-1]
    raw = np.frombuffer(lines.data, dtype=np.uint8)
    if (field_len[firsts + 2] == 0).any() or (raw[starts + scores_end - 1] <= 0x20).any():
        return _append_per_line(lines, columns)
    # Values head_0, rest_0, head_1, rest_1, … are contiguous in lines.data: one zero-copy array.
    cuts = np.empty(2 * len(lines) + 1, dtype=np.int64)
    cuts[0:-1:2] = starts
    cuts[1::2] = starts + scores_end
    cuts[-1] = lines.offsets[-1]
    pieces = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 2 * len(lines),
                                              [None, pa.py_buffer(cuts), pa.py_buffer(lines.data)])
    extra = pc.binary_join_element_wise("", columns, " ").cast(pa.large_binary())  # " P U[ F]"
    both = pa.concat_arrays([pieces, extra])
    order = np.empty(3 * len(lines), dtype=np.int64)
    order[0::3] = np.arange(0, 2 * len(lines), 2)
    order[1::3] = 2 * len(lines) + np.arange(len(lines))
    order[2::3] = np.arange(1, 2 * len(lines), 2)
    out = pc.take(both, pa.array(order))
    value_offsets = out.buffers()[1]
    first, last = np.frombuffer(value_offsets, dtype=np.int64)[[out.offset, out.offset + len(out)]]
    return memoryview(out.buffers()[2])[int(first) : int(last)]


def _append_per_line(lines: LineChunk, columns: pa.Array) -> bytes:
    out = append_score_columns_bulk(lines.lines, [c.encode("ascii") for c in columns.to_pylist()])
    return b"\n".join(out) + b"\n"


def format_lines(
    lines: LineChunk | SpooledChunk,
    good_rows: np.ndarray | None,
    columns: Sequence[ColumnValues],
    compress_level: int | None,
) -> bytes:
    """:func:`format_chunk` of the scored rows (``good_rows``, None: all) of lines in memory or in the
    spool; a spool file is deleted once read, as this is its last use.

    A gzip member starts at the chunk's first line and at each of its grid points
    (:func:`rescorer.tables.aligned.grid_rows`, found from the line numbers alone), where a shard may
    start: so a shard's output, a stretch of the whole run's chunks from one grid point on, is also
    the whole run's bytes. Of a subset of rows, a member starts at a row if a grid point lies after
    the row before it.
    """
    chunk = lines_of(lines)
    if isinstance(lines, SpooledChunk):
        lines.drop()
    members = None
    if compress_level is not None and len(chunk):
        points = np.cumsum(grid_rows(chunk))  # grid points at or before each row
        at = points[good_rows] if good_rows is not None else points
        members = np.flatnonzero(np.diff(at)) + 1
    return format_chunk(chunk.take(good_rows) if good_rows is not None else chunk, columns, compress_level, members)
