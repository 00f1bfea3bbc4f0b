"""The Table 1 report: how runs are combined and what the Markdown shows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mert.evaluate import paired_bootstrap
from mert.significance import RunsTest, pooled_bootstrap, runs_test
from table1.report import (
    ConfigScores,
    RunScores,
    TunedRun,
    build_table,
    draw_png,
    figure_comparisons,
    format_markdown,
    score_runs,
)
from table1.rerender import rerender
from table1.settings import CONFIGURATIONS_BY_KEY


def _runs(values: list[tuple[float, float]], p: float | None = None) -> list[RunScores]:
    return [RunScores(k, dev, test, test - 1, {"LM0": [0.1 * k]}, p, seed=999 + k)
            for k, (dev, test) in enumerate(values, start=1)]


def test_mean_and_sample_std_over_runs_and_p_values_per_run():
    scores = [
        ConfigScores(CONFIGURATIONS_BY_KEY["baseline"], _runs([(20.0, 15.0), (22.0, 16.0), (27.0, 17.0)])),
        ConfigScores(CONFIGURATIONS_BY_KEY["rnn"], _runs([(21.0, 15.5)], p=0.2)),
        ConfigScores(CONFIGURATIONS_BY_KEY["cslm-rnn"], []),
    ]
    doc = build_table(scores, settings={"scale": "x"}, signature="sig", runs_requested=3, timings={"data": 2.0})
    base, rnn, cslm = doc["rows"]
    assert base["dev"]["mean"] == 23.0 and math.isclose(base["dev"]["std"], math.sqrt(13), abs_tol=1e-4)
    assert base["test"] == {"mean": 16.0, "std": 1.0}
    assert rnn["dev"] == {"mean": 21.0, "std": None} and rnn["p_values_vs_baseline"] == [0.2]
    assert cslm["runs_finished"] == 0 and cslm["test"]["mean"] is None
    assert [r["seed"] for r in base["runs"]] == [1000, 1001, 1002]
    md = format_markdown(doc, "make table1 SCALE=small")
    assert "| Baseline | 23.00 ± 3.61 (3 runs) | 16.00 ± 1.00 (3 runs) |" in md
    assert "| + RNN | 21.00 (1 run) |" in md and "| (p 0.200) |" in md
    assert "| + CSLM + RNN | – | – | – | 31.48 | 34.64 | – | – | – |" in md
    assert "| data | 2 |" in md and "Made by `make table1 SCALE=small`" in md


def _noisy(refs: list[str], error_rate: float, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    """The first word ("0") kept: detruecasing leaves it as it is, so the test text is the scored text."""
    return [" ".join(w if i == 0 or rng.random() > error_rate else f"x{rng.integers(50)}"
                     for i, w in enumerate(ref.split())) for ref in refs]


def _scored_rows(tmp_path, refs: list[str], outputs: dict[tuple[str, int], list[str]]):
    """score_runs over the rows and runs of ``outputs`` ((key, run) -> test output), every
    reference (dev, raw and tokenised test) being ``refs``."""
    for name in ("dev.tok", "test.raw", "test.tok"):
        (tmp_path / name).write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    collected = []
    for key in dict.fromkeys(key for key, _ in outputs):
        found = []
        for k in sorted(run for row, run in outputs if row == key):
            out = tmp_path / f"{key}.{k}.tok"
            out.write_text("".join(h + "\n" for h in outputs[key, k]), encoding="utf-8")
            found.append(TunedRun(k, 999 + k, out, out, {"LM0": [0.5]}, 3, "weights converged"))
        collected.append((CONFIGURATIONS_BY_KEY[key], found))
    return score_runs(collected, dev_tok_ref=tmp_path / "dev.tok", test_ref=tmp_path / "test.raw",
                      test_tok_ref=tmp_path / "test.tok", lang="fr", bootstrap_samples=200)


def test_each_row_gets_one_pooled_p_value_and_the_report_says_what_it_can_detect(tmp_path):
    """score_runs pools a row's runs against the same-numbered Baseline runs, exactly as
    mert.significance does, and measures the detectable Δ between Baseline runs."""
    rng = np.random.default_rng(0)
    refs = ["0 " + " ".join(f"w{i}" for i in rng.integers(0, 80, size=int(rng.integers(6, 14)))) for _ in range(150)]
    outputs = {("baseline", k): _noisy(refs, 0.5, k) for k in (1, 2, 3)}
    outputs |= {("rnn", k): _noisy(refs, 0.3, 10 + k) for k in (1, 2)}
    scored, _, detectable = _scored_rows(tmp_path, refs, outputs)
    expected = pooled_bootstrap([outputs["baseline", k] for k in (1, 2)], [outputs["rnn", k] for k in (1, 2)],
                                [refs], samples=200)
    over_runs = runs_test([outputs["baseline", k] for k in (1, 2)], [outputs["rnn", k] for k in (1, 2)], [refs],
                          samples=200)
    base, rnn = scored
    assert base.pooled is None and rnn.pooled == expected and rnn.pooled.runs == 2
    assert base.over_runs is None and rnn.over_runs == over_runs and over_runs.sentence_part == "exact"
    assert rnn.pooled.delta > 10 and rnn.pooled.p_value < 0.01  # 30% against 50% of the words wrong
    assert detectable is not None and detectable.baseline_runs == 3 and detectable.per_run > 0
    assert 0 < rnn.pooled.threshold < rnn.pooled.delta
    md = format_markdown(build_table(scored, settings={}, signature="sig", runs_requested=3, detectable=detectable))
    assert (f"| {rnn.pooled.delta:+.2f} (p {rnn.pooled.p_value:.3f}, 2 runs; significant from "
            f"±{rnn.pooled.threshold:.2f}) |") in md
    assert f"from |Δ| of {detectable.per_run:.2f} BLEU for one run against one run" in md
    low, high = over_runs.interval
    assert (f"| **{over_runs.mean_delta:+.2f}** [{low:+.2f}, {high:+.2f}], p {over_runs.p_value:.3f} (2 runs) |"
            in md)
    assert "Welch–Satterthwaite" in md and "†" not in md  # named, and exact


def test_a_row_is_also_compared_with_the_rows_it_names(tmp_path):
    """+ RNN + proposals gets its Δ against + RNN (run k against run k, then pooled), exactly the
    paired bootstrap of that pair; the paper has no such row, so its paper cells are empty."""
    rng = np.random.default_rng(1)
    refs = ["0 " + " ".join(f"w{i}" for i in rng.integers(0, 80, size=int(rng.integers(6, 14)))) for _ in range(120)]
    rates = {"baseline": 0.5, "rnn": 0.45, "rnn-proposals": 0.3}
    outputs = {(key, k): _noisy(refs, rate, 20 * k + len(key)) for key, rate in rates.items() for k in (1, 2)}
    scored, _, _ = _scored_rows(tmp_path, refs, outputs)
    proposals = scored[2]
    assert [v.label for v in proposals.versus] == ["+ RNN"] and not scored[1].versus
    versus = proposals.versus[0]
    expected = pooled_bootstrap([outputs["rnn", k] for k in (1, 2)], [outputs["rnn-proposals", k] for k in (1, 2)],
                                [refs], samples=200)
    assert versus.pooled == expected and versus.pooled.delta > 5
    assert versus.over_runs == runs_test([outputs["rnn", k] for k in (1, 2)],
                                         [outputs["rnn-proposals", k] for k in (1, 2)], [refs], samples=200)
    one = paired_bootstrap(("rnn run1", outputs["rnn", 1]), ("rnn-proposals run1", outputs["rnn-proposals", 1]),
                           [refs], samples=200)
    assert versus.per_run[0] == (1, one.delta, one.p_value)
    md = format_markdown(build_table(scored, settings={}, signature="sig", runs_requested=2))
    assert "| + RNN + proposals | + RNN | " in md
    assert f"{expected.delta:+.2f} (p {expected.p_value:.3f}, 2 runs;" in md
    row = next(line for line in md.splitlines() if line.startswith("| + RNN + proposals | ") and "±" in line)
    assert "| – | – | **" in row  # no paper figures


def _old_report(tmp_path: Path) -> Path:
    """A report as table1 wrote it before the test over runs: per-run (Δ, p), a pooled test for
    one row, none for the other, a hand-written line in its Markdown that must survive."""
    doc = {
        "rows": [
            {"key": "baseline", "label": "Baseline", "paper": {"dev": 30.64, "test": 33.30}, "runs_finished": 3,
             "dev": {"mean": 20.0, "std": 0.1}, "test": {"mean": 17.0, "std": 0.1},
             "test_tokenized": {"mean": 18.0, "std": 0.1}, "p_values_vs_baseline": [], "deltas_vs_baseline": [],
             "pooled_vs_baseline": None, "versus": [], "runs": []},
            {"key": "rnn", "label": "+ RNN", "paper": {"dev": 31.2, "test": 33.87}, "runs_finished": 3,
             "dev": {"mean": 20.0, "std": 0.1}, "test": {"mean": 17.3, "std": 0.4},
             "test_tokenized": {"mean": 18.0, "std": 0.1}, "p_values_vs_baseline": [0.03, 0.2, 0.001],
             "deltas_vs_baseline": [-0.27, 0.07, 0.80],
             "pooled_vs_baseline": {"runs": 3, "delta": 0.2062, "p_value": 0.012, "baseline_bleu": 17.0,
                                    "system_bleu": 17.2, "significant_from": 0.1512},
             "versus": [], "runs": []},
            {"key": "cslm-rnn", "label": "+ CSLM + RNN", "paper": {"dev": 31.48, "test": 34.64}, "runs_finished": 3,
             "dev": {"mean": 20.0, "std": 0.1}, "test": {"mean": 17.3, "std": 0.1},
             "test_tokenized": {"mean": 18.0, "std": 0.1}, "p_values_vs_baseline": [0.003, 0.01, 0.002],
             "deltas_vs_baseline": [0.55, 0.45, 0.5], "versus": [], "runs": []},
        ],
        "runs_requested": 3, "sacrebleu_signature": "sig", "combination": "old", "settings": {},
    }
    path = tmp_path / "table1.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    old = format_markdown(doc, "make table1").replace("Made by", "Hand-written line.\n\nMade by")
    path.with_suffix(".md").write_text("> Superseded, kept for comparison.\n\n" + old + "\nA note after.\n",
                                       encoding="utf-8")
    return path


def test_rerender_adds_the_test_over_runs_to_an_old_report_from_what_it_kept(tmp_path):
    """Between-run part exact from the stored Δ_k; σ_sent from the pooled threshold (t / 1.162) where
    a pooled test was kept, else from the per-run p-values; the old page's own lines kept."""
    path = _old_report(tmp_path)
    rerender(path, "python -m table1.rerender table1.json", root=tmp_path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    rnn, cslm = doc["rows"][1]["over_runs_vs_baseline"], doc["rows"][2]["over_runs_vs_baseline"]
    deltas = [-0.27, 0.07, 0.80]
    sd = 0.1512 / (1.959964 - math.sqrt(2 / math.pi))
    expected = RunsTest(tuple(deltas), sd)
    assert rnn["mean_delta"] == pytest.approx(0.2, abs=1e-4) and rnn["run_sd"] == pytest.approx(np.std(deltas, ddof=1),
                                                                                               abs=1e-4)
    assert rnn["sentence_sd"] == pytest.approx(sd, abs=1e-4) and rnn["ci95"] == pytest.approx(expected.interval,
                                                                                              abs=1e-4)
    assert rnn["p_value"] > 0.5  # the pooled test's p 0.012 does not survive MERT's variance
    assert "pooled bootstrap's stored threshold" in rnn["sentence_part"]
    assert "per-run paired bootstraps" in cslm["sentence_part"] and cslm["p_value"] < 0.05  # three runs agree
    md = path.with_suffix(".md").read_text(encoding="utf-8")
    assert md.startswith("> Superseded, kept for comparison.") and "Hand-written line." in md and "A note after." in md
    assert "| +0.20 [" in md and "p 0.012" in md and md.count("† σ_sent recovered") == 2
    assert "Statistics over runs added to this report by `python -m table1.rerender table1.json`" in md
    assert path.with_suffix(".png").stat().st_size > 0


def test_the_figure_shows_each_comparisons_deltas_its_interval_and_the_papers_delta(tmp_path):
    """What table1.png plots: Δ per run, the test over runs and the paper's Δ against its Baseline
    (33.87 − 33.30 for + RNN), then the rows compared with another row; no absolute BLEU."""
    path = _old_report(tmp_path)
    rerender(path, "python -m table1.rerender table1.json", root=tmp_path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["rows"][2]["versus"] = [{"label": "+ RNN", "runs": [{"run": 1, "delta": 0.8, "p_value": 0.01}],
                                 "pooled": None, "over_runs": None}]
    plotted = figure_comparisons(doc)
    assert [label for label, *_ in plotted] == ["+ RNN", "+ CSLM + RNN", "+ CSLM + RNN\nvs + RNN"]
    label, deltas, test, paper = plotted[0]
    assert deltas == [-0.27, 0.07, 0.80] and test == doc["rows"][1]["over_runs_vs_baseline"]
    assert paper == pytest.approx(0.57) and plotted[2][3] is None
    draw_png(doc, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000
