"""``rescore-phrase-table -v`` says where the time went: each phase reached, in order, counted from the
command's start, and the main thread's seconds per chunk; the output's bytes are those of a run
without it, and a ``--resume`` may add or drop it."""

from __future__ import annotations

import re
import time
from pathlib import Path

from rescore_runs import SAMPLE_TABLE, assert_ran, assert_same_output, run_command

from rescorer.pipeline.timeline import PHASES, Timeline, process_age
from shared_paths import shared_file

NUMBER = r"\d+\.\d+"


def test_verbose_prints_every_phase_in_order_and_each_chunks_main_thread_time(sample_model: Path,
                                                                              tmp_path: Path) -> None:
    table = shared_file(SAMPLE_TABLE)  # 5,166 lines: chunks of at most 100
    common = ["--model", str(sample_model), "--device", "cpu", "-j", "1", "--chunk-lines", "100", "-q"]
    quiet = run_command([str(table), str(tmp_path / "plain.gz"), *common])
    assert_ran(quiet)
    assert "timeline" not in quiet.output
    run = run_command([str(table), str(tmp_path / "timed.gz"), *common, "-v"])
    assert_ran(run)
    assert_same_output(tmp_path / "timed.gz", tmp_path / "plain.gz")

    phases = re.search(r"^timeline, seconds since the command's start: (.*)$", run.output, re.M)
    assert phases, run.output
    reached = [(m.group(1), float(m.group(2))) for m in re.finditer(rf"([a-z ]+) ({NUMBER})(?:; |$)", phases[1])]
    assert [name.strip() for name, _ in reached] == list(PHASES), phases[1]
    times = [t for _, t in reached]
    assert times == sorted(times), phases[1]
    # counted from the process' start: the imports before the command ran are in the first figure
    assert times[0] > 0
    per_chunk = re.search(r"^main thread over (\d+) chunks: (.*)$", run.output, re.M)
    assert per_chunk and int(per_chunk[1]) >= 52, run.output
    writing = re.search(r"^writing thread: (.*)$", run.output, re.M)
    assert writing, run.output
    for name, line in (("waiting for a prepared chunk", per_chunk[2]), ("scoring", per_chunk[2]),
                       ("waiting for the writing stage", per_chunk[2]), ("waiting for its formatting", writing[1]),
                       ("writing (data, fsync, progress record)", writing[1])):
        assert re.search(rf"{re.escape(name)} {NUMBER} s \(median {NUMBER}, max {NUMBER}\)", line), name
    run_time = times[-1] - times[PHASES.index("stages started")] + 0.05
    for line in (per_chunk[2], writing[1]):  # each thread's seconds within the run's own time
        assert sum(float(s) for s in re.findall(rf"({NUMBER}) s \(median", line)) <= run_time, line


def test_the_process_age_counts_from_the_process_start() -> None:
    """The timeline's origin is the process' start as the kernel has it: an age that grows with the clock."""
    first = process_age()
    assert first is not None and first > 0
    time.sleep(0.05)
    assert process_age() >= first + 0.04
    timeline = Timeline.since_process_start()
    assert timeline.from_process_start
    assert abs((time.monotonic() - timeline.origin) - process_age()) < 0.05
