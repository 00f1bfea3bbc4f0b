"""The reranking report: every feature set against Baseline reranked, over runs, with the lists' oracle.

Rebuilt from the stamps and outputs of :mod:`table1.reranking` on every run (never stamped). Test BLEU is
sacreBLEU on detruecased, detokenised output against the raw reference, as in Table 1's report; dev BLEU
is MERT's own (tokenised) on the lists it tuned on. Each set's main figures are the mean Δ over runs with
the 95% interval and p of :func:`mert.significance.runs_test` (:data:`mert.significance.RUNS_METHOD`),
against Baseline reranked; the pooled bootstrap (sentences only) is a labelled secondary column. The set
whose examples are shown is chosen on dev (mean dev BLEU over runs), never on test, and its examples by
position.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from infrastructure.files import atomic_output, write_json
from infrastructure.lines import read_text_lines
from mert.evaluate import PostProcessor, score_system
from mert.significance import RUNS_METHOD, pooled_bootstrap, runs_test
from table1.report import draw_png, over_runs_cell, pooled_json
from table1.reranking import (
    BASELINE_RERANKED,
    LIST_FEATURE,
    NMT_TRANSLATE_STAMP,
    FeatureSet,
    baseline_plan,
    list_path,
    mert_stamp,
    nmt_test_output,
    oracle_stamp,
    output_path,
)
from table1.reranking_models import readout_stamp, readouts
from table1.workspace import Experiment

#: What :func:`write_reranking_report` writes into the results folder.
REPORT_FILES = ("reranking.json", "reranking.md", "reranking.png")
#: The reranking gain (BLEU, mean over runs, its 95% interval above 0) from which a set is worth three
#: tunings with its features inside the tuning loop.
TUNING_LOOP_GAIN = 0.3
#: The Table 1 row that tunes a set's features inside the tuning loop, where one is defined.
TUNING_LOOP_ROWS = {"+ p_RNN": "rnn", "+ p_RNN + RNN(f|e)": "rnn-both", "+ NMT p(e|f)": "nmt-nbest",
                    "+ NMT p(e|f)+p(f|e)": "nmt-both-nbest"}


def set_runs(exp: Experiment, fset: FeatureSet, runs: int, refs: list[list[str]], test_ref: Path
             ) -> tuple[list[dict[str, object]], dict[int, list[str]]]:
    """Each tuned run of a set: dev BLEU (MERT's), test sacreBLEU and weights; and its detokenised test output."""
    out, detok = [], {}
    tok_ref = exp.prepared("test", exp.tgt)
    for k in range(1, runs + 1):
        if not exp.done(mert_stamp(fset, k)):
            continue
        stamp = exp.read_stamp(mert_stamp(fset, k))
        path = output_path(exp, fset, k, "test")
        score = score_system(path.name, path, read_text_lines(path), refs, [test_ref], lang=exp.tgt,
                             tokenized_references=[read_text_lines(tok_ref)], tokenized_ref_paths=[tok_ref])
        out.append({"run": k, "dev_bleu": stamp["dev_bleu"], "start_dev_bleu": stamp["start_dev_bleu"],
                    "test_bleu": round(score.bleu, 4), "test_bleu_tokenized": round(score.tokenized_bleu or 0.0, 4),
                    "weights": stamp["weights"], "new_columns": stamp["new_columns"], "signature": score.signature,
                    "choice_depth": stamp.get("choice_depth")})
        detok[k] = score.detokenized
    return out, detok


def compare(base: dict[int, list[str]], mine: dict[int, list[str]], refs: list[list[str]]) -> dict[str, object]:
    """The set's runs against Baseline reranked's same-numbered runs: the test over runs, and pooled."""
    paired = sorted(set(base) & set(mine))
    if not paired:
        return {}
    b, m = [base[k] for k in paired], [mine[k] for k in paired]
    return {"over_runs": runs_test(b, m, refs).to_json(), "pooled": pooled_json(pooled_bootstrap(b, m, refs))}


def first_hypothesis_check(exp: Experiment, runs: int) -> list[dict[str, object]]:
    """How many of each test list's first hypotheses are Baseline's own test output (eval step), run by run:
    the lists must come from the tuned systems the report compares against."""
    out = []
    for k in range(1, runs + 1):
        plan = baseline_plan(k)
        one_best, decoded = list_path(exp, k, "test").with_name(f"run{k}.test.1best"), exp.eval_output(plan, "test")
        if one_best.exists() and decoded.exists():
            a, b = read_text_lines(one_best), read_text_lines(decoded)
            out.append({"run": k, "same": sum(x.strip() == y.strip() for x, y in zip(a, b, strict=False)),
                        "sentences": len(b)})
    return out


def changed_examples(exp: Experiment, fset: FeatureSet, count: int) -> list[dict[str, object]]:
    """Run 1's test sentences whose 1-best the set changed against Baseline reranked, ``count`` of them
    evenly spaced by position: the source, both outputs (detokenised) and the reference."""
    base_set = FeatureSet(BASELINE_RERANKED, ())
    a_path, b_path = output_path(exp, base_set, 1, "test"), output_path(exp, fset, 1, "test")
    if not (a_path.exists() and b_path.exists()):
        return []
    a, b = read_text_lines(a_path), read_text_lines(b_path)
    changed = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if not changed:
        return []
    n = min(count, len(changed))
    picks = [changed[j * len(changed) // n] for j in range(n)]
    post = PostProcessor(exp.tgt)
    sources, refs = (read_text_lines(exp.path("raw", f"test.{lang}")) for lang in (exp.src, exp.tgt))
    return [{"line": i + 1, "source": sources[i], "reference": refs[i], BASELINE_RERANKED: post(a[i]),
             fset.label: post(b[i])} for i in picks]


def nmt_standalone(exp: Experiment, refs: list[list[str]], test_ref: Path) -> dict[str, object] | None:
    """The NMT model p(e|f)'s own beam-search translation of test: its sacreBLEU, as Table 1's rows are scored."""
    if not exp.done(NMT_TRANSLATE_STAMP):
        return None
    out = nmt_test_output(exp)
    score = score_system(out.name, out, read_text_lines(out), refs, [test_ref], lang=exp.tgt)
    return {"test_bleu": round(score.bleu, 4), "signature": score.signature}


def readout_document(exp: Experiment) -> list[dict[str, object]]:
    """The paper-size RNN's read-outs so far: hours, validation perplexity, agreement with lex(e|f)."""
    keys = ("hours", "valid_perplexity", "step", "sample_pairs", "lex_e_f", "rnn_step_lex_e_f")
    return [{k: exp.read_stamp(readout_stamp(h)).get(k) for k in keys}
            for h in readouts(exp)[0] if exp.done(readout_stamp(h))]


def tuning_loop_choice(rows: list[dict], runs: int) -> dict[str, object]:
    """The set to tune inside the tuning loop: of the sets whose mean gain over all ``runs`` is at least
    :data:`TUNING_LOOP_GAIN` with an interval above 0, the best on dev; with its Table 1 row, or why none."""
    qualified = [r for r in rows if len(r["runs"]) == runs and (t := r.get("over_runs")) and t.get("ci95")
                 and t["mean_delta"] >= TUNING_LOOP_GAIN and t["ci95"][0] > 0]
    if not qualified:
        return {"set": None, "row": None,
                "reason": f"no set gains {TUNING_LOOP_GAIN:+.1f} or more with an interval above 0 over {runs} runs"}
    best = max(qualified, key=lambda r: float(np.mean([x["dev_bleu"] for x in r["runs"]])))
    row = TUNING_LOOP_ROWS.get(best["label"])
    return {"set": best["label"], "row": row,
            "reason": "the best on dev of the sets that gain enough" if row else "no Table 1 row tunes this set yet"}


def reranking_document(exp: Experiment, runs: int, sets: list[FeatureSet], missing: list[str]) -> dict[str, object]:
    """Everything the report shows, as JSON."""
    test_ref = exp.path("raw", f"test.{exp.tgt}")
    refs = [read_text_lines(test_ref)]
    rows, detok = [], {}
    for fset in sets:
        per_run, detok[fset.label] = set_runs(exp, fset, runs, refs, test_ref)
        row: dict[str, object] = {"label": fset.label, "features": list(fset.features), "runs": per_run}
        if fset.label != BASELINE_RERANKED:
            row.update(compare(detok[BASELINE_RERANKED], detok[fset.label], refs))
        rows.append(row)
    complete = [r for r in rows if len(r["runs"]) == runs and r["label"] != BASELINE_RERANKED]
    best = max(complete, key=lambda r: float(np.mean([x["dev_bleu"] for x in r["runs"]])), default=None)
    best_set = next((s for s in sets if best and s.label == best["label"]), None)
    r = exp.settings.reranking
    return {
        "scale": exp.settings.name, "runs": runs, "settings": asdict(r), "method": RUNS_METHOD,
        "list_feature": LIST_FEATURE, "rows": rows, "not_trained": missing,
        "oracle": {f"run{k}": {split: exp.read_stamp(oracle_stamp(k, split)) for split in ("dev", "test")
                               if exp.done(oracle_stamp(k, split))} for k in range(1, runs + 1)},
        "first_hypothesis_check": first_hypothesis_check(exp, runs),
        "nmt_standalone": nmt_standalone(exp, refs, test_ref),
        "best_on_dev": best_set.label if best_set else None,
        "tuning_loop": tuning_loop_choice(rows, runs),
        "readouts": readout_document(exp),
        "changed_examples": changed_examples(exp, best_set, r.changed_examples) if best_set else [],
    }


def _mean(values: list[float]) -> str:
    return f"{np.mean(values):.2f}" if values else "–"


def format_markdown(doc: dict[str, object], command: str = "") -> str:
    rows: list[dict] = doc["rows"]  # type: ignore[assignment]
    settings: dict = doc["settings"]  # type: ignore[assignment]
    lines = [f"# Reranking Baseline's n-best lists (SCALE={doc['scale']}, {doc['runs']} runs)", "",
             f"Each Baseline run's dev and test lists ({settings['nbest_size']}-best distinct; the first "
             f"{settings['rerank_size']} of each scored and reranked), each feature set's weights tuned on run k's "
             f"dev lists by MERT ({settings['restarts']} random restarts, from run k's tuned weights) and test "
             f"reranked with them. Δ is against **{BASELINE_RERANKED}** (the same lists tuned the same way, "
             f"no new feature). {LIST_FEATURE} is the phrase RNN's column as + RNN ran it.", "",
             "| feature set | dev BLEU (MERT's) | test BLEU per run | mean | Δ over runs [95% interval], p | "
             "pooled Δ, p (sentences only) | new features' weights (run 1) |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        runs = row["runs"]
        tests = [x["test_bleu"] for x in runs]
        new = {c: runs[0]["weights"][c] for c in runs[0]["new_columns"]} if runs else {}
        pooled = row.get("pooled")
        pooled_cell = "–" if not pooled else f"{pooled['delta']:+.2f} (p {pooled['p_value']:.3f})"
        lines.append(f"| {row['label']} | {_mean([x['dev_bleu'] for x in runs])} | "
                     f"{', '.join(f'{t:.2f}' for t in tests) or '–'} | {_mean(tests)} | "
                     f"{over_runs_cell(row.get('over_runs')) if row['label'] != BASELINE_RERANKED else '–'} | "
                     f"{pooled_cell} | "
                     f"{', '.join(f'{k} {v:+.3g}' for k, v in new.items()) or '–'} |")
    lines += ["", f"Method: {doc['method']}.", ""]
    if doc["not_trained"]:
        lines += [f"Not trained yet, so not in the table: {', '.join(doc['not_trained'])}.", ""]
    nmt = doc.get("nmt_standalone")
    if nmt:
        lines += [f"The NMT model p(e|f) alone (its own beam search, beam 5) reaches {nmt['test_bleu']:.2f} test BLEU "
                  f"({nmt['signature']}).", ""]
    choice = doc["tuning_loop"]
    if choice["row"]:
        lines += [f"In the tuning loop next ({choice['reason']}): **{choice['set']}**, as Table 1's row "
                  f"`{choice['row']}`: `make table1 SCALE={doc['scale']} CONFIGS='baseline {choice['row']}' "
                  "STEPS='tune eval report'`.", ""]
    else:
        lines += [f"In the tuning loop next: none ({choice['reason']}"
                  + (f": {choice['set']}" if choice["set"] else "") + ").", ""]
    lines += format_readouts(doc)
    lines += format_oracle(doc)
    lines += format_depth(doc)
    check = doc["first_hypothesis_check"]
    if check:
        lines += ["Each test list's first hypothesis is Baseline's own test output in "
                  + ", ".join(f"{c['same']} of {c['sentences']} (run {c['run']})" for c in check) + ".", ""]
    lines += format_examples(doc)
    if command:
        lines += ["Made by:", "", "```", command, "```", ""]
    return "\n".join(lines)


def format_readouts(doc: dict[str, object]) -> list[str]:
    found: list[dict] = doc.get("readouts") or []  # type: ignore[assignment]
    if not found:
        return []

    def r(corr: dict | None) -> str:
        value = (corr or {}).get("pearson_same_source")
        return "–" if value is None else f"{value:+.3f}"

    return ["The paper-size RNN as it trains: validation perplexity, and how its ln p_RNN agrees with ln lex(e|f) "
            "among a source's targets (Pearson r, each source's mean taken out; on a sample of the + RNN table), "
            "beside the + RNN model's on the same pairs.", "",
            "| hours | validation perplexity (step) | sample pairs | r with lex(e\\|f) | + RNN model's r |",
            "|---|---|---|---|---|",
            *(f"| {x['hours']:g} | {x['valid_perplexity']:.2f} ({x['step']}) | {x['sample_pairs']} | "
              f"{r(x['lex_e_f'])} | {r(x['rnn_step_lex_e_f'])} |" for x in found), ""]


def format_oracle(doc: dict[str, object]) -> list[str]:
    oracle: dict = doc["oracle"]  # type: ignore[assignment]
    curves = [(run, split, o["oracle_bleu"]) for run, splits in oracle.items() for split, o in splits.items()]
    if not curves:
        return []
    sizes = [size for size, _ in curves[0][2]]
    return ["Oracle BLEU of the lists (tokenised; each sentence's hypothesis chosen to raise corpus BLEU most, "
            "by coordinate ascent from the 1-best) by list size: how much reranking could gain at most.", "",
            "| list | " + " | ".join(f"first {s}" for s in sizes) + " |", "|---|" + "---|" * len(sizes),
            *(f"| {run} {split} | " + " | ".join(f"{bleu:.2f}" for _, bleu in c) + " |" for run, split, c in curves),
            ""]


def format_depth(doc: dict[str, object]) -> list[str]:
    """Where each set's reranked test 1-best lies in the list, as shares of the sentences over all runs."""
    table = []
    for row in doc["rows"]:  # type: ignore[attr-defined]
        depths = [x["choice_depth"]["test"] for x in row["runs"] if x.get("choice_depth")]
        if depths:
            totals = {stretch: sum(d[stretch] for d in depths) for stretch in depths[0]}
            table.append((row["label"], totals))
    if not table:
        return []
    stretches = sorted(table[0][1], key=lambda stretch: int(stretch.split("-")[0]))  # stamps sort their keys
    return ["Where each set's reranked test 1-best lies in the list (its position in Moses' order; share of "
            "the test sentences of all runs): a set that often chooses from the last stretch would have found "
            "more in a deeper list.", "",
            "| feature set | " + " | ".join(f"position {s}" for s in stretches) + " |",
            "|---|" + "---|" * len(stretches),
            *(f"| {label} | " + " | ".join(f"{100 * totals[s] / sum(totals.values()):.1f}%" for s in stretches)
              + " |" for label, totals in table), ""]


def format_examples(doc: dict[str, object]) -> list[str]:
    examples: list[dict] = doc["changed_examples"]  # type: ignore[assignment]
    best = doc["best_on_dev"]
    if not examples or not best:
        return []
    out = [f"Test sentences whose 1-best **{best}** (the best set on dev) changed, run 1, chosen evenly by "
           "position among all changed ones:", ""]
    for ex in examples:
        out += [f"- line {ex['line']}", f"  - source: {ex['source']}",
                f"  - {BASELINE_RERANKED}: {ex[BASELINE_RERANKED]}", f"  - {best}: {ex[best]}",
                f"  - reference: {ex['reference']}"]
    return out + [""]


def figure_document(doc: dict[str, object]) -> dict[str, object]:
    """The rows as :func:`table1.report.draw_png` reads them (Baseline reranked as its baseline)."""
    rows = []
    for row in doc["rows"]:  # type: ignore[attr-defined]
        deltas = (row.get("over_runs") or {}).get("deltas", [])
        rows.append({"key": "baseline" if row["label"] == BASELINE_RERANKED else row["label"], "label": row["label"],
                     "deltas_vs_baseline": deltas, "over_runs_vs_baseline": row.get("over_runs"),
                     "paper": {"test": None}, "runs": row["runs"]})
    return {"rows": rows}


def write_reranking_report(exp: Experiment, runs: int, sets: list[FeatureSet], missing: list[str], out_dir: Path,
                           command: str = "") -> list[Path]:
    """reranking.{json,md,png} in ``out_dir``."""
    doc = reranking_document(exp, runs, sets, missing)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in REPORT_FILES]
    write_json(paths[0], doc)
    with atomic_output(paths[1]) as fh:
        fh.write(format_markdown(doc, command).encode("utf-8"))
    draw_png(figure_document(doc), paths[2], against=BASELINE_RERANKED)
    return paths
