"""How well proposals fit their source for each rerank weight, and the weights chosen.

For the text's n-grams that ``rescorer propose --for-text`` fills (missing and thin, as it chooses
them), the search and the reverse model run once; then for every (λ, μ) of a grid each source's
``per_source`` best candidates by ``log p(e|f) + λ log p(f|e) + μ log P(m | n)``
(rescorer.proposals.rerank) are measured by the two figures the weights are chosen on:

* **length**: the proposals' target words per source word against the table's own ratio (over
  its pairs, each line once);
* **in the reference**: of the proposed targets for *missing* sources, the share that occurs as
  whole tokens in the reference sentence of a sentence whose source holds them (and the same for
  thin sources); what table1's proposals evidence measures on the test set (5.9% for missing sources).

The length ratio is also given against the table's pairs *with the same source lengths* (each
proposal's source length n counts the table's mean target length for n): the table's overall ratio
is dominated by its one-word sources (2.6 target words each in Table 1's small-news table), while
the missing sources of a text are mostly 3 to 7 words long, whose table pairs have about 1 target
word per source word.

**The choice** (:func:`choose_point`): among the points whose length ratio is within
:data:`LENGTH_BAND` of the same-length table ratio, the one with most missing-source targets in
the reference (ties: the smaller weights); when none is within it, the most in the reference over
all, said so. Dev text only: on other text (test) the figures are measured, never chosen from.

``rescorer rerank-weights`` prints every point and the choice; Table 1's ``proposals-both/weights``
step runs it on dev before its proposals.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from infrastructure.errors import FileLineError
from infrastructure.files import display_name
from infrastructure.lines import iter_text_lines
from moses_integration.phrase_coverage import Lengths, Proposal, reference_overlap, table_targets
from moses_integration.phrase_table import no_lines_error
from moses_integration.tokens import split_tokens
from rescorer.model.checkpoint import Checkpoint
from rescorer.proposals.beam import default_rows_per_step, search_sources
from rescorer.proposals.lexical import read_word_table
from rescorer.proposals.propose import KindCounts, linked_candidates, with_reverse_scores
from rescorer.proposals.rerank import (
    RERANK_BEAM,
    LengthPrior,
    RerankWeights,
    best_candidates,
    preselect,
    reverse_scorer,
)
from rescorer.proposals.sources import SourceToFill, TableStatistics, choose_for_text, table_statistics, text_ngrams

#: How far (a share) a point's length ratio may be from the table's same-length ratio and be chosen.
LENGTH_BAND = 0.2
#: The longest n-gram of the text looked up (the table's longest source is usually shorter).
LONGEST_NGRAM = 20


def first_lines(path: Path, count: int | None, folder: Path) -> Path:
    """The first ``count`` lines of ``path`` (all with None; all too where it has fewer) as a file in ``folder``."""
    if count is None:
        return path
    with open(path, encoding="utf-8", newline="\n") as fh:
        lines = list(itertools.islice(fh, count))
    out = folder / path.name
    out.write_text("".join(lines), encoding="utf-8")
    return out


def check_parallel(text: Path, reference: Path) -> None:
    """The reference has a line for each line of the text: a reference of another text, or one a line
    short, would count targets against the wrong sentences without any sign of it. An empty text is
    refused too: with no sentence there is nothing to measure, and every point of the grid would tie at 0."""
    counts = [sum(1 for _ in iter_text_lines(path)) for path in (text, reference)]
    if counts[0] == 0:
        raise FileLineError(display_name(text), None, "the text holds no lines; there are no sentences to measure "
                            "the proposals on")
    if counts[0] != counts[1]:
        raise FileLineError(display_name(reference), min(counts) + 1,
                            f"the reference has {counts[1]} lines but the text {display_name(text)} has {counts[0]}")


def reference_copy(path: Path, count: int | None, folder: Path) -> Path:
    """The reference's first ``count`` lines, in a folder of its own (its name may be the text's)."""
    own = folder / "reference"
    own.mkdir(exist_ok=True)
    return first_lines(path, count, own)


@dataclass
class GridText:
    """The text's sources to fill, and what the measures compare them with."""

    path: Path  # the (first sentences of the) text
    reference: Path
    sources: list[SourceToFill]  # as propose --for-text chooses them
    own: dict[str, list[str]]  # each source's targets in the table (phrase_coverage.table_targets)
    table_ratio: float  # the table's target words per source word, over its pairs of those sources
    mean_target: np.ndarray  # the table's mean target length by source length


def read_grid_text(table: Path, forward: Checkpoint, text: Path, reference: Path, sentences: int | None,
                   thin_below: int, folder: Path, say: Callable[[str], None]) -> tuple[GridText, TableStatistics]:
    """The text's first sentences, the sources ``propose --for-text`` would fill, and the table's scan."""
    text = first_lines(text, sentences, folder)
    reference = reference_copy(reference, sentences, folder)
    ngrams = text_ngrams(text, LONGEST_NGRAM)
    scan = table_statistics(table, forward.src_vocab, forward.tgt_vocab, frozenset(ngrams))
    if scan.lines == 0:
        raise no_lines_error(table, "there are no pairs to measure proposals against")
    ngrams = {g: n for g, n in ngrams.items() if g.count(" ") < scan.max_source_words}
    choice = choose_for_text(ngrams, scan, forward.src_vocab, thin_below)
    sources = choice.to_fill
    if not sources:
        raise FileLineError(display_name(text), None, f"no n-gram of the text is a source propose --for-text would "
                            f"fill (missing or thin in {table}, every word known to the model): there are no "
                            "proposals to measure")
    table_lengths = Lengths()
    own = table_targets(table, {s.source for s in sources}, table_lengths)
    table_ratio = table_lengths.target_words / table_lengths.source_words
    counts = scan.length_counts()
    mean_target = (counts * range(counts.shape[1])).sum(axis=1) / counts.sum(axis=1).clip(min=1)
    read = sum(1 for _ in iter_text_lines(text))  # --sentences 100 of a 2-line text is 2
    say(f"{text.name}: {read} sentences; {len(sources)} sources to fill "
        f"({choice.count('missing')} missing, {choice.count('thin')} thin); table {table}: "
        f"{table_lengths.pairs} pairs, {table_ratio:.3f} target words per source word")
    return GridText(text, reference, sources, own, table_ratio, mean_target), scan


class Search:
    """The forward model's searches over the text's sources, and the figures of a choice of candidates."""

    def __init__(self, text: GridText, forward: Checkpoint, scan: TableStatistics, device: torch.device,
                 tables: tuple) -> None:
        self.text, self.forward, self.device = text, forward, device
        self.rows, self.max_words = default_rows_per_step(device), scan.max_target_words
        self.tables = tables  # (lex.f2e, lex.e2f), as propose links a target's words to its source's
        self.kinds = {"missing": KindCounts(), "thin": KindCounts(), "table": KindCounts()}

    def search(self, width: int, collect: bool) -> tuple[list, float]:
        """Each source's linked candidates of a beam of ``width`` (``collect``: every finished one), and
        the seconds the search took."""
        started = time.perf_counter()
        sources, vocab = self.text.sources, self.forward.src_vocab
        ids = [vocab.encode(split_tokens(s.source)) for s in sources]
        found = list(search_sources(self.forward.model, ids, width, max_words=self.max_words, rows_per_step=self.rows,
                                    collect=collect))
        seconds = time.perf_counter() - started
        return [linked_candidates(s, hyps, self.forward.tgt_vocab, self.tables, self.kinds[s.kind], None)
                for s, hyps in zip(sources, found, strict=True)], seconds

    def figures(self, chosen: list) -> tuple[str, float, float]:
        """The line that describes the proposals ``chosen`` (per source), their length ratio against the
        table's pairs of the same source lengths, and the share of missing sources' targets in the reference."""
        text = self.text
        proposals: dict[str, list] = {}
        lengths = Lengths()
        matched = 0.0  # the table's mean target length for each proposal's source length
        for s, picked in zip(text.sources, chosen, strict=True):
            for c in picked:
                proposals.setdefault(s.source, []).append(Proposal(s.kind, c.target, c.log_p))
                lengths.add(s.source, c.target)
                matched += text.mean_target[min(len(split_tokens(s.source)), len(text.mean_target) - 1)]
        overlap = reference_overlap(proposals, text.own, text.path, text.reference)
        ratio = lengths.target_words / max(1, lengths.source_words)
        same = matched / max(1, lengths.source_words)
        parts = [f"{lengths.pairs} proposals, {ratio:.3f} target/source words ({ratio / text.table_ratio:.0%} of "
                 f"the table's; the table's pairs of the same source lengths: {same:.3f}, "
                 f"{ratio / max(same, 1e-9):.0%})"]
        for kind in ("missing", "thin"):
            o = overlap.get(kind)
            if o is not None and o.proposed:
                parts.append(f"{kind}: {o.proposed_in_ref} of {o.proposed} in the reference "
                             f"({100 * o.proposed_in_ref / o.proposed:.1f}%)")
        missing = overlap.get("missing")
        share = missing.proposed_in_ref / missing.proposed if missing and missing.proposed else 0.0
        return "; ".join(parts), ratio / max(same, 1e-9), share


def scored_candidates(search: Search, reverse: Checkpoint, scan: TableStatistics, beam: int, mus: Sequence[float],
                      say: Callable[[str], None]) -> tuple[list, object]:
    """The collecting beam's candidates, those the reranking could keep for any μ of the grid scored by
    the reverse model (as propose's preselect chooses them), and the length prior; says the speeds."""
    sources = search.text.sources
    wide, seconds = search.search(beam, True)
    prior = LengthPrior(scan.length_counts(), search.max_words)
    union = []  # what propose scores in reverse for each μ, once for the union over the grid's μ
    for s, found in zip(sources, wide, strict=True):
        keep = {c.target: c for mu in mus
                for c in preselect(found, len(split_tokens(s.source)), prior, RerankWeights(0.0, mu), beam)}
        union.append(list(keep.values()))
    started = time.perf_counter()
    scorer = reverse_scorer(reverse, search.device, None, "fp32")
    scored = with_reverse_scores(sources, union, reverse, scorer)
    reverse_seconds = time.perf_counter() - started
    pairs = sum(len(found) for found in scored)
    found_per_source = sum(len(found) for found in wide) / max(1, len(wide))
    say(f"collecting beam {beam}: {len(sources) / seconds:.1f} sources/s, {found_per_source:.0f} candidates "
        f"per source; reverse model: {pairs} candidates in {reverse_seconds:.1f} s "
        f"({pairs / max(reverse_seconds, 1e-9):.0f} pairs/s); with both "
        f"{len(sources) / (seconds + reverse_seconds):.1f} sources/s")
    return scored, prior


@dataclass(frozen=True)
class GridPoint:
    """One (λ, μ) of the grid and its two figures."""

    reverse: float  # λ
    length: float  # μ
    ratio: float  # target/source words against the table's pairs of the same source lengths
    share: float  # of the missing sources' proposed targets, the share in the reference

    @property
    def within(self) -> bool:
        return abs(self.ratio - 1) <= LENGTH_BAND


def grid_points(search: Search, scored: list, prior, beam: int, per_source: int, lambdas: Sequence[float],
                mus: Sequence[float], say: Callable[[str], None]) -> list[GridPoint]:
    """Each (λ, μ)'s figures, said as they come."""
    points = []
    for lam in lambdas:
        for mu in mus:
            weights = RerankWeights(lam, mu)
            chosen = []
            for s, found in zip(search.text.sources, scored, strict=True):
                n = len(split_tokens(s.source))
                top = {c.target for c in preselect(found, n, prior, weights, beam)}
                chosen.append(best_candidates([c for c in found if c.target in top], n, prior, weights, per_source))
            line, ratio, share = search.figures(chosen)
            say(f"  λ {lam:g}, μ {mu:g}: {line}")
            points.append(GridPoint(lam, mu, float(ratio), float(share)))
    return points


def choose_point(points: Sequence[GridPoint]) -> tuple[GridPoint, str]:
    """The rule of the module doc, and the line that says what it chose and why."""
    within = [p for p in points if p.within]
    best = max(within or points, key=lambda p: (p.share, -p.reverse - p.length))
    how = "within" if within else "none within"
    return best, (f"chosen: λ {best.reverse:g}, μ {best.length:g} ({how} {LENGTH_BAND:.0%} of the length ratio of "
                  f"the table's pairs of the same source lengths; {100 * best.share:.1f}% of missing sources' "
                  f"proposed targets in the reference, length ratio {best.ratio:.0%} of the table's same-length pairs)")


#: The grid ``rescorer propose``'s defaults (rerank.DEFAULT_WEIGHTS) were chosen on (docs/proposals.md).
DEFAULT_REVERSE_GRID = (0.0, 0.25, 0.5, 1.0, 1.5)  # λ
DEFAULT_LENGTH_GRID = (0.0, 0.5, 1.0, 2.0)  # μ


@dataclass(frozen=True)
class RerankGrid:
    """The text's first ``sentences`` (None: all) and the (λ, μ) grid the weights are measured on."""

    sentences: int | None = 50
    reverse: tuple[float, ...] = DEFAULT_REVERSE_GRID  # λ
    length: tuple[float, ...] = DEFAULT_LENGTH_GRID  # μ


@dataclass(frozen=True)
class ChoiceInputs:
    """What the search reads beside the two RNNs: the system's (filtered) table and its word tables,
    and ``rescorer propose``'s choice of sources and proposals per source."""

    table: Path
    lex_e2f: Path
    lex_f2e: Path
    per_source: int
    thin_below: int


def grid_figures(forward: Checkpoint, reverse: Checkpoint, inputs: ChoiceInputs, text: Path, reference: Path,
                 grid: RerankGrid, say: Callable[[str], None], beam: int | None = None,
                 plain_beam: int | None = None) -> list[GridPoint]:
    """Every point's figures on ``text`` and its reference, with the collecting beam ``rescorer propose
    --reverse-model`` searches with (``beam``: another width), on the forward model's device; each
    line is said as it comes. ``plain_beam``: first the proposals of a plain beam of that width
    without a reverse model, as ``propose`` makes them without one."""
    beam = beam or RERANK_BEAM
    forward.model.eval()
    device = next(forward.model.parameters()).device
    tables = (read_word_table(inputs.lex_f2e), read_word_table(inputs.lex_e2f))  # a bad one stops before the search
    with tempfile.TemporaryDirectory() as tmp:
        found, scan = read_grid_text(inputs.table, forward, text, reference, grid.sentences, inputs.thin_below,
                                     Path(tmp), say)
        search = Search(found, forward, scan, device, tables)
        if plain_beam:
            plain, seconds = search.search(plain_beam, False)
            line, _, _ = search.figures([hyps[: inputs.per_source] for hyps in plain])
            say(f"plain beam {plain_beam} (no reverse model): {len(found.sources) / seconds:.1f} sources/s; {line}")
        scored, prior = scored_candidates(search, reverse, scan, beam, grid.length, say)
        return grid_points(search, scored, prior, beam, inputs.per_source, grid.reverse, grid.length, say)
