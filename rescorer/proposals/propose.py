"""``rescorer propose``: a phrase table completed with the targets the RNN Encoder–Decoder proposes.

The paper's conclusion names the step: "replace the whole, or a part of the phrase table by
letting the RNN Encoder–Decoder propose target phrases". A run goes:

1. the word tables and the table are read once and checked (:mod:`rescorer.proposals.lexical`,
   :func:`rescorer.proposals.sources.table_statistics`), and the sources to fill are chosen, before any
   search;
2. the batched beam search (:mod:`rescorer.proposals.beam`) proposes targets for those sources,
   batch by batch, streamed in the table's sort order; a proposal the table already holds, one
   with ``[UNK]``, one cut before ``</s>`` and one the word tables cannot link are dropped; with a
   reverse model the remaining candidates are reranked by both directions and the table's length
   prior (:mod:`rescorer.proposals.rerank`), otherwise the beam's order stands; each batch's
   proposals are appended to the listing and made durable before the next batch;
3. the table's lines, byte for byte, and the listing's proposed lines are merged into sorted order
   (what ``LC_ALL=C sort`` gives and Moses' training writes);
4. that table goes through ``rescore-phrase-table``'s own pipeline
   (:func:`rescorer.pipeline.rescore.rescore`), which appends the RNN and
   unknown-word columns to every line, with a reverse model its p_RNN(f|e) column too (so the
   table carries the RNN both ways, as ``rescore-phrase-table --reverse-model`` writes it), and,
   for the proposed lines, an indicator column exp(1) (1 elsewhere), so that Moses' feature counts
   the proposals a translation uses;
5. the result is renamed onto the output.

Every step works in ``.OUTPUT.propose/`` beside the output (:mod:`rescorer.proposals.work`): a
failed or killed run keeps it, ``--resume`` goes on from its last durable batch (or phase) to the
same bytes, and it goes once the output is in place. Nothing holds the table in memory: the search
reads its own stream of sources, and the merge streams the table and the listing side by side.
docs/proposals.md says how each column of a proposed line is filled, and why.
"""

from __future__ import annotations

import array
import itertools
import math
import os
import shutil
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from tqdm import tqdm

from infrastructure.files import atomic_output, atomic_path, display_name, exclusive_use
from infrastructure.interrupts import Interrupted
from infrastructure.lines import iter_text_lines
from infrastructure.progress import progress_bar
from infrastructure.resume_record import content_identity, file_identity, options_record
from moses_integration.phrase_table import SEPARATOR, iter_lines, no_lines_error
from moses_integration.tokens import split_tokens
from neural.device import autocast_dtype, scoring_precision, select_device
from neural.vocab import UNK_ID
from rescorer.model.checkpoint import Checkpoint
from rescorer.pipeline.columns.rnn import LOW_OVERLAP_PERCENT
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.rescore import RescoreOptions, RescoreSummary, rescore
from rescorer.pipeline.scoring import PairScorer
from rescorer.pipeline.train_or_load import Models
from rescorer.proposals.beam import default_rows_per_step, search_sources
from rescorer.proposals.lexical import WordTable, lexical_scores, read_word_table
from rescorer.proposals.rerank import (
    DEFAULT_WEIGHTS,
    Candidate,
    LengthPrior,
    RerankWeights,
    best_candidates,
    forward_shares,
    preselect,
    proposed_phrase_probabilities,
    reverse_log_probs,
    reverse_scorer,
)
from rescorer.proposals.sources import (
    KINDS,
    MOSES_COLUMNS,
    Choice,
    Skipped,
    SourceToFill,
    TableStatistics,
    choose_for_text,
    source_key,
    table_sources,
    table_statistics,
    text_ngrams,
)
from rescorer.proposals.work import PROGRESS_VERSION as WORK_VERSION
from rescorer.proposals.work import ProposeWork


@dataclass
class ProposeOptions:
    for_text: str | None = None  # None: every source of the table
    thin_below: int = 3  # a text n-gram with fewer targets in the table is thin
    max_source_words: int | None = None  # n-grams of --for-text up to this length [the table's longest source]
    beam: int = 10
    per_source: int = 5  # proposals kept per source (the best new ones among the beam's)
    max_target_words: int | None = None  # [the table's longest target]
    lex_e2f: str | None = None  # [lex.e2f beside the table]
    lex_f2e: str | None = None
    list_path: str | None = None  # TSV of the proposals: kind, source, target, log p (+ 2 columns when reranked)
    rerank: RerankWeights = DEFAULT_WEIGHTS  # with a reverse model: λ and μ (rescorer.proposals.rerank)
    rows_per_step: int | None = None  # hypotheses per decoder step [CPU 4096, GPU 16384]
    resume: bool = False  # continue the run kept in .OUTPUT.propose/ (rescorer.proposals.work)
    # The rescoring pipeline's options; its device and progress bar serve the search too.
    rescore: RescoreOptions = field(default_factory=RescoreOptions)


@dataclass
class KindCounts:
    """The search's outcome for one kind of source."""

    sources: int = 0  # sources searched
    filled: int = 0  # sources that got at least one proposal
    proposals: int = 0
    found_in_table: int = 0  # finished beam targets the table already holds for the source
    dropped: int = 0  # beam targets with [UNK], empty, or cut before </s>
    unlinked: int = 0  # new targets none of whose words the word tables link to a source word


@dataclass
class ProposeSummary:
    scan: TableStatistics
    phrase_probabilities: tuple[float, float]
    reranked: RerankWeights | None = None  # None: the beam's order and the constant columns (no reverse model)
    kinds: dict[str, KindCounts] = field(default_factory=lambda: {k: KindCounts() for k in KINDS})
    choice: Choice | None = None
    skipped: Skipped = field(default_factory=Skipped)  # sources with a word outside the source shortlist
    search_seconds: float = 0.0
    rescore: RescoreSummary | None = None
    seconds: float = 0.0

    @property
    def proposals(self) -> int:
        return sum(k.proposals for k in self.kinds.values())

    @property
    def searched(self) -> int:
        return sum(k.sources for k in self.kinds.values())

    def report(self) -> str:
        p_fe, p_ef = self.phrase_probabilities
        rate = self.searched / self.search_seconds if self.search_seconds > 0 else 0.0
        scan = self.scan
        table = f"table: {scan.lines} lines, {scan.sources} sources (longest {scan.max_source_words} words)"
        if self.reranked is None:
            lines = [f"{table}; proposed lines get p(f|e) {p_fe:.6g}, p(e|f) {p_ef:.6g} (geometric means over "
                     f"{self.scan.singletons or self.scan.lines} {'singleton ' if self.scan.singletons else ''}pairs)"]
        else:
            lines = [f"{table}; candidates reranked by {self.reranked.describe()}; proposed lines get p(f|e) from the "
                     f"reverse model, p(e|f) from the forward model normalised over each source's candidates"]
        if self.choice is not None:
            c = self.choice
            lines.append(f"text: {c.ngrams} distinct n-grams, {c.covered} covered, {c.count('thin')} thin, "
                         f"{c.count('missing')} missing")
        if self.skipped.count:
            lines.append(f"skipped {self.skipped.count} sources with a word outside the model's source shortlist "
                         f"(e.g. {self.skipped.example!r}): the network would read [UNK] there")
        for kind, k in self.kinds.items():
            if k.sources:
                lines.append(f"{kind}: {k.sources} sources searched, {k.filled} got proposals, {k.proposals} "
                             f"proposals; {k.found_in_table} beam targets already in the table, {k.dropped} dropped "
                             f"([UNK], empty or unfinished), {k.unlinked} without a word link in the lex tables")
        lines.append(f"search: {self.searched} sources in {self.search_seconds:.1f} s ({rate:.1f} sources/s)")
        if self.rescore is not None:
            lines.append(self.rescore.report())
        lines.append(f"wrote {self.scan.lines + self.proposals} lines ({self.proposals} proposed) in "
                     f"{self.seconds:.1f} s")
        return "\n".join(lines)


def lex_paths(table: str | os.PathLike, e2f: str | None = None, f2e: str | None = None) -> tuple[str, str]:
    """(lex.e2f, lex.f2e): those given, else those in the table's folder, where ``train-model.perl`` writes them."""
    folder = Path(table).resolve().parent
    return e2f or str(folder / "lex.e2f"), f2e or str(folder / "lex.f2e")


def check_propose_paths(table: str, output: str, opts: ProposeOptions) -> None:
    """Refuse paths that cannot work, before anything is read."""
    if table == "-" or output == "-":
        raise RescoreError("propose reads the table twice and renames its output into place: give files, not -")
    if not Path(table).is_file():
        raise RescoreError(f"input {table} is not a file")
    if Path(table).resolve() == Path(output).resolve():
        raise RescoreError(f"refusing to overwrite the input {table}; choose another output path")
    for path in (output, opts.list_path):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise RescoreError(f"output folder {Path(path).parent} does not exist")
    if opts.for_text is not None and not Path(opts.for_text).is_file():
        raise RescoreError(f"--for-text {opts.for_text} is not a file")
    check_beam_keeps(opts.per_source, opts.beam)


def check_beam_keeps(per_source: int, beam: int, option: str = "--beam") -> None:
    """Refuse ``--per-source`` above the beam's width (given as ``option``): a beam keeps no more
    hypotheses than it is wide, so the proposals asked for could never all be there, and a run
    would look as if the model had found nothing worth proposing."""
    if per_source > beam:
        raise RescoreError(f"--per-source {per_source} is more than the beam keeps ({option} {beam})")


def propose(table: str, output: str, checkpoint: Checkpoint, opts: ProposeOptions,
            reverse: Checkpoint | None = None) -> ProposeSummary:
    """Write ``output``: ``table`` completed with proposals and its new columns (:func:`new_columns`) (module doc).

    ``reverse``: a model of p(f|e) (its source side reads the table's targets); with it the beam's
    candidates are reranked and the phrase probabilities come from the two models
    (:mod:`rescorer.proposals.rerank`), without it the beam's best are proposed with constant ones.

    The run works in ``.OUTPUT.propose/`` beside the output (:mod:`rescorer.proposals.work`): kept when
    it fails or is killed, continued by ``opts.resume``, removed once the output is in place.
    """
    started = time.monotonic()
    check_propose_paths(table, output, opts)
    models = Models(checkpoint, reverse)  # refuses a reverse model as the forward one: it would propose sources
    device = select_device(opts.rescore.device)
    rows = opts.rows_per_step or default_rows_per_step(device)
    work = ProposeWork(output)
    identity = _run_identity(table, checkpoint, opts, device, rows, reverse)
    with exclusive_use(output):
        state = work.start(identity, opts.resume)  # before any input is read: a refusal costs nothing
        try:
            summary = _run(table, output, models, opts, device, rows, work, identity, state)
        except KeyboardInterrupt as exc:
            work.discard_if_empty()
            if work.folder.exists():  # a record says what in it is done: say where, and how to go on
                raise Interrupted(f"the work done so far kept in {work.folder} (run again with --resume to "
                                  "continue)") from exc
            raise
        except BaseException:
            work.discard_if_empty()
            raise
        work.remove()
    summary.seconds = time.monotonic() - started
    return summary


#: Options a resumed run may change: where the listing's copy goes, ``resume`` itself, and the rescoring's
#: options, which its own progress record checks (the device type and precision they resolve to, which the
#: search uses too, are recorded here).
PROPOSE_MAY_DIFFER = frozenset({"list_path", "resume", "rescore"})


def _run_identity(table: str, checkpoint: Checkpoint, opts: ProposeOptions, device: torch.device, rows: int,
                  reverse: Checkpoint | None) -> dict:
    """What decides the output's bytes: the input files and every option but :data:`PROPOSE_MAY_DIFFER`
    (files by their identity). A resume must have the same.

    The device type and ``rows`` decide the search's batches, hence the shapes of its matmuls and
    the last bits of its scores. The options of ``--for-text`` count only with it, λ and μ only with a
    reverse model (None otherwise, as records that lack them read).
    """
    e2f, f2e = lex_paths(table, opts.lex_e2f, opts.lex_f2e)
    with_text = opts.for_text is not None
    options = options_record(opts, PROPOSE_MAY_DIFFER, recorded_as={
        "lex_e2f": _identity_if_present(e2f), "lex_f2e": _identity_if_present(f2e),
        "for_text": _identity_if_present(opts.for_text), "rows_per_step": rows,
        "thin_below": opts.thin_below if with_text else None,
        "max_source_words": opts.max_source_words if with_text else None,
        "rerank": asdict(opts.rerank) if reverse is not None else None,
    })
    options.update(device=device.type, precision=scoring_precision(opts.rescore.precision))
    if reverse is not None:
        options.update(reverse_model=_identity_if_present(getattr(reverse, "path", None), content_identity))
    return {"version": WORK_VERSION, "input": file_identity(table),
            "model": _identity_if_present(getattr(checkpoint, "path", None), content_identity), "options": options}


def _identity_if_present(path: str | os.PathLike | None, identity=file_identity) -> dict | None:
    """A file's identity (a model's by its content), None without one (a missing word table is reported by
    its reader, at its line)."""
    return identity(path) if path is not None and os.path.isfile(path) else None


def _run(table: str, output: str, models: Models, opts: ProposeOptions,
         device: torch.device, rows: int, work: ProposeWork, identity: dict, state: dict) -> ProposeSummary:
    """The phases from ``state`` on: search (batch by batch), merge, rescoring, and the renames into place."""
    checkpoint, reverse = models.forward, models.reverse
    e2f, f2e = lex_paths(table, opts.lex_e2f, opts.lex_f2e)
    word_tables = (read_word_table(f2e), read_word_table(e2f))
    summary, sources, total = _choose_sources(table, checkpoint, opts, reverse)
    checkpoint.model.to(device).eval()
    rerank = None
    if reverse is not None:
        max_words = opts.max_target_words or summary.scan.max_target_words
        prior = LengthPrior(summary.scan.length_counts(), max(max_words, summary.scan.max_target_words))
        scorer = reverse_scorer(reverse, device, search_dtype(opts), scoring_precision(opts.rescore.precision))
        rerank = _Rerank(reverse, scorer, prior, opts.rerank)
        summary.reranked = opts.rerank
    summary.kinds.update({kind: KindCounts(**counts) for kind, counts in state["kinds"].items()})
    summary.search_seconds = state["search_seconds"]
    if state["phase"] == "search":
        max_words = opts.max_target_words or summary.scan.max_target_words
        with progress_bar(total=total, initial=state["sources_done"], unit="src", desc="proposing",
                          show=opts.rescore.progress, dynamic_ncols=True) as bar:
            _search(sources, (checkpoint, rerank), opts, rows, max_words, word_tables, summary, work, identity, state,
                    bar)
        state.update(phase="searched", skipped=asdict(summary.skipped))
        work.record(identity, state)
    elif state["skipped"] is not None:
        summary.skipped = Skipped(**state["skipped"])  # counted while the search streamed the sources
    if state["phase"] != "merged" or not (work.merged.exists() and work.flagged.exists()):
        _merge(table, work, summary.phrase_probabilities, word_tables, reranked=rerank is not None)
        state["phase"] = "merged"
        work.record(identity, state)
    rescore_opts = replace(opts.rescore, flag_lines=np.load(work.flagged), num_scores=len(MOSES_COLUMNS), resume=True)
    summary.rescore = rescore(str(work.merged), str(work.table), models, rescore_opts)
    if opts.list_path is not None:
        with atomic_path(opts.list_path) as tmp:
            shutil.copyfile(work.listing, tmp)  # a copy: the folder stays whole until the output is in place
    with atomic_path(output) as tmp:
        os.replace(work.table, tmp)
    return summary


def _choose_sources(table: str, checkpoint: Checkpoint, opts: ProposeOptions, reverse: Checkpoint | None = None,
                    ) -> tuple[ProposeSummary, Iterable[SourceToFill], int]:
    """The table scan and the sources to fill, in sort order, with how many there will be."""
    ngrams: dict[str, int] = {}
    if opts.for_text is not None:
        # The n-gram length is the table's longest source, which only the scan knows: read the
        # text with a generous bound first (phrase tables rarely go beyond 7 words) and cut after.
        ngrams = text_ngrams(opts.for_text, opts.max_source_words or 20)
    reverse_vocabs = (reverse.src_vocab, reverse.tgt_vocab) if reverse is not None else None
    scan = table_statistics(table, checkpoint.src_vocab, checkpoint.tgt_vocab, frozenset(ngrams), reverse_vocabs)
    if scan.lines == 0:
        raise no_lines_error(table, "there are no sources to propose targets for")
    _warn_low_overlap(table, scan, checkpoint, reverse)
    summary = ProposeSummary(scan, scan.phrase_probabilities())
    if opts.for_text is None:
        return summary, table_sources(table, checkpoint.src_vocab, summary.skipped), scan.sources
    longest = opts.max_source_words or scan.max_source_words
    ngrams = {g: n for g, n in ngrams.items() if g.count(" ") < longest}
    summary.choice = choose_for_text(ngrams, scan, checkpoint.src_vocab, opts.thin_below)
    summary.skipped = summary.choice.skipped
    return summary, summary.choice.to_fill, len(summary.choice.to_fill)


def _warn_low_overlap(table: str, scan: TableStatistics, checkpoint: Checkpoint,
                      reverse: Checkpoint | None = None) -> None:
    """Warn when a model's shortlists miss most of the table's words (a model for another table?).

    A warning, as ``rescore-phrase-table``'s for its first chunk: a share below half is a sign, not a
    proof (a small shortlist, a table of names and numbers), and what it costs is already handled
    source by source (one with a word outside the source shortlist gets no proposals, and is counted).
    The mistake that is certain, a model of the other direction, is refused by the direction saved with
    it. A reverse model's source shortlist must hold the table's target words and its target shortlist
    the source words.
    """
    checks = [(checkpoint, "model", "source", "source", scan.source_known, scan.source_tokens),
              (checkpoint, "model", "target", "target", scan.target_known, scan.target_tokens)]
    if reverse is not None:
        checks += [(reverse, "--reverse-model", "source", "target", scan.reverse_target_known, scan.target_tokens),
                   (reverse, "--reverse-model", "target", "source", scan.reverse_source_known, scan.source_tokens)]
    for model, which, side, table_side, known, tokens in checks:
        share = known / tokens if tokens else 0.0
        if scan.lines and 100 * share < LOW_OVERLAP_PERCENT:
            where = getattr(model, "path", None) or f"the {which}"
            warnings.warn(f"only {100 * share:.1f}% of the {table_side} words of {display_name(table)} are in the "
                          f"{side} shortlist of {where} ({which}); is it trained for this table's languages and "
                          "tokenisation?", stacklevel=2)


@dataclass(frozen=True)
class _Rerank:
    """What reranking needs during the search: the reverse model, its scorer, the prior and the weights."""

    reverse: Checkpoint
    scorer: PairScorer
    prior: LengthPrior
    weights: RerankWeights


def _search(sources: Iterable[SourceToFill], models: tuple[Checkpoint, _Rerank | None], opts: ProposeOptions,
            rows: int, max_words: int, tables: tuple[WordTable, WordTable], summary: ProposeSummary,
            work: ProposeWork, identity: dict, state: dict, bar: tqdm) -> None:
    """Search the sources not searched yet, one batch at a time, each made durable before the next.

    The sources already searched are skipped: they come first, in the same order, and each batch
    was a whole number of ``rows // beam`` sources, so the batches that follow are an
    uninterrupted run's.
    """
    per_batch = max(1, rows // opts.beam)
    pending = itertools.islice(iter(sources), state["sources_done"], None)
    with work.open_listing(state["listing_bytes"]) as listing:
        while batch := list(itertools.islice(pending, per_batch)):
            started = time.monotonic()
            lines = _search_batch(batch, models, opts, rows, max_words, tables, summary)
            summary.search_seconds += time.monotonic() - started
            state.update(sources_done=state["sources_done"] + len(batch), search_seconds=summary.search_seconds)
            work.commit_batch(listing, "".join(lines).encode("utf-8"), identity, state, summary.kinds)
            bar.update(len(batch))


def search_dtype(opts: ProposeOptions) -> torch.dtype | None:
    """The beam search's matmul dtype: ``--precision`` as scoring reads it (``auto`` is exact fp32;
    ``bf16`` runs the matmuls on bf16 units, states and log-softmax in fp32, as scoring does)."""
    return autocast_dtype(torch.device("cpu"), scoring_precision(opts.rescore.precision))


def _search_batch(batch: list[SourceToFill], models: tuple[Checkpoint, _Rerank | None], opts: ProposeOptions,
                  rows: int, max_words: int, tables: tuple[WordTable, WordTable], summary: ProposeSummary) -> list[str]:
    """The listing lines of one batch's proposals, sorted as the merge needs them; the counts go to ``summary``.

    A line is kind, source, target, log p(e|f); when reranked, also log p(f|e) and the ln of the
    p(e|f) column (the candidate's share of its source's finished candidates).
    """
    checkpoint, rerank = models
    model, src_vocab, tgt_vocab = checkpoint.model, checkpoint.src_vocab, checkpoint.tgt_vocab
    ids = [src_vocab.encode(split_tokens(s.source)) for s in batch]
    results = list(search_sources(model, ids, opts.beam, max_words=max_words, rows_per_step=rows,
                                  amp_dtype=search_dtype(opts), collect=rerank is not None))
    per_source = [linked_candidates(to_fill, hypotheses, tgt_vocab, tables, summary.kinds[to_fill.kind],
                                     None if rerank else opts.per_source)
                  for to_fill, hypotheses in zip(batch, results, strict=True)]
    if rerank is not None:
        per_source = _reranked(batch, per_source, rerank, opts.beam, opts.per_source)
    lines: list[str] = []
    for to_fill, chosen in zip(batch, per_source, strict=True):
        counts = summary.kinds[to_fill.kind]
        counts.filled += bool(chosen)
        counts.proposals += len(chosen)
        lines.extend(_listing_line(to_fill, c, reranked=rerank is not None)
                     for c in sorted(chosen, key=lambda c: source_key(c.target)))
    return lines


def linked_candidates(to_fill: SourceToFill, hypotheses: list, tgt_vocab, tables: tuple[WordTable, WordTable],
                       counts: KindCounts, keep: int | None) -> list[Candidate]:
    """The beam's targets that may be proposed, in the beam's order: finished, without ``[UNK]``, new to
    the table and linked by the word tables; at most ``keep`` of them (None: all).

    Each carries its share of the source's finished candidates (the p(e|f) column when reranked).
    """
    counts.sources += 1
    finished = [h for h in hypotheses if h.finished]
    shares = dict(zip((id(h) for h in finished), forward_shares([h.log_p for h in finished]), strict=True))
    source_words = split_tokens(to_fill.source)
    linked: list[Candidate] = []
    for h in hypotheses:
        if not h.finished or not h.ids or UNK_ID in h.ids:
            counts.dropped += 1
            continue
        target = " ".join(tgt_vocab.decode(h.ids))
        if target in to_fill.targets:
            counts.found_in_table += 1
            continue
        if keep is not None and len(linked) == keep:
            continue
        # Moses' extraction never makes a pair without a word link (and its compact tables
        # refuse an empty alignment): a target the word tables cannot link to the source goes.
        if lexical_scores(source_words, target.split(" "), *tables).alignment:
            linked.append(Candidate(target, h.log_p, math.nan, shares[id(h)]))
        else:
            counts.unlinked += 1
    return linked


def _reranked(batch: list[SourceToFill], candidates: list[list[Candidate]], rerank: _Rerank, width: int,
              per_source: int) -> list[list[Candidate]]:
    """Each source's best ``per_source`` candidates by both directions and the length prior, among the
    ``width`` best by the forward model and the prior (:func:`rescorer.proposals.rerank.preselect`)."""
    chosen = [preselect(found, len(split_tokens(to_fill.source)), rerank.prior, rerank.weights, width)
              for to_fill, found in zip(batch, candidates, strict=True)]
    scored = with_reverse_scores(batch, chosen, rerank.reverse, rerank.scorer)
    return [best_candidates(found, len(split_tokens(to_fill.source)), rerank.prior, rerank.weights, per_source)
            for to_fill, found in zip(batch, scored, strict=True)]


def with_reverse_scores(batch: list[SourceToFill], candidates: list[list[Candidate]], reverse: Checkpoint,
                        scorer: PairScorer) -> list[list[Candidate]]:
    """The candidates with log p(f|e) filled in: the reverse model scores every candidate of the batch
    in one call of the pipeline's scorer."""
    pairs = [(to_fill.source, c.target) for to_fill, found in zip(batch, candidates, strict=True) for c in found]
    scores = iter(reverse_log_probs(scorer, reverse, pairs).tolist())
    return [[replace(c, log_p_reverse=next(scores)) for c in found] for found in candidates]


def _listing_line(to_fill: SourceToFill, c: Candidate, *, reranked: bool) -> str:
    if not reranked:
        return f"{to_fill.kind}\t{to_fill.source}\t{c.target}\t{c.log_p:.6f}\n"
    return f"{to_fill.kind}\t{to_fill.source}\t{c.target}\t{c.log_p:.6f}\t{c.log_p_reverse:.6f}\t{c.log_share:.6f}\n"


def _merge(table: str, work: ProposeWork, phrase_probabilities: tuple[float, float],
           tables: tuple[WordTable, WordTable], *, reranked: bool) -> None:
    """The table and the listing's proposals in sorted order into ``work.merged``, their line numbers into
    ``work.flagged``; each written atomically, so a kill here leaves the search's result as it was."""
    with atomic_output(work.merged, zlib_level=1) as out:
        lines = proposed_lines(work.listing, phrase_probabilities, tables, reranked=reranked)
        flagged = merge_proposals(table, lines, out)
    with atomic_path(work.flagged) as tmp, open(tmp, "wb") as fh:
        np.save(fh, flagged)


def proposed_lines(listing: Path, phrase_probabilities: tuple[float, float],
                   tables: tuple[WordTable, WordTable], *, reranked: bool = False) -> Iterator[bytes]:
    """The Moses line of each proposal of the listing (kind, source, target, log p, ...), in its order.

    The listing is the search's record; a line's columns follow from its pair: the phrase
    probabilities are the run's constants, or when ``reranked`` the two models' (the listing's
    log p(f|e) and share, :func:`rescorer.proposals.rerank.proposed_phrase_probabilities`), the lexical
    weights and the alignment the word tables' (docs/proposals.md). The source may hold a tab
    (Moses splits phrases on it), the target never does (it is the shortlist's words joined by
    spaces), so the fields are cut from the right.
    """
    p_fe, p_ef = phrase_probabilities
    for _, line in iter_text_lines(listing):
        if reranked:
            kind_and_source, target, log_p, log_reverse, log_share = line.rsplit("\t", 4)
            scores = Candidate(target, float(log_p), float(log_reverse), float(log_share))
            p_fe, p_ef = proposed_phrase_probabilities(scores)
        else:
            kind_and_source, target, _ = line.rsplit("\t", 2)
        source = kind_and_source.split("\t", 1)[1]
        lex = lexical_scores(split_tokens(source), target.split(" "), *tables)
        yield (f"{source} ||| {target} ||| {p_fe:.6g} {lex.source_given_target:.6g} {p_ef:.6g} "
               f"{lex.target_given_source:.6g} ||| {lex.alignment_field()}").encode()


def merge_proposals(table: str, proposals: Iterable[bytes], out: BinaryIO) -> np.ndarray:
    """Write the table's lines (byte for byte) and the proposed lines in sorted order to ``out``.

    Both streams are sorted as ``LC_ALL=C sort`` sorts lines; a proposed line goes before the first
    table line that sorts after it. Comparing a proposal's ``source ||| target ||| `` with a whole
    table line decides as comparing the two lines would: phrases hold no ``|||`` (Moses escapes
    ``|``), so the first difference falls inside that prefix. Returns the 1-based output line
    numbers of the proposed lines (what the indicator column flags).
    """
    flagged = array.array("q")
    queue = _InOrder(iter(proposals))
    line_no = 0
    for _, raw in iter_lines(table):
        while queue.line is not None and queue.key < raw:
            line_no += 1
            out.write(queue.line + b"\n")
            flagged.append(line_no)
            queue.advance()
        if queue.line is not None and raw.startswith(queue.key):
            raise RuntimeError(f"a proposal repeats a pair of the table: {queue.line[:80]!r}")
        line_no += 1
        out.write(raw + b"\n")
    while queue.line is not None:
        line_no += 1
        out.write(queue.line + b"\n")
        flagged.append(line_no)
        queue.advance()
    return np.frombuffer(flagged, dtype=np.int64).copy() if flagged else np.zeros(0, dtype=np.int64)


class _InOrder:
    """The next proposed line and its sort key; a line out of order is a bug, not bad input."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self.lines = lines
        self.line: bytes | None = None
        self.key = b""
        self.advance()

    def advance(self) -> None:
        previous = self.key
        self.line = next(self.lines, None)
        self.key = _pair_key(self.line)
        if self.line is not None and previous and self.key <= previous:
            raise RuntimeError(f"proposals out of order: {self.line[:80]!r}")


def _pair_key(line: bytes | None) -> bytes:
    """``source ||| target ||| `` of a proposed line: what it sorts by against the table's lines."""
    if line is None:
        return b""
    parts = line.split(SEPARATOR, 2)
    return parts[0] + SEPARATOR + parts[1] + SEPARATOR
