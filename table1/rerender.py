"""Add the test over runs to a Table 1 report written before it, from the figures the report kept.

A report's per-sentence statistics live in its work folder, not in ``results/``; where that folder
is gone, the report's JSON still holds each comparison's per-run Δ_k, per-run paired bootstrap p
and, for the later reports, the pooled test's Δ and ``significant_from``. The between-run part of
:class:`mert.significance.RunsTest` is exact from the Δ_k; σ_sent is recovered on the wide side
(:func:`mert.significance.sentence_sd_from_threshold`, else
:func:`mert.significance.sentence_sd_from_p_values`) and the report says so beside each figure.

``python -m table1.rerender results/table1.json …`` rewrites each report in place: the JSON gains
``over_runs_vs_baseline`` (and ``over_runs`` in each ``versus``), the Markdown's results table and
its "Beside the other runs" table are redrawn from it (the rest of the page, written by the code
of its day, is kept as it is), and the figure is drawn again. Reports named as ``--beside``
columns are read again, so rewrite those first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from infrastructure.files import atomic_write_bytes, write_json
from mert.significance import (
    RUNS_METHOD,
    RunsTest,
    sentence_sd_from_p_values,
    sentence_sd_from_threshold,
)
from table1.beside import format_beside
from table1.report import COMBINATION, draw_png, format_results
from table1.workspace import ExperimentError

FROM_THRESHOLD = ("recovered from the pooled bootstrap's stored threshold (significant from ±t: σ = t / 1.162, "
                  "the largest σ a normal resample allows; the per-sentence statistics are gone)")
FROM_P_VALUES = ("recovered from the per-run paired bootstraps' stored (Δ_k, p_k) (σ_k at which normal resamples "
                 "give p_k; their mean, never below the SD of the runs' mean; no pooled test was stored)")


def stored_runs_test(deltas: Sequence[float], p_values: Sequence[float], pooled: dict | None) -> RunsTest | None:
    """The test over runs from a report's stored figures: Δ_k exact, σ_sent recovered."""
    if not deltas:
        return None
    if pooled and pooled.get("significant_from") is not None:
        return RunsTest(tuple(deltas), sentence_sd_from_threshold(pooled["significant_from"]), FROM_THRESHOLD)
    sd = sentence_sd_from_p_values(deltas, p_values)
    if sd is None:
        raise ExperimentError(f"no run's (Δ, p) in {list(zip(deltas, p_values, strict=True))} says what σ_sent is")
    return RunsTest(tuple(deltas), sd, FROM_P_VALUES)


def add_tests_over_runs(doc: dict) -> None:
    """Each comparison of ``doc`` without a test over runs gets one from its stored figures."""
    for row in doc["rows"]:
        if row["key"] != "baseline" and not row.get("over_runs_vs_baseline"):
            test = stored_runs_test(row.get("deltas_vs_baseline") or [], row.get("p_values_vs_baseline") or [],
                                    row.get("pooled_vs_baseline"))
            row["over_runs_vs_baseline"] = None if test is None else test.to_json()
        for v in row.get("versus") or []:
            if not v.get("over_runs"):
                test = stored_runs_test([r["delta"] for r in v["runs"]], [r["p_value"] for r in v["runs"]],
                                        v.get("pooled"))
                v["over_runs"] = None if test is None else test.to_json()
    doc["significance"] = RUNS_METHOD
    doc["combination"] = COMBINATION


def refresh_beside(doc: dict, root: Path) -> None:
    """The "Beside the other runs" cells get each report's test over runs, read again from its file
    (``name (path)`` in the column's name, relative to ``root``); this report's from its own rows."""
    beside = doc.get("beside")
    if not beside:
        return
    columns = []
    for column in beside["columns"]:
        name = column["name"]
        source = name[name.index("(") + 1:-1] if name.endswith(")") else ""
        if source == "this report":
            columns.append({row["key"]: row for row in doc["rows"]})
        else:
            try:
                other = json.loads((root / source).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise ExperimentError(f"beside column {name!r}: {exc}") from exc
            columns.append({row["key"]: row for row in other["rows"]})
    for row in beside["rows"]:
        for cell, rows in zip(row["cells"], columns, strict=True):
            if cell is not None and row["key"] != "baseline" and row["key"] in rows:
                cell["over_runs"] = rows[row["key"]].get("over_runs_vs_baseline")


def _splice(markdown: str, first: str, last: str, new: list[str]) -> str:
    """``markdown`` with the lines from the first that starts with ``first`` to the next that starts
    with ``last`` (or the next heading when ``last`` is "##") replaced by ``new``."""
    lines = markdown.split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(first))
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith(last))
    except StopIteration:
        raise ExperimentError(f"no '{first}' … '{last}' block in the report to replace") from None
    keep_last = last == "## "
    return "\n".join(lines[:start] + new + lines[end if keep_last else end + 1:])


def rerender(json_path: Path, command: str, root: Path = Path(".")) -> list[Path]:
    """Rewrite one report (its .json, .md and .png) with the test over runs; returns the paths."""
    doc = json.loads(json_path.read_text(encoding="utf-8"))
    add_tests_over_runs(doc)
    refresh_beside(doc, root)
    md_path, png_path = json_path.with_suffix(".md"), json_path.with_suffix(".png")
    markdown = md_path.read_text(encoding="utf-8")
    results = format_results(doc)
    results[-1] += f" Statistics over runs added to this report by `{command}`."
    markdown = _splice(markdown, "| configuration | dev", "sacreBLEU signature:", results)
    if doc.get("beside"):
        markdown = _splice(markdown, "## Beside the other runs", "## ", [*format_beside(doc["beside"]), ""])
    write_json(json_path, doc)
    atomic_write_bytes(md_path, markdown.encode("utf-8"))
    draw_png(doc, png_path)
    return [json_path, md_path, png_path]


if __name__ == "__main__":  # pragma: no cover
    for name in sys.argv[1:]:
        for path in rerender(Path(name), f"python -m table1.rerender {name}"):
            print(f"wrote {path}", file=sys.stderr)
