"""benchmarks/gpu_suite.sh runs whole on the CPU at tiny sizes, so a lent GPU's minutes go to
measuring, not to finding a broken script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from leftovers import marked_env, wait_until_gone

from rescorer.pipeline.spool import abandoned_spools
from shared_paths import REPO_ROOT, shared_file

pytestmark = pytest.mark.slow


def test_the_gpu_suite_runs_on_the_cpu_and_its_identity_checks_hold(tmp_path: Path) -> None:
    table = shared_file("fixtures/hansard-enfr/model/phrase-table.gz")
    env, mark = marked_env(DEVICE="cpu", TINY="1", PYTHON=sys.executable, JOBS="2")
    out = tmp_path / "logs"
    abandoned_before = set(abandoned_spools())
    run = subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "gpu_suite.sh"), str(out), str(table)],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # The suite kills a run with SIGKILL: its workers and reader go with it, and so does its spool.
    assert not wait_until_gone(mark, 5), "processes left running by the suite"
    assert not set(abandoned_spools()) - abandoned_before, "spools left by the suite"
    summary = (out / "summary.txt").read_text()
    for step in ("precision:", "e2e fp32:", "start-up", "cuda tests:", "train:", "cslm:", "gpu_suite: done"):
        assert step in summary, summary
    for log in ("precision.log", "e2e.fp32.log", "startup.log", "train.log", "cslm.log", "identity.log"):
        assert (out / log).stat().st_size > 0, log
    identity = (out / "identity.log").read_text()
    assert "rerun: byte-identical" in identity and "kill + --resume: byte-identical" in identity, identity
    assert "pairs/s" in (out / "e2e.fp32.log").read_text()
    assert "passed" in (out / "cuda-tests.log").read_text()  # the CPU's tests of the file; the GPU's skip
    # the suite's model is random_checkpoint's: the log must not call it trained (run 8's did)
    assert "random weights, never trained: " in (out / "precision.log").read_text()
