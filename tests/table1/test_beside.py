"""``table1 --beside``: other runs' reports beside this one's rows (medium beside small and the paper)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from click.testing import CliRunner

from table1.beside import beside_document, format_beside, read_beside
from table1.cli import main

REPO = Path(__file__).resolve().parents[2]
SMALL_TEST = {"path": "newstest/newstest2014.{lang}", "first": 1, "last": 1000}
MEDIUM_TEST = {"path": "newstest/newstest2014.{lang}", "first": 1, "last": None}


def row(key: str, label: str, mean: float, std: float | None, runs: int, pooled: tuple[float, float] | None,
        paper: float | None, over_runs: dict | None = None) -> dict:
    """A report row as table1.json holds it (only what the table reads)."""
    return {"key": key, "label": label, "paper": {"dev": None, "test": paper}, "runs_finished": runs,
            "test": {"mean": mean, "std": std}, "over_runs_vs_baseline": over_runs,
            "pooled_vs_baseline": None if pooled is None else {"delta": pooled[0], "p_value": pooled[1], "runs": runs}}


def write_report(path: Path, scale: str, test: dict, rows: list[dict]) -> Path:
    settings = {"scale": {"name": scale, "test": test}}
    path.write_text(json.dumps({"rows": rows, "runs_requested": 3, "settings": settings}))
    return path


def test_other_reports_rows_stand_beside_this_ones_with_the_papers(tmp_path: Path) -> None:
    small = read_beside(write_report(tmp_path / "small.json", "small", SMALL_TEST, [
        row("baseline", "Baseline", 16.96, 0.13, 3, None, 33.30),
        row("rnn", "+ RNN", 16.92, 0.20, 3, (-0.04, 0.193), 33.87,
            {"mean_delta": -0.037, "ci95": [-0.29, 0.22], "p_value": 0.76, "sentence_part": "recovered from …"}),
        row("cslm-rnn", "+ CSLM + RNN", 17.07, 0.30, 3, (0.10, 0.169), 34.64)]))
    rows = [row("baseline", "Baseline", 25.0, None, 1, None, 33.30),
            row("rnn", "+ RNN", 25.5, None, 1, (0.5, 0.02), 33.87),
            row("rnn-wp", "+ RNN + WP", 25.25, None, 1, (0.25, 0.2), None)]
    doc = beside_document(rows, {"name": "medium", "test": MEDIUM_TEST}, [small])
    md = "\n".join(format_beside(doc))
    assert "| configuration | medium (this report) | small (" + str(tmp_path / "small.json") + ") | paper |" in md
    assert "| Baseline | 25.00 (1 run) | 16.96 ± 0.13 (3 runs) | 33.30 |" in md
    # the paper's Δ: 33.87 − 33.30; small's + RNN with its own Δ over runs against its own Baseline (†: its
    # σ_sent recovered); a report without the test over runs shows its pooled test, named as sentences only
    assert ("| + RNN | 25.50 (1 run); pooled Δ +0.50 (p 0.020, sentences only) | 16.92 ± 0.20 (3 runs); "
            "Δ -0.04 [-0.29, +0.22] (p 0.760†) | 33.87; Δ +0.57 |") in md
    assert "| + RNN + WP | 25.25 (1 run); pooled Δ +0.25 (p 0.200, sentences only) | – | – |" in md  # small lacks it
    assert "CSLM" not in md  # only this report's rows
    assert "- medium (this report): test newstest2014, all lines" in md
    assert f"- small ({tmp_path / 'small.json'}): test newstest2014 lines 1–1000" in md


def test_the_report_shows_the_section_after_its_notes() -> None:
    from table1.report import format_markdown

    rows = [row("baseline", "Baseline", 25.0, None, 1, None, 33.30)]
    beside = beside_document(rows, {"name": "medium", "test": MEDIUM_TEST}, [])
    md = format_markdown({"rows": [], "combination": "mean", "runs_requested": 1, "sacrebleu_signature": "sig",
                          "notes": ["SCALE=medium"], "settings": {}, "beside": beside})
    assert md.index("- SCALE=medium") < md.index("## Beside the other runs") < md.index("## Tuned weights")
    assert "| Baseline | 25.00 (1 run) | 33.30 |" in md


def test_a_bad_beside_file_is_one_line_naming_it_before_any_step(tmp_path: Path) -> None:
    work = tmp_path / "work"
    broken = tmp_path / "broken.json"
    broken.write_text('{"rows": [')
    not_a_report = write_report(tmp_path / "other.json", "small", SMALL_TEST, [{"key": "baseline"}])
    for bad, says in ((broken, "not a readable table1.json"), (not_a_report, "not a table1.json report")):
        result = CliRunner().invoke(main, ["report", "--work", str(work), "--data", str(tmp_path),
                                           "--results", str(tmp_path / "results"), "--beside", str(bad)])
        assert result.exit_code != 0
        assert result.output.count("\n") == 1 and f"--beside {bad}: {says}" in result.output, result.output
        assert not work.exists() and not (tmp_path / "results").exists()


def test_the_report_being_written_cannot_be_beside_itself(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    own = write_report(results / "table1.json", "small", SMALL_TEST,
                       [row("baseline", "Baseline", 17, 0.1, 3, None, 33.3)])
    result = CliRunner().invoke(main, ["report", "--work", str(tmp_path / "work"), "--data", str(tmp_path),
                                       "--results", str(results), "--beside", str(own)])
    assert result.exit_code != 0 and "is the input --beside" in result.output, result.output
    assert json.loads(own.read_text())["rows"][0]["test"]["mean"] == 17


def test_the_reranking_report_cannot_be_written_over_a_report_beside_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    own = write_report(results / "reranking.json", "small", SMALL_TEST,
                       [row("baseline", "Baseline", 17, 0.1, 3, None, 33.3)])
    before = own.read_bytes()
    result = CliRunner().invoke(main, ["reranking", "--work", str(tmp_path / "work"), "--data", str(tmp_path),
                                       "--results", str(results), "--beside", str(own)])
    assert result.exit_code != 0 and "is the input --beside" in result.output, result.output
    assert own.read_bytes() == before and not (tmp_path / "work").exists()


def test_make_beside_becomes_one_option_each() -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MAKELEVEL"}}
    out = subprocess.run(["make", "-n", "table1", "BESIDE=results/table1.json results/domain-check/table1.json",
                          "WORK=/w"], cwd=REPO, capture_output=True, text=True, check=True, env=env).stdout
    assert "--beside results/table1.json --beside results/domain-check/table1.json" in out
