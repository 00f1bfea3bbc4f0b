"""The benchmark commands the docs cite are the ones that run, and every benchmark is run by a test:
a figure in README is only as good as the command that produced it."""

from __future__ import annotations

import re

from shared_paths import REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
CITING = [REPO_ROOT / "README.md", REPO_ROOT / "Makefile", *sorted((REPO_ROOT / "docs").glob("*.md")),
          *sorted(BENCHMARKS.glob("*.py")), BENCHMARKS / "gpu_suite.sh"]


def test_the_docs_run_benchmarks_as_modules_of_the_package() -> None:
    """``python benchmarks/X.py`` cannot import its sibling helpers any more: the docs say ``-m benchmarks.X``."""
    stale, missing = [], []
    for path in CITING:
        text = path.read_text(encoding="utf-8")
        for no, line in enumerate(text.splitlines(), 1):
            where = f"{path.relative_to(REPO_ROOT)}:{no}"
            stale += [f"{where}: {m}" for m in re.findall(r"python\S* +benchmarks/\w+\.py", line)]
            missing += [f"{where}: {name}" for name in re.findall(r"-m benchmarks\.([a-z_]+)", line)
                        if not (BENCHMARKS / f"{name}.py").is_file()]
    assert not stale, "cite `python -m benchmarks.NAME` instead:\n" + "\n".join(stale)
    assert not missing, "no such benchmark:\n" + "\n".join(missing)


def test_every_benchmark_is_run_by_a_test() -> None:
    """By a smoke test, the GPU suite's CPU run (tests/benchmarks/test_gpu_suite.py), or as a helper
    that one of those imports."""
    tests = "\n".join(p.read_text(encoding="utf-8") for p in (REPO_ROOT / "tests" / "benchmarks").glob("test_*.py"))
    run = set(re.findall(r'run_benchmark\(\s*"(\w+)"', tests)) | set(re.findall(r"from benchmarks import (\w+)", tests))
    run |= set(re.findall(r"^\s*bench (\w+)", (BENCHMARKS / "gpu_suite.sh").read_text(), re.M))
    covered = set(run)
    for name in run:
        covered |= set(re.findall(r"from benchmarks\.(\w+) import", (BENCHMARKS / f"{name}.py").read_text()))
    modules = {p.stem for p in BENCHMARKS.glob("*.py")} - {"__init__"}
    assert modules - covered == set()
