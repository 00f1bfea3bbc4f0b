"""The reading stage of ``rescore-phrase-table``: read the table, cut it, keep this run's chunks and
hand each to be prepared, in table order.

One generator (:func:`read_chunks`) reads wherever it runs: in a reader process of its own
(:class:`ReaderProcess`, ``-j 2`` and more on a file), which puts each chunk's lines in the spool
(:mod:`rescorer.pipeline.spool`) and tells the main process only where they are, so that
decompression (ISA-L), the newline search and the content hashes of :mod:`rescorer.tables.aligned`
take a core of their own and no line crosses a process boundary by pickling; or in a thread of the
main process (:func:`read_here`: ``-j 0/1``, and stdin, which a child process cannot read). Either
way, its chunks reach one thread of the main process (:func:`feed`) as :class:`ReadChunk` messages,
the stage's one message, and its end as :class:`ReadingEnd`. That thread hands each chunk to an
executor to be prepared (:class:`Preparing`: worker processes, or with ``-j 0/1``
:class:`~rescorer.pipeline.chunk_prep.InlineExecutor`, which prepares it there and then) and on to
the run, which takes each chunk's preparation in table order (:func:`prepared_in_table_order`,
checking its column count against the chunks before it). The layouts differ only in where
:func:`read_chunks` runs and which executor prepares.

The shard's part of the reading is here too: the cut found (:meth:`ShardFilter.of_table`) where the
reading runs, the chunks before the shard passed on without their lines (the progress record
advances past them), and the rows a chunk holding an end of the shard writes (:attr:`ReadChunk.keep`).
Torch-free: the reader process imports no model.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, BinaryIO

import numpy as np

from infrastructure.files import input_position, open_input
from infrastructure.processes import die_with_parent, leave_interrupts_to_parent
from moses_integration.phrase_table import PhraseTableError
from rescorer.pipeline.chunk_prep import PreparedChunk, PrepareTask, prepare_chunk, prepared
from rescorer.pipeline.columns.base import Planner
from rescorer.pipeline.shards import ShardFilter
from rescorer.pipeline.spool import Spool, SpooledChunk, lines_of
from rescorer.tables.aligned import aligned_chunks
from rescorer.tables.chunks import LineChunk, iter_line_chunks

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreSummary


@dataclass(frozen=True)
class ReadingSettings:
    """What the reading needs, wherever it runs (picklable: it crosses to a spawned process)."""

    path: str
    chunk_lines: int
    lines_done: int  # lines an interrupted run had done (--resume): its chunks are skipped
    shard: tuple[int, int] | None
    shard_state: dict | None  # the interrupted shard's cut (--resume), checked against the table's


@dataclass
class ReadChunk:
    """The reading stage's one message: a chunk of the table as read, on its way to the scorer.

    The reader fills the first six fields (with a reader process, ``lines`` is a
    :class:`SpooledChunk`: the main process holds only their place); the thread that hands it on
    adds its ``task`` and ``preparation`` (a future of the executor that prepares it). A chunk
    outside the run's shard has no lines, task or preparation: it only advances the progress record.
    """

    first_line_no: int
    last_line_no: int
    lines: LineChunk | SpooledChunk | None  # None: outside this run's shard (its lines are not scored)
    # Rows [a, b) of this run's shard in a chunk that holds an end of it (None: all): the chunk is
    # scored whole, in the whole run's batches, and only these rows are written and counted.
    keep: tuple[int, int] | None
    shard_state: dict | None  # the shard filter's state after this chunk (for --resume)
    position: int | None  # bytes of the file read so far (compressed, for gzip): the progress bar
    task: PrepareTask | None = None
    preparation: futures.Future | None = None

    @property
    def in_run(self) -> bool:
        return self.lines is not None

    def prepared(self) -> PreparedChunk:
        """The prepared chunk, waiting for its preparation; the preparation's error is raised."""
        return prepared(self.preparation.result())  # type: ignore[union-attr]

    def kept(self, prep: PreparedChunk) -> np.ndarray | None:
        """Which of the scored (good) rows are written: a mask over them, None for all."""
        if self.keep is None:
            return None
        rows = np.asarray(prep.good_rows, dtype=np.int64)
        return (rows >= self.keep[0]) & (rows < self.keep[1])

    def format_args(self, prep: PreparedChunk | None) -> tuple[LineChunk | SpooledChunk, np.ndarray | None]:
        """The lines to format and which of them (None: all), for
        :func:`~rescorer.pipeline.output_chunks.format_lines`: the scored rows, and of those the shard's."""
        if prep is None or self.lines is None:
            return LineChunk.from_lines(self.first_line_no, []), None
        kept = self.kept(prep)
        if kept is not None:
            return self.lines, np.asarray(prep.good_rows, dtype=np.int64)[kept]
        return self.lines, (prep.good_rows if prep.bad_rows else None)

    def good_line_numbers(self, prep: PreparedChunk | None) -> np.ndarray:
        """The 1-based input line numbers of the lines written (those :meth:`format_args` formats)."""
        if prep is None or self.lines is None:
            return np.zeros(0, dtype=np.int64)
        rows = np.asarray(prep.good_rows, dtype=np.int64) if prep.bad_rows else np.arange(len(self.lines))
        kept = self.kept(prep)
        return self.first_line_no + (rows[kept] if kept is not None else rows)

    def new_sources(self, prep: PreparedChunk, prev_source: str | None) -> int:
        """How many distinct sources the rows written add to those before (``prev_source``: the last
        source written): a source block cut by the chunk's start counts once, and a shard's first row
        starts a source of its own (a source block split between two shards counts in both)."""
        if not prep.scored:
            return 0
        continues = prev_source is not None and prep.first_source == prev_source
        kept = self.kept(prep)
        if kept is None:
            return prep.source_changes + int(not continues)
        sources = prep.source_of_row[kept]  # a chunk holding an end of the shard: its rows only
        if not len(sources):
            return 0
        return int(np.count_nonzero(np.diff(sources))) + int(self.keep[0] > 0 or not continues)  # type: ignore[index]

    def rejected_lines(self, prep: PreparedChunk | None) -> list[tuple[int, str, bytes]]:
        """``(line number, reason, raw line)`` of the lines set aside by ``--skip-bad-lines`` (the shard's)."""
        if prep is None or not prep.bad_rows or self.lines is None:
            return []
        lines = lines_of(self.lines)  # read back from the spool: rare, and only these lines
        first, last = (lines.first_line_no + self.keep[0], lines.first_line_no + self.keep[1]) if self.keep \
            else (lines.first_line_no, lines.last_line_no + 1)
        return [(n, why, lines.line(n - lines.first_line_no)) for n, why in prep.bad_rows if first <= n < last]


@dataclass
class ReadingEnd:
    """The reading's last message: the CPU seconds of its parts (for the run's stage figures) and the
    error that ended it, if one did (raised by the run after the chunks before it)."""

    cpu: dict[str, float]
    error: BaseException | None = None


def table_chunks(fh: BinaryIO, path: str, chunk_lines: int, lines_done: int,
                 shard_filter: ShardFilter | None, prefetch: Prefetched | None = None) -> Iterator[ReadChunk]:
    """The table's chunks after line ``lines_done`` (a resumed run's), cut where every run cuts them.

    Stops after the chunk that ends the shard. Chunks before the shard start come without their
    lines so that the progress record advances past them; a chunk that holds an end of the shard is
    scored whole (the whole run's batches) and only its rows ``keep`` are written. With
    ``prefetch``, the lines are found in a thread of their own while this one computes the sync
    points (both mostly in NumPy and Arrow kernels that release the GIL): the reader's two halves
    run on two cores.
    """
    lines = iter_line_chunks(fh, path, chunk_lines)
    for chunk in aligned_chunks(prefetch.of(lines) if prefetch else lines, chunk_lines):
        if chunk.last_line_no <= lines_done:  # done by the interrupted run (the shard state is restored)
            continue
        rows = shard_filter.rows(chunk) if shard_filter else (0, len(chunk))
        keep = rows if rows not in (None, (0, len(chunk))) else None
        yield ReadChunk(chunk.first_line_no, chunk.last_line_no, chunk if rows is not None else None, keep,
                        shard_filter.state() if shard_filter else None, input_position(fh))
        if shard_filter and shard_filter.finished:
            return


def read_chunks(settings: ReadingSettings, fh: BinaryIO, spool: Spool | None = None,
                prefetch: Prefetched | None = None) -> Iterator[ReadChunk]:
    """The run's chunks of the table open as ``fh``, wherever the reading runs: a shard's reader first
    finds where the table is cut (:meth:`ShardFilter.of_table`, a pass of its own); with a ``spool``,
    each chunk's lines go there and the message holds their place."""
    shard = ShardFilter.of_table(settings.path, settings.shard, settings.shard_state) if settings.shard else None
    for index, item in enumerate(table_chunks(fh, settings.path, settings.chunk_lines, settings.lines_done, shard,
                                              prefetch)):
        if spool is not None and isinstance(item.lines, LineChunk):
            item.lines = spool.put(index, item.lines)
        yield item


def read_here(settings: ReadingSettings, fh: BinaryIO, spool: Spool | None) -> Iterator[ReadChunk | ReadingEnd]:
    """:func:`read_chunks` in the thread that takes its chunks (``-j 0/1``, stdin), then its end: the
    CPU seconds of the reading alone ("read"), not of what the taker does between two chunks."""
    seconds, started = 0.0, time.thread_time()
    try:
        for item in read_chunks(settings, fh, spool):
            seconds += time.thread_time() - started
            yield item
            started = time.thread_time()
    except Exception as exc:  # the run raises it after the chunks before it
        yield ReadingEnd({"read": seconds + time.thread_time() - started}, exc)
        return
    yield ReadingEnd({"read": seconds + time.thread_time() - started})


class Prefetched:
    """Runs an iterator in a thread of its own, a few items ahead; its errors come out in order.

    ``cpu_seconds`` is that thread's CPU time once the iterator is exhausted (for the stage figures).
    """

    def __init__(self, ahead: int = 2) -> None:
        self.ahead = ahead
        self.cpu_seconds = 0.0

    def of(self, items: Iterator) -> Iterator:
        q: queue.Queue = queue.Queue(maxsize=self.ahead)
        done = threading.Event()  # the consumer is gone: stop producing
        end = object()

        def produce() -> None:
            started = time.thread_time()
            try:
                for item in items:
                    if not put_unless_stopped(q, (item, None), done):
                        return
                put_unless_stopped(q, (end, None), done)
            except BaseException as exc:  # re-raised in the consumer, in order
                put_unless_stopped(q, (end, exc), done)
            finally:
                self.cpu_seconds = time.thread_time() - started

        worker = threading.Thread(target=produce, daemon=True, name="find-lines")
        worker.start()
        try:
            while True:
                item, error = q.get()
                if error is not None:
                    raise error
                if item is end:
                    return
                yield item
        finally:
            done.set()
            worker.join()


def read_to_spool(settings_from: Connection, spool_folder: str, parent_pid: int, out_q, stop) -> None:
    """Reader process: :func:`read_chunks` with each chunk's lines in the spool, each message on
    ``out_q``, then a :class:`ReadingEnd` whose CPU seconds are those of its three threads: "gunzip",
    "read" (finding the lines) and "align" (sync points, chunks, spool writes). Ends with the run's
    process ``parent_pid``, and gives up when ``stop`` is set (nobody would take what it puts).

    It starts before the run knows where to read from (a ``--resume``'s line, a shard's cut: after the
    models are loaded), so it takes its :class:`ReadingSettings` from ``settings_from`` when they come
    (:meth:`ReaderProcess.read`). Gzip is decompressed in a thread of its own (no GIL), so cutting the
    lines has this core to itself."""
    die_with_parent(parent_pid)
    leave_interrupts_to_parent()
    settings = _settings_when_sent(settings_from, stop)
    if settings is None:
        return
    started, thread_started = time.process_time(), time.thread_time()

    prefetch = Prefetched()

    def cpu() -> dict[str, float]:
        thread = time.thread_time() - thread_started
        return {"read": prefetch.cpu_seconds, "align": thread,
                "gunzip": max(0.0, time.process_time() - started - thread - prefetch.cpu_seconds)}

    try:
        with open_input(settings.path, decompress_thread=True) as fh:
            for item in read_chunks(settings, fh, Spool(spool_folder), prefetch):
                if not put_unless_stopped(out_q, item, stop):
                    return
        put_unless_stopped(out_q, ReadingEnd(cpu()), stop)
    except BaseException as exc:  # handed to the main process, which re-raises it
        put_unless_stopped(out_q, ReadingEnd(cpu(), exc), stop)


def _settings_when_sent(settings_from: Connection, stop) -> ReadingSettings | None:
    """The reading's settings once the run sends them; None if it stops first."""
    try:
        while not stop.is_set():
            if settings_from.poll(0.1):
                return settings_from.recv()
    except (EOFError, OSError):  # the run ended without sending them
        pass
    return None


class ReaderProcess:
    """:func:`read_to_spool` in a process of its own (spawned: it imports no torch), its queue of
    messages and its stop flag. Start it with the run's interrupts held and its semaphores named
    (:meth:`~rescorer.pipeline.spool.Spool.semaphores`), as the worker pool; it starts before the run
    knows what to read, and reads when told (:meth:`read`), so its start-up overlaps the models'."""

    def __init__(self, spool: Spool, queue_size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.queue = context.Queue(maxsize=queue_size)
        settings_from, self._settings_to = context.Pipe(duplex=False)
        self.process = context.Process(target=read_to_spool, daemon=True, name="rescore-reader",
                                       args=(settings_from, str(spool.folder), os.getpid(), self.queue, self.stop))
        try:
            self.process.start()
        finally:
            settings_from.close()  # the child's end: its copy is the child's now

    def read(self, settings: ReadingSettings) -> None:
        """Start reading the table as ``settings`` say (once)."""
        self._settings_to.send(settings)

    def messages(self, stop: threading.Event) -> Iterator[ReadChunk | ReadingEnd]:
        """Its messages, in order, up to its end (or until ``stop`` is set)."""
        while not stop.is_set():
            try:
                message = self.queue.get(timeout=0.1)
            except queue.Empty:
                continue
            yield message
            if isinstance(message, ReadingEnd):
                return

    def close(self) -> None:
        """Stop it and wait for it (a few seconds at most, then SIGKILL)."""
        self.stop.set()
        self._settings_to.close()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()


@dataclass
class Preparing:
    """Where the chunks read are prepared: the ``executor`` (worker processes, or
    :class:`~rescorer.pipeline.chunk_prep.InlineExecutor`), the function it runs on each task
    (``prepare``), and how a chunk's task is made (``task``: its lines and the column count known).

    The count known is the one fixed by the chunks the run has taken (``taken_count``), or, with an
    executor that prepares at once, the one the last chunk prepared here found: a chunk sent with the
    count of the chunks before it is parsed once, as a serial run parses it."""

    executor: futures.Executor
    prepare: Callable[[PrepareTask], object]
    task: Callable[[LineChunk | SpooledChunk, int | None], PrepareTask]
    taken_count: Callable[[], int | None]
    found_count: int | None = None

    def submit(self, chunk: ReadChunk) -> None:
        """Give the chunk its task and start its preparation (nothing for a chunk outside the shard)."""
        if chunk.lines is None:
            return
        taken = self.taken_count()
        chunk.task = self.task(chunk.lines, taken if taken is not None else self.found_count)
        chunk.preparation = self.executor.submit(self.prepare, chunk.task)
        if chunk.preparation.done() and chunk.preparation.exception() is None:
            result = chunk.preparation.result()
            if isinstance(result, PreparedChunk) and result.num_scores is not None:
                self.found_count = result.num_scores


def feed(messages: Iterator[ReadChunk | ReadingEnd], preparing: Preparing, out_q: queue.Queue,
         stop: threading.Event) -> None:
    """The thread of the main process that takes the chunks read (:func:`read_here`, or
    :meth:`ReaderProcess.messages`), starts each one's preparation and hands it on to the run in table
    order, then the reading's end. With a reader process it touches no line: a chunk is a spool file's
    name here. Its own error comes to the run as the reading's, after the chunks before it."""
    try:
        for message in messages:
            if stop.is_set():
                return
            if isinstance(message, ReadChunk):
                preparing.submit(message)
            if not put_unless_stopped(out_q, message, stop) or isinstance(message, ReadingEnd):
                return
    except BaseException as exc:  # handed to the main thread, which re-raises
        put_unless_stopped(out_q, ReadingEnd({}, exc), stop)


@dataclass
class CarriedAcrossChunks:
    """What carries from one chunk to the next, as known in chunk order.

    The reader sends each chunk with the column count known when it is sent; the main thread,
    which takes the chunks in order, checks it against the count fixed by the chunks before.
    """

    num_scores: int | None
    prev_source: str | None


def prepared_in_table_order(pending: ReadChunk, carried: CarriedAcrossChunks, planners: tuple[Planner, ...],
                              summary: RescoreSummary) -> PreparedChunk | None:
    """The chunk's preparation, exactly as a serial run would have made it (or its error), taken in
    table order: it waits for the worker, and updates what ``carried`` holds and the summary's counts.

    A chunk sent before the table's column count was known was parsed with the count of its own
    first good line; if that differs from the count fixed by earlier chunks, or any line was
    bad, it is parsed again here with the right count, so the same lines are rejected (or the same
    line stops the run) as in a serial run.
    """
    if pending.task is None:
        return None
    try:
        prep = pending.prepared()
    except PhraseTableError:
        if pending.task.num_scores is not None or carried.num_scores is None:
            raise
        prep = None
    if pending.task.num_scores is None and carried.num_scores is not None and (
        prep is None or prep.bad_rows or prep.num_scores not in (None, carried.num_scores)
    ):
        pending.task.num_scores = carried.num_scores
        prep = prepare_chunk(pending.task, planners)
    if prep.num_scores is not None:
        carried.num_scores = prep.num_scores
    summary.add_stage("parse", prep.parse_seconds)
    summary.add_stage("trees", prep.tree_seconds)
    summary.distinct_sources += pending.new_sources(prep, carried.prev_source)
    if prep.scored:
        carried.prev_source = prep.last_source
    return prep


def put_unless_stopped(q, item, stop) -> bool:
    """Put ``item`` on the bounded queue unless the run stops first (nobody would take it); whether it
    was put. The pipeline's one way to hand a chunk on, in the reader process and the main process."""
    while not stop.is_set():
        with contextlib.suppress(queue.Full):
            q.put(item, timeout=0.1)
            return True
    return False


def drain(q: queue.Queue) -> None:
    """Empty the queue so that a thread blocked on putting to it sees the stop flag."""
    with contextlib.suppress(queue.Empty):
        while True:
            q.get_nowait()
