"""The rerank weights of Table 1's proposals-both row, chosen on dev by table1.rerank_choice's rule."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import shutil

from analysis_checkpoint import EXAMPLE_TABLE
from proposal_system import EXAMPLE_INI, write_model, write_word_tables
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.training.train import train_on_phrase_table
from table1 import collect, report, systems
from table1.rerank_choice import LENGTH_BAND, GridPoint, choose_point
from table1.settings import ProposalSettings
from table1.workspace import RERANK_STEP
from table1_folders import small_experiment

TINY = ModelSizes(hidden=16, embedding=8, maxout_units=8, output_rank=8, init_std=0.3)


def test_the_rule_takes_the_most_in_the_reference_within_the_length_band_and_says_so() -> None:
    """Within 20% of the table's same-length ratio the most in the reference wins, even against a
    point outside the band that finds more; ties go to the smaller weights; with none inside, the
    most in the reference over all, and the line says that none was within."""
    points = [GridPoint(0.0, 0.0, 0.66, 0.119), GridPoint(0.5, 0.0, 0.82, 0.065),
              GridPoint(1.0, 0.0, 0.89, 0.043), GridPoint(0.25, 1.0, 1.0, 0.065), GridPoint(1.5, 2.0, 1.21, 0.9)]
    best, line = choose_point(points)
    assert (best.reverse, best.length) == (0.5, 0.0)  # 0.065 ties with λ 0.25, μ 1: smaller weights
    assert line.startswith("chosen: λ 0.5, μ 0 (within 20% of the length ratio") and "6.5% of missing" in line
    assert LENGTH_BAND == 0.2
    outside = [GridPoint(0.0, 0.0, 0.5, 0.1), GridPoint(1.0, 0.0, 0.7, 0.05)]
    best, line = choose_point(outside)
    assert (best.reverse, best.length, best.within) == (0.0, 0.0, False)
    assert "(none within 20%" in line


def _dev_system(exp) -> None:  # noqa: ANN001
    """What the weights step reads: the filtered table and word tables of the baseline, the two RNNs,
    and dev's tokenised text (10 sentences, each a table source and two more words)."""
    filtered = exp.path("baseline", "filtered")
    filtered.mkdir(parents=True)
    shutil.copy(EXAMPLE_TABLE, filtered / EXAMPLE_TABLE.name)
    shutil.copy(EXAMPLE_INI, filtered / "moses.ini")
    model = exp.path("baseline", "model")
    model.mkdir(parents=True)
    write_word_tables(EXAMPLE_TABLE, model)
    exp.path("rnn").mkdir()
    write_model(EXAMPLE_TABLE, exp.path("rnn", "model.pt"))
    lines = gzip.decompress(EXAMPLE_TABLE.read_bytes()).decode().splitlines()
    swapped = sorted(" ||| ".join([f[1], f[0], f[2]]) for f in (line.split(" ||| ") for line in lines))
    exp.reverse_model.parent.mkdir()
    (exp.path("rnn-both") / "reverse.gz").write_bytes(gzip.compress("".join(f"{s}\n" for s in swapped).encode()))
    train_on_phrase_table(str(exp.path("rnn-both") / "reverse.gz"), exp.reverse_model, model_sizes=TINY,
                          shortlist=3000, device="cpu", progress=False,
                          train_config=TrainConfig(max_steps=20, valid_every=10, patience=None, seed=7))
    pairs = [line.split(" ||| ")[:2] for line in lines[::40]]
    exp.path("prepared").mkdir()
    exp.prepared("dev", "en").write_text("".join(f"{s} the budget\n" for s, _ in pairs))
    exp.prepared("dev", "fr").write_text("".join(f"{t} le budget\n" for _, t in pairs))
    exp.prepared("test", "en").write_text("".join(f"{s}\n" for s, _ in pairs[::-1]))


def test_the_weights_step_chooses_by_the_rule_from_the_figures_it_prints_on_dev_and_keeps_them(tmp_path) -> None:
    """The step searches dev (the whole of it: it has fewer sentences than the grid asks for), prints
    every (λ, μ) of the scale's grid, and stamps the point the rule picks from those printed figures;
    the report's notes say it; a rerun reads the stamp, even with the models gone, so the proposals
    keep the weights they were chosen with."""
    exp = small_experiment(tmp_path)
    # one target per source, so that the weights change which (the sample's sources have a few candidates each)
    exp.settings = dataclasses.replace(exp.settings, proposals=ProposalSettings(per_source=1))
    _dev_system(exp)
    reverse, length = systems.rerank_weights(exp)
    report_lines = exp.rerank_report.read_text(encoding="utf-8").splitlines()
    assert report_lines[0].startswith("dev.tok.tc.en: 50 sentences; ") and " sources to fill (" in report_lines[0]
    grid = exp.settings.rerank
    printed = {}
    for line in report_lines:
        found = re.match(r"  λ (\S+), μ (\S+): \d+ proposals, .*, (\d+)%\); missing: (\d+) of (\d+) in", line)
        if found:
            lam, mu, pct, hit, of = found.groups()
            printed[float(lam), float(mu)] = (int(pct), int(hit) / int(of))
    assert sorted(printed) == sorted((lam, mu) for lam in grid.reverse for mu in grid.length)
    assert len(set(printed.values())) > 1  # the reverse model's weight changes which targets are proposed
    within = {k: v for k, v in printed.items() if 80 <= v[0] <= 120} or printed
    best = max(within, key=lambda k: (within[k][1], -k[0] - k[1]))
    assert (reverse, length) == best
    assert report_lines[-1].startswith(f"chosen: λ {reverse:g}, μ {length:g} (")
    stamp = json.loads(exp.stamp_path(RERANK_STEP).read_text())
    assert (stamp["reverse"], stamp["length"]) == best and stamp["within_band"] == (within is not printed)
    section = report.format_rerank_grid(collect.rerank_grid(exp))  # the report shows them all, and the choice
    assert section[0] == "## The both-ways proposals' rerank weights, chosen on dev"
    assert section[-len(report_lines) - 1:] == [*report_lines, "```"]
    exp.reverse_model.unlink()
    exp.path("rnn", "model.pt").unlink()
    assert systems.rerank_weights(exp) == (reverse, length)
