"""Evidence beside Table 1's BLEU scores: what the RNN column holds and what MERT made of it.

A +RNN row that does not beat Baseline can mean a weak model, a column that repeats what the
table already says, or a weight MERT left near 0. The report therefore states, from the run's own
files: how the RNN's log-probabilities correlate with each of the table's four columns on the
filtered table the systems decode with (the paper's Fig. 3 shows little correlation with the
phrase frequencies), and the weight each tuned run gave the RNN and word-penalty columns, also
as a share of all the dense weights' L1 norm (a scale-free measure, since MERT's weights are
only defined up to a positive factor); and, reranking each run's own dev n-best pool, what dev
BLEU each new column is worth (without it, and at its best weight), beside p(e|f) and the LM;
and on the test set, how many of + RNN's 1-bests differ from Baseline's and ten sentences whose
phrase choice differs, read from Moses' translation details.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from infrastructure.errors import FileLineError, UserError
from infrastructure.lines import read_text_lines
from mert.line_search import line_search
from mert.nbest_set import load_tuning_set
from moses_integration.phrase_table import LOG_FLOOR, read_phrase_table
from moses_integration.tokens import split_tokens
from moses_integration.translation_details import (
    DetailedTranslation,
    TranslationDetailsError,
    read_translation_details,
)

# Moses' four phrase-table columns, then the two this project appends.
COLUMN_NAMES = ("p(f|e)", "lex(f|e)", "p(e|f)", "lex(e|f)", "p_RNN", "WP")
RNN_COLUMN, WP_COLUMN = 4, 5


@dataclass(frozen=True)
class ColumnCorrelation:
    column: str
    pearson: float | None  # None where a column is constant (no correlation is defined)
    spearman: float | None
    # Pearson r among pairs whose targets have the same number of words: each length's mean taken out
    # of both first. ln p_RNN and lex(e|f) are both sums over the target's words, so both fall with its
    # length; this is what is left of their agreement once that shared cause is held fixed.
    pearson_same_length: float | None = None
    # Pearson r among the targets of one source: each source's mean taken out of both. The decoder
    # chooses among a source's targets, so this is the agreement that decides whether the RNN can
    # change a choice that lex(e|f) would have made anyway.
    pearson_same_source: float | None = None
    # ... and among the targets of one source that have the same number of words: both causes held fixed.
    pearson_same_source_length: float | None = None


@dataclass(frozen=True)
class TableScores:
    """What the analysis reads of a rescored table: ln of every score, each target's length and
    which source it translates."""

    log_scores: np.ndarray  # [pairs, columns]: max(ln p, −100), as Moses reads them
    target_words: np.ndarray  # [pairs]: words of each pair's target phrase
    source_ids: np.ndarray  # [pairs]: the same number for the pairs of the same source phrase


def read_table_scores(table: Path) -> TableScores:
    """The scores of a (rescored) phrase table, its targets' lengths and sources, in one pass over it."""
    rows, lengths, sources = [], [], []
    source_ids: dict[str, int] = {}  # by value, not by run: a table need not be sorted for this
    for entry in read_phrase_table(table):
        rows.append(entry.scores)
        lengths.append(len(split_tokens(entry.target)))
        sources.append(source_ids.setdefault(entry.source, len(source_ids)))
    if not rows:
        raise UserError(f"{table}: no phrase pairs")
    with np.errstate(divide="ignore"):
        log_scores = np.maximum(np.log(np.asarray(rows, dtype=np.float64)), LOG_FLOOR)
    return TableScores(log_scores, np.asarray(lengths, dtype=np.int64), np.asarray(sources, dtype=np.int64))


def _pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson r, None where either side is constant."""
    return None if np.ptp(a) == 0 or np.ptp(b) == 0 else float(np.corrcoef(a, b)[0, 1])


def _within_groups(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``values`` less the mean of their group."""
    _, index = np.unique(groups, return_inverse=True)
    means = np.bincount(index, weights=values) / np.bincount(index)
    return values - means[index]


def rnn_correlations(scores: TableScores, rnn_column: int = RNN_COLUMN) -> list[ColumnCorrelation]:
    """Pearson and Spearman correlation of ln p_RNN with each of the table's own columns, and the
    Pearson r within target lengths, within sources, and within both."""
    rnn = scores.log_scores[:, rnn_column]
    groups = {"length": scores.target_words, "source": scores.source_ids,
              "source_length": scores.source_ids * (int(scores.target_words.max()) + 1) + scores.target_words}
    rnn_within = {name: _within_groups(rnn, g) for name, g in groups.items()}
    found = []
    for i in range(min(4, rnn_column)):
        column = scores.log_scores[:, i]
        pearson = _pearson(column, rnn)
        if pearson is None:
            found.append(ColumnCorrelation(COLUMN_NAMES[i], None, None))
            continue
        within = {name: _pearson(_within_groups(column, g), rnn_within[name]) for name, g in groups.items()}
        found.append(ColumnCorrelation(COLUMN_NAMES[i], pearson, float(spearmanr(column, rnn).statistic),
                                       within["length"], within["source"], within["source_length"]))
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
    scores = read_table_scores(table)
    log_scores = scores.log_scores
    return {
        "table": str(table),
        "phrase_pairs": int(log_scores.shape[0]),
        "rnn_log_p": {"mean": float(log_scores[:, RNN_COLUMN].mean()), "std": float(log_scores[:, RNN_COLUMN].std())},
        "pairs_with_unknown_words": float((log_scores[:, WP_COLUMN] < 0).mean()),
        "correlations": [c.__dict__ for c in rnn_correlations(scores)],
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
            row_labels = {**labels, **r.get("column_labels", {})}  # a row's own names win (its 7th column)
            for c in r["columns"]:
                name = _escaped(row_labels.get(c["column"], c["column"]))
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
           "Within the same target length: Pearson r once each length's mean is taken out of both columns "
           "(ln p_RNN and ln lex(e|f) are sums over the target's words, so both fall with its length). "
           "Within the same source: once each source phrase's mean is taken out of both, the agreement "
           "among the targets the decoder chooses from; and within a source's targets of the same length.", "",
           "| table column (ln) | Pearson r with ln p_RNN | Spearman ρ | Pearson r, same target length | "
           "Pearson r, same source | Pearson r, same source and target length |",
           "|---|---|---|---|---|---|"]
    out += [f"| {_escaped(c['column'])} | {_number(c['pearson'])} | {_number(c['spearman'])} | "
            f"{_number(c['pearson_same_length'])} | {_number(c['pearson_same_source'])} | "
            f"{_number(c['pearson_same_source_length'])} |" for c in doc["correlations"]]
    out += ["", "–: no correlation is defined (a constant column, or no group with two pairs)."]
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
    return "–" if value is None else f"{value:.3f}"


def _escaped(text: str) -> str:
    """A Markdown table cell's text: a bare | (as in p(e|f)) would end the cell."""
    return text.replace("|", "\\|")


# --------------------------------------------------------------------------------------------
# Where + RNN's 1-best differs from Baseline's: how often, and ten sentences to read

#: How many sentences whose phrase choice changed the report shows.
EXAMPLES = 10


@dataclass(frozen=True)
class DecodedRun:
    """One run's decode of the test set: its tokenised 1-best and Moses' translation details of it."""

    run: int
    seed: int | None
    output: Path
    details: Path  # may be missing: runs decoded before the eval step kept it


def rnn_changes_document(baseline: Sequence[DecodedRun], system: Sequence[DecodedRun], source: Path,
                         reference: Path, examples: int = EXAMPLES) -> dict[str, object]:
    """How often run k of a row translates a test sentence otherwise than Baseline's run k (the
    same MERT seed), and ``examples`` sentences where its phrase choice differs.

    Why: a BLEU difference near 0 can hide many changed sentences (changes that cancel out) or
    none (a column MERT gave no say). The 1-best strings count every change; the translation
    details tell a new phrase choice (the set of source span -> target phrase pairs) from the same
    pairs put in another order, and show which pairs the RNN made Moses prefer. The examples are
    evenly spaced through the changed sentences of the first run with details, in test order,
    so that no score picks them.
    """
    sources, references = read_text_lines(source), read_text_lines(reference)
    theirs = {d.run: d for d in baseline}

    @functools.cache  # each decode is compared with up to three others: read it once
    def output(d: DecodedRun) -> list[str]:
        return _test_output(d.output, len(sources))

    @functools.cache
    def details(d: DecodedRun) -> list[DetailedTranslation] | None:
        return _checked_details(d.details, sources) if d.details.exists() else None

    def compared(a: DecodedRun, b: DecodedRun) -> tuple:  # both 1-bests are checked before any details are read
        outputs = (output(a), output(b))
        return _compared(outputs, (details(a), details(b)), len(sources))

    runs, missing, shown = [], [], None
    for mine in sorted(system, key=lambda d: d.run):
        other = theirs.get(mine.run)
        if other is None:
            continue
        counts, phrases, (before, after) = compared(other, mine)
        entry = {"run": mine.run, "seeds": [other.seed, mine.seed], **counts}
        missing += [str(d.details) for d in (other, mine) if not d.details.exists()]
        if phrases is not None and shown is None:
            changed = [i for i, (a, b) in enumerate(zip(*phrases, strict=True)) if a.choices() != b.choices()]
            picked = changed if len(changed) <= examples else [changed[j * len(changed) // examples]
                                                               for j in range(examples)]
            shown = {"run": mine.run, "changed": len(changed), "selection": (
                f"of the N sentences whose phrase choice changed, in test order, those at positions "
                f"floor(j N / {examples}) + 1 for j = 0..{examples - 1} (all when N <= {examples})"), "sentences": [
                _example(i, sources[i], references[i], (before[i], phrases[0][i]), (after[i], phrases[1][i]))
                for i in picked]}
        runs.append(entry)
    between = [{"row": row, "runs": [first.run, second.run], "seeds": [first.seed, second.seed],
                **compared(first, second)[0]}
               for row, decoded in (("baseline", baseline), ("system", system))
               for first, second in itertools.combinations(sorted(decoded, key=lambda d: d.run), 2)]
    return {"runs": runs, "overall": _overall(runs), "missing_details": missing, "examples": shown,
            "between_runs": between}


def _compared(outputs: tuple[list[str], list[str]],
              details: tuple[list[DetailedTranslation] | None, list[DetailedTranslation] | None],
              sentences: int) -> tuple[dict[str, int | None],
                                       tuple[list[DetailedTranslation], list[DetailedTranslation]] | None,
                                       tuple[list[str], list[str]]]:
    """In how many test sentences two decodes differ: their 1-bests, and where both kept their
    translation details, their phrase choices (None otherwise); then the details (None unless both
    have them) and the 1-bests."""
    phrases = None if details[0] is None or details[1] is None else (details[0], details[1])
    return {"sentences": sentences, "changed_1best": sum(a != b for a, b in zip(*outputs, strict=True)),
            "changed_phrase_choice": None if phrases is None else sum(
                a.choices() != b.choices() for a, b in zip(*phrases, strict=True))}, phrases, outputs


def _test_output(path: Path, sentences: int) -> list[str]:
    lines = read_text_lines(path)
    if len(lines) != sentences:
        raise FileLineError(path, None, f"{len(lines)} lines, but the test set has {sentences} sentences")
    return lines


def _checked_details(path: Path, sources: Sequence[str]) -> list[DetailedTranslation]:
    """A run's translation details, checked against the test source: one block per sentence, and
    every pair's source words where its span says (else the file belongs to another decode)."""
    found = read_translation_details(path)
    if len(found) != len(sources):
        raise TranslationDetailsError(path, None, f"{len(found)} sentences, but the test set has {len(sources)}")
    for sentence, line in zip(found, sources, strict=True):
        words = split_tokens(line)
        for pair in sentence.pairs:
            if split_tokens(pair.source) != words[pair.start:pair.end + 1]:
                raise TranslationDetailsError(path, sentence.line_no, f"source words [{pair.span()}] are "
                                              f"{pair.source!r} here but not in the test source line {line[:80]!r}")
    return found


def _example(index: int, source: str, reference: str, before: tuple[str, DetailedTranslation],
             after: tuple[str, DetailedTranslation]) -> dict[str, object]:
    """One sentence: both 1-bests with their phrase pairs, each marked ``changed`` where the other
    system did not choose that target phrase for that source span."""
    def side(mine: tuple[str, DetailedTranslation], other: DetailedTranslation) -> dict[str, object]:
        kept = other.choices()
        return {"output": mine[0], "pairs": [{"span": p.span(), "source": p.source, "target": p.target,
                                              "changed": p.choice not in kept} for p in mine[1].pairs]}
    return {"line": index + 1, "source": source, "reference": reference,
            "baseline": side(before, after[1]), "system": side(after, before[1])}


def _overall(runs: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """The runs together: all sentences of all paired runs (phrase choice: of the runs with details)."""
    with_details = [r for r in runs if r["changed_phrase_choice"] is not None]
    return {"sentences": sum(int(r["sentences"]) for r in runs),  # type: ignore[call-overload]
            "changed_1best": sum(int(r["changed_1best"]) for r in runs),  # type: ignore[call-overload]
            "sentences_with_details": sum(int(r["sentences"]) for r in with_details),  # type: ignore[call-overload]
            "changed_phrase_choice": sum(int(r["changed_phrase_choice"]) for r in with_details)}  # type: ignore[call-overload]


def format_rnn_changes(doc: Mapping[str, object], label: str, against: str) -> list[str]:
    """Markdown lines: the share of changed test 1-bests per run and overall, then the examples."""
    out = [f"## Where {label}'s test 1-best differs from {against}'s", "",
           "Run k of both rows is tuned with the same MERT seed. A 1-best changed where the tokenised output "
           "differs; its phrase choice changed where the set of (source span, target phrase) pairs Moses "
           "chose differs (its translation details), whatever their order.", "",
           "| run | seeds | test sentences | 1-best changed | phrase choice changed |", "|---|---|---|---|---|"]
    for r in doc["runs"]:  # type: ignore[attr-defined]
        seeds = " / ".join("–" if s is None else str(s) for s in r["seeds"])
        out.append(f"| {r['run']} | {seeds} | {r['sentences']:,} | {_share(r['changed_1best'], r['sentences'])} | "
                   f"{_share(r['changed_phrase_choice'], r['sentences'])} |")
    total: Mapping[str, int] = doc["overall"]  # type: ignore[assignment]
    phrase_total = total["changed_phrase_choice"] if total["sentences_with_details"] else None
    out.append(f"| all | | {total['sentences']:,} | {_share(total['changed_1best'], total['sentences'])} | "
               f"{_share(phrase_total, total['sentences_with_details'])} |")
    out.append("")
    between: Sequence[Mapping[str, object]] = doc.get("between_runs", [])  # type: ignore[assignment]
    if between:
        out += ["For scale, each row against itself tuned with other MERT seeds: the share of test sentences "
                "that two tunings of the same system translate otherwise.", "",
                "| row | runs | seeds | 1-best changed | phrase choice changed |", "|---|---|---|---|---|"]
        for b in between:
            runs, seeds = (" / ".join("–" if v is None else str(v) for v in b[k]) for k in ("runs", "seeds"))  # type: ignore[attr-defined]
            out.append(f"| {against if b['row'] == 'baseline' else label} | {runs} | {seeds} | "
                       f"{_share(b['changed_1best'], b['sentences'])} | "
                       f"{_share(b['changed_phrase_choice'], b['sentences'])} |")
        out.append("")
    missing: list[str] = doc["missing_details"]  # type: ignore[assignment]
    if missing:
        out += [f"No translation details for {len(missing)} decode(s), decoded before the eval step kept them "
                f"(–: phrase choice unknown there): {', '.join(f'`{m}`' for m in missing)}.", ""]
    shown: Mapping[str, object] | None = doc["examples"]  # type: ignore[assignment]
    if not shown:
        return out + ["No sentences to show: no run of both rows has translation details.", ""]
    sentences: list[Mapping[str, object]] = shown["sentences"]  # type: ignore[assignment]
    out += [f"### {len(sentences)} sentences where {label} changed the phrase choice (run {shown['run']})", "",
            f"Chosen without looking at any score: of the N = {shown['changed']:,} test sentences of run "
            f"{shown['run']} whose phrase choice changed, in test order, the ones at positions ⌊j·N/{EXAMPLES}⌋ + 1 "
            f"for j = 0…{EXAMPLES - 1}, evenly spaced through them (all of them when N ≤ {EXAMPLES}). "
            "Tokenised text; each 1-best is "
            f"followed by its phrase pairs in target order, `span: source → target` with 0-based source word "
            f"positions; `*` marks a pair the other system did not choose.", ""]
    for s in sentences:
        rows = [f"test sentence {s['line']}", f"source    : {s['source']}", f"reference : {s['reference']}"]
        for name, side in ((against, s["baseline"]), (label, s["system"])):
            rows += [f"{name:<10}: {side['output']}", "  " + " | ".join(  # type: ignore[index]
                f"{'*' if p['changed'] else ''}{p['span']}: {p['source']} → {p['target'] or '(dropped)'}"
                for p in side["pairs"])]  # type: ignore[index]
        fence = "`" * max(3, 1 + max((len(run) for row in rows for run in re.findall(r"`+", row)), default=0))
        out += [fence + "text", *rows, fence, ""]
    return out


def _share(count: int | None, total: int) -> str:
    return "–" if count is None or not total else f"{count:,} ({100 * count / total:.1f}%)"
