"""A program's own children end with the run that started it (infrastructure.processes.run_as_group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

from infrastructure.processes import run_as_group

# A script that starts a child of its own, as mert-moses.pl starts moses, says its pid, and waits for it.
STARTS_A_CHILD = "sleep 300 & echo $! > {pid}.tmp && mv {pid}.tmp {pid}; wait"


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended (gone, or a zombie its parent has not reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].startswith("Z")


def child_pid(pid_file: Path) -> int:
    return int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), "the child's pid"))


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_the_programs_own_child_ends_with_a_run_stopped_by(stop, tmp_path):
    """``mert tune --mert-moses`` killed by SIGKILL left the moses that mert-moses.pl had started decoding
    the dev set for an hour; a Ctrl-C or SIGTERM, which reach the run only, must end it too."""
    pid_file = tmp_path / "child.pid"
    code = ("import sys\nfrom infrastructure.interrupts import stopped_runs_say_so\nfrom infrastructure.processes "
            "import run_as_group\nwith stopped_runs_say_so('test'):\n    run_as_group(['sh', '-c', sys.argv[1]])\n")
    run = subprocess.Popen([sys.executable, "-c", code, STARTS_A_CHILD.format(pid=pid_file)],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, stderr=subprocess.PIPE)
    child = child_pid(pid_file)
    try:
        run.send_signal(stop)
        run.wait()
        wait_until(lambda: ended(child), "the end of the program's child")
    finally:
        if not ended(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize(("stop", "name"), [(signal.SIGINT, "INT"), (signal.SIGTERM, "TERM")])
def test_a_ctrl_c_or_sigterm_is_passed_on_and_the_program_ends_as_it_chooses(stop, name, tmp_path):
    """A training under ``table1`` stopped from the terminal saves its state (Ctrl-C reached it there): the
    program gets the run's own signal, and the run waits for it to end."""
    pid_file, said = tmp_path / "child.pid", tmp_path / "said"
    script = f"trap 'echo {name} > {said}; exit 9' {name}; {STARTS_A_CHILD.format(pid=pid_file)}"
    code = ("import sys\nfrom infrastructure.interrupts import stopped_runs_say_so\nfrom infrastructure.processes "
            "import run_as_group\nwith stopped_runs_say_so('test'):\n    run_as_group(['sh', '-c', sys.argv[1]])\n")
    run = subprocess.Popen([sys.executable, "-c", code, script],
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, stderr=subprocess.PIPE)
    child = child_pid(pid_file)
    try:
        run.send_signal(stop)
        assert run.wait() == 128 + stop
        assert said.read_text() == f"{name}\n"  # before the run ended
        wait_until(lambda: ended(child), "the end of the program's child")
    finally:
        if not ended(child):
            os.kill(child, signal.SIGKILL)


def test_a_program_that_returns_leaves_nothing_running_and_gives_its_status(tmp_path):
    pid_file = tmp_path / "child.pid"
    assert run_as_group(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; exit 3"]) == 3
    child = int(pid_file.read_text())
    wait_until(lambda: ended(child), "the end of the child the program left running")


def test_a_program_that_cannot_start_is_the_usual_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_as_group([str(tmp_path / "no-such-program")])


def test_the_program_starts_with_no_signal_held_back(tmp_path):
    """It is started while this run holds Ctrl-C and SIGTERM back (so that one cannot come before the group is
    known); a program that inherited that mask would never see the Ctrl-C passed on to it."""
    status = tmp_path / "status"
    with open(status, "wb") as out:
        assert run_as_group(["cat", "/proc/self/status"], stdout=out) == 0
    blocked = next(line for line in status.read_text().splitlines() if line.startswith("SigBlk:"))
    assert int(blocked.split()[1], 16) & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)) == 0, blocked
