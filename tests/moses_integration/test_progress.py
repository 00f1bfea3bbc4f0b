"""Progress bars: redrawn in place on a terminal, a few lines in a file or a pipe (``make demo > log``)."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

# 40 updates over about 2 s: tqdm's default (a redraw every 0.1 s) draws about 20 times.
SCRIPT = """
import time
from moses_integration.progress import progress_bar
for _ in progress_bar(range(40), show={show}, desc="work"):
    time.sleep(0.05)
"""


def _run(show: bool, stderr) -> None:
    subprocess.run([sys.executable, "-c", SCRIPT.format(show=show)], stderr=stderr, check=True, timeout=60)


def test_a_bar_written_to_a_file_redraws_only_its_first_and_last_state(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        _run(True, err)
    text = log.read_bytes()  # bytes: text mode would turn each redraw's \r into a newline
    assert text.count(b"\r") <= 3, text
    assert b"40/40" in text  # the final state is always written


def test_on_a_terminal_the_bar_keeps_redrawing(tmp_path: Path) -> None:
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm sizes the bar to it
    try:
        _run(True, slave)
        os.set_blocking(master, False)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except (BlockingIOError, OSError):
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(slave)
        os.close(master)
    assert b"".join(chunks).count(b"\r") >= 8


def test_quiet_draws_nothing(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        _run(False, err)
    assert log.read_bytes() == b""
