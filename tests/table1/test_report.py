"""The Table 1 report: how runs are combined and what the Markdown shows."""

from __future__ import annotations

import math

from table1.report import ConfigScores, RunScores, build_table, format_markdown
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
    assert "| + CSLM + RNN | – | – | – | 31.48 | 34.64 | – |" in md
    assert "| data | 2 |" in md and "Made by `make table1 SCALE=small`" in md
