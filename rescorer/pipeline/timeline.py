"""Where a run's wall time goes: when each phase was reached, counted from the command's start
(imports included), and per chunk what the main thread spent its time on.

``rescore-phrase-table -v`` prints it after the summary; ``benchmarks/gpu_suite.sh`` reads the fixed
cost from it (start to the first scored chunk), which a GPU run must keep small: the time before the
first chunk is scored is paid once per table, the rest per line. The main thread is the one that
drives the model, so every second it waits for a prepared chunk or for the writing stage (whose
thread waits for each chunk's formatting and writes it, shown apart) is a second the device is idle.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

#: The phases, in the order a run reaches them.
PHASES = ("options checked", "models ready", "stages started", "first chunk prepared", "first chunk scored",
          "first chunk written", "last chunk written", "done")
#: What the main thread does per chunk, and how the report names it.
WAITS = {"prepared": "waiting for a prepared chunk", "score": "scoring", "writer": "waiting for the writing stage"}
#: What the writing stage's thread (:mod:`rescorer.pipeline.writing`) does per chunk.
WRITING = {"format": "waiting for its formatting", "write": "writing (data, fsync, progress record)"}


def process_age() -> float | None:
    """Seconds since this process started, from ``/proc`` (the kernel's start time, in clock ticks
    since boot, against the boot-time clock); None where there is no ``/proc``."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


@dataclass
class Timeline:
    """The phases reached (seconds since :attr:`origin`) and the main thread's seconds per chunk.

    ``origin`` is a ``time.monotonic()`` reading: the process' start (:meth:`since_process_start`),
    or when the timeline was made.
    """

    origin: float = field(default_factory=time.monotonic)
    from_process_start: bool = False
    marks: dict[str, float] = field(default_factory=dict)
    waits: dict[str, list[float]] = field(default_factory=lambda: {kind: [] for kind in {**WAITS, **WRITING}})

    @classmethod
    def since_process_start(cls) -> Timeline:
        age = process_age()
        return cls(time.monotonic() - (age or 0.0), from_process_start=age is not None)

    def mark(self, phase: str, again: bool = False) -> None:
        """Note that ``phase`` is reached now; a phase is noted once unless ``again`` (the last chunk)."""
        if again or phase not in self.marks:
            self.marks[phase] = time.monotonic() - self.origin

    @contextmanager
    def timing(self, kind: str, same_chunk: bool = False) -> Iterator[None]:
        """Time one chunk's ``kind`` of work in the main thread (a key of :data:`WAITS`); ``same_chunk``:
        more of the chunk timed last."""
        started = time.monotonic()
        try:
            yield
        finally:
            seconds, times = time.monotonic() - started, self.waits[kind]
            if same_chunk and times:
                times[-1] += seconds
            else:
                times.append(seconds)

    @property
    def fixed_cost(self) -> float | None:
        """Seconds from the start to the first scored chunk (None: no chunk was scored)."""
        return self.marks.get("first chunk scored")

    def report(self) -> str:
        """Three lines: the phases with their times, the main thread's seconds per kind of work, and
        the writing thread's."""
        start = "the command's start" if self.from_process_start else "the run's start"
        phases = "; ".join(f"{phase} {self.marks[phase]:.2f}" for phase in PHASES if phase in self.marks)
        chunks = len(self.waits["score"])
        return (f"timeline, seconds since {start}: {phases}\n"
                f"main thread over {chunks} chunk{'s' * (chunks != 1)}: {self._spent(WAITS)}\n"
                f"writing thread: {self._spent(WRITING)}")

    def _spent(self, kinds: dict[str, str]) -> str:
        parts = []
        for kind, name in kinds.items():
            seconds = self.waits[kind]
            if seconds:
                parts.append(f"{name} {sum(seconds):.2f} s (median {statistics.median(seconds):.3f}, "
                             f"max {max(seconds):.3f})")
        return "; ".join(parts) or "nothing"
