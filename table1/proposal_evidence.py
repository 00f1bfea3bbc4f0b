"""The evidence a proposals row is read by: how many proposed pairs the tuned systems use
in their test translations, how often a proposed target occurs in the test reference against the
table's own targets for the same sources, the indicator's tuned weight, and a few proposals; and
what each MERT iteration's decode of dev made of them, which shows whether tuning
turned the proposals off and what they cost while they were on.

Everything is read from what the steps left: ``rescorer propose --list`` (kind, source, target,
log p), the filtered table, the tokenised test text and reference, and the test n-best lists the
eval step keeps (Moses' first hypothesis of a sentence is its 1-best, and its feature values say
how many phrases it used, ``PhrasePenalty0``, and how many of them were proposals, the indicator
column, whose log value is 1 per proposal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from infrastructure.lines import iter_text_lines
from moses_integration.nbest import read_nbest
from moses_integration.phrase_coverage import Lengths, Proposal, reference_overlap, table_targets
from moses_integration.tokens import split_tokens

#: Proposals shown per kind of source in the report (the paper's Table 3 shows a handful).
EXAMPLES_PER_KIND = 4


def read_proposals(listing: Path) -> dict[str, list[Proposal]]:
    """``rescorer propose --list``'s TSV, by source, in the listing's order (the table's: by target).

    A reranked run's listing has two more columns (log p(f|e) and the p(e|f) column's ln), not read here.
    """
    found: dict[str, list[Proposal]] = {}
    for _, line in iter_text_lines(listing):
        kind, source, target, log_p = line.split("\t")[:4]
        found.setdefault(source, []).append(Proposal(kind, target, float(log_p)))
    return found


@dataclass(frozen=True)
class Usage:
    """What the 1-best translations of one test n-best list are made of."""

    sentences: int
    phrases: int  # PhrasePenalty0 summed
    proposed: int  # the indicator column summed
    sentences_using_proposals: int


def proposal_usage(nbest: Path, table_feature: str, indicator: int) -> Usage:
    """The phrases and proposed pairs of each sentence's first (1-best) hypothesis."""
    sentences = phrases = proposed = using = 0
    last = -1
    for entry in read_nbest(nbest):
        if entry.sent_id == last:
            continue
        last = entry.sent_id
        features = dict(entry.features)
        count = round(features[table_feature][indicator])
        sentences += 1
        phrases += round(features["PhrasePenalty0"][0])
        proposed += count
        using += count > 0
    return Usage(sentences, phrases, proposed, using)


@dataclass(frozen=True)
class TuningDecode:
    """One MERT iteration's decode of dev: the weights it decoded with, its n-best list, its 1-best's BLEU."""

    run: int
    iteration: int
    nbest: Path
    weights: Mapping[str, Sequence[float]]
    dev_bleu: float


def tuning_usage(decodes: Sequence[TuningDecode], table_feature: str, indicator: int) -> list[dict[str, object]]:
    """Per iteration: the indicator weight it decoded with, the dev 1-best's BLEU and its proposed pairs."""
    return [{"run": d.run, "iteration": d.iteration, "indicator_weight": d.weights[table_feature][indicator],
             "dev_bleu": d.dev_bleu, "usage": proposal_usage(d.nbest, table_feature, indicator).__dict__}
            for d in decodes if d.nbest.exists()]


def examples(proposals: Mapping[str, Sequence[Proposal]], table: Mapping[str, Sequence[str]], test_src: Path,
             per_kind: int = EXAMPLES_PER_KIND) -> list[dict[str, object]]:
    """A few sources of each kind as they first occur in the test text (two words or more, so
    that the table's choices and the RNN's can differ in more than one word): their proposals, best
    first as in the paper's Table 3, and, for a thin source, the table's targets."""
    chosen: dict[str, list[dict[str, object]]] = {}
    for _, line in iter_text_lines(test_src):
        words = split_tokens(line)
        for n in (3, 2):
            for i in range(len(words) - n + 1):
                gram = " ".join(words[i:i + n])
                found = proposals.get(gram)
                if not found or any(e["source"] == gram for e in chosen.get(found[0].kind, [])):
                    continue
                bucket = chosen.setdefault(found[0].kind, [])
                if len(bucket) < per_kind:
                    bucket.append({"kind": found[0].kind, "source": gram,
                                   "proposed": [[p.target, round(p.log_p, 2)]
                                                for p in sorted(found, key=lambda p: -p.log_p)],
                                   "table": list(table.get(gram, []))[:5]})
    return [e for kind in sorted(chosen) for e in chosen[kind]]


def evidence_document(listing: Path, table: Path, test_src: Path, test_ref: Path,
                      runs: Sequence[tuple[int, Path, Mapping[str, Sequence[float]]]],
                      table_feature: str, indicator: int, tuning: Sequence[TuningDecode] = ()) -> dict[str, object]:
    """The ``proposals`` part of the report: ``runs`` holds each tuned run's number, test n-best
    list and tuned weights; ``tuning`` the decodes of its tuning runs."""
    proposals = read_proposals(listing)
    lengths = {"proposed": Lengths(), "table": Lengths()}
    for source, props in proposals.items():
        for p in props:
            lengths["proposed"].add(source, p.target)
    own = table_targets(table, set(proposals), lengths["table"])
    overlap = reference_overlap(proposals, own, test_src, test_ref)
    kinds: dict[str, int] = {}
    for found in proposals.values():
        kinds[found[0].kind] = kinds.get(found[0].kind, 0) + len(found)
    return {
        "listing": str(listing),
        "proposals": sum(kinds.values()),
        "sources": len(proposals),
        "proposals_by_kind": kinds,
        "overlap": {kind: o.__dict__ for kind, o in sorted(overlap.items())},
        "lengths": {name: v.__dict__ for name, v in lengths.items()},
        "runs": [{"run": k, "indicator_weight": weights[table_feature][indicator],
                  "usage": proposal_usage(nbest, table_feature, indicator).__dict__}
                 for k, nbest, weights in runs if nbest.exists()],
        "tuning": tuning_usage(tuning, table_feature, indicator),
        "examples": examples(proposals, own, test_src),
    }


def _share(part: int, whole: int) -> str:
    return f"{part:,} of {whole:,} ({100 * part / whole:.1f}%)" if whole else "–"


def format_tuning_usage(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The lines on each tuning iteration's dev 1-best (:func:`tuning_usage`); none without rows."""
    if not rows:
        return []
    out = ["", "On dev, while MERT tuned: each iteration's decode (iteration 1 with the start weights, "
           "iteration k with those MERT chose after k − 1), the indicator weight it decoded with, the "
           "tokenised BLEU of its 1-best and the proposed pairs in that 1-best.", "",
           "| run | iteration | indicator weight | dev 1-best BLEU | proposed pairs in the dev 1-best | "
           "of all phrases used | sentences using one or more |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        u: Mapping[str, int] = row["usage"]  # type: ignore[assignment]
        out.append(f"| {row['run']} | {row['iteration']} | {row['indicator_weight']:.4g} | {row['dev_bleu']:.2f} | "
                   f"{u['proposed']:,} | {_share(u['proposed'], u['phrases'])} | "
                   f"{_share(u['sentences_using_proposals'], u['sentences'])} |")
    return out


def format_evidence(doc: Mapping[str, object], label: str) -> list[str]:
    """The report's section on the proposals row."""
    out = [f"## {label}: what the proposals are and what the tuned systems made of them", "",
           f"`rescorer propose` proposed {doc['proposals']:,} pairs for {doc['sources']:,} sources of the "
           f"dev+test text ({', '.join(f'{k}: {v:,}' for k, v in doc['proposals_by_kind'].items())}).", "",
           "| run | indicator weight | proposed pairs in the test 1-best | of all phrases used | "
           "sentences using one or more |", "|---|---|---|---|---|"]
    for run in doc["runs"]:  # type: ignore[attr-defined]
        u = run["usage"]
        using = _share(u["sentences_using_proposals"], u["sentences"])
        out.append(f"| {run['run']} | {run['indicator_weight']:.4g} | {u['proposed']:,} | "
                   f"{_share(u['proposed'], u['phrases'])} | {using} |")
    out += format_tuning_usage(doc["tuning"])  # type: ignore[arg-type]
    out += ["", "Proposed targets against the test reference: for every test sentence and every source "
            "n-gram of it that got proposals, whether each proposed target occurs (as whole tokens) in that "
            "sentence's tokenised reference, and the same for the table's own targets of those sources.", "",
            "| kind | (sentence, source) pairs | proposed targets in the reference | pairs with one in the "
            "reference | table targets in the reference | pairs with one in the reference |",
            "|---|---|---|---|---|---|"]
    for kind, o in doc["overlap"].items():  # type: ignore[attr-defined]
        out.append(f"| {kind} | {o['occurrences']:,} | {_share(o['proposed_in_ref'], o['proposed'])} | "
                   f"{_share(o['occurrences_with_proposal_in_ref'], o['occurrences'])} | "
                   f"{_share(o['table_in_ref'], o['table'])} | "
                   f"{_share(o['occurrences_with_table_in_ref'], o['occurrences'])} |")
    out += ["", "| pairs | count | source words (mean) | target words (mean) | target/source | targets shorter than "
            "their source |", "|---|---|---|---|---|---|"]
    for name, n in doc.get("lengths", {}).items():  # type: ignore[attr-defined]
        if n["pairs"]:
            out.append(f"| {name} | {n['pairs']:,} | {n['source_words'] / n['pairs']:.2f} | "
                       f"{n['target_words'] / n['pairs']:.2f} | {n['target_words'] / max(1, n['source_words']):.3f} | "
                       f"{_share(n['shorter_targets'], n['pairs'])} |")
    out += ["", "A few proposals (the first sources of each kind in the test text, as the paper's Table 3; "
            "log p(target | source) beside each):", "",
            "| kind | source | proposed | the table's |", "|---|---|---|---|"]
    for e in doc["examples"]:  # type: ignore[attr-defined]
        proposed = "; ".join(f"{t} ({lp})" for t, lp in e["proposed"])
        out.append(f"| {e['kind']} | {e['source']} | {proposed} | {'; '.join(e['table']) or '–'} |")
    return out
