"""The reading stage: the same chunks and the same end whether it reads in a process of its own or in
the thread that takes them; the executor of ``-j 0/1``; the reader's prefetching thread (items in
order, its error after the items before it, and a consumer that stops early stops it)."""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

import pytest

from infrastructure.files import open_input
from rescorer.pipeline.chunk_prep import InlineExecutor
from rescorer.pipeline.reader import Prefetched, ReaderProcess, ReadingEnd, ReadingSettings, read_here
from rescorer.pipeline.spool import Spool, lines_of
from rescorer.tables.chunks import UnreadableInputError


def table(path: Path, sources: int, truncated: bool = False) -> Path:
    """A sorted gzip table, 1 to 4 targets per source; ``truncated``: its last 40 bytes cut off."""
    lines = [f"s{s:05d} x ||| t{t} y ||| 0.5 0.5 0.5 0.5\n".encode() for s in range(sources) for t in range(1 + s % 4)]
    data = gzip.compress(b"".join(lines))
    path.write_bytes(data[:-40] if truncated else data)
    return path


def read_both_ways(settings: ReadingSettings) -> list[list]:
    """Each chunk read (line numbers, rows kept, shard state, its lines' bytes or None) and the end's
    error, read in this thread and by a reader process through the spool."""
    with open_input(settings.path) as fh:
        here = list(read_here(settings, fh, None))
    spool = Spool()
    try:
        reader = ReaderProcess(spool, queue_size=4)
        reader.read(settings)
        there = list(reader.messages(threading.Event()))
        reader.close()
        return [[(m.first_line_no, m.last_line_no, m.keep, m.shard_state, m.in_run and lines_of(m.lines).data)
                 if not isinstance(m, ReadingEnd) else type(m.error) for m in messages]
                for messages in (here, there)]
    finally:
        spool.close()


@pytest.mark.parametrize("shard", [None, (2, 3)])
def test_a_reader_process_reads_what_the_thread_reads(tmp_path: Path, shard) -> None:
    settings = ReadingSettings(str(table(tmp_path / "pt.gz", 600)), 200, 0, shard, None)
    here, there = read_both_ways(settings)
    assert here == there and here[-1] is type(None)  # the end, without an error
    chunks = here[:-1]
    assert len(chunks) > 3 and chunks[0][0] == 1
    assert all(a[1] + 1 == b[0] for a, b in zip(chunks, chunks[1:], strict=False))
    if shard:  # the chunks after the shard are not read, those before it come without their lines
        assert not chunks[0][4] and chunks[-1][1] < 1500 and chunks[-1][3] == chunks[0][3]


def test_a_truncated_table_ends_the_reading_with_its_error_after_the_chunks_before_it(tmp_path: Path) -> None:
    """Each way ends with the error; the chunks before it (how many depends on how far its reader
    decompresses ahead) are the whole table's first ones."""
    whole, _ = read_both_ways(ReadingSettings(str(table(tmp_path / "pt.gz", 40_000)), 5000, 0, None, None))
    cut = ReadingSettings(str(table(tmp_path / "cut.gz", 40_000, truncated=True)), 5000, 0, None, None)
    for messages in read_both_ways(cut):
        assert messages[-1] is UnreadableInputError and messages[:-1] == whole[: len(messages) - 1]


def test_the_inline_executor_runs_each_task_at_once_and_keeps_its_error_in_the_future() -> None:
    executor = InlineExecutor()
    assert executor.submit(sum, [1, 2]).result() == 3
    failed = executor.submit(int, "x")
    assert failed.done() and isinstance(failed.exception(), ValueError)  # raised where the result is taken

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # an interrupt stops the run where it comes
        executor.submit(interrupted)


def test_items_come_in_order_then_the_error_and_the_thread_ends() -> None:
    def items():
        yield from range(5)
        raise ValueError("line 6: broken")

    prefetch = Prefetched(ahead=2)
    seen = []
    with pytest.raises(ValueError, match="line 6"):
        for item in prefetch.of(items()):
            seen.append(item)
    assert seen == [0, 1, 2, 3, 4]
    assert not [t for t in threading.enumerate() if t.name == "find-lines"]
    assert prefetch.cpu_seconds >= 0.0


def test_a_consumer_that_stops_early_stops_the_producer() -> None:
    produced = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    stream = Prefetched(ahead=2).of(items())
    assert [next(stream) for _ in range(3)] == [0, 1, 2]
    stream.close()
    assert not [t for t in threading.enumerate() if t.name == "find-lines"]
    assert len(produced) < 10  # it stopped a few items ahead, not at the end
