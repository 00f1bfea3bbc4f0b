"""Other runs of the experiment beside this one: the report's "Beside the other runs" table.

A scale's answer only means something next to the others (medium's + RNN beside SCALE=small's,
the domain check's Baseline and the paper). ``table1 --beside FILE`` names another
run's ``table1.json``; it is read and checked while the command line is read, before any step, and
the report puts each of its rows' test score and pooled Δ against its own Baseline beside this
run's, one column a report, with the paper's last. Only this run's rows are shown: another report's
row that this one lacks has nothing to be compared with here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mert.significance import EXACT
from table1.workspace import ExperimentError

#: Marks a test over runs whose sentence part was recovered from an older report's figures.
APPROXIMATE = "†"


@dataclass(frozen=True)
class BesideRun:
    """Another run's report, as much of it as the table shows."""

    source: str  # the path as the command line gave it
    scale: str
    test: str  # "newstest2014 lines 1–1000"
    rows: dict[str, dict]  # configuration key -> the report's row

    @property
    def column(self) -> str:
        return f"{self.scale} ({self.source})"


def describe_test(test: dict) -> str:
    """``newstest2014 lines 1–1000``, or ``newstest2014, all lines``, from a scale's test spec."""
    name = Path(str(test["path"]).replace(".{lang}", "")).name
    first, last = test.get("first", 1), test.get("last")
    return f"{name}, all lines" if last is None and first == 1 else f"{name} lines {first}–{last or 'end'}"


def read_beside(path: Path) -> BesideRun:
    """``path``'s report, or one line naming the file and what is wrong with it."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExperimentError(f"--beside {path}: not a readable table1.json ({exc})") from exc
    try:
        scale = doc["settings"]["scale"]
        rows = {row["key"]: row for row in doc["rows"]}
        for key, row in rows.items():
            if not isinstance(row["test"], dict) or not isinstance(row["runs_finished"], int):
                raise TypeError(f"row {key!r}")
        return BesideRun(str(path), str(scale["name"]), describe_test(scale["test"]), rows)
    except (KeyError, TypeError, ValueError) as exc:
        raise ExperimentError(f"--beside {path}: not a table1.json report of this experiment "
                              f"(no {exc} where table1 writes it)") from exc


def _cell(row: dict | None, baseline: bool) -> dict | None:
    if row is None or row["test"].get("mean") is None:
        return None
    return {"test": row["test"], "runs": row["runs_finished"],
            "pooled": None if baseline else row.get("pooled_vs_baseline"),
            "over_runs": None if baseline else row.get("over_runs_vs_baseline")}


def beside_document(rows: Sequence[dict], scale: dict, others: Sequence[BesideRun]) -> dict:
    """The table as JSON: this run's column, then each other report's, then the paper's test and
    its Δ against the paper's Baseline."""
    paper_baseline = next((row["paper"]["test"] for row in rows if row["key"] == "baseline"), None)
    columns = [{"name": f"{scale['name']} (this report)", "test": describe_test(scale["test"])}]
    columns += [{"name": other.column, "test": other.test} for other in others]
    table = []
    for row in rows:
        baseline = row["key"] == "baseline"
        paper = row["paper"]["test"]
        table.append({
            "key": row["key"], "label": row["label"],
            "cells": [_cell(row, baseline)] + [_cell(other.rows.get(row["key"]), baseline) for other in others],
            "paper": None if paper is None else {
                "test": paper,
                "delta": None if baseline or paper_baseline is None else round(paper - paper_baseline, 2)},
        })
    return {"columns": columns, "rows": table}


def _format_cell(cell: dict | None) -> str:
    if cell is None:
        return "–"
    test, runs = cell["test"], cell["runs"]
    text = f"{test['mean']:.2f}" + (f" ± {test['std']:.2f}" if test.get("std") is not None else "")
    text += f" ({runs} run{'s' if runs != 1 else ''})"
    over_runs, pooled = cell.get("over_runs"), cell.get("pooled")
    if over_runs and over_runs.get("ci95"):
        low, high = over_runs["ci95"]
        mark = "" if over_runs["sentence_part"] == EXACT else APPROXIMATE
        text += f"; Δ {over_runs['mean_delta']:+.2f} [{low:+.2f}, {high:+.2f}] (p {over_runs['p_value']:.3f}{mark})"
    elif pooled:
        text += f"; pooled Δ {pooled['delta']:+.2f} (p {pooled['p_value']:.3f}, sentences only)"
    return text


def format_beside(doc: dict) -> list[str]:
    """The markdown section: one row a configuration of this run, one column a report."""
    columns = doc["columns"]
    out = ["## Beside the other runs", "",
           "Test sacreBLEU, mean ± std over each report's runs, and the mean Δ against that report's own "
           "Baseline with its 95% interval and p over runs (MERT's variance and the test set's, as in the main "
           f"table; {APPROXIMATE}: σ_sent recovered from the report's stored figures); the paper's test BLEU and its "
           "Δ against the paper's Baseline. The reports differ in their data and sizes (each one's Settings "
           "section).", "",
           "| configuration | " + " | ".join(c["name"] for c in columns) + " | paper |",
           "|---|" + "---|" * (len(columns) + 1)]
    for row in doc["rows"]:
        paper = row["paper"]
        paper_cell = "–" if paper is None else f"{paper['test']:.2f}" + (
            f"; Δ {paper['delta']:+.2f}" if paper.get("delta") is not None else "")
        out.append(f"| {row['label']} | " + " | ".join(_format_cell(c) for c in row["cells"]) + f" | {paper_cell} |")
    out += [""] + [f"- {c['name']}: test {c['test']}" for c in columns]
    return out
