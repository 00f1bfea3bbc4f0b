"""Table 1 from the runs: dev and test BLEU per configuration, weights, settings (md/json/png).

How the runs are combined: each configuration was tuned ``RUNS`` times with different MERT
seeds (random restarts). Table cells are the mean ± sample standard deviation over those runs.
Each comparison's main figures are the mean Δ over runs with the 95% interval and p of
:func:`mert.significance.runs_test` (:data:`mert.significance.RUNS_METHOD`), which counts MERT's
variance between tunings as well as the test set's sampling (Clark et al. 2011). Beside them:
sacreBLEU's paired bootstrap of run *k* against Baseline's run *k*, one p per pair; the pooled
bootstrap of all runs (:func:`mert.significance.pooled_bootstrap`), sentences only, a secondary
column; and the smallest difference one run against one run could show, measured between Baseline
runs (:func:`mert.significance.detectable_delta`). The figure shows each comparison's Δ per run and
over runs with its interval, with the paper's Δ marked.

:func:`rerender` adds the test over runs to a report written before it, from the figures it kept.

Dev BLEU is on the tokenised, truecased dev set (what MERT maximises); test BLEU is sacreBLEU on
detruecased, detokenised output against the raw reference (with its signature), plus the
tokenised figure. The CSLM rows run the CSLM inside Moses' search (its NeuralLM feature), as the
paper did; the rows marked (n-best) rescore n-best lists with it instead.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sacrebleu.metrics import BLEU

from infrastructure.files import atomic_output, write_json
from infrastructure.lines import read_text_lines
from mert.evaluate import check_same_length, mean_std, paired_bootstrap, score_system
from mert.significance import (
    EXACT,
    RUNS_METHOD,
    PooledTest,
    RunsTest,
    detectable_delta,
    pooled_bootstrap,
    runs_test,
)
from table1.analysis import format_analysis, format_leverage, format_rnn_changes, format_trajectories
from table1.beside import APPROXIMATE, format_beside
from table1.proposal_evidence import format_evidence
from table1.reference_choice import format_reference_choice
from table1.settings import Configuration

#: What :func:`write_report` writes into the results folder, in this order.
REPORT_FILES = ("table1.json", "table1.md", "table1.png")


@dataclass(frozen=True)
class TunedRun:
    """What the report reads of one tuned run: its outputs on dev and test, and how it was tuned."""

    run: int
    seed: int | None  # mert tune's --seed, from the run's tuning state
    dev_output: Path
    test_output: Path
    weights: dict[str, list[float]]
    iterations: int | None
    stop_reason: str | None = None  # mert tune's: weights converged, maximum iterations, no new hypotheses


@dataclass
class RunScores:
    """One tuned run of one configuration."""

    run: int
    dev_bleu: float  # tokenised BLEU on the dev set (MERT's metric)
    test_bleu: float  # sacreBLEU, detokenised
    test_tokenized_bleu: float | None
    weights: dict[str, list[float]]
    p_value: float | None = None  # paired bootstrap against Baseline's run of the same number
    iterations: int | None = None
    delta: float | None = None  # test sacreBLEU minus that Baseline run's: a p-value alone has no sign
    seed: int | None = None
    stop_reason: str | None = None


@dataclass(frozen=True)
class Versus:
    """A row against another row than Baseline (its ``compare_with``): run k against run k, then pooled."""

    label: str  # the other row's
    per_run: list[tuple[int, float, float]]  # (run, Δ test sacreBLEU, p)
    pooled: PooledTest | None
    over_runs: RunsTest | None = None


@dataclass
class ConfigScores:
    config: Configuration
    runs: list[RunScores] = field(default_factory=list)
    pooled: PooledTest | None = None  # all runs against the same-numbered Baseline runs, sentences resampled
    over_runs: RunsTest | None = None  # the same runs, MERT's variance counted too: the main test
    versus: list[Versus] = field(default_factory=list)


def pooled_json(pooled: PooledTest | None) -> dict[str, object] | None:
    return None if pooled is None else {
        "runs": pooled.runs, "delta": round(pooled.delta, 4), "p_value": pooled.p_value,
        "baseline_bleu": round(pooled.baseline_bleu, 4), "system_bleu": round(pooled.system_bleu, 4),
        "significant_from": round(pooled.threshold, 4)}


@dataclass(frozen=True)
class Detectable:
    """The smallest test Δ (sacreBLEU) the paired bootstrap would call significant (p < 0.05) for one
    run against one run, measured between Baseline runs (k against k + 1, averaged over the pairs)."""

    per_run: float
    baseline_runs: int


def _mean_std_json(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "std": None}
    mean, std = mean_std(values)
    return {"mean": round(mean, 4), "std": None if std is None else round(std, 4)}


COMBINATION = ("mean ± sample std over runs; over runs: mean Δ (bold where its 95% interval excludes 0), interval and "
               "p of the test over runs (above); "
               "per run: run k against Baseline run k on test (sacreBLEU; p: two-sided paired bootstrap, 1000 "
               "samples); pooled (sentences only, secondary): all runs against the same-numbered Baseline runs, "
               "resampling test sentences, MERT's variance not counted")


def build_table(
    scores: Sequence[ConfigScores], *, settings: dict[str, object], signature: str, runs_requested: int,
    timings: dict[str, float] | None = None, notes: Sequence[str] = (), detectable: Detectable | None = None,
) -> dict[str, object]:
    """The report as one JSON-able document (what table1.json holds; md and png are drawn from it)."""
    rows = []
    for cs in scores:
        runs = sorted(cs.runs, key=lambda r: r.run)
        rows.append({
            "key": cs.config.key,
            "label": cs.config.label,
            "paper": {"dev": cs.config.paper_dev, "test": cs.config.paper_test},
            "runs_finished": len(runs),
            "dev": _mean_std_json([r.dev_bleu for r in runs]),
            "test": _mean_std_json([r.test_bleu for r in runs]),
            "test_tokenized": _mean_std_json([r.test_tokenized_bleu for r in runs
                                              if r.test_tokenized_bleu is not None]),
            "p_values_vs_baseline": [r.p_value for r in runs if r.p_value is not None],
            "deltas_vs_baseline": [r.delta for r in runs if r.p_value is not None],
            "pooled_vs_baseline": pooled_json(cs.pooled),
            "over_runs_vs_baseline": None if cs.over_runs is None else cs.over_runs.to_json(),
            "versus": [{"label": v.label, "runs": [{"run": k, "delta": round(d, 4), "p_value": pv}
                                                   for k, d, pv in v.per_run],
                        "pooled": pooled_json(v.pooled),
                        "over_runs": None if v.over_runs is None else v.over_runs.to_json()} for v in cs.versus],
            "runs": [
                {"run": r.run, "seed": r.seed, "dev_bleu": r.dev_bleu, "test_bleu": r.test_bleu,
                 "test_tokenized_bleu": r.test_tokenized_bleu, "p_value_vs_baseline": r.p_value,
                 "delta_vs_baseline": r.delta,
                 "iterations": r.iterations, "stop_reason": r.stop_reason, "weights": r.weights}
                for r in runs
            ],
        })
    return {
        "rows": rows,
        "runs_requested": runs_requested,
        "sacrebleu_signature": signature,
        "combination": COMBINATION,
        "significance": RUNS_METHOD,
        "detectable": None if detectable is None else {
            "per_run": round(detectable.per_run, 4), "baseline_runs": detectable.baseline_runs, "level": 0.05},
        "settings": settings,
        "timings_seconds": timings or {},
        "notes": list(notes),
    }


def _paper(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _pooled_cell(pooled: dict | None) -> str:
    return ("–" if not pooled else f"{pooled['delta']:+.2f} (p {pooled['p_value']:.3f}, {pooled['runs']} "
            f"run{'s' if pooled['runs'] != 1 else ''}; significant from ±{pooled['significant_from']:.2f})")


def over_runs_cell(test: dict | None) -> str:
    """``+0.21 [−0.95, +1.37], p 0.421 (3 runs)``: mean Δ (bold where the interval excludes 0), 95% interval
    and p of the test over runs."""
    if not test:
        return "–"
    mark = "" if test["sentence_part"] == EXACT else APPROXIMATE
    if test["ci95"] is None:
        return f"{test['mean_delta']:+.2f}{mark} (1 run: MERT's variance not measured)"
    low, high = test["ci95"]
    mean = f"{test['mean_delta']:+.2f}"
    if low > 0 or high < 0:  # the interval excludes 0: p < 0.05
        mean = f"**{mean}**"
    return f"{mean} [{low:+.2f}, {high:+.2f}], p {test['p_value']:.3f}{mark} ({test['runs']} runs)"


def _versus_lines(rows: list[dict]) -> list[str]:
    """The rows compared with another row than Baseline (e.g. + RNN + proposals against + RNN)."""
    compared = [(row, v) for row in rows for v in row.get("versus") or []]
    if not compared:
        return []
    out = ["| configuration | against | Δ over runs [95% interval], p | test Δ, p (per run) | "
           "pooled Δ, p (sentences only) |", "|---|---|---|---|---|"]
    for row, v in compared:
        per_run = ", ".join(f"{r['delta']:+.2f} (p {r['p_value']:.3f})" for r in v["runs"]) or "–"
        out.append(f"| {row['label']} | {v['label']} | {over_runs_cell(v.get('over_runs'))} | {per_run} | "
                   f"{_pooled_cell(v['pooled'])} |")
    return out + [""]


def _approximations(rows: list[dict]) -> list[str]:
    """How σ_sent was recovered, once per kind, where a report kept no per-sentence statistics."""
    tests = [row.get("over_runs_vs_baseline") for row in rows]
    tests += [v.get("over_runs") for row in rows for v in row.get("versus") or []]
    kinds = dict.fromkeys(t["sentence_part"] for t in tests if t and t["sentence_part"] != EXACT)
    return [f"{APPROXIMATE} σ_sent {kind}." for kind in kinds]


def format_results(doc: dict[str, object]) -> list[str]:
    """The main table, the comparisons with other rows and how the runs were combined (what
    :func:`rerender` replaces in an older report)."""
    rows: list[dict] = doc["rows"]  # type: ignore[assignment]
    out = [
        "| configuration | dev (ours) | test (ours, sacreBLEU) | test (ours, tokenised) | paper dev | paper test | "
        "Δ vs Baseline over runs [95% interval], p | test Δ vs Baseline, p (per run) | pooled Δ, p (sentences only) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        deltas = row.get("deltas_vs_baseline") or [None] * len(row["p_values_vs_baseline"])
        ps = ", ".join(("" if d is None else f"{d:+.2f} ") + f"(p {p:.3f})"
                       for d, p in zip(deltas, row["p_values_vs_baseline"], strict=True)) or "–"
        n = row["runs_finished"]
        pooled_cell = _pooled_cell(row.get("pooled_vs_baseline"))
        out.append(
            f"| {row['label']} | {_cell(row['dev'], n)} | {_cell(row['test'], n)} | {_cell(row['test_tokenized'], 0)} "
            f"| {_paper(row['paper']['dev'])} | {_paper(row['paper']['test'])} | "
            f"{over_runs_cell(row.get('over_runs_vs_baseline'))} | {ps} | {pooled_cell} |"
        )
    out += [""] + _versus_lines(rows)
    out += [f"Significance (the Δ over runs, its interval and p): {doc.get('significance', RUNS_METHOD)}. "
            "The pooled bootstrap resamples sentences only: it treats the runs as fixed, so it understates "
            "the uncertainty wherever the runs disagree; it is kept as a secondary column.", ""]
    approximations = _approximations(rows)
    if approximations:
        out += [*approximations, ""]
    out += [f"Runs combined: {doc['combination']}. Runs requested per configuration: {doc['runs_requested']}.",
            f"sacreBLEU signature: `{doc['sacrebleu_signature']}`."]
    return out


def _cell(stat: dict[str, float | None], finished: int) -> str:
    if stat.get("mean") is None:
        return "–"
    std = stat.get("std")
    text = f"{stat['mean']:.2f}" + (f" ± {std:.2f}" if std is not None else "")
    return text + (f" ({finished} run{'s' if finished != 1 else ''})" if finished else "")


def format_markdown(doc: dict[str, object], command: str = "") -> str:
    """table1.md: the table with the paper's numbers beside ours, then every run and the settings."""
    rows: list[dict] = doc["rows"]  # type: ignore[assignment]
    out = ["# Table 1: English→French, tuned on newstest2012+2013, tested on newstest2014", ""]
    if command:
        out += [f"Made by `{command}`.", ""]
    out += [*format_results(doc), ""]
    detectable = doc.get("detectable")
    if detectable:
        out += [f"What this setup can detect: measured between Baseline runs ({detectable['baseline_runs']} runs), "  # type: ignore[index]
                "the paired bootstrap calls a test difference significant (p < 0.05) from |Δ| of "
                f"{detectable['per_run']:.2f} BLEU for one run against one run; each pooled test gives its own "  # type: ignore[index]
                "threshold (significant from ±…). Smaller differences cannot be told from the test set's sampling "
                "noise.", ""]
    for note in doc.get("notes", []):  # type: ignore[union-attr]
        out.append(f"- {note}")
    if doc.get("beside"):
        out += [""] + format_beside(doc["beside"])  # type: ignore[arg-type]
    out += ["", "## Tuned weights of every run", ""]
    for row in rows:
        for run in row["runs"]:
            weights = "; ".join(f"{k}= {' '.join(f'{v:.4g}' for v in vs)}" for k, vs in run["weights"].items())
            reason = run.get("stop_reason")
            stopped = f", {run['iterations']} iterations, stopped: {reason}" if reason else ""
            out.append(f"- {row['label']} run {run['run']} (seed {run['seed']}{stopped}, dev {run['dev_bleu']:.2f}, "
                       f"test {run['test_bleu']:.2f}): {weights}")
    if doc.get("analysis"):

        out += [""] + format_analysis(doc["analysis"])  # type: ignore[arg-type]
    if doc.get("reference_choice"):
        out += [""] + format_reference_choice(doc["reference_choice"])  # type: ignore[arg-type]
    if doc.get("rnn_changes"):
        changes: dict = doc["rnn_changes"]  # type: ignore[assignment]
        out += [""] + format_rnn_changes(changes, changes["label"], changes["against"])
    for proposals in doc.get("proposals") or []:  # type: ignore[attr-defined]
        out += [""] + format_evidence(proposals, proposals["label"])
    if doc.get("rerank_weights"):
        out += [""] + format_rerank_grid(doc["rerank_weights"])  # type: ignore[arg-type]
    if doc.get("leverage"):

        leverage: dict = doc["leverage"]  # type: ignore[assignment]
        out += [""] + format_leverage(leverage["runs"], leverage["labels"])
    table2: dict[str, str] = doc.get("table2") or {}  # type: ignore[assignment]
    for kind, text in table2.items():
        out += ["", f"## Table 2 ({kind} long source phrases): top targets by the table's φ(e|f) and by the RNN",
                "", "`rescorer compare MODEL phrase-table.gz --" + kind + "` on the baseline's full table.", "",
                text.rstrip("\n")]
    if doc.get("tuning"):

        out += [""] + format_trajectories(doc["tuning"])  # type: ignore[arg-type]
    timings: dict[str, float] = doc.get("timings_seconds", {})  # type: ignore[assignment]
    if timings:
        out += ["", "## Wall time of each step (2-core machine, shared with other jobs)", "", "| step | seconds |",
                "|---|---|"]
        out += [f"| {name} | {sec:.0f} |" for name, sec in timings.items()]
    out += ["", "## Settings", "", "```json", json.dumps(doc["settings"], indent=1, sort_keys=True), "```", ""]
    return "\n".join(out)


def figure_comparisons(doc: dict[str, object]) -> list[tuple[str, list[float], dict | None, float | None]]:
    """(label, Δ per run, test over runs, paper's Δ) of every comparison, against Baseline first."""
    rows: list[dict] = doc["rows"]  # type: ignore[assignment]
    paper_base = next((row["paper"]["test"] for row in rows if row["key"] == "baseline"), None)
    out = []
    for row in rows:
        if row["key"] == "baseline" or not row.get("deltas_vs_baseline"):
            continue
        paper = row["paper"]["test"]
        out.append((row["label"], row["deltas_vs_baseline"], row.get("over_runs_vs_baseline"),
                    None if paper is None or paper_base is None else paper - paper_base))
    for row in rows:
        for v in row.get("versus") or []:
            out.append((f"{row['label']}\nvs {v['label']}", [r["delta"] for r in v["runs"]], v.get("over_runs"), None))
    return out


def _draw_baseline_spread(ax: object, doc: dict[str, object]) -> None:
    """A report of Baseline alone has no Δ: its runs' test BLEU about their mean, MERT's spread."""
    rows: list[dict] = doc["rows"]  # type: ignore[assignment]
    scores = [run["test_bleu"] for row in rows if row["key"] == "baseline" for run in row["runs"]]
    if scores:
        mean = sum(scores) / len(scores)
        ax.scatter([0] * len(scores), [v - mean for v in scores], s=18, color="#8c8c8c")  # type: ignore[attr-defined]
        ax.set_xticks([0], [f"Baseline ({len(scores)} runs, mean {mean:.2f})"], fontsize=8)  # type: ignore[attr-defined]
    ax.set_ylabel("test BLEU − mean over runs")  # type: ignore[attr-defined]
    ax.set_title("Baseline only: each run's test BLEU − the mean (MERT's spread)", fontsize=10)  # type: ignore[attr-defined]


def draw_png(doc: dict[str, object], path: Path, against: str = "Baseline") -> None:
    """table1.png: each comparison's test Δ (sacreBLEU), run by run and over runs with its 95%
    interval, and the paper's Δ against its Baseline; absolute BLEU would hide the differences.
    ``against`` names the row keyed ``baseline`` (the reranking's figure: "Baseline reranked")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compared = figure_comparisons(doc)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 * len(compared) + 2), 5))
    ax.axhline(0, color="#888888", linewidth=0.8)
    for x, (_, deltas, test, paper) in enumerate(compared):
        ax.scatter([x - 0.15] * len(deltas), deltas, s=18, color="#8c8c8c", zorder=3,
                   label=f"Δ per run (run k vs {against} run k)" if x == 0 else None)
        if test and test.get("ci95"):
            mean, (low, high) = test["mean_delta"], test["ci95"]
            ax.errorbar([x + 0.1], [mean], yerr=[[mean - low], [high - mean]], fmt="o", color="#4c72b0", capsize=5,
                        zorder=4, label="mean Δ over runs, 95% interval (runs + sentences)" if x == 0 else None)
        if paper is not None:
            ax.scatter([x + 0.1], [paper], marker="_", s=700, linewidths=2.5, color="#c44e52", zorder=5,
                       label="paper's Δ" if not any(c[3] is not None for c in compared[:x]) else None)
    if compared:
        labels = ["\n".join(textwrap.fill(part, 22) for part in label.split("\n")) for label, *_ in compared]
        ax.set_xticks(range(len(compared)), labels, fontsize=8)
        ax.set_xlim(-0.7, len(compared) - 0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14 if len(compared) < 4 else -0.2), ncol=3,
                  fontsize=8, frameon=False)
        ax.set_ylabel("test Δ BLEU (sacreBLEU)")
        against_others = any("\nvs " in label for label, *_ in compared)
        ax.set_title(f"Test Δ against {against}" + (" (columns \"vs X\": against row X)" if against_others else ""))
    else:
        _draw_baseline_spread(ax, doc)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def format_rerank_grid(grid: str) -> list[str]:
    """The both-ways proposals' rerank weights as chosen on dev: every point of the grid, then the choice."""
    return ["## The both-ways proposals' rerank weights, chosen on dev", "",
            "`rescorer propose --reverse-model` keeps each source's best candidates by log p(e|f) + λ log p(f|e) + "
            "μ log P(m | n). `rescorer rerank-weights` on dev's first sentences, for this system's two RNNs: for "
            "each (λ, μ) the proposals' length against the table's pairs of the same source lengths and the share "
            "of missing sources' targets in the reference, then the choice by its rule (docs/proposals.md). No "
            "test text is read.", "", "```", *grid.splitlines(), "```"]


def write_report(doc: dict[str, object], out_dir: Path, command: str = "") -> list[Path]:
    """Write table1.json, table1.md and table1.png into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in REPORT_FILES]
    write_json(paths[0], doc)
    with atomic_output(paths[1]) as fh:
        fh.write(format_markdown(doc, command).encode("utf-8"))
    draw_png(doc, paths[2])
    return paths


def score_runs(
    configs: Sequence[tuple[Configuration, list[TunedRun]]],
    *, dev_tok_ref: Path, test_ref: Path, test_tok_ref: Path, lang: str, bootstrap_samples: int = 1000,
) -> tuple[list[ConfigScores], str, Detectable | None]:
    """Score every run's dev and test output; bootstrap each against Baseline's run of the same number,
    then all of a row's runs together, and measure what the test can detect between Baseline runs."""
    dev_ref = [read_text_lines(dev_tok_ref)]
    refs, tok_refs = [read_text_lines(test_ref)], [read_text_lines(test_tok_ref)]
    signature = ""
    scored: list[ConfigScores] = []
    baseline_detok: dict[int, tuple[str, list[str]]] = {}
    by_key: dict[str, tuple[str, dict[int, list[str]]]] = {}  # each row's label and test outputs, for compare_with
    for config, runs in configs:
        cs = ConfigScores(config)
        detokenized: dict[int, list[str]] = {}
        for tuned in runs:
            run, dev_out, test_out = tuned.run, tuned.dev_output, tuned.test_output
            dev_hyps = read_text_lines(dev_out)
            check_same_length(dev_out, len(dev_hyps), [dev_tok_ref], [len(dev_ref[0])])
            dev_bleu = float(BLEU(tokenize="none", force=True).corpus_score(dev_hyps, dev_ref).score)
            test = score_system(test_out.name, test_out, read_text_lines(test_out), refs, [test_ref], lang=lang,
                                tokenized_references=tok_refs, tokenized_ref_paths=[test_tok_ref])
            signature = test.signature
            p_value = delta = None
            if config.key == "baseline":
                baseline_detok[run] = (f"baseline run{run}", test.detokenized)
            elif run in baseline_detok:
                result = paired_bootstrap(baseline_detok[run], (f"{config.key} run{run}", test.detokenized), refs,
                                          samples=bootstrap_samples)
                p_value, delta = result.p_value, round(result.delta, 4)
            cs.runs.append(RunScores(run, dev_bleu, test.bleu, test.tokenized_bleu, tuned.weights, p_value,
                                     tuned.iterations, delta, tuned.seed, tuned.stop_reason))
            detokenized[run] = test.detokenized
        paired = sorted(set(detokenized) & set(baseline_detok))
        if config.key != "baseline" and paired:
            baseline_paired, system_paired = [baseline_detok[k][1] for k in paired], [detokenized[k] for k in paired]
            cs.pooled = pooled_bootstrap(baseline_paired, system_paired, refs, samples=bootstrap_samples)
            cs.over_runs = runs_test(baseline_paired, system_paired, refs, samples=bootstrap_samples)
        cs.versus = [_versus(by_key[key], detokenized, config.key, refs, bootstrap_samples)
                     for key in config.compare_with if key in by_key]
        by_key[config.key] = (config.label, detokenized)
        scored.append(cs)
    baseline_runs = [baseline_detok[k][1] for k in sorted(baseline_detok)]
    return scored, signature, _detectable(baseline_runs, refs, bootstrap_samples)


def _versus(other: tuple[str, dict[int, list[str]]], mine: dict[int, list[str]], key: str, refs: list[list[str]],
            samples: int) -> Versus:
    """Run k of a row against run k of ``other`` (same seed), each and pooled."""
    label, theirs = other
    paired = sorted(set(theirs) & set(mine))
    per_run = []
    for k in paired:
        result = paired_bootstrap((f"{label} run{k}", theirs[k]), (f"{key} run{k}", mine[k]), refs, samples=samples)
        per_run.append((k, result.delta, result.p_value))
    if not paired:
        return Versus(label, per_run, None)
    theirs_paired, mine_paired = [theirs[k] for k in paired], [mine[k] for k in paired]
    return Versus(label, per_run, pooled_bootstrap(theirs_paired, mine_paired, refs, samples=samples),
                  runs_test(theirs_paired, mine_paired, refs, samples=samples))


def _detectable(baseline: list[list[str]], refs: list[list[str]], samples: int) -> Detectable | None:
    """Baseline run k against run k + 1 (and the last against the first), averaged over the pairs."""
    if len(baseline) < 2:
        return None
    n = len(baseline)
    pairs = [(baseline[k], baseline[(k + 1) % n]) for k in range(n if n > 2 else 1)]  # 2 runs: one pair
    per_run = [detectable_delta([a], [b], refs, samples=samples) for a, b in pairs]
    return Detectable(sum(per_run) / len(per_run), len(baseline))
