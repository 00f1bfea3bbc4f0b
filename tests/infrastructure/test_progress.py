"""Progress bars: redrawn in place on a terminal, a few lines in a file or a pipe (``make demo > log``)."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

# 40 updates over about 2 s: tqdm's default (a redraw every 0.1 s) draws about 20 times (a pause of 0
# where time does not matter: a quiet bar draws nothing, however long it runs).
# Every 10 updates a postfix and a message, as the training loops do: on a terminal each of those
# redraws the bar too.
SCRIPT = """
import sys, time
from tqdm import tqdm
from infrastructure.progress import progress_bar
bar = progress_bar(total=40, show={show}, desc="work")
for i in range(40):
    time.sleep({pause})
    bar.update(1)
    if i % 10 == 9:
        bar.set_postfix(loss=i)
        tqdm.write(f"message {{i}}", file=sys.stderr)
bar.close()
"""


def _run(show: bool, stderr, pause: float = 0.05) -> None:
    subprocess.run([sys.executable, "-c", SCRIPT.format(show=show, pause=pause)], stderr=stderr, check=True,
                   timeout=60)


def test_a_bar_written_to_a_file_is_its_first_and_last_state_on_lines_of_their_own(tmp_path: Path) -> None:
    log = tmp_path / "stderr.log"
    with open(log, "w") as err:
        _run(True, err)
    text = log.read_bytes()  # bytes: text mode would turn each redraw's \r into a newline
    assert b"\r" not in text, text
    lines = text.decode().splitlines()
    drawn = [line for line in lines if line.startswith("work:")]
    assert 2 <= len(drawn) <= 3, lines
    assert "0/40" in drawn[0] and "40/40" in drawn[-1]  # the first and the final state are written
    assert [line for line in lines if line.startswith("message")] == [f"message {i}" for i in (9, 19, 29, 39)]


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
        _run(False, err, pause=0.0)
    assert b"work" not in log.read_bytes()
