"""How the smoke tests run a benchmark: as the docs do, ``python -m benchmarks.NAME`` from the
repository root, in a process of its own (a benchmark sets thread counts and matmul precision for
its whole process), with no PYTHONPATH, so a benchmark that only imports with a path edit fails."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from waiting import SAFETY_SECONDS

from benchmarks.machine_peak import WINDOW_ENV
from shared_paths import REPO_ROOT, shared_data_dir

RunBenchmark = Callable[..., str]


@pytest.fixture
def run_benchmark() -> RunBenchmark:
    def run(name: str, *args: str, timeout: float = SAFETY_SECONDS, env: dict[str, str] | None = None) -> str:
        environment = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "MOSES_BIN_DIR"}}
        shared = shared_data_dir()
        if shared is not None:
            environment["SHARED_DATA_DIR"] = str(shared)
        # The yardsticks timed for 0.25 s, not 2 s: the smoke tests check what is printed, not the figures.
        environment.setdefault(WINDOW_ENV, "0.25")
        environment.update(env or {})
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=REPO_ROOT,
                              env=environment, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"benchmarks.{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    return run
