"""Evidence beside Table 1's BLEU scores: what the RNN column holds and what MERT made of it.

A +RNN row that does not beat Baseline can mean a weak model, a column that repeats what the
table already says, or a weight MERT left near 0. The report therefore states, from the run's own
files: how the RNN's log-probabilities correlate with each of the table's four columns on the
filtered table the systems decode with (the paper's Fig. 3 shows little correlation with the
phrase frequencies), and the weight each tuned run gave the RNN and word-penalty columns, also
as a share of all the dense weights' L1 norm (a scale-free measure, since MERT's weights are
only defined up to a positive factor); and, reranking each run's own dev n-best pool, what dev
BLEU each new column is worth (without it, and at its best weight), beside p(e|f) and the LM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from mert.line_search import line_search
from mert.nbest_set import load_tuning_set
from moses_integration.phrase_table import LOG_FLOOR, read_phrase_table

# Moses' four phrase-table columns, then the two this project appends.
COLUMN_NAMES = ("p(f|e)", "lex(f|e)", "p(e|f)", "lex(e|f)", "p_RNN", "WP")
RNN_COLUMN, WP_COLUMN = 4, 5


@dataclass(frozen=True)
class ColumnCorrelation:
    column: str
    pearson: float | None  # None where a column is constant (no correlation is defined)
    spearman: float | None


def read_log_scores(table: Path) -> np.ndarray:
    """ln of every score of a (rescored) phrase table, as Moses reads them: max(ln p, −100)."""
    rows = [entry.scores for entry in read_phrase_table(table)]
    if not rows:
        raise ValueError(f"{table}: no phrase pairs")
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(np.asarray(rows, dtype=np.float64)), LOG_FLOOR)


def rnn_correlations(log_scores: np.ndarray, rnn_column: int = RNN_COLUMN) -> list[ColumnCorrelation]:
    """Pearson and Spearman correlation of ln p_RNN with each of the table's own columns."""
    rnn = log_scores[:, rnn_column]
    found = []
    for i in range(min(4, rnn_column)):
        column = log_scores[:, i]
        if np.ptp(column) == 0 or np.ptp(rnn) == 0:
            found.append(ColumnCorrelation(COLUMN_NAMES[i], None, None))
            continue
        found.append(ColumnCorrelation(COLUMN_NAMES[i], float(np.corrcoef(column, rnn)[0, 1]),
                                       float(spearmanr(column, rnn).statistic)))
    return found


def weight_shares(weights: Mapping[str, Sequence[float]], table_feature: str) -> dict[str, float]:
    """The tuned RNN and WP weights of one run, and the RNN's share of the L1 norm of all weights."""
    table = list(weights[table_feature])
    total = sum(abs(w) for values in weights.values() for w in values)
    return {
        "rnn": table[RNN_COLUMN],
        "wp": table[WP_COLUMN],
        "rnn_l1_share": abs(table[RNN_COLUMN]) / total if total else 0.0,
    }


def analysis_document(table: Path, runs: Mapping[str, Sequence[tuple[int, Mapping[str, Sequence[float]]]]],
                      table_feature: str) -> dict[str, object]:
    """The ``analysis`` part of table1.json: correlations on ``table``, weights of each row's runs."""
    log_scores = read_log_scores(table)
    return {
        "table": str(table),
        "phrase_pairs": int(log_scores.shape[0]),
        "rnn_log_p": {"mean": float(log_scores[:, RNN_COLUMN].mean()), "std": float(log_scores[:, RNN_COLUMN].std())},
        "pairs_with_unknown_words": float((log_scores[:, WP_COLUMN] < 0).mean()),
        "correlations": [c.__dict__ for c in rnn_correlations(log_scores)],
        "weights": {label: [{"run": k, **weight_shares(w, table_feature)} for k, w in found]
                    for label, found in runs.items()},
    }


@dataclass(frozen=True)
class ColumnLeverage:
    """What one weight does to dev BLEU when the run's n-best pool is reranked, all else as tuned."""

    column: str  # an n-best column name (``TranslationModel0_4``, ``CSLM0_0``)
    weight: float  # as tuned
    bleu_without: float  # pool BLEU with this weight set to 0
    best_bleu: float  # the best pool BLEU along this weight's axis (exact line search)
    best_weight: float  # the weight that reaches it


def column_leverage(nbest_paths: Sequence[Path], references: Sequence[Path], weights: Mapping[str, Sequence[float]],
                    columns: Sequence[str]) -> tuple[float, list[ColumnLeverage]]:
    """Dev BLEU of the tuned weights on the run's merged n-best pool, and for each of ``columns``
    that BLEU without the column and at its best weight.

    Why: a column MERT weights near 0 may still matter (its scale may be large), and a column with
    a visible weight may change no 1-best. Reranking the pool every iteration decoded answers
    this without decoding again: if dropping a column costs nothing and no weight on it gains
    anything, the column carries nothing MERT can use on this dev set.
    """

    nbest, data = load_tuning_set(nbest_paths, references)
    names = nbest.column_names()
    point = np.array([v for name, count in nbest.feature_names for v in list(weights[name])[:count]], dtype=np.float64)
    found = []
    for column in columns:
        i = names.index(column)
        without, axis = point.copy(), np.zeros_like(point)
        without[i], axis[i] = 0.0, 1.0
        step, best = line_search(data, point, axis)
        found.append(ColumnLeverage(column, float(point[i]), round(data.score(without), 4), round(best, 4),
                                    float(point[i] + step)))
    return round(data.score(point), 4), found


def format_leverage(runs: Mapping[str, Sequence[Mapping[str, object]]], labels: Mapping[str, str]) -> list[str]:
    """Markdown lines: each run's pool BLEU, and per column the BLEU without it and at its best weight."""
    out = ["## What each column moves on the dev n-best pool, and on the test n-best list", "",
           "Dev: each tuned run's n-best lists of all its iterations, merged and reranked with the tuned weights "
           "(tokenised BLEU); then the same with one weight set to 0, and with that weight at its best value along "
           "its axis, every other weight as tuned. Test: the 100-best list the eval step decoded with the tuned "
           "weights, reranked the same way (tokenised BLEU; – where the eval kept no list). p(e|f) and the LM are "
           "there for scale.", "",
           "| configuration | run | column | weight | dev pool BLEU | dev without it | dev best on its axis (weight) "
           "| test n-best BLEU | test without it |",
           "|---|---|---|---|---|---|---|---|---|"]
    for label, found in runs.items():
        for r in found:
            test = r.get("test") or {}
            test_columns = {c["column"]: c for c in test.get("columns", [])}
            for c in r["columns"]:
                name = _escaped(labels.get(c["column"], c["column"]))
                t = test_columns.get(c["column"])
                test_cells = f"{test['pool_bleu']:.2f} | {t['bleu_without']:.2f}" if t else "– | –"
                out.append(f"| {label} | {r['run']} | {name} | {c['weight']:.4g} | {r['pool_bleu']:.2f} | "
                           f"{c['bleu_without']:.2f} | {c['best_bleu']:.2f} ({c['best_weight']:.4g}) | {test_cells} |")
    return out + [""]


def format_analysis(doc: Mapping[str, object]) -> list[str]:
    """Markdown lines of the analysis section of table1.md."""
    out = ["## What the RNN column holds, and what MERT made of it", "",
           f"On the filtered table the systems decode with ({doc['phrase_pairs']:,} phrase pairs): ln p_RNN has "
           f"mean {doc['rnn_log_p']['mean']:.2f} and std {doc['rnn_log_p']['std']:.2f}; "
           f"{100 * doc['pairs_with_unknown_words']:.1f}% of the pairs hold a word outside the shortlists.", "",
           "| table column (ln) | Pearson r with ln p_RNN | Spearman ρ |", "|---|---|---|"]
    out += [f"| {_escaped(c['column'])} | {_number(c['pearson'])} | {_number(c['spearman'])} |"
            for c in doc["correlations"]]
    out += ["", "| configuration | run | RNN weight | WP weight | RNN share of the L1 norm |", "|---|---|---|---|---|"]
    for label, runs in doc["weights"].items():
        out += [f"| {label} | {r['run']} | {r['rnn']:.4g} | {r['wp']:.4g} | {100 * r['rnn_l1_share']:.1f}% |"
                for r in runs]
    return out + [""]


def tuning_trajectory(state: Mapping[str, object]) -> list[float]:
    """Dev BLEU of the 1-best at each iteration of a tuning run (``mert tune``'s tuning-state.json).

    Iteration 1 decodes with the start weights, iteration k with the weights MERT chose after
    k - 1: the list shows how far the start weights are from tuned ones and where MERT swung.
    """
    return [round(float(it["dev_bleu_1best"]), 2) for it in state.get("iterations", [])]  # type: ignore[union-attr]


def format_trajectories(runs: Mapping[str, Sequence[Mapping[str, object]]]) -> list[str]:
    """Markdown lines: one row per run (``{"run": k, "dev_bleu_1best": [...]}``), one column per iteration."""
    width = max((len(r["dev_bleu_1best"]) for found in runs.values() for r in found), default=0)  # type: ignore[arg-type]
    if not width:
        return []
    head = ["1 (start weights)", *(str(i) for i in range(2, width + 1))]
    out = ["## Tuning: dev BLEU of the 1-best at each MERT iteration", "",
           "Tokenised BLEU of each iteration's decode of the tuning set (iteration k uses the weights MERT chose "
           "after iteration k − 1). A run that converged early has fewer iterations.", "",
           "| configuration | run | " + " | ".join(head) + " |", "|---|---|" + "---|" * width]
    for label, found in runs.items():
        for r in found:
            bleus = list(r["dev_bleu_1best"])  # type: ignore[arg-type]
            cells = [f"{b:.2f}" for b in bleus] + [""] * (width - len(bleus))
            out.append(f"| {label} | {r['run']} | " + " | ".join(cells) + " |")
    return out + [""]


def _number(value: float | None) -> str:
    return "– (constant column)" if value is None else f"{value:.3f}"


def _escaped(text: str) -> str:
    """A Markdown table cell's text: a bare | (as in p(e|f)) would end the cell."""
    return text.replace("|", "\\|")
