"""A score column of one's own is one class of the :class:`Column` shape and its registration: the run plans,
scores, writes, puts in the Parquet output and records for ``--resume`` whatever columns it is given."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rescore_runs import SAMPLE_TABLE, assert_same_output, lines_of, rescore

from rescorer.model.checkpoint import load_checkpoint
from rescorer.pipeline import columns as registered
from rescorer.pipeline.columns.base import ChunkRows
from rescorer.pipeline.errors import RescoreError
from shared_paths import shared_file

LINES = 900  # of the sample table: several chunks of 200 lines


def line_number_text(values: np.ndarray) -> pa.Array:
    return pa.array([str(v) for v in values.tolist()], pa.string())


class LineNumbers:
    """A new column: each line's own 1-based number in the input (what a test can know without the model)."""

    parquet = ("line_number", pa.int64())
    format = staticmethod(line_number_text)
    planner = None
    model = None

    def __init__(self, version: str = "v1") -> None:
        self.version = version

    def score(self, rows: ChunkRows) -> np.ndarray:
        return rows.line_numbers

    def summarise(self, values: np.ndarray, rows: ChunkRows, summary) -> None:
        """Nothing to add."""

    def record_identity(self, record: dict) -> None:
        record["options"]["line_numbers"] = self.version

    def first_chunk(self, rows: ChunkRows) -> None:
        """Nothing to check."""


def register(monkeypatch, column: LineNumbers) -> None:
    """The column's registration: after the run's own columns."""
    own = registered.columns_of_run
    monkeypatch.setattr(registered, "columns_of_run", lambda *args: [*own(*args), column])


@pytest.fixture
def table(tmp_path: Path) -> Path:
    with gzip.open(shared_file(SAMPLE_TABLE)) as fh:
        lines = fh.read().splitlines()[:LINES]
    path = tmp_path / "pt.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_a_registered_column_is_on_every_line_and_in_the_parquet_output(table: Path, sample_model: Path,
                                                                         tmp_path: Path, monkeypatch) -> None:
    model = load_checkpoint(sample_model)
    rescore(table, tmp_path / "plain.gz", model, chunk_lines=200)
    register(monkeypatch, LineNumbers())
    parquet = tmp_path / "scores.parquet"
    rescore(table, tmp_path / "more.gz", model, chunk_lines=200, scores_parquet=str(parquet))
    plain, more = lines_of(tmp_path / "plain.gz"), lines_of(tmp_path / "more.gz")
    assert len(more) == LINES
    # The new column is the last score of each line; the line without it is the run's own output.
    cut = [line.split(b" ||| ") for line in more]
    assert [int(fields[2].split()[-1]) for fields in cut] == list(range(1, LINES + 1))
    for fields in cut:
        fields[2] = fields[2].rsplit(b" ", 1)[0]
    assert_same_output(b"\n".join(b" ||| ".join(fields) for fields in cut) + b"\n", b"\n".join(plain) + b"\n")
    assert pq.read_table(parquet).column("line_number").to_pylist() == list(range(1, LINES + 1))


def test_a_registered_column_is_in_the_resume_record(table: Path, sample_model: Path, tmp_path: Path,
                                                    monkeypatch) -> None:
    """A resume with the column's identity changed would splice two outputs: it is refused, naming it."""
    lines = table.read_bytes().splitlines()
    lines[700] = b"a ||| b ||| not a score"
    table.write_bytes(b"\n".join(lines) + b"\n")
    model, out = load_checkpoint(sample_model), tmp_path / "out.gz"
    register(monkeypatch, LineNumbers("v1"))
    with pytest.raises(Exception, match="pt.txt:701"):
        rescore(table, out, model, chunk_lines=200)
    assert json.loads((tmp_path / ".out.gz.progress.json").read_text())["options"]["line_numbers"] == "v1"
    monkeypatch.undo()
    register(monkeypatch, LineNumbers("v2"))
    with pytest.raises(RescoreError, match="was made with --line-numbers v1, now v2"):
        rescore(table, out, model, chunk_lines=200, resume=True, skip_bad_lines=True)
