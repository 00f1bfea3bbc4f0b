"""``rescorer compare`` (the paper's Table 2) against a direct computation on the real fixture table."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from analysis_checkpoint import write_random_checkpoint
from moses_integration.tokens import split_tokens
from rescorer.analysis.compare import compare_blocks
from rescorer.cli import main
from rescorer.model.checkpoint import load_checkpoint
from rescorer.tables.scan import scan_table
from shared_paths import shared_file


@pytest.fixture(scope="module")
def sample_table() -> Path:
    return shared_file("fixtures/hansard-enfr/phrase-table.sample.gz")


@pytest.fixture(scope="module")
def checkpoint_path(sample_table, tmp_path_factory) -> Path:
    return write_random_checkpoint(sample_table, tmp_path_factory.mktemp("compare") / "model.pt")


def _direct_blocks(table: Path) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """(source, count(source), [(target, φ(e|f))]) per source block, by plain string handling."""
    blocks: list[tuple[str, float, list[tuple[str, float]]]] = []
    with gzip.open(table, "rt", encoding="utf-8") as fh:
        for line in fh:
            fields = line.rstrip("\n").split(" ||| ")
            source, target, scores, counts = fields[0], fields[1], fields[2].split(), fields[4].split()
            if not blocks or blocks[-1][0] != source:
                blocks.append((source, float(counts[1]), []))
            blocks[-1][2].append((target, float(scores[2])))
    return blocks


def _log_p(checkpoint, source: str, target: str) -> float:
    """log p(target | source) of one pair alone through the model's forward pass."""
    src = checkpoint.src_vocab.encode(split_tokens(source), add_eos=True)
    tgt = checkpoint.tgt_vocab.encode(split_tokens(target), add_eos=True)
    with torch.no_grad():
        return float(checkpoint.model(torch.tensor([src]), torch.tensor([len(src)]),
                                      torch.tensor([tgt]), torch.tensor([len(tgt)])))


def test_frequent_long_sources_and_top_targets_match_a_direct_computation(sample_table, checkpoint_path):
    checkpoint = load_checkpoint(checkpoint_path)
    scan = scan_table(sample_table, min_src_words=4, n_chosen=5, min_targets=2, progress=False)
    long_blocks = [b for b in _direct_blocks(sample_table) if len(split_tokens(b[0])) >= 4 and len(b[2]) >= 2]
    expected = sorted(long_blocks, key=lambda b: -b[1])[:5]  # stable: ties keep table order
    assert [b.source for b in scan.frequent] == [b[0] for b in expected]
    rows = compare_blocks(checkpoint, scan.frequent, top=3)
    for row, (source, count, targets) in zip(rows, expected, strict=True):
        assert row.source == source and row.count == count and row.targets == len(targets)
        by_table = sorted(targets, key=lambda t: -t[1])[:3]
        assert row.by_table == by_table
        rnn = sorted(((t, _log_p(checkpoint, source, t)) for t, _ in targets), key=lambda t: -t[1])[:3]
        assert [t for t, _ in row.by_rnn] == [t for t, _ in rnn]
        assert [lp for _, lp in row.by_rnn] == pytest.approx([lp for _, lp in rnn], abs=1e-4)


def test_rare_sources_are_the_least_frequent_and_stable(sample_table):
    scan = scan_table(sample_table, n_chosen=4, progress=False)
    counts = [b[1] for b in _direct_blocks(sample_table) if len(split_tokens(b[0])) >= 4 and len(b[2]) >= 2]
    assert len(scan.rare) == 4
    assert all(block.count == min(counts) for block in scan.rare)
    again = scan_table(sample_table, n_chosen=4, progress=False)
    assert [b.source for b in again.rare] == [b.source for b in scan.rare]
    assert scan.summary.lines == 5166 and scan.summary.sources == 2000 and scan.summary.score_columns == 4


def test_cli_markdown_and_json(sample_table, checkpoint_path):
    runner = CliRunner()
    result = runner.invoke(main, ["compare", str(checkpoint_path), str(sample_table), "--sources", "2", "--quiet"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("| source (count) |") and len(lines) == 2 + 2 * 3
    result = runner.invoke(main, ["compare", str(checkpoint_path), str(sample_table), "--sources", "3", "--rare",
                                  "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 3 and all(len(r["by_rnn"]) <= 3 and r["by_table"] for r in rows)
    bad = runner.invoke(main, ["compare", str(checkpoint_path), str(sample_table), "--column", "9", "--quiet"])
    assert bad.exit_code == 1 and "no column 9" in bad.output


def test_a_reverse_model_is_refused_as_rescore_refuses_it(sample_table, tmp_path):
    """A p(f|e) model's log p was listed under the RNN's p(e|f) column, exit 0."""
    reverse = write_random_checkpoint(sample_table, tmp_path / "rev.pt", direction="reverse")
    result = CliRunner().invoke(main, ["compare", str(reverse), str(sample_table), "--quiet"])
    assert result.exit_code == 1
    assert result.output == (f"Error: {reverse}: a reverse model (it scores p(f|e), from rescorer train --reverse): "
                             "MODEL must be a forward model (rescorer train without --reverse)\n")


def test_a_damaged_counts_field_is_one_line_at_its_line(sample_table, checkpoint_path, tmp_path):
    """A counts field '271 x 3' was read as no counts at all: exit 0, the header said "targets" instead of
    "count" and the sources were ranked by their number of targets."""
    lines = gzip.decompress(sample_table.read_bytes()).split(b"\n")
    fields = lines[1].split(b" ||| ")
    fields[4] = b"271 x 3"
    lines[1] = b" ||| ".join(fields)
    bad = tmp_path / "bad.gz"
    bad.write_bytes(gzip.compress(b"\n".join(lines)))
    result = CliRunner().invoke(main, ["compare", str(checkpoint_path), str(bad), "--quiet"])
    assert result.exit_code == 1
    assert result.output == f"Error: {bad}:2: counts field '271 x 3': count 'x' is not a number\n"


def test_a_table_out_of_order_is_one_line_at_the_first_line_out_of_place(sample_table, checkpoint_path, tmp_path):
    """A line moved to the end listed its source twice, each time with part of its targets, exit 0."""
    lines = [line for line in gzip.decompress(sample_table.read_bytes()).split(b"\n") if line]
    moved = lines[:1] + lines[2:] + lines[1:2]
    unsorted = tmp_path / "unsorted.gz"
    unsorted.write_bytes(gzip.compress(b"\n".join(moved) + b"\n"))
    result = CliRunner().invoke(main, ["compare", str(checkpoint_path), str(unsorted), "--quiet"])
    assert result.exit_code == 1
    assert result.output == (f"Error: {unsorted}:{len(lines)}: the table is not sorted as `LC_ALL=C sort` sorts it "
                             "(this line sorts before the one above); its sources' targets are read as runs of lines\n")


def test_an_empty_table_or_a_column_it_lacks_is_one_line_naming_the_table(sample_table, checkpoint_path, tmp_path):
    """An empty table printed the table's header alone, exit 0; ``--column 9`` said "the table has 4 score
    columns" without saying which table."""
    empty = tmp_path / "empty.gz"
    empty.write_bytes(gzip.compress(b""))
    result = CliRunner().invoke(main, ["compare", str(checkpoint_path), str(empty), "--quiet"])
    assert (result.exit_code, result.output) == (1, f"Error: {empty}: the table holds no phrase-table lines; there "
                                                    "are no sources to compare\n")
    result = CliRunner().invoke(main, ["compare", str(checkpoint_path), str(sample_table), "--column", "9", "--quiet"])
    assert (result.exit_code, result.output) == (1, f"Error: {sample_table}: the table has 4 score columns; there "
                                                    "is no column 9\n")
