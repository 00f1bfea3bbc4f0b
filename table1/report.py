"""Table 1 from the runs: dev and test BLEU per configuration, weights, settings (md/json/png).

How the runs are combined: each configuration was tuned ``RUNS`` times with different MERT
seeds (random restarts). Table cells are the mean ± sample standard deviation over those runs.
Significance is sacreBLEU's paired bootstrap (1,000 resamples) of run *k* of a configuration
against run *k* of Baseline (the same seed), one p-value per pair, as Clark et al. (2011)
recommend comparing whole tuning runs rather than the best of them; the table shows all of them,
then one pooled p-value per row over all its runs (:func:`mert.significance.pooled_bootstrap`),
and beside them the smallest difference the setup could call significant, measured between
Baseline runs (:func:`mert.significance.detectable_delta`).

Dev BLEU is on the tokenised, truecased dev set (what MERT maximises); test BLEU is sacreBLEU on
detruecased, detokenised output against the raw reference (with its signature), plus the
tokenised figure. The CSLM rows run the CSLM inside Moses' search (its NeuralLM feature), as the
paper did; the rows marked (n-best) rescore n-best lists with it instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sacrebleu.metrics import BLEU

from infrastructure.files import atomic_output
from infrastructure.lines import read_text_lines
from mert.evaluate import check_same_length, mean_std, paired_bootstrap, score_system
from mert.significance import PooledTest, detectable_delta, pooled_bootstrap
from table1.analysis import format_analysis, format_leverage, format_rnn_changes, format_trajectories
from table1.beside import format_beside
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


@dataclass
class ConfigScores:
    config: Configuration
    runs: list[RunScores] = field(default_factory=list)
    pooled: PooledTest | None = None  # all runs against the same-numbered Baseline runs
    versus: list[Versus] = field(default_factory=list)


def _pooled_json(pooled: PooledTest | None) -> dict[str, object] | None:
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
            "pooled_vs_baseline": _pooled_json(cs.pooled),
            "versus": [{"label": v.label, "runs": [{"run": k, "delta": round(d, 4), "p_value": pv}
                                                   for k, d, pv in v.per_run],
                        "pooled": _pooled_json(v.pooled)} for v in cs.versus],
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
        "combination": "mean ± sample std over runs; Δ and p: run k against Baseline run k on test (sacreBLEU; "
                       "p: two-sided paired bootstrap, 1000 samples); pooled: all runs against the same-numbered "
                       "Baseline runs, resampling test sentences",
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


def _versus_lines(rows: list[dict]) -> list[str]:
    """The rows compared with another row than Baseline (e.g. + RNN + proposals against + RNN)."""
    compared = [(row, v) for row in rows for v in row.get("versus") or []]
    if not compared:
        return []
    out = ["| configuration | against | test Δ, p (per run) | pooled Δ, p |", "|---|---|---|---|"]
    for row, v in compared:
        per_run = ", ".join(f"{r['delta']:+.2f} (p {r['p_value']:.3f})" for r in v["runs"]) or "–"
        out.append(f"| {row['label']} | {v['label']} | {per_run} | {_pooled_cell(v['pooled'])} |")
    return out + [""]


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
    out += [
        "| configuration | dev (ours) | test (ours, sacreBLEU) | test (ours, tokenised) | paper dev | paper test | "
        "test Δ vs Baseline, p (per run) | pooled Δ, p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        deltas = row.get("deltas_vs_baseline") or [None] * len(row["p_values_vs_baseline"])
        ps = ", ".join(("" if d is None else f"{d:+.2f} ") + f"(p {p:.3f})"
                       for d, p in zip(deltas, row["p_values_vs_baseline"], strict=True)) or "–"
        n = row["runs_finished"]
        pooled_cell = _pooled_cell(row.get("pooled_vs_baseline"))
        out.append(
            f"| {row['label']} | {_cell(row['dev'], n)} | {_cell(row['test'], n)} | {_cell(row['test_tokenized'], 0)} "
            f"| {_paper(row['paper']['dev'])} | {_paper(row['paper']['test'])} | {ps} | {pooled_cell} |"
        )
    out += [""] + _versus_lines(rows)
    out += [f"Runs combined: {doc['combination']}. Runs requested per configuration: {doc['runs_requested']}.",
            f"sacreBLEU signature: `{doc['sacrebleu_signature']}`.", ""]
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


def draw_png(doc: dict[str, object], path: Path) -> None:
    """table1.png: dev and test BLEU (mean ± std over runs) per configuration, paper numbers as marks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[dict] = doc["rows"]  # type: ignore[assignment]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
    for ax, split in zip(axes, ("dev", "test"), strict=True):
        xs = range(len(rows))
        means = [r[split]["mean"] if r[split]["mean"] is not None else 0.0 for r in rows]
        stds = [r[split]["std"] or 0.0 for r in rows]
        ax.bar(xs, means, yerr=stds, capsize=4, color="#4c72b0", label="ours (mean ± std over runs)")
        paper = [(x, r["paper"][split]) for x, r in zip(xs, rows, strict=True) if r["paper"][split] is not None]
        ax.scatter([x for x, _ in paper], [v for _, v in paper], marker="_", s=600, color="#c44e52", label="paper")
        ax.set_xticks(list(xs), [r["label"] for r in rows], rotation=15)
        ax.set_title(f"{split} BLEU")
        ax.legend(loc="lower right", fontsize=8)
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
    with atomic_output(paths[0]) as fh:
        fh.write((json.dumps(doc, indent=1) + "\n").encode("utf-8"))
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
            cs.pooled = pooled_bootstrap([baseline_detok[k][1] for k in paired], [detokenized[k] for k in paired], refs,
                                         samples=bootstrap_samples)
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
    pooled = pooled_bootstrap([theirs[k] for k in paired], [mine[k] for k in paired], refs,
                              samples=samples) if paired else None
    return Versus(label, per_run, pooled)


def _detectable(baseline: list[list[str]], refs: list[list[str]], samples: int) -> Detectable | None:
    """Baseline run k against run k + 1 (and the last against the first), averaged over the pairs."""
    if len(baseline) < 2:
        return None
    n = len(baseline)
    pairs = [(baseline[k], baseline[(k + 1) % n]) for k in range(n if n > 2 else 1)]  # 2 runs: one pair
    per_run = [detectable_delta([a], [b], refs, samples=samples) for a, b in pairs]
    return Detectable(sum(per_run) / len(per_run), len(baseline))
