"""``--scores-parquet``: the scores of every scored line as a Parquet file, for analysis.

One part file per chunk (written atomically, so ``--resume`` can drop the parts after the last
durable chunk), merged into the destination when the run completes. Columns: ``source``,
``target``, ``log_p`` (the RNN's log-probability), ``n_unk`` (the penalty's count) and
``table_scores`` (the line's original scores, fixed-size list); with ``--reverse-model``,
``reverse_log_p`` too (the reverse model's log p(f|e)).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infrastructure.files import atomic_path


def part_path(parts_dir: Path, chunk_index: int) -> Path:
    return parts_dir / f"part-{chunk_index:08d}.parquet"


def drop_parts_from(parts_dir: Path, first_chunk: int) -> None:
    """Remove the parts of chunks ``first_chunk`` onwards (not yet durable in the output)."""
    parts_dir.mkdir(parents=True, exist_ok=True)
    for part in parts_dir.glob("part-*.parquet"):
        if int(part.stem.split("-")[1]) >= first_chunk:
            part.unlink()


#: The fields of a part in their order; a new column's field goes after them.
FIELD_ORDER = ("source", "target", "log_p", "n_unk", "table_scores", "reverse_log_p")


def write_part(path: Path, source: pa.Array, target: pa.Array, scores: np.ndarray | None,
               columns: dict[tuple[str, pa.DataType], np.ndarray]) -> None:
    """One chunk's rows: their phrases, table scores and the columns' values (by field name and type)."""
    rows = len(source)
    scores = scores if scores is not None else np.zeros((rows, 0))
    width = scores.shape[1]
    flat = pa.array(scores.reshape(-1), pa.float64())
    fields = {
        "source": source, "target": target,
        "table_scores": pa.FixedSizeListArray.from_arrays(flat, width) if width else pa.nulls(rows),
        **{name: pa.array(values, kind) for (name, kind), values in columns.items()},
    }
    order = [name for name in FIELD_ORDER if name in fields] + [name for name in fields if name not in FIELD_ORDER]
    with atomic_path(path) as tmp:
        pq.write_table(pa.table({name: fields[name] for name in order}), tmp)


def merge_parts(parts_dir: Path, dest: Path) -> None:
    """Concatenate the parts in chunk order into ``dest`` (atomically), then remove them."""
    parts = sorted(parts_dir.glob("part-*.parquet"))
    with atomic_path(dest) as tmp:
        writer = None
        try:
            for part in parts:
                table = pq.read_table(part)
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
        finally:
            if writer:
                writer.close()
        if writer is None:
            pq.write_table(pa.table({"source": pa.array([], pa.string())}), tmp)
    for part in parts:
        part.unlink()
    parts_dir.rmdir()
