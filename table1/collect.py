"""The ``report`` step: gather every evaluated run of a work folder (outputs, tuned weights, tuning
trajectories, timings, training logs) and hand them to :mod:`table1.report`."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from mert.features import read_sidecar
from mert.tune import iteration_path, read_state
from moses_integration.moses_ini import MosesIni
from table1.analysis import DecodedRun, analysis_document, column_leverage, rnn_changes_document, tuning_trajectory
from table1.beside import BesideRun, beside_document
from table1.proposal_evidence import TuningDecode, evidence_document
from table1.reference_choice import reference_choice
from table1.report import TunedRun, build_table, score_runs, write_report
from table1.settings import Configuration, RunPlan
from table1.tuning import budget_notes, check_run_current, details_output, state_seed
from table1.workspace import (
    RERANK_STEP,
    STAMPS,
    TABLE2_KINDS,
    TIMINGS_FILE,
    Experiment,
    ExperimentError,
    single_phrase_table,
)

# --------------------------------------------------------------------------------------------
# table1: the report


def run_weights(tuned_ini: Path) -> dict[str, list[float]]:
    """The tuned weights of a run: moses.ini's tuneable ones plus the extra n-best features'."""

    weights = dict(MosesIni.read(tuned_ini).weights())
    weights.pop("UnknownWordPenalty0", None)
    weights.update({e.name: list(e.weights) for e in read_sidecar(tuned_ini)})
    return weights


def step_timings(exp: Experiment) -> dict[str, float]:
    """Wall seconds of each stamped step, plus ``STEP (total)`` summing a step's parts."""
    timings: dict[str, float] = {}
    for stamp in sorted(exp.path(STAMPS).glob("*.json")):
        info = json.loads(stamp.read_text(encoding="utf-8"))
        timings[info["step"]] = float(info["seconds"])
    totals: dict[str, float] = {}
    for name, seconds in timings.items():
        top = name.split("/", 1)[0]
        totals[f"{top} (total)"] = totals.get(f"{top} (total)", 0.0) + seconds
    return {**timings, **{k: round(v, 1) for k, v in totals.items()}}


def training_notes(exp: Experiment) -> list[str]:
    """What the RNN and CSLM trainings reached, from the last lines their logs hold (the report
    states it beside the BLEU scores: a weak model explains a small gain)."""
    wanted = {
        "rnn": ("RNN training", (r"trained \d+ steps ", r"step \d+: valid ")),
        "rnn-both": ("Reverse RNN training", (r"trained \d+ steps ", r"step \d+: valid ")),
        "cslm": ("CSLM training", (r"stopped by ", r"epoch \d+: valid perplexity ")),
    }
    notes = []
    for name, (label, patterns) in wanted.items():
        log = exp.path("logs", f"{name}.log")
        if not log.exists():
            continue
        last: dict[str, str] = {}
        # Progress bars (older runs logged them) end their updates with \r, not \n.
        for line in re.split(r"[\r\n]+", log.read_text(encoding="utf-8", errors="replace")):
            for pattern in patterns:
                if re.match(pattern, line):
                    last[pattern] = line.strip()
        found = [last[p] for p in patterns if p in last]
        if found:
            notes.append(f"{label}: " + "; last validation: ".join(found) + ".")
    return notes


def rerank_grid(exp: Experiment) -> str | None:
    """Every (λ, μ)'s figures on dev and the choice the both-ways proposals were made with, where the
    ``proposals-both/weights`` step chose them (``rescorer rerank-weights``)."""
    return exp.rerank_report.read_text(encoding="utf-8") if exp.done(RERANK_STEP) and exp.rerank_report.exists() \
        else None


def leverage_columns(config: Configuration, table_feature: str, moses_columns: int, lm: str) -> dict[str, str]:
    """The n-best columns whose leverage the report shows for a row, with their names, in order: p_RNN
    and WP where the row tunes them, the CSLM, the row's other appended columns (p_RNN(f|e), the
    proposals' indicator: a 7th column is either, an 8th the indicator), then p(e|f) and the LM for scale."""
    own = {f"{table_feature}_{moses_columns + i}": name for i, name in enumerate(config.appended_labels())}
    keys = list(own)
    chosen = [keys[0]] * config.rnn + [keys[1]] * config.wp + ["CSLM0_0"] * config.cslm + keys[2:]
    names = {**own, "CSLM0_0": "CSLM", f"{table_feature}_2": "p(e|f)", f"{lm}_0": "n-gram LM"}
    return {key: names[key] for key in chosen + [f"{table_feature}_2", f"{lm}_0"]}


def leverage_document(exp: Experiment, collected: list, table_feature: str, ini: MosesIni) -> dict[str, object]:
    """Per run: dev BLEU of its n-best pool, and what each of its row's columns (and, for scale,
    p(e|f) and the n-gram LM) moves there (:func:`table1.analysis.column_leverage`)."""

    lm = next((name for name in ini.weights() if name.startswith("LM")), "LM0")
    moses = len(ini.weights()[table_feature]) - 2  # Moses' own columns: the 6-column table less p_RNN and WP
    labels: dict[str, str] = {}
    runs: dict[str, list[dict[str, object]]] = {}
    for config, found in collected:
        own = leverage_columns(config, table_feature, moses, lm)
        labels.update((k, v) for k, v in own.items() if v in ("p_RNN", "WP", "CSLM", "p(e|f)", "n-gram LM"))
        chosen = list(own)
        for tuned in found:
            tune_dir = exp.tune_dir(RunPlan(config, tuned.run))
            lists = [path for i in range(1, (tuned.iterations or 0) + 1)
                     if (path := iteration_path(tune_dir, i, "nbest.gz")).exists()]
            if not lists:
                continue
            pool, columns = column_leverage(lists, [exp.prepared("dev", exp.tgt)], tuned.weights, chosen)
            entry: dict[str, object] = {"run": tuned.run, "pool_bleu": pool, "columns": [c.__dict__ for c in columns],
                                        "column_labels": own}  # a row's 7th column means what its table holds
            test_nbest = tuned.test_output.with_name(tuned.test_output.name + ".nbest.gz")
            if test_nbest.exists():  # the same on the test set's n-best list, decoded with the tuned weights
                test_pool, test_columns = column_leverage([test_nbest], [exp.prepared("test", exp.tgt)],
                                                          tuned.weights, chosen)
                entry["test"] = {"pool_bleu": test_pool, "columns": [c.__dict__ for c in test_columns]}
            runs.setdefault(config.label, []).append(entry)
    return {"labels": labels, "runs": runs}


def proposals_documents(exp: Experiment, collected: list, table_feature: str) -> list[dict[str, object]]:
    """The evidence of each proposals row (:func:`table1.proposal_evidence.evidence_document`), from its
    own system's listing and indicator column (the last)."""
    found_rows = [(config, found) for config, found in collected if config.proposals and found
                  and exp.proposals_list(config.table_system).exists()]
    if not found_rows:
        return []
    _, filtered, _ = single_phrase_table(exp.path("baseline", "filtered", "moses.ini"))
    return [{"label": config.label, **evidence_document(
        exp.proposals_list(config.table_system), exp.path("baseline", "filtered", filtered),
        exp.prepared("test", exp.src), exp.prepared("test", exp.tgt),
        [(t.run, t.test_output.with_name(t.test_output.name + ".nbest.gz"), t.weights) for t in found],
        table_feature, single_phrase_table(exp.table_system(config))[2] - 1,
        [d for t in found for d in tuning_decodes(exp.tune_dir(RunPlan(config, t.run)), t.run)])}
        for config, found in found_rows]


def tuning_decodes(tune_dir: Path, run: int) -> list[TuningDecode]:
    """Each iteration of a tuning run that left its ini and n-best list: what it decoded dev with."""
    found = []
    for it in (read_state(tune_dir) or {}).get("iterations", []):  # type: ignore[union-attr]
        ini, nbest = (iteration_path(tune_dir, it["iteration"], suffix) for suffix in ("moses.ini", "nbest.gz"))
        if ini.exists() and nbest.exists():
            found.append(TuningDecode(run, it["iteration"], nbest, run_weights(ini), float(it["dev_bleu_1best"])))
    return found


def rnn_changes(exp: Experiment, collected: list) -> dict[str, object] | None:
    """+ RNN's test 1-bests against Baseline's, run k against run k (:func:`table1.analysis.rnn_changes_document`);
    None unless both rows have an evaluated run of the same number."""

    rows = {config.key: (config, found) for config, found in collected}
    if "baseline" not in rows or "rnn" not in rows:
        return None
    (baseline, base_runs), (rnn, rnn_runs) = rows["baseline"], rows["rnn"]
    if not {t.run for t in base_runs} & {t.run for t in rnn_runs}:
        return None
    decodes = [[DecodedRun(t.run, t.seed, t.test_output, details_output(t.test_output)) for t in found]
               for found in (base_runs, rnn_runs)]
    return {"label": rnn.label, "against": baseline.label, **rnn_changes_document(
        *decodes, exp.prepared("test", exp.src), exp.prepared("test", exp.tgt))}


def reference_choice_document(exp: Experiment, collected: list, table: Path, table_feature: str) -> list[dict]:
    """:func:`table1.reference_choice.reference_choice` for each run number both Baseline and + RNN
    have evaluated, on ``table`` (the 6-column table both decode with); empty without such a run."""
    rows = {config.key: found for config, found in collected}
    base = {t.run: t.weights[table_feature] for t in rows.get("baseline", [])}
    rnn = {t.run: t.weights[table_feature] for t in rows.get("rnn", [])}
    runs = {k: (base[k], rnn[k]) for k in sorted(base.keys() & rnn.keys())}
    if not runs:
        return []
    found = reference_choice(table, exp.prepared("test", exp.src), exp.prepared("test", exp.tgt), runs)
    return [c.__dict__ for c in found]


def portable(doc: dict[str, object], work: Path) -> dict[str, object]:
    """The report with the work folder's path written ``WORK``: a committed report names no machine's folders."""
    text = json.dumps(doc)
    for form in {str(work), str(work.resolve())}:  # a whole path component only: not WORK2 or WORK-old
        text = re.sub(re.escape(json.dumps(form)[1:-1]) + r'(?=/|"|\s|$)', "WORK", text)
    return json.loads(text)


def step_report(
    exp: Experiment, configs: list[Configuration], runs: int, out_dir: Path, command: str = "",
    beside: Sequence[BesideRun] = (),
) -> list[Path]:
    """results/table1.{md,json,png} from every run whose dev and test outputs exist (never stamped:
    it is cheap and is redone as runs are added), with ``beside``'s reports beside its rows. Also
    copies the step timings beside it."""

    collected, tuning = [], {}
    for config in configs:
        found = []
        for k in range(1, runs + 1):
            plan = RunPlan(config, k)
            if not (exp.done(f"eval/{plan.name}/dev") and exp.done(f"eval/{plan.name}/test")):
                continue
            check_run_current(exp, plan)
            state = read_state(exp.tune_dir(plan)) or {}
            found.append(TunedRun(k, state_seed(state), exp.eval_output(plan, "dev"), exp.eval_output(plan, "test"),
                                  run_weights(exp.tune_dir(plan) / "moses.ini"), state.get("completed_iterations"),
                                  state.get("stop_reason")))
            tuning.setdefault(config.label, []).append({"run": k, "dev_bleu_1best": tuning_trajectory(state)})
        collected.append((config, found))
    if not any(found for _, found in collected):
        raise ExperimentError(f"no evaluated run in {exp.work} yet: run the eval step first")
    scored, signature, detectable = score_runs(
        collected, dev_tok_ref=exp.prepared("dev", exp.tgt), test_ref=exp.path("raw", f"test.{exp.tgt}"),
        test_tok_ref=exp.prepared("test", exp.tgt), lang=exp.tgt,
    )
    timings = step_timings(exp)
    notes = [
        f"SCALE={exp.settings.name}; data and sizes differ from the paper's (see Settings and README).",
        "The CSLM rows run the CSLM inside Moses' search (NeuralLM, trained self-normalised), as the paper did; "
        f"rows marked (n-best) rescore {exp.settings.nbest_size}-best lists with it as an extra MERT feature instead.",
        "Columns outside a configuration are fixed at weight 0 during MERT (same 6-column table for every row; "
        "a proposals row's table is the same one completed by the RNN's proposals, with a 7th column, the indicator "
        "of a proposed pair, which it tunes: docs/proposals.md; a both-directions row's table has the reverse "
        "model's p_RNN(f|e) as its 7th column, which it tunes: docs/rescore.md; the both-ways proposals row's "
        "has both, p_RNN(f|e) 7th and the indicator 8th).",
        *training_notes(exp),
        *budget_notes(exp, configs, runs),
    ]
    doc = build_table(scored, settings={"scale": exp.settings.to_json(), "runs": runs}, signature=signature,
                      detectable=detectable,
                      runs_requested=runs, timings=timings, notes=notes)
    table_feature, table_path, _ = single_phrase_table(exp.rnn_ini)
    if Path(table_path).exists():
        doc["analysis"] = analysis_document(
            Path(table_path), {config.label: [(t.run, t.weights) for t in found] for config, found in collected},
            table_feature,
        )
        doc["reference_choice"] = reference_choice_document(exp, collected, Path(table_path), table_feature)
    else:
        doc["notes"].append(f"No analysis of the RNN column: {table_path} (the 6-column table) is missing.")
    doc["leverage"] = leverage_document(exp, collected, table_feature, MosesIni.read(exp.rnn_ini))
    changes = rnn_changes(exp, collected)
    if changes:
        doc["rnn_changes"] = changes
    doc["tuning"] = tuning
    if beside:
        doc["beside"] = beside_document(doc["rows"], exp.settings.to_json(), beside)
    doc["proposals"] = proposals_documents(exp, collected, table_feature)
    doc["rerank_weights"] = rerank_grid(exp)
    doc["table2"] = {k: exp.table2_path(k).read_text(encoding="utf-8") for k in TABLE2_KINDS
                     if exp.table2_path(k).exists()}
    paths = write_report(portable(doc, exp.work), out_dir, command)
    shutil.copyfile(exp.path(TIMINGS_FILE), out_dir / "timings.tsv")
    return paths


