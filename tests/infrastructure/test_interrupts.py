"""Ctrl-C and SIGTERM held back while child processes start."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from infrastructure.interrupts import held_while_starting_children, stopped_runs_say_so


def blocked_signals(pid: int) -> int:
    """The signal mask of process ``pid`` (``SigBlk`` of /proc), as a bit set."""
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("SigBlk:")).split()[1], 16)


def test_a_sigterm_while_children_start_comes_once_they_have_started() -> None:
    """The signal waits for the end of the block, then ends the run as it would have (one line,
    143); the child started in the block, and a multiprocessing semaphore made in it (which starts
    multiprocessing's resource tracker, and that unblocks both signals), start with both blocked."""
    stops = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    with pytest.raises(SystemExit) as stopped, stopped_runs_say_so("test"), held_while_starting_children():
        multiprocessing.get_context("spawn").Lock()
        child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        os.kill(os.getpid(), signal.SIGTERM)
        child_blocks = blocked_signals(child.pid)
        child.stdin.close()
        child.wait()
    assert stopped.value.code == 128 + signal.SIGTERM
    assert child_blocks & stops == stops, hex(child_blocks)
    assert blocked_signals(os.getpid()) & stops == 0  # this process takes them again


#: A stand-in for torch's import: a Ctrl-C comes while it runs (when asked), and its code swallows the
#: KeyboardInterrupt (as a bare ``except:`` in an import does), so without the hold the program runs to its end.
SWALLOWING_IMPORT = """import os, signal, sys, time
try:
    if os.environ.get("CTRL_C"):
        os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
except BaseException:
    pass
print("imported", flush=True)
"""


def _import_stand_in(folder: Path, *, held: bool, ctrl_c: bool, then: str = "") -> subprocess.CompletedProcess:
    """Import :data:`SWALLOWING_IMPORT` as ``torch`` in a new Python, after ``before_torch_loads`` if ``held``."""
    (folder / "torch").mkdir(exist_ok=True)
    (folder / "torch/__init__.py").write_text(SWALLOWING_IMPORT)
    hold = "from infrastructure.threads import before_torch_loads\nbefore_torch_loads()\n" if held else ""
    code = f"import sys\nsys.path.insert(0, {str(folder)!r})\n{hold}import torch\n{then}print('ran to the end')\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **({"CTRL_C": "1"} if ctrl_c else {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("held", [True, False])
def test_a_ctrl_c_while_torch_is_imported_ends_the_program_once_it_is(tmp_path, held: bool) -> None:
    """A Ctrl-C 0.6-1.4 s into a command, while torch was being imported, was swallowed in 6 of 21 tries (the
    command ran to its end, exit 0), or aborted it from C++. Held during the import, it comes as the import
    ends, as a Ctrl-C comes: the program stops there."""
    run = _import_stand_in(tmp_path, held=held, ctrl_c=True)
    if held:
        assert run.returncode == -signal.SIGINT and run.stdout == "imported\n", run
        assert run.stderr.splitlines()[-1] == "KeyboardInterrupt"
    else:  # what the hold is for: the stand-in swallows the Ctrl-C
        assert run.returncode == 0 and run.stdout == "imported\nran to the end\n", run


def test_a_held_import_is_the_usual_import(tmp_path) -> None:
    """No Ctrl-C: the module is imported once, by its own loader, and the program goes on."""
    run = _import_stand_in(tmp_path, held=True, ctrl_c=False,
                           then="import importlib.machinery\nassert type(torch.__loader__) is "
                                "importlib.machinery.SourceFileLoader is type(torch.__spec__.loader)\n"
                                "assert any(type(f).__name__ == '_HeldImportFinder' for f in sys.meta_path)\n")
    assert run.returncode == 0 and run.stdout == "imported\nran to the end\n", run
