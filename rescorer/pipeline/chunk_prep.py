"""Everything done to a chunk before and after the model, in worker processes: no torch here.

``rescore-phrase-table`` reads the table in its reading stage (:mod:`rescorer.pipeline.reader`),
which only decompresses and cuts it into chunks of whole lines. Each chunk then goes to a pool of
processes (or, with ``-j 0/1``, :class:`InlineExecutor`, which runs each task where it is
submitted) that validate and parse it, map words to ids and build its prefix trees
(:func:`prepare_chunk`); after scoring, the same pool formats and compresses it
(:func:`rescorer.pipeline.output_chunks.format_chunk`). Results are consumed in chunk order, so the output,
the progress record and the error for a bad line are those of a serial run. Each task reports
the CPU seconds it took (:func:`timed`), which is how the pipeline measures its stages.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import multiprocessing.synchronize
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infrastructure.processes import die_with_parent, leave_interrupts_to_parent
from rescorer.pipeline.columns.base import ChunkPhrases, Planner, PlanSettings
from rescorer.pipeline.scoring_plan import ScoringPlan
from rescorer.pipeline.spool import SpooledChunk, SpooledObject, lines_of
from rescorer.tables.chunks import LineChunk, parse_chunk

#: The file, in the folder a pool is started with (the run's spool), that holds the planners of the
#: run's columns (the models' shortlists): written once (:func:`send_planners`), read by each worker.
PLANNERS_FILE = "planners.pickle"
# This worker's folder (:func:`init_worker`), and the planners read from it on the first chunk.
_FOLDER: Path | None = None
_PLANNERS: tuple[Planner, ...] | None = None


def init_worker(folder: str, parent_pid: int | None = None,
                all_started: multiprocessing.synchronize.Barrier | None = None) -> None:
    """Pool initializer: where this worker finds the columns' planners (:func:`send_planners`).

    The planners are not the initializer's arguments: those go down the pipe a spawned process is
    started through, which holds 64 KiB, and a paper-size model's shortlists pickle to several
    hundred, so each process start would block until the child had imported its modules and read
    them, and the pool's workers would start one after the other. They are read from ``folder``
    instead, once per worker, on its first chunk, so they may be written after the pool starts.

    With ``parent_pid``, the worker ends with that process (:func:`die_with_parent`) and leaves
    Ctrl-C and SIGTERM to it (:func:`leave_interrupts_to_parent`). With
    ``all_started``, it waits until every worker of the pool has started (:func:`worker_pool`).
    """
    global _FOLDER, _PLANNERS
    if parent_pid is not None:
        die_with_parent(parent_pid)
        leave_interrupts_to_parent()
    _FOLDER, _PLANNERS = Path(folder), None
    if all_started is not None:
        all_started.wait(timeout=_START_SECONDS)


_START_SECONDS = 600.0  # a worker still not started by then will not be (a loaded machine takes seconds)


def send_planners(planners: tuple[Planner, ...], folder: str | Path) -> None:
    """Leave the planners in ``folder`` for the workers started with it (:func:`init_worker`):
    before the first chunk is submitted to them."""
    (Path(folder) / PLANNERS_FILE).write_bytes(pickle.dumps(planners, protocol=pickle.HIGHEST_PROTOCOL))


def _worker_planners() -> tuple[Planner, ...]:
    """This worker's planners, read on its first chunk (:func:`send_planners`)."""
    global _PLANNERS
    if _PLANNERS is None:
        if _FOLDER is None:
            raise RuntimeError("prepare_chunk without planners, outside a worker started by init_worker")
        _PLANNERS = pickle.loads((_FOLDER / PLANNERS_FILE).read_bytes())
    return _PLANNERS


def worker_pool(workers: int, folder: str | Path) -> futures.ProcessPoolExecutor:
    """``workers`` processes that prepare and format chunks, all started now, by this thread; they
    read the planners from ``folder`` (:func:`send_planners`).

    Each ends with this process, SIGKILL included (:func:`die_with_parent`), which the kernel ties
    to the thread that started it. A pool starts its processes on demand, from whichever thread
    submits, and the thread that hands the reader's chunks to the pool ends before the run does;
    so here the calling thread (the run's own) submits one task per worker, each held until all
    workers have started, which makes the pool start every one of them in this call. Each process
    start returns once the child is launched (what it is sent fits the pipe: :func:`init_worker`),
    so the workers import their modules side by side.
    """
    context = multiprocessing.get_context("spawn")
    all_started = context.Barrier(workers)
    pool = futures.ProcessPoolExecutor(workers, mp_context=context, initializer=init_worker,
                                       initargs=(str(folder), os.getpid(), all_started))
    for _ in range(workers):
        pool.submit(os.getpid)
    return pool


class InlineExecutor(futures.Executor):
    """Runs each task in the calling thread when it is submitted: the executor of ``-j 0/1``, so that
    the pipeline takes the same path whether chunks are prepared and formatted by worker processes or
    here. Its futures are done when :meth:`submit` returns; a task's error is its future's, as a
    worker's is (an interrupt is not caught: it stops the run where it comes)."""

    def submit(self, fn: Callable, /, *args, **kwargs) -> futures.Future:
        future: futures.Future = futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


@dataclass
class PrepareTask:
    """A chunk's lines of this run (the shard's rows) and how to prepare them."""

    lines: LineChunk | SpooledChunk  # in memory, or in the spool (read by the worker)
    path: str
    num_scores: int | None  # columns every line must have; None: unknown yet when sent
    skip_bad_lines: bool
    keep_phrases: bool  # the phrases and scores are wanted too (--scores-parquet)
    token_budget: int
    share_sources: bool = True
    sort_by_length: bool = True


@dataclass
class PreparedChunk:
    """A parsed chunk ready for the model: what crosses back from a worker (never the raw lines)."""

    good_rows: np.ndarray  # rows of the task's lines that were parsed (the others are bad_rows)
    bad_rows: list[tuple[int, str]]  # (line number, reason) set aside by --skip-bad-lines
    num_scores: int | None
    # Each planning column's plan (Planner.name: plan); none when no line is good.
    plans: dict[str, ScoringPlan] = field(default_factory=dict)
    source_of_row: np.ndarray | None = None  # each good row's index among the chunk's distinct sources
    source_changes: int = 0  # rows whose source differs from the row before, within the chunk
    first_source: str | None = None
    last_source: str | None = None
    source: pa.Array | None = None  # phrases and table scores, with keep_phrases
    target: pa.Array | None = None
    scores: np.ndarray | None = None
    parse_seconds: float = 0.0  # CPU time of parsing and id mapping
    tree_seconds: float = 0.0  # CPU time of grouping and prefix trees

    @property
    def scored(self) -> int:
        """How many rows were parsed, planned and scored."""
        return 0 if self.source_of_row is None else len(self.source_of_row)


def prepare_chunk(task: PrepareTask, planners: tuple[Planner, ...] | None = None) -> PreparedChunk:
    """Validate and parse the lines, and make each column's plan (groups and trees).

    A malformed line raises :class:`moses_integration.phrase_table.PhraseTableError` naming it,
    unless ``skip_bad_lines``. ``planners`` default to the worker's (:func:`send_planners`).
    """
    planners = planners if planners is not None else _worker_planners()
    started = time.thread_time()
    parsed = parse_chunk(lines_of(task.lines), task.path, num_scores=task.num_scores,
                         skip_bad_lines=task.skip_bad_lines, want_scores=task.keep_phrases)
    out = PreparedChunk(parsed.good_rows, parsed.bad_rows, parsed.num_scores)
    if task.keep_phrases:
        out.source, out.target, out.scores = parsed.source, parsed.target, parsed.scores
    n = len(parsed.source)
    if n:
        encoded = pc.dictionary_encode(parsed.source)
        source_of_row = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        phrases = ChunkPhrases(parsed.source, parsed.target, encoded.dictionary, source_of_row)
        out.source_of_row = source_of_row
        out.source_changes = int(np.count_nonzero(np.diff(source_of_row)))
        out.first_source, out.last_source = parsed.source[0].as_py(), parsed.source[n - 1].as_py()
        parsed_at = time.thread_time()
        out.parse_seconds = parsed_at - started
        settings = PlanSettings(task.token_budget, task.share_sources, task.sort_by_length)
        out.plans = {planner.name: planner.plan(phrases, settings) for planner in planners}
        out.tree_seconds = time.thread_time() - parsed_at
    else:
        out.parse_seconds = time.thread_time() - started
    return out


def prepare_spooled(task: PrepareTask) -> SpooledObject:
    """:func:`prepare_chunk` in a worker for a spooled chunk, the result left beside its lines
    (:class:`SpooledObject`): the main process maps the plan instead of unpickling it."""
    return SpooledObject.dump(prepare_chunk(task), task.lines.path + ".prepared")


def prepared(result: PreparedChunk | SpooledObject) -> PreparedChunk:
    """A worker's result, from the spool where it waits."""
    return result.load() if isinstance(result, SpooledObject) else result


def timed(fn: Callable, *args) -> tuple[object, float]:
    """``fn(*args)`` and the CPU seconds it took in this thread (for the pipeline's stage figures)."""
    started = time.thread_time()
    result = fn(*args)
    return result, time.thread_time() - started
