"""How well proposals fit their source, and the reranking weights that fit them best (issue 48).

Usage: python -m benchmarks.propose_weights --table FILTERED_TABLE --model RNN.pt --reverse-model REVERSE.pt
       --lex-e2f lex.e2f --lex-f2e lex.f2e --text DEV.tok.tc.en --reference DEV.tok.tc.fr
       [--sentences 100] [--beam 40] [--plain-beam 10] [--per-source 5]
       [--reverse 0,0.25,0.5,1,1.5,2] [--length 0,0.5,1,2] [--threads 2]

For the text's n-grams that ``rescorer propose --for-text`` fills (missing and thin, as it chooses
them), it runs the search and the reverse model once, then for every (λ, μ) of the grid takes
each source's ``--per-source`` best candidates by ``log p(e|f) + λ log p(f|e) + μ log P(m | n)``
(rescorer.proposals.rerank) and prints the two figures issue 48 sets targets on:

* **length**: the proposals' target words per source word against the table's own ratio (over
  its pairs, each line once);
* **in the reference**: of the proposed targets for *missing* sources, the share that occurs as
  whole tokens in the reference sentence of a sentence whose source holds them (and the same for
  thin sources); what issue 39's report measured on the test set (5.9% for missing sources).

The length ratio is also given against the table's pairs *with the same source lengths* (each
proposal's source length n counts the table's mean target length for n): the table's overall ratio
is dominated by its one-word sources (2.6 target words each in Table 1's small-news table), while
the missing sources of a text are mostly 3 to 7 words long, whose table pairs have about 1 target
word per source word.

It also prints today's proposals (no reverse model: the best ``--per-source`` of a ``--plain-beam``
search), and the search's speed at both beams. **The choice**: among the points whose length ratio
is within 20% of the same-length table ratio, the one with most missing-source targets in the
reference (ties: the smaller weights); when none is within 20%, the most in the reference over
all, said so. Run it on dev text only: ``--measure`` prints the points' figures on other text
(test) without choosing.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _first_lines(path: Path, count: int | None, folder: Path) -> Path:
    """The first ``count`` lines of ``path`` (all with None) as a file in ``folder``."""
    if count is None:
        return path
    with open(path, encoding="utf-8", newline="\n") as fh:
        lines = [next(fh) for _ in range(count)]
    out = folder / path.name
    out.write_text("".join(lines), encoding="utf-8")
    return out


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", type=Path, required=True, help="the (filtered) phrase table proposals complete")
    parser.add_argument("--model", required=True)
    parser.add_argument("--reverse-model", required=True)
    parser.add_argument("--lex-e2f", required=True)
    parser.add_argument("--lex-f2e", required=True)
    parser.add_argument("--text", type=Path, required=True, help="tokenised, truecased source text (dev)")
    parser.add_argument("--reference", type=Path, required=True, help="its tokenised, truecased reference")
    parser.add_argument("--sentences", type=int, default=None, help="the text's first N sentences [all]")
    parser.add_argument("--beam", type=int, default=None, help="the reranked search's beam [rerank.RERANK_BEAM]")
    parser.add_argument("--plain-beam", type=int, default=10, help="today's beam without a reverse model")
    parser.add_argument("--per-source", type=int, default=5)
    parser.add_argument("--thin-below", type=int, default=3)
    parser.add_argument("--reverse", default="0,0.25,0.5,1,1.5,2", help="λ values")
    parser.add_argument("--length", default="0,0.5,1,2", help="μ values")
    parser.add_argument("--measure", action="store_true",
                        help="print each point's figures and choose nothing (text other than dev: test)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args()


@dataclass
class _Text:
    """The text's sources to fill, and what the measures compare them with."""

    path: Path  # the (first sentences of the) text
    reference: Path
    sources: list  # rescorer.proposals.sources.SourceToFill, as propose --for-text chooses them
    own: dict  # each source's targets in the table (table1.proposal_evidence.table_targets)
    table_ratio: float  # the table's target words per source word, over its pairs of those sources
    mean_target: object  # numpy: the table's mean target length by source length


class _Search:
    """The forward model's searches over the text's sources, and the figures of a choice of candidates."""

    def __init__(self, args: argparse.Namespace, text: _Text, forward, scan, device) -> None:
        from rescorer.proposals.beam import default_rows_per_step
        from rescorer.proposals.lexical import read_word_table
        from rescorer.proposals.propose import KindCounts

        self.text, self.forward, self.device = text, forward, device
        self.rows, self.max_words = default_rows_per_step(device), scan.max_target_words
        self.tables = (read_word_table(args.lex_f2e), read_word_table(args.lex_e2f))
        self.kinds = {"missing": KindCounts(), "thin": KindCounts(), "table": KindCounts()}

    def search(self, width: int, collect: bool) -> tuple[list, float]:
        """Each source's linked candidates of a beam of ``width`` (``collect``: every finished one), and
        the seconds the search took."""
        from moses_integration.tokens import split_tokens
        from rescorer.proposals.beam import search_sources
        from rescorer.proposals.propose import linked_candidates

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
        from moses_integration.tokens import split_tokens
        from table1.proposal_evidence import Lengths, Proposal, reference_overlap

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


def _text(args: argparse.Namespace, folder: Path, forward) -> tuple[_Text, object]:
    """The text's first sentences, the sources ``propose --for-text`` would fill, and the table's scan."""
    from rescorer.proposals.sources import choose_for_text, scan_table, text_ngrams
    from table1.proposal_evidence import Lengths, table_targets

    text = _first_lines(args.text, args.sentences, folder)
    reference = _reference_copy(args.reference, args.sentences, folder)
    ngrams = text_ngrams(text, 20)
    scan = scan_table(args.table, forward.src_vocab, forward.tgt_vocab, frozenset(ngrams))
    ngrams = {g: n for g, n in ngrams.items() if g.count(" ") < scan.max_source_words}
    choice = choose_for_text(ngrams, scan, forward.src_vocab, args.thin_below)
    sources = choice.to_fill
    table_lengths = Lengths()
    own = table_targets(args.table, {s.source for s in sources}, table_lengths)
    table_ratio = table_lengths.target_words / table_lengths.source_words
    counts = scan.length_counts()
    mean_target = (counts * range(counts.shape[1])).sum(axis=1) / counts.sum(axis=1).clip(min=1)
    print(f"{text.name}: {args.sentences or 'all'} sentences; {len(sources)} sources to fill "
          f"({choice.count('missing')} missing, {choice.count('thin')} thin); table {args.table}: "
          f"{table_lengths.pairs} pairs, {table_ratio:.3f} target words per source word")
    return _Text(text, reference, sources, own, table_ratio, mean_target), scan


def _scored_candidates(search: _Search, reverse, scan, beam: int, mus: list[float]) -> tuple[list, object]:
    """The collecting beam's candidates, those the reranking could keep for any μ of the grid scored by
    the reverse model (as propose's preselect chooses them), and the length prior; prints the speeds."""
    from moses_integration.tokens import split_tokens
    from rescorer.proposals.propose import with_reverse_scores
    from rescorer.proposals.rerank import LengthPrior, RerankWeights, preselect, reverse_scorer

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
    print(f"collecting beam {beam}: {len(sources) / seconds:.1f} sources/s, {found_per_source:.0f} candidates "
          f"per source; reverse model: {pairs} candidates in {reverse_seconds:.1f} s "
          f"({pairs / max(reverse_seconds, 1e-9):.0f} pairs/s); with both "
          f"{len(sources) / (seconds + reverse_seconds):.1f} sources/s")
    return scored, prior


def _grid(search: _Search, scored: list, prior, beam: int, per_source: int, lambdas: list[float],
          mus: list[float]) -> list[tuple]:
    """Each (λ, μ)'s figures, printed; returned as (within 20%, missing share, −λ−μ, λ, μ, length ratio)."""
    from moses_integration.tokens import split_tokens
    from rescorer.proposals.rerank import RerankWeights, best_candidates, preselect

    points = []
    for lam in lambdas:
        for mu in mus:
            weights = RerankWeights(lam, mu)
            chosen = []
            for s, found in zip(search.text.sources, scored, strict=True):
                n = len(split_tokens(s.source))
                top = {c.target for c in preselect(found, n, prior, weights, beam)}
                chosen.append(best_candidates([c for c in found if c.target in top], n, prior, weights, per_source))
            line, matched, share = search.figures(chosen)
            print(f"  λ {lam:g}, μ {mu:g}: {line}")
            points.append((abs(matched - 1) <= 0.2, share, -lam - mu, lam, mu, matched))
    return points


def _print_choice(points: list[tuple]) -> None:
    """The rule of the module doc: within 20% of the same-length ratio, most in the reference."""
    within = [p for p in points if p[0]]
    best = max(within or points, key=lambda p: (p[1], p[2]))
    how = "within" if within else "none within"
    print(f"chosen: λ {best[3]:g}, μ {best[4]:g} ({how} 20% of the length ratio of the table's pairs of the "
          f"same source lengths; {100 * best[1]:.1f}% of missing sources' proposed targets in the reference, "
          f"length ratio {best[5]:.0%} of the table's same-length pairs)")


def main() -> None:
    args = _arguments()

    import torch

    from neural.device import select_device
    from rescorer.model.checkpoint import load_checkpoint
    from rescorer.proposals.rerank import RERANK_BEAM

    torch.set_num_threads(args.threads)
    device = select_device(args.device)
    beam = args.beam or RERANK_BEAM
    forward, reverse = load_checkpoint(args.model), load_checkpoint(args.reverse_model)
    forward.model.to(device).eval()
    with tempfile.TemporaryDirectory() as tmp:
        text, scan = _text(args, Path(tmp), forward)
        search = _Search(args, text, forward, scan, device)
        plain, seconds = search.search(args.plain_beam, False)
        line, _, _ = search.figures([found[: args.per_source] for found in plain])
        print(f"plain beam {args.plain_beam} (no reverse model): {len(text.sources) / seconds:.1f} sources/s; {line}")
        mus = _floats(args.length)
        scored, prior = _scored_candidates(search, reverse, scan, beam, mus)
        points = _grid(search, scored, prior, beam, args.per_source, _floats(args.reverse), mus)
        if len(points) > 1 and not args.measure:
            _print_choice(points)


def _reference_copy(path: Path, count: int | None, folder: Path) -> Path:
    """The reference's first ``count`` lines, in a folder of its own (its name may be the text's)."""
    own = folder / "reference"
    own.mkdir(exist_ok=True)
    return _first_lines(path, count, own)


if __name__ == "__main__":
    main()
