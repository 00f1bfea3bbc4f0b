"""The reading stage of ``rescore-phrase-table``: decompress, cut, keep this run's chunks.

One generator (:func:`table_chunks`) does the work wherever it runs: in a thread of the main
process (``-j 0/1``, and stdin, which a child process cannot read), or in a reader process of its
own (:func:`read_to_spool`, ``-j 2`` and more), which puts each chunk's lines in the spool
(:mod:`rescorer.pipeline.spool`) and tells the main process only where they are. Decompression
(ISA-L), the newline search and the content hashes of :mod:`rescorer.tables.aligned` then take a
core of their own instead of the main process' time, and no line crosses a process boundary by
pickling. Torch-free: the reader process imports no model.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from infrastructure.files import input_position, open_input
from infrastructure.processes import die_with_parent, leave_interrupts_to_parent
from rescorer.pipeline.shards import ShardFilter
from rescorer.pipeline.spool import Spool, SpooledChunk
from rescorer.tables.aligned import aligned_chunks
from rescorer.tables.chunks import LineChunk, iter_line_chunks


@dataclass
class ReadChunk:
    """One chunk as read, and where the reading stands after it."""

    chunk: LineChunk
    in_run: bool  # False: outside this run's shard (its lines are not scored)
    keep: tuple[int, int] | None  # rows [a, b) of the shard in a chunk that holds one of its ends (None: all)
    shard_state: dict | None  # the shard filter's state after this chunk (for --resume)
    position: int | None  # bytes of the file read so far (compressed, for gzip): the progress bar


def table_chunks(fh: BinaryIO, path: str, chunk_lines: int, lines_done: int,
                 shard_filter: ShardFilter | None, prefetch: Prefetched | None = None) -> Iterator[ReadChunk]:
    """The table's chunks after line ``lines_done`` (a resumed run's), cut where every run cuts them.

    Stops after the chunk that ends the shard. Chunks before the shard start come as ``in_run=False``
    so that the progress record advances past them; a chunk that holds an end of the shard is
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
        yield ReadChunk(chunk, rows is not None, keep, shard_filter.state() if shard_filter else None,
                        input_position(fh))
        if shard_filter and shard_filter.finished:
            return


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


@dataclass(frozen=True)
class ReaderSettings:
    """What the reader process needs (picklable: it crosses to a spawned process)."""

    path: str
    chunk_lines: int
    lines_done: int
    shard: tuple[int, int] | None
    shard_state: dict | None
    spool_folder: str
    parent_pid: int  # the run's process: the reader ends with it (die_with_parent)


@dataclass(frozen=True)
class SkippedChunk:
    """A chunk outside the run's shard: its line numbers, for the progress record."""

    first_line_no: int
    last_line_no: int


def read_to_spool(settings: ReaderSettings, out_q, stop) -> None:
    """Reader process: each chunk to the spool, ``("chunk", SpooledChunk | SkippedChunk, shard
    state, position, rows kept)`` on ``out_q``; then ``("end", cpu)`` or ``("error", exception, cpu)``, with
    ``cpu`` the CPU seconds of its three threads: "gunzip", "read" (finding the lines) and "align"
    (sync points, chunks, spool writes). Gives up when
    ``stop`` is set (nobody would take what it puts).

    Gzip is decompressed in a thread of its own (no GIL), so cutting the lines has this core to
    itself. A shard's reader first finds where the table is cut (:meth:`ShardFilter.of_table`)."""
    die_with_parent(settings.parent_pid)
    leave_interrupts_to_parent()
    started, thread_started = time.process_time(), time.thread_time()

    prefetch = Prefetched()

    def cpu() -> dict[str, float]:
        thread = time.thread_time() - thread_started
        return {"read": prefetch.cpu_seconds, "align": thread,
                "gunzip": max(0.0, time.process_time() - started - thread - prefetch.cpu_seconds)}

    spool = Spool(settings.spool_folder)
    try:
        shard = ShardFilter.of_table(settings.path, settings.shard, settings.shard_state) if settings.shard else None
        with open_input(settings.path, decompress_thread=True) as fh:
            for index, item in enumerate(table_chunks(fh, settings.path, settings.chunk_lines, settings.lines_done,
                                                      shard, prefetch)):
                ref: SpooledChunk | SkippedChunk = (spool.put(index, item.chunk) if item.in_run else
                                                    SkippedChunk(item.chunk.first_line_no, item.chunk.last_line_no))
                if not put_unless_stopped(out_q, ("chunk", ref, item.shard_state, item.position, item.keep), stop):
                    return
        put_unless_stopped(out_q, ("end", cpu()), stop)
    except BaseException as exc:  # handed to the main process, which re-raises it
        put_unless_stopped(out_q, ("error", exc, cpu()), stop)


def put_unless_stopped(q, item, stop) -> bool:
    """Put ``item`` on the bounded queue unless the run stops first (nobody would take it); whether it
    was put. The pipeline's one way to hand a chunk on, in the reader process and the main process."""
    while not stop.is_set():
        with contextlib.suppress(queue.Full):
            q.put(item, timeout=0.1)
            return True
    return False
