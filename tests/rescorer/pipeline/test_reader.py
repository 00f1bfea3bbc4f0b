"""The reader's prefetching thread: items in order, its error after the items before it, and a
consumer that stops early stops it."""

from __future__ import annotations

import threading

import pytest

from rescorer.pipeline.reader import Prefetched


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
