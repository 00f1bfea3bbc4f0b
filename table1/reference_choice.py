"""Which of a source phrase's targets the test reference uses, and which score ranks it first.

BLEU says whether + RNN translates better, not whether its column knows which phrase is right.
This asks the column directly. For every occurrence of a table source phrase in the test source
text, the targets the decoder can choose from (the best ``limit`` of the table's targets under each
compared run's tuned phrase-table weights: Moses keeps ``table-limit`` = 20 by default) are split
into those that occur in the sentence's reference and those that do not. For each pair of one of
each, with targets of the same number of words, a score is right if it ranks the one the reference
uses higher (ties count half). Same length only: a short target occurs in a reference more often
whatever it means, and every column here prefers short targets to a different degree; the
decoder's word penalty and LM, not the phrase table, weigh lengths.

The scores compared: each of the table's columns alone, p_RNN alone, and each compared run's
tuned phrase-table score (its weights on the table's columns), + RNN's also without its p_RNN
term. That last pair says how much the column adds to the choice MERT made with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infrastructure.errors import FileLineError
from infrastructure.lines import read_text_lines
from moses_integration.phrase_table import LOG_FLOOR, read_phrase_table
from moses_integration.tokens import split_tokens
from table1.analysis import COLUMN_NAMES, RNN_COLUMN

#: Moses' default ``table-limit``: the targets of a source the decoder considers.
DEFAULT_LIMIT = 20
#: The longest source phrase a Moses table holds by default (``train-model.perl -max-phrase-length``).
MAX_SOURCE_WORDS = 7
#: The columns compared alone: the table's four and p_RNN (not WP, a count of unknown words).
COLUMNS = COLUMN_NAMES[:RNN_COLUMN + 1]
#: The scores compared, in the report's order: those columns, then the runs' tuned phrase-table scores.
SCORE_NAMES = (*COLUMNS, "Baseline's tuned score", "+ RNN's tuned score", "+ RNN's tuned score less p_RNN")


@dataclass(frozen=True)
class ChoiceAccuracy:
    run: int
    occurrences: int  # source occurrences with a target the reference uses and one it does not
    pairs: int  # (used, unused) target pairs of the same length
    accuracy: dict[str, float | None]  # by SCORE_NAMES: the share of pairs the score ranks right (None: no pair)


@dataclass(frozen=True)
class _Targets:
    words: list[tuple[str, ...]]
    log_scores: np.ndarray  # [targets, 5]: ln of the table's four columns and p_RNN, floored as Moses reads them


def _ngrams(words: Sequence[str], longest: int) -> list[tuple[str, ...]]:
    """Every n-gram of ``words`` of 1 to ``longest`` words (per sentence: a reference's matter only
    to its own sentence, so :func:`rescorer.proposals.sources.text_ngrams`' counts over a whole
    file do not serve)."""
    return [tuple(words[i:i + n]) for n in range(1, longest + 1) for i in range(len(words) - n + 1)]


def _right_and_pairs(scored: np.ndarray, lengths: np.ndarray, is_used: np.ndarray) -> tuple[np.ndarray, int]:
    """Per score, how many same-length (used, unused) pairs it ranks right (ties half), and the pairs."""
    same = lengths[is_used][:, None] == lengths[~is_used][None, :]
    diff = (scored[is_used][:, None, :] - scored[~is_used][None, :, :])[same]  # [pairs, scores]
    return (diff > 0).sum(0) + 0.5 * (diff == 0).sum(0), int(same.sum())


def _read_targets(table: Path, wanted: set[str]) -> dict[str, _Targets]:
    """The targets and scores of the sources in ``wanted``, in one pass over the table."""
    words: dict[str, list[tuple[str, ...]]] = {}
    scores: dict[str, list[list[float]]] = {}
    for entry in read_phrase_table(table):
        if entry.source in wanted:
            words.setdefault(entry.source, []).append(tuple(split_tokens(entry.target)))
            scores.setdefault(entry.source, []).append(list(entry.scores[:len(COLUMNS)]))
    found = {}
    for source, targets in words.items():
        with np.errstate(divide="ignore"):
            log_scores = np.maximum(np.log(np.asarray(scores[source], dtype=np.float64)), LOG_FLOOR)
        found[source] = _Targets(targets, log_scores)
    return found


def _candidates(targets: _Targets, weights: Sequence[np.ndarray], limit: int) -> np.ndarray:
    """The targets the decoder considers under any of ``weights``: each one's best ``limit``."""
    best = [np.argsort(-(targets.log_scores @ w), kind="stable")[:limit] for w in weights]
    return np.unique(np.concatenate(best))


def reference_choice(table: Path, source: Path, reference: Path,
                     runs: Mapping[int, tuple[Sequence[float], Sequence[float]]],
                     limit: int = DEFAULT_LIMIT) -> list[ChoiceAccuracy]:
    """For each run number in ``runs`` (Baseline's and + RNN's tuned phrase-table weights, the
    table's columns in order), the share of same-length (used, unused) target pairs each score ranks
    right (module doc). ``source`` and ``reference`` are the tokenised test text the table was
    filtered for, one sentence a line."""
    sentences = [[" ".join(g) for g in _ngrams(split_tokens(line), MAX_SOURCE_WORDS)]
                 for line in read_text_lines(source)]
    references = read_text_lines(reference)
    if len(references) != len(sentences):  # one line short: the classic wrong test set, named before the table is read
        raise FileLineError(reference, min(len(references), len(sentences)) + 1,
                            f"the reference has {len(references)} lines but its source {source} has {len(sentences)}")
    targets = _read_targets(table, {phrase for phrases in sentences for phrase in phrases})
    longest = max((len(w) for t in targets.values() for w in t.words), default=1)
    used = [set(_ngrams(split_tokens(line), longest)) for line in references]
    found = []
    for run, (baseline, rnn) in sorted(runs.items()):
        wb, wr = (np.asarray(w[:len(COLUMNS)], dtype=np.float64) for w in (baseline, rnn))
        wr_less = wr.copy()
        wr_less[RNN_COLUMN] = 0.0
        combos = np.column_stack([np.eye(len(COLUMNS)), wb, wr, wr_less])  # [columns, scores]
        right, pairs, occurrences = np.zeros(len(SCORE_NAMES)), 0, 0
        kept: dict[str, tuple[np.ndarray, np.ndarray, list[tuple[str, ...]]]] = {}  # per source, its candidates
        for phrases, in_reference in zip(sentences, used, strict=True):
            for phrase in phrases:
                if phrase in targets and phrase not in kept:
                    t = targets[phrase]
                    index = _candidates(t, (wb, wr), limit)
                    words = [t.words[i] for i in index]
                    kept[phrase] = (t.log_scores[index] @ combos, np.array([len(w) for w in words]), words)
                if phrase in kept:
                    scored, lengths, words = kept[phrase]
                    is_used = np.array([w in in_reference for w in words])
                    here, n = _right_and_pairs(scored, lengths, is_used)
                    right, pairs, occurrences = right + here, pairs + n, occurrences + (n > 0)
        found.append(ChoiceAccuracy(run, occurrences, pairs,
                                    {name: float(r / pairs) if pairs else None
                                     for name, r in zip(SCORE_NAMES, right, strict=True)}))
    return found


def format_reference_choice(found: Sequence[Mapping[str, object]]) -> list[str]:
    """Markdown lines of the report's section (``found``: :class:`ChoiceAccuracy` as dicts)."""
    if not found:
        return []
    out = ["## Which target the reference uses: how often each score ranks it first", "",
           "Each test source phrase's targets that the decoder considers (the best 20 under Baseline's or + RNN's "
           "tuned phrase-table weights of the same run), split into those the sentence's reference uses and the "
           "others; for each pair of one of each with the same number of words, the share of pairs a score ranks "
           "right (ties half; docs/table1.md).", "",
           "| score | " + " | ".join(f"run {r['run']}" for r in found) + " |", "|---|" + "---|" * len(found)]
    for name in SCORE_NAMES:
        shares = [r["accuracy"][name] for r in found]  # type: ignore[index]
        out += [f"| {name} | " + " | ".join("–" if a is None else f"{100 * a:.1f}%" for a in shares) + " |"]
    counts = " | ".join(f"{r['occurrences']:,}; {r['pairs']:,}" for r in found)
    out += [f"| (source occurrences; pairs) | {counts} |"]
    return out + [""]
