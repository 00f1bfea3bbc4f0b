"""benchmarks/gpu_suite.sh runs whole on the CPU at tiny sizes, so a lent GPU's minutes go to
measuring, not to finding a broken script."""

from __future__ import annotations

import re
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
    assert not wait_until_gone(mark), "processes left running by the suite"
    assert not set(abandoned_spools()) - abandoned_before, "spools left by the suite"
    summary = (out / "summary.txt").read_text()
    for step in ("precision:", "e2e fp32:", "e2e fp32, 2 copies of the table:", "e2e fp32 steady: ", "start-up",
                 "cuda tests:", "train:", "cslm:", "nmt:", "gpu_suite: done"):
        assert step in summary, summary
    for log in ("precision.log", "e2e.fp32.log", "startup.log", "train.log", "cslm.log", "nmt.log", "identity.log"):
        assert (out / log).stat().st_size > 0, log
    # the NMT model's commands ran on the device end to end: 10 sources, 5 hypotheses each, scored
    assert re.search(r"^nmt commands on cpu: train, translate --nbest 5, nbest in [\d.]+ s; 50 n-best lines scored$",
                     summary, re.M), summary
    assert re.search(r"^nmt: fp32: nmt [\d,]+ target units/s, torch peer \(nn.GRU\) [\d,]+: [\d.]+x; per CPU-second "
                     r"[\d,]+ and [\d,]+: [\d.]+x .*n-best scoring: ",
                     summary, re.M), summary
    identity = (out / "identity.log").read_text()
    assert "rerun: byte-identical" in identity and "kill + --resume: byte-identical" in identity, identity
    assert "pairs/s" in (out / "e2e.fp32.log").read_text()
    # -v's timeline: the fixed cost and the main thread's time per chunk, for each end-to-end run
    fixed = r"; fixed cost \(command start to first scored chunk\) [\d.]+ s; main thread over \d+ chunks: waiting"
    assert re.search(rf"^e2e fp32: rescored 6000 lines.*{fixed}", summary, re.M), summary
    assert re.search(rf"^e2e fp32, 2 copies of the table: rescored 12000 lines.*{fixed}", summary, re.M), summary
    # Two copies of the 6,000 lines: the steady rate from the difference, and the fixed cost apart; or, where
    # a loaded machine made two copies no slower than one (timing, not a fault), the line that says so.
    assert re.search(r"^e2e fp32 steady: (?:[\d,]+ lines/s = \(L2 - L1\) / \(T2 - T1\) with L1 = 6,000 lines, .*"
                     r"fixed cost T1 - L1 / rate = -?[\d.]+ s|2 copies took no longer than one \([\d.]+ s against "
                     r"[\d.]+ s\): no steady rate)$", summary, re.M), summary
    assert "passed" in (out / "cuda-tests.log").read_text()  # the CPU's tests of the file; the GPU's skip
    # the suite's model is random_checkpoint's: the log must not call it trained (run 8's did)
    assert "random weights, never trained: " in (out / "precision.log").read_text()


def _suite_same(first: Path, other: Path) -> str:
    """The suite's identity verdict on two outputs (its ``same`` function, run alone)."""
    script = (REPO_ROOT / "benchmarks" / "gpu_suite.sh").read_text()
    same = script[script.index("same() {"):script.index("\n}\n", script.index("same() {")) + 3]
    run = subprocess.run(["bash", "-c", f'{same}\nsame "$1" "$2" check', "same", str(first), str(other)],
                         env={"REPO": str(REPO_ROOT), "PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120, check=True)
    return run.stdout.strip()


def test_the_identity_check_tells_lines_members_and_bytes_apart(tmp_path: Path) -> None:
    """The same bytes pass; the same lines in the same members compressed otherwise, other member
    boundaries, or other lines do not, and the verdict says which. Members larger than the reader's
    block, and many of them, as in a whole table (the first version copied the rest of the file per
    member: minutes on a GPU)."""
    import zlib

    rows = [f"src {i} ||| tgt {i * 7919 % 100003} ||| 0.5 0.25 0.125 0.0625 ||| 0-0 ||| 1 1 1\n".encode()
            for i in range(60_000)]
    stretches = [b"".join(rows[a:a + 150]) for a in range(0, 3000, 150)] + [b"".join(rows[3000:])]

    def gz(parts: list[bytes], level: int = 6) -> Path:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.gz"
        path.write_bytes(b"".join(zlib.compress(part, level, wbits=31) for part in parts))
        return path

    first = gz(stretches)
    assert len(stretches[-1]) > 1 << 20  # a member far larger than one 64 KB block
    assert _suite_same(first, gz(stretches)) == "check: byte-identical"
    recoded = gz(stretches[:3]).read_bytes() + gz([stretches[3]], 1).read_bytes() + gz(stretches[4:]).read_bytes()
    (tmp_path / "recoded.gz").write_bytes(recoded)  # member 3 at another level: the same text, other bytes
    verdict = _suite_same(first, tmp_path / "recoded.gz")
    assert verdict.startswith("check: NOT the same output: the same 60000 lines in the same 21 gzip members, "
                              "compressed differently"), verdict
    assert "; 1 of 21 members encoded differently: [(3, " in verdict, verdict
    assert "NOT the same output: the same 60000 lines in 20 gzip members against 21" in \
        _suite_same(first, gz([stretches[0] + stretches[1], *stretches[2:]]))
    assert "NOT the same output: 60000 lines against 60000 expected, 1 of the shared ones differ" in \
        _suite_same(first, gz([*stretches[:-1], stretches[-1].replace(b"tgt 1 ", b"tgt 2 ")]))
