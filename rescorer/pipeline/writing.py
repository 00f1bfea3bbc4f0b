"""The writing stage of ``rescore-phrase-table``: each chunk's formatted bytes, in table order, appended
to the partial output and made durable (:class:`~rescorer.pipeline.partial_output.DurableWriter`: data,
fsync, progress record), in a thread of its own.

The main thread drives the model; with a fast model, the fsyncs and the progress record took a third of
its time (``benchmarks/pipeline_speed.py``, ``-j 1``), and on a GPU every such second is one the device
is idle. So the main thread only hands each chunk over (:meth:`WritingStage.submit`), waiting only when
``window`` chunks are queued (their bytes are in memory), and the writes happen here, one thread, in
order: a chunk is recorded as durable only after every chunk before it, as before, so ``--resume`` after
SIGKILL continues from the same kind of record. A write error (disk full) is raised in the main thread
at its next hand-over, or at :meth:`finish`, and the run stops as it did when it wrote itself.
"""

from __future__ import annotations

import concurrent.futures as futures
import queue
import threading
from dataclasses import dataclass

from rescorer.pipeline.partial_output import ChunkProgress, DurableWriter
from rescorer.pipeline.timeline import Timeline

#: Seconds between looks at the stop flag while waiting (a chunk's formatting, a full queue).
POLL_SECONDS = 0.05


@dataclass
class Formatting:
    """A chunk scored and sent to be formatted: the executor's future of its bytes (and the CPU
    seconds they took), its rejected lines' bytes, and the progress record once it is written."""

    job: futures.Future
    rejects: bytes
    progress: ChunkProgress


class WritingStage:
    """The thread that writes the formatted chunks in order; see the module doc."""

    def __init__(self, writer: DurableWriter, window: int, timeline: Timeline) -> None:
        self.writer, self.timeline = writer, timeline
        self.queue: queue.Queue[Formatting | None] = queue.Queue(maxsize=max(1, window))
        self.error: BaseException | None = None
        self.format_seconds = 0.0  # CPU seconds of the chunks' formatting, wherever it ran
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._write_all, daemon=True, name="rescore-write")
        self.thread.start()

    def submit(self, chunk: Formatting) -> None:
        """Queue ``chunk`` to be written after those before it; the stage's error, if it has stopped."""
        with self.timeline.timing("writer"):
            while True:
                self._raise_error()
                try:
                    self.queue.put(chunk, timeout=POLL_SECONDS)
                    return
                except queue.Full:
                    continue

    def finish(self) -> None:
        """Write every chunk queued, then end the thread; the stage's error, if it stopped."""
        with self.timeline.timing("writer", same_chunk=True):
            while self.thread.is_alive():
                try:
                    self.queue.put(None, timeout=POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            self.thread.join()
        self._raise_error()

    def stop(self) -> None:
        """End the thread at once: the chunk it is writing is finished (so the partial files and the
        record agree), the ones queued are not written (a ``--resume`` scores them again)."""
        self.halt.set()
        self.thread.join()

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _write_all(self) -> None:
        try:
            while (chunk := self._next()) is not None:
                data = self._formatted(chunk)
                if data is None:
                    return
                with self.timeline.timing("write"):
                    self.writer.write(data, chunk.rejects, chunk.progress)
                self.timeline.mark("first chunk written")
                self.timeline.mark("last chunk written", again=True)
        except BaseException as exc:  # raised in the main thread
            self.error = exc

    def _next(self) -> Formatting | None:
        while not self.halt.is_set():
            try:
                return self.queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
        return None

    def _formatted(self, chunk: Formatting) -> bytes | None:
        """The chunk's bytes once formatted (None: the stage was stopped meanwhile)."""
        with self.timeline.timing("format"):
            while not self.halt.is_set():
                try:
                    data, seconds = chunk.job.result(timeout=POLL_SECONDS)
                except futures.TimeoutError:
                    continue
                self.format_seconds += seconds
                return data
        return None
