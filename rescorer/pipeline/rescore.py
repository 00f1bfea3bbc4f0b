"""``rescore-phrase-table``: stream a Moses table, append score columns: :func:`rescore`, the one entry point.

The columns are those of :func:`rescorer.pipeline.columns.columns_of_run`: the RNN's p(e|f) and the
unknown-word count, with ``--reverse-model`` a reverse model's p(f|e) (computed in the same run from the
same chunks, each with a second plan), with ``flag_lines`` ``rescorer propose``'s indicator. Each is a
:class:`rescorer.pipeline.columns.base.Column`: the run plans, scores, writes and records whatever
columns it is given.

The run is a pipeline of overlapping stages, so that no stage waits on another:

* the reading stage (:mod:`rescorer.pipeline.reader`) decompresses the table and cuts it into chunks
  of whole lines (vectorised), in a reader process of its own or a thread of this one, and hands
  each chunk to be prepared;
* ``-j`` worker processes validate and parse each chunk, map words to ids (pyarrow) and build its
  prefix trees (:mod:`rescorer.pipeline.chunk_prep`), so all of that overlaps the model;
* the main thread scores each chunk with the model (torch releases the GIL), in chunk order;
* the same worker processes format the lines and compress each chunk into its own gzip member.

With ``-j 0/1`` the same stages prepare and format through
:class:`~rescorer.pipeline.chunk_prep.InlineExecutor`: the reading thread prepares each chunk as
it hands it on, and the main thread formats.
Memory is bounded by a few chunks per worker whatever the table size. Output goes to a hidden partial file
next to the destination and is renamed only when complete; every chunk is recorded as durable
(:mod:`rescorer.pipeline.partial_output`, :mod:`rescorer.pipeline.resume`), so ``--resume`` continues a killed run.
The output holds only lines Moses can load: with ``--skip-bad-lines`` a malformed line goes byte
for byte to ``OUT.rejects`` instead, so input lines = output lines + rejected lines. Sharding is in
:mod:`rescorer.pipeline.shards`, the Parquet side output in :mod:`rescorer.pipeline.score_parquet`, the moses.ini
edit in :mod:`rescorer.pipeline.moses_config`.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import functools
import os
import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from infrastructure.files import (
    DEFAULT_MEMBER_LEVEL,
    display_name,
    exclusive_use,
    open_input,
    streamed_output,
)
from infrastructure.interrupts import held_while_starting_children
from infrastructure.progress import progress_bar
from infrastructure.resume_record import file_identity, options_record
from infrastructure.threads import available_cpus
from moses_integration.phrase_table import PhraseTableError
from neural.device import autocast_dtype, matmul_precision, scoring_precision, select_device
from rescorer.model.checkpoint import Checkpoint
from rescorer.pipeline import columns as registered
from rescorer.pipeline import score_parquet
from rescorer.pipeline.chunk_prep import (
    InlineExecutor,
    PreparedChunk,
    PrepareTask,
    prepare_chunk,
    prepare_spooled,
    send_planners,
    timed,
    worker_pool,
)
from rescorer.pipeline.columns.base import ChunkRows, ChunkScorer, Column, ScoringModel
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.option_rules import WHOLE_NUMBERS, wp_side_problem
from rescorer.pipeline.output_chunks import format_lines
from rescorer.pipeline.partial_output import ChunkProgress, DurableWriter, OutputFiles, check_partial_output, stop_error
from rescorer.pipeline.reader import (
    CarriedAcrossChunks,
    Preparing,
    ReadChunk,
    ReaderProcess,
    ReadingEnd,
    ReadingSettings,
    drain,
    feed,
    prepared_in_table_order,
    read_here,
)
from rescorer.pipeline.resume import (
    PROGRESS_VERSION,
    ResumeError,
    load_progress,
    recorded_options,
)
from rescorer.pipeline.scoring import PairScorer, ScoringOptions, auto_token_budget
from rescorer.pipeline.spool import Spool, SpooledChunk
from rescorer.pipeline.timeline import Timeline
from rescorer.pipeline.train_or_load import Models
from rescorer.pipeline.writing import Formatting, WritingStage
from rescorer.tables.chunks import LineChunk, UnreadableInputError


@dataclass
class RescoreOptions:
    chunk_lines: int = 100_000
    workers: int = field(default_factory=available_cpus)
    wp_side: str = "target"
    skip_bad_lines: bool = False
    shard: tuple[int, int] | None = None  # (K, N), K in 1..N
    resume: bool = False
    scores_parquet: str | None = None
    # zlib level of each chunk's gzip member (MEMBER_LEVELS, 0..9)
    compress_level: int = DEFAULT_MEMBER_LEVEL
    progress: bool = True
    device: str = "auto"
    precision: str = "auto"
    num_scores: int | None = None  # score columns every line must have (moses.ini num-features)
    scoring: ScoringOptions = field(default_factory=ScoringOptions)
    # Sorted 1-based input line numbers that get exp(1) in a third new column, every other line 1
    # (``rescorer propose``'s indicator of proposed pairs); None: two new columns only.
    flag_lines: np.ndarray | None = None
    # Where the run's time goes (``-v``): its phases and the main thread's seconds per chunk are noted
    # in this timeline, made by the caller at its start; None: rescore() makes one for the run.
    timeline: Timeline | None = None

    #: Options a resumed run may change, as they leave the output's bytes alone: how many processes,
    #: what is shown, and ``skip_bad_lines`` (up to the first bad line the output is the same either way,
    #: so a run stopped by a malformed line can continue with ``--skip-bad-lines --resume``). The device,
    #: precision and token budget asked for may differ too: the ones they resolved to are recorded
    #: instead (:func:`rescorer.pipeline.columns.base.scorer_identity`). Every other option is in the record.
    MAY_DIFFER = frozenset({"workers", "progress", "resume", "skip_bad_lines", "device", "precision",
                            "token_budget", "timeline"})
    #: Options their column records itself (:meth:`~rescorer.pipeline.columns.base.Column.record_identity`).
    RECORDED_BY_COLUMNS = frozenset({"flag_lines"})

    def identity(self) -> dict:
        """Every option but :attr:`MAY_DIFFER` and :attr:`RECORDED_BY_COLUMNS`: a resume must use the same ones."""
        return options_record(self, self.MAY_DIFFER | self.RECORDED_BY_COLUMNS)

    def check(self) -> None:
        """Refuse a value no run can use, in one line naming the option: the rules of
        :mod:`rescorer.pipeline.option_rules`, the ones the command line parses with."""
        if (problem := wp_side_problem(self.wp_side)) is not None:
            raise RescoreError(f"Invalid value for '--wp-side': {problem}")
        for name, rule in WHOLE_NUMBERS.items():
            value = self.scoring.token_budget if name == "token_budget" else getattr(self, name)
            problem = None if value is None and name == "token_budget" else rule.problem(value)
            if problem is not None:
                raise RescoreError(f"Invalid value for {rule.hint}: {problem}")


@dataclass
class RescoreSummary:
    lines: int = 0  # lines written (all scored)
    rejected: int = 0  # malformed lines moved to the rejects file
    distinct_sources: int = 0
    sum_log_prob: float = 0.0
    target_tokens: int = 0
    target_unknown: int = 0
    seconds: float = 0.0
    sum_reverse_log_prob: float | None = None  # with --reverse-model: the sum of log p(f|e)
    rejects_path: str | None = None
    resumed_lines: int = 0  # lines an interrupted run had done (not part of this run's speed)
    finished_already: str | None = None  # the output a --resume found complete: nothing was scored
    # CPU seconds of this run's stages, wherever they ran (threads or worker processes): "read"
    # (decompress, cut into chunks, shard filter; with a reader process, "gunzip" is the decompression
    # in its own thread (no --shard), "read" the finding of lines, "align" the sync points and
    # spooling), "parse" (validate, parse, map to ids), "trees" (groups and prefix trees), "score"
    # (the model), "format" (format and compress).
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def add_stage(self, stage: str, seconds: float) -> None:
        self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + seconds

    @property
    def mean_log_prob(self) -> float:
        return self.sum_log_prob / self.lines if self.lines else float("nan")

    @property
    def unknown_share(self) -> float:
        return self.target_unknown / self.target_tokens if self.target_tokens else 0.0

    def report(self) -> str:
        if self.finished_already is not None:
            return (f"{self.finished_already} is finished already (no partial output beside it): nothing to resume; "
                    "remove it to score the table again")
        rate = (self.lines - self.resumed_lines) / self.seconds if self.seconds > 0 else 0.0
        rejected = f", {self.rejected} malformed lines rejected to {self.rejects_path}" if self.rejected else ""
        reverse = f", mean log p(f|e) {self.sum_reverse_log_prob / self.lines:.4f}" \
            if self.sum_reverse_log_prob is not None and self.lines else ""
        return (
            f"rescored {self.lines} lines{rejected}, "
            f"{self.distinct_sources} distinct sources; "
            f"mean log p {f'{self.mean_log_prob:.4f}' if self.lines else 'n/a (no lines)'}{reverse}; "
            f"target words outside the shortlist {100 * self.unknown_share:.2f}%; "
            f"{self.seconds:.1f} s ({rate:.0f} pairs/s)"
        )


def rescore(input_path: str, output_path: str, models: Models, options: RescoreOptions | None = None) -> RescoreSummary:
    """Stream ``input_path`` to ``output_path`` with the run's score columns appended to each line
    (:func:`rescorer.pipeline.columns.columns_of_run`): the one entry point of the pipeline.

    In order, before any long work: the options are checked (:func:`check_options`), a stopped run's
    partial output is refused without ``--resume`` and a ``--resume`` of a finished output does nothing
    but say so (the summary's ``finished_already``, :func:`check_partial_output`); both models are
    loaded and checked, or the forward one trained first (:meth:`Models.load`). The run's other
    processes start before the models are loaded (:class:`_ChildProcesses`). See the module doc.
    """
    opts = options or RescoreOptions()
    check_options(input_path, output_path, opts)
    opts = replace(opts, timeline=opts.timeline or Timeline())  # the caller's, or one of the run's own
    timeline = opts.timeline
    timeline.mark("options checked")
    if check_partial_output(output_path, opts.resume):
        return RescoreSummary(finished_already=output_path)
    # Spawned, they import no torch, yet each takes a second or so to start: overlapped with the
    # loading, not after it. Not before a training, which would keep them waiting for hours.
    children = _ChildProcesses(opts.workers, input_path != "-") if models.forward is not None else None
    try:
        columns, scorer, precision = _columns_of_models(input_path, output_path, models, opts)
        timeline.mark("models ready")
        with matmul_precision(precision):
            children = children or _ChildProcesses(opts.workers, input_path != "-")
            return _run_pipeline(input_path, output_path, columns, scorer, opts, children)
    finally:
        if children is not None:
            children.close()


def _columns_of_models(input_path: str, output_path: str, models: Models,
                       opts: RescoreOptions) -> tuple[list[Column], ChunkScorer, str]:
    """The run's columns with their models loaded (:meth:`Models.load`), on the device and at the
    precision the options resolve to; the forward model's scorer (whose budget the chunks are planned
    for) and the precision."""
    forward, reverse = models.load(input_path, output_path, opts)
    device = select_device(opts.device)
    precision = scoring_precision(opts.precision)
    scoring = opts.scoring
    if opts.resume and scoring.token_budget is None and not streamed_output(output_path):
        # The automatic budget follows free GPU memory; the resumed run keeps the recorded one, so
        # its groups, and hence its bytes, are those of the interrupted run.
        recorded = recorded_options(OutputFiles.beside(output_path).progress)
        scoring = replace(scoring, token_budget=recorded.get("token_budget"))
    if isinstance(reverse, Checkpoint) and isinstance(forward, Checkpoint) and scoring.token_budget is None:
        # One budget for both plans of a chunk: the smaller, as the larger output layer needs.
        scoring = replace(scoring, token_budget=min(auto_token_budget(device, forward.config),
                                                    auto_token_budget(device, reverse.config)))

    def scoring_model(model: Checkpoint | ScoringModel) -> ScoringModel:
        if isinstance(model, ScoringModel):
            return model
        scorer = PairScorer(model.model, device, autocast_dtype(device, precision), scoring, precision)
        return ScoringModel(scorer, model.src_vocab.words, model.tgt_vocab.words, getattr(model, "path", None))

    forward_model = scoring_model(forward)
    columns = registered.columns_of_run(forward_model, None if reverse is None else scoring_model(reverse), opts)
    return columns, forward_model.scorer, precision


def _progress_so_far(files: OutputFiles, identity: dict) -> ChunkProgress:
    """What an interrupted run recorded as durable (``--resume``), checked against this run."""
    try:
        fresh = asdict(ChunkProgress())
        return ChunkProgress.from_record(load_progress(files.progress, files.counted_partials(), identity, fresh))
    except ResumeError as exc:
        raise RescoreError(str(exc)) from exc


def _run_pipeline(input_path: str, output_path: str, columns: list[Column], scorer: ChunkScorer,
                  opts: RescoreOptions, children: _ChildProcesses) -> RescoreSummary:
    """The pipeline itself, for checked options: ``columns`` appended to each line, the chunks'
    trees grouped for ``scorer``'s token budget, prepared by ``children``. The run holds ``output_path``
    (:func:`exclusive_use`): a second run writing it would share its partial output."""
    with exclusive_use(output_path):
        run = _Run(input_path, output_path, columns, scorer, opts, children)
        try:
            run.start_stages()
            run.timeline.mark("stages started")
            while (pending := run.next_chunk()) is not None:
                run.score_and_format(pending)
            run.finish()
            run.timeline.mark("done")
        except BaseException as exc:
            replacement = run.stopped(exc)
            if replacement is exc:
                raise
            raise replacement from exc
        finally:
            run.close()
        return run.final_summary()


class _ChildProcesses:
    """The run's processes besides this one, with ``-j`` 2 and more: the worker pool
    (:func:`~rescorer.pipeline.chunk_prep.worker_pool`), the reader process on a file (stdin only a
    thread of this process can read), and the spool they share; with ``-j 0/1``, none.

    They start before the models are loaded, as soon as the options are checked (unless a model is
    to be trained first): spawned, they import no torch, but each takes a second or so (more on a
    loaded machine) to import what it needs, which then overlaps the loading of the models and of
    torch's device instead of coming after it. What they work with comes when the run starts its
    stages: the planners, which need the models (:func:`~rescorer.pipeline.chunk_prep.send_planners`),
    and the reading's settings, which need the progress record
    (:meth:`~rescorer.pipeline.reader.ReaderProcess.read`).

    They start with Ctrl-C and SIGTERM held back (a stop while one starts would leave it
    half-started), and the semaphores they share are named after the spool, which is how a later
    run finds and removes them if this whole process group is killed.
    """

    def __init__(self, workers: int, reads_file: bool) -> None:
        self.spool: Spool | None = None
        self.pool: futures.ProcessPoolExecutor | None = None
        self.reader: ReaderProcess | None = None
        if workers <= 1:
            return
        self.spool = Spool()
        try:
            with self.spool.semaphores(), held_while_starting_children():
                self.pool = worker_pool(workers, self.spool.folder)
                if reads_file:
                    self.reader = ReaderProcess(self.spool, queue_size=2 * workers)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End them: the workers (waited for, also one still starting, which would otherwise find the
        semaphores it shares removed as this process ends, and print a traceback), the reader, then
        the spool. Once: a second call does nothing."""
        pool, reader, spool = self.pool, self.reader, self.spool
        self.pool = self.reader = self.spool = None
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if reader is not None:
            reader.close()
        if spool is not None:
            spool.close()


class _Run:
    """One run of the pipeline: its files, its stages and the chunks in flight.

    The main thread takes the prepared chunks in order (:meth:`next_chunk`), scores each and sends
    it to be formatted (:meth:`score_and_format`), and hands it to the writing stage
    (:class:`~rescorer.pipeline.writing.WritingStage`), a thread that appends the formatted chunks to the
    output in order as they come back, keeping a bounded window in flight.
    """

    def __init__(self, input_path: str, output_path: str, columns: list[Column], scorer: ChunkScorer,
                 opts: RescoreOptions, children: _ChildProcesses) -> None:
        self.input_path, self.columns, self.scorer, self.opts = input_path, columns, scorer, opts
        self.children = children
        self.timeline: Timeline = opts.timeline  # set by rescore()
        self.started = time.monotonic()
        self.to_stdout = streamed_output(output_path)
        self.files = OutputFiles.beside(output_path)
        self.parts_dir = Path(opts.scores_parquet + ".parts") if opts.scores_parquet else None
        # The gzip member level of a .gz output; None: plain text.
        self.compress_level = opts.compress_level if output_path.endswith(".gz") else None
        identity = {"version": PROGRESS_VERSION, "input": file_identity(input_path), "model": None,
                    "options": opts.identity()}
        for column in columns:
            column.record_identity(identity)
        self.done = _progress_so_far(self.files, identity) if opts.resume and not self.to_stdout \
            else ChunkProgress()
        for chunk_scorer, budget in zip(self._scorers(), self.done.token_budgets or [], strict=False):
            chunk_scorer.token_budget = budget  # the identity holds the first budget, a halving the one since
        self.summary = RescoreSummary(**(self.done.summary or {}))
        self.summary.seconds, self.summary.resumed_lines, self.summary.stage_seconds = 0.0, self.summary.lines, {}
        if self.parts_dir:
            score_parquet.drop_parts_from(self.parts_dir, self.done.chunks_done)
        self.fh = open_input(input_path)  # before any output file exists: an unreadable input leaves none
        # With worker processes, a reader process reads the table (stdin only a thread can read).
        if children.reader is not None:
            self.fh.close()
        try:
            self.writer = DurableWriter(self.files, self.to_stdout, identity, self.done)
        except BaseException:
            self.fh.close()
            raise
        self.spool = children.spool
        in_size = None if input_path == "-" else os.path.getsize(input_path)
        self.bar = progress_bar(total=in_size, unit="B", unit_scale=True, desc="rescoring", show=opts.progress,
                                dynamic_ncols=True)
        self.planners = tuple(column.planner for column in columns if column.planner is not None)
        self.prepared_q: queue.Queue = queue.Queue(maxsize=2 * max(1, opts.workers))
        self.stop = threading.Event()
        # What parses and formats the chunks: this process (-j 0/1), or the worker pool, with the
        # reader process where there is one.
        self.executor: futures.Executor = children.pool or InlineExecutor()
        self.reader = children.reader
        num_scores = opts.num_scores if opts.num_scores is not None else self.done.num_scores
        self.carried = CarriedAcrossChunks(num_scores, self.done.prev_source)
        # The formatted chunks' bytes in memory: those being formatted and those queued to be written.
        self.writing = WritingStage(self.writer, 2 * max(1, opts.workers), self.timeline)
        self.chunks_done = self.done.chunks_done
        self.warned = False

    def _scorers(self) -> list[ChunkScorer]:
        """The run's scorers, in their columns' order (the forward model's, then the reverse model's):
        whose token budgets the progress record carries."""
        return [column.model.scorer for column in self.columns if column.model is not None]

    def start_stages(self) -> None:
        """The reading stage (:mod:`rescorer.pipeline.reader`) and what prepares the chunks: with a
        file and -j 2 and more, a reader process and a worker pool; with stdin, the reading in a
        thread of this process and the pool; with -j 0/1, the reading in that thread and this
        process' executor. One thread hands the chunks read to the executor and on, in order.
        The processes are started already (:class:`_ChildProcesses`): they are told now what to
        work with, the workers the planners and the reader the settings.
        """
        opts = self.opts
        settings = ReadingSettings(self.input_path, opts.chunk_lines, self.done.lines_done, opts.shard,
                                   self.done.shard_state)
        prepare = functools.partial(prepare_chunk, planners=self.planners)
        if self.children.pool is not None:
            send_planners(self.planners, self.spool.folder)
            prepare = prepare_spooled
        if self.reader is not None:
            self.reader.read(settings)
        messages = self.reader.messages(self.stop) if self.reader else read_here(settings, self.fh, self.spool)
        preparing = Preparing(self.executor, prepare, self._task, lambda: self.carried.num_scores)
        threading.Thread(target=feed, args=(messages, preparing, self.prepared_q, self.stop), daemon=True,
                         name="rescore-feed").start()

    def _task(self, lines: LineChunk | SpooledChunk, num_scores: int | None) -> PrepareTask:
        """How a chunk is prepared: the options, and the scorer's budget as it is now."""
        scorer, opts = self.scorer, self.opts
        return PrepareTask(lines, self.input_path, num_scores, opts.skip_bad_lines, bool(opts.scores_parquet),
                           scorer.token_budget, scorer.options.share_sources, scorer.options.sort_by_length)

    def next_chunk(self) -> ReadChunk | None:
        """The next chunk in table order (None at the end); the reading's error, after its chunks."""
        with self.timeline.timing("prepared"):
            item = self.prepared_q.get()
        self.timeline.mark("first chunk prepared")
        if isinstance(item, ReadingEnd):
            for stage, seconds in item.cpu.items():
                self.summary.add_stage(stage, seconds)
            if item.error is not None:
                raise item.error
            return None
        return item

    def score_and_format(self, pending: ReadChunk) -> None:
        """Score one chunk here, report its rejected lines, and send it off to be formatted."""
        summary = self.summary
        with self.timeline.timing("prepared", same_chunk=True):  # its worker may not be done with it
            prep = prepared_in_table_order(pending, self.carried, self.planners, summary)
        with self.timeline.timing("score"):
            values = self._score(pending, prep)
        if len(values[0]):
            self.timeline.mark("first chunk scored")
        rejected = pending.rejected_lines(prep)
        rejects = _report_rejects(rejected, self.input_path)
        summary.rejected += len(rejected)
        if self.parts_dir and len(values[0]):
            self._write_parquet_part(pending.kept(prep), prep, values)
        lines, good_rows = pending.format_args(prep)
        columns = [(column.format, column_values) for column, column_values in zip(self.columns, values, strict=True)]
        formatting = functools.partial(format_lines, lines, good_rows, columns, compress_level=self.compress_level)
        job = self.executor.submit(timed, formatting)
        self.chunks_done += 1
        progress = ChunkProgress(
            lines_done=pending.last_line_no, chunks_done=self.chunks_done, summary=asdict(summary),
            shard_state=pending.shard_state, prev_source=self.carried.prev_source,
            num_scores=self.carried.num_scores, token_budgets=[s.token_budget for s in self._scorers()],
        )
        self.writing.submit(Formatting(job, rejects, progress))
        if pending.position is not None:
            self.bar.update(pending.position - self.bar.n)
        rate = summary.lines / (time.monotonic() - self.started)
        self.bar.set_postfix(lines=f"{summary.lines:,}", pairs_s=f"{rate:.0f}")

    def _score(self, pending: ReadChunk, prep: PreparedChunk | None) -> list[np.ndarray]:
        """Each column's values of the chunk's lines written (a shard's end: all rows are scored, its
        own written), with their figures added to the summary; the first chunk with lines is shown
        to each column (its warnings)."""
        if prep is None or not prep.scored:
            return [np.zeros(0) for _ in self.columns]
        rows = ChunkRows(prep, pending.kept(prep), pending.good_line_numbers(prep))
        started = time.thread_time()
        values = [column.score(rows) for column in self.columns]
        self.summary.add_stage("score", time.thread_time() - started)
        self.summary.lines += len(values[0])
        for column, column_values in zip(self.columns, values, strict=True):
            column.summarise(column_values, rows, self.summary)
        if not self.warned:
            self.warned = True
            for column in self.columns:
                column.first_chunk(rows)
        return values

    def _write_parquet_part(self, kept: np.ndarray | None, prep: PreparedChunk, values: list[np.ndarray]) -> None:
        """The chunk's rows written, with their phrases, table scores and each column's values."""
        source, target, scores = prep.source, prep.target, prep.scores
        if kept is not None:
            source, target, scores = source.filter(pa.array(kept)), target.filter(pa.array(kept)), scores[kept]
        fields = {column.parquet: column_values for column, column_values in zip(self.columns, values, strict=True)
                  if column.parquet is not None}
        score_parquet.write_part(score_parquet.part_path(self.parts_dir, self.chunks_done), source, target, scores,
                                 fields)

    def finish(self) -> None:
        self.writing.finish()
        self.summary.add_stage("format", self.writing.format_seconds)
        # An empty table is still a valid gzip file; an empty shard writes no byte, so that the
        # shards concatenate to the whole run's output.
        self.writer.finish(self.compress_level is not None and self.opts.shard is None)
        if self.parts_dir:
            score_parquet.merge_parts(self.parts_dir, Path(self.opts.scores_parquet))  # type: ignore[arg-type]

    def stopped(self, exc: BaseException) -> BaseException:
        """The exception to raise for ``exc``, after the partial files are left sane (:func:`stop_error`)."""
        self.stop.set()
        if isinstance(exc, PhraseTableError) and not isinstance(exc, UnreadableInputError):
            # The chunks before a malformed line are complete: keep them all, as a serial run does.
            with contextlib.suppress(Exception):
                self.writing.finish()
        self.writing.stop()
        return stop_error(exc, self.writer, self.files, self.to_stdout, self.input_path == "-")

    def close(self) -> None:
        """End the stages, the child processes with them (:meth:`_ChildProcesses.close`)."""
        self.bar.close()
        self.stop.set()
        self.writing.stop()
        if self.reader is not None:
            self.reader.stop.set()
        drain(self.prepared_q)
        self.children.close()
        self.fh.close()

    def final_summary(self) -> RescoreSummary:
        self.summary.seconds = time.monotonic() - self.started
        self.summary.rejects_path = str(self.files.rejects) if self.summary.rejected else None
        return self.summary


def _report_rejects(rejected: list[tuple[int, str, bytes]], input_path: str) -> bytes:
    """``FILE:LINE: reason`` on stderr for each rejected line; their raw bytes for the rejects file."""
    name = display_name(input_path)
    for line_no, reason, _ in rejected:
        sys.stderr.write(f"{name}:{line_no}: {reason} (rejected)\n")
    return b"".join(raw + b"\n" for _, _, raw in rejected)




def check_options(input_path: str, output_path: str, opts: RescoreOptions) -> None:
    """Refuse settings that cannot work, before any training or scoring starts: the values
    (:meth:`RescoreOptions.check`), then the paths and what they allow."""
    opts.check()
    if input_path != "-":
        if Path(input_path).is_dir():
            raise RescoreError(f"input {input_path} is a folder, not a phrase table")
        if not Path(input_path).exists():
            raise RescoreError(f"input {input_path} does not exist")
    if input_path == "-" and (opts.resume or opts.shard):
        raise RescoreError("--resume and --shard need a file as input, not stdin")
    if streamed_output(output_path):
        stream = "stdout" if output_path == "-" else f"{output_path}, a device or a pipe"
        if opts.resume:
            raise RescoreError(f"--resume needs a file as output, not {stream}")
        if opts.skip_bad_lines:
            raise RescoreError(f"--skip-bad-lines writes rejected lines beside the output: give a file, not {stream}")
        return
    if input_path != "-" and Path(input_path).resolve() == Path(output_path).resolve():
        raise RescoreError(f"refusing to overwrite the input {input_path}; choose another output path")
    if Path(output_path).is_dir():
        raise RescoreError(f"output {output_path} is a folder; give a file path for the output table")
    if not Path(output_path).resolve().parent.is_dir():
        raise RescoreError(f"output folder {Path(output_path).parent} does not exist")
