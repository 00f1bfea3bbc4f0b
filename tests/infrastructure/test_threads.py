"""--threads defaults to the CPUs this process may use, not the machine's core count."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from infrastructure.errors import UserError
from infrastructure.threads import available_cpus, limit_threads, resolve_threads

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")


@pytest.mark.slow
@needs_affinity
def test_default_follows_the_affinity_mask_like_a_slurm_job() -> None:
    one_cpu = min(os.sched_getaffinity(0))
    code = (
        "import os, torch\n"
        f"os.sched_setaffinity(0, {{{one_cpu}}})\n"
        "from infrastructure.threads import limit_threads\n"
        "from rescorer.pipeline.rescore import RescoreOptions\n"
        "print(limit_threads(None), torch.get_num_threads(), RescoreOptions().workers)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1", "1"]


def test_explicit_threads_and_bad_values() -> None:
    assert resolve_threads(None) == available_cpus() >= 1
    assert resolve_threads(3) == 3
    for bad in (0, -2, True, 1.5):
        with pytest.raises(UserError, match="--threads"):
            resolve_threads(bad)  # type: ignore[arg-type]
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        assert limit_threads(1) == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_threads_hold_for_torch_loaded_after_the_command_chose_them() -> None:
    """``mert tune --threads 1`` chooses 1 before a CSLM feature loads torch: torch must still use 1,
    not its own default (the machine's cores)."""
    pytest.importorskip("torch")
    if _torch_default_threads() < 2:
        pytest.skip("torch starts with one thread here: nothing to limit")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    wanted = 1
    code = (
        "import sys\n"
        "from infrastructure.threads import limit_threads\n"
        f"assert 'torch' not in sys.modules and limit_threads({wanted}) == {wanted}\n"
        "import torch\n"
        "print(torch.get_num_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(wanted)


def test_every_command_runs_with_sleeping_openmp_threads_unless_told_otherwise() -> None:
    """A fresh interpreter that loads the CLI conventions (as every command does before torch) has
    OMP_WAIT_POLICY=PASSIVE; one given another policy keeps it."""
    code = "import os, infrastructure.cli_options; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert fresh.stdout.strip() == "PASSIVE"
    told = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                          capture_output=True, text=True, check=True)
    assert told.stdout.strip() == "ACTIVE"


def _huge_page_mode() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), None where unknown."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


@pytest.mark.skipif(_huge_page_mode() not in ("madvise", "always"),
                    reason="the kernel gives no transparent huge pages (transparent_hugepage: never, or not Linux)")
def test_every_command_puts_large_tensors_in_huge_pages_unless_told_otherwise() -> None:
    """A fresh interpreter that loads the CLI conventions before torch, as every command does, gets a
    64 MB tensor in huge pages (the kernel's own count, /proc/self/smaps_rollup); one told
    THP_MEM_ALLOC_ENABLE=0 gets none where the kernel gives them only when asked (madvise)."""
    code = ("import infrastructure.cli_options, torch\n"
            "x = torch.ones(16 << 20)\n"
            "print(sum(int(line.split()[1]) for line in open('/proc/self/smaps_rollup') "
            "if line.startswith('AnonHugePages:')))")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(fresh.stdout) >= 2048, fresh.stdout  # kB: at least one 2 MB page
    if _huge_page_mode() == "madvise":
        told = subprocess.run([sys.executable, "-c", code], env={**env, "THP_MEM_ALLOC_ENABLE": "0"},
                              capture_output=True, text=True, check=True)
        assert int(told.stdout) == 0, told.stdout


def _glibc() -> bool:
    return platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _glibc(), reason="keeping freed memory is glibc's mallopt; other C libraries differ")
def test_every_command_refills_freed_memory_without_faults_unless_told_otherwise() -> None:
    """A fresh interpreter that loads the CLI conventions, as every command does, gets a freed 64 MB
    block back from the C library with its pages still there: filling it again faults on (almost) no
    page. One told MALLOC_MMAP_THRESHOLD_ (glibc's own setting, here its default) gets a fresh mapping,
    and faults on every 4 KiB page of it (the kernel's count, getrusage). Read through malloc itself:
    what torch's allocations gain from it depends on what else the allocator placed around them, and
    is measured in docs/performance.md."""
    code = ("import ctypes, resource, infrastructure.cli_options\n"
            "libc = ctypes.CDLL(None); libc.malloc.restype = ctypes.c_void_p; libc.free.argtypes = [ctypes.c_void_p]\n"
            "size = 64 << 20\n"
            "block = libc.malloc(size); ctypes.memset(block, 1, size); libc.free(block)\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "block = libc.malloc(size); ctypes.memset(block, 1, size); libc.free(block)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)")
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    kept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    told = subprocess.run([sys.executable, "-c", code], env={**env, "MALLOC_MMAP_THRESHOLD_": "131072"},
                          capture_output=True, text=True, check=True)
    assert int(kept.stdout) < 50 and int(told.stdout) >= 16_000, (kept.stdout, told.stdout)


@functools.cache
def _torch_default_threads() -> int:
    """Torch's own thread count in a fresh interpreter told nothing: asked once, a fresh torch costs seconds."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return int(out)


@pytest.mark.slow
@pytest.mark.parametrize("torch_loaded", ["before the command", "by the command body"])
def test_the_threads_option_applies_itself_whenever_torch_loads(torch_loaded: str) -> None:
    """A command that only declares ``--threads`` (no call in its body) runs torch on that many threads,
    whether torch was loaded before the command line is read or only in the body; and gets the number."""
    pytest.importorskip("torch")
    if _torch_default_threads() < 2:
        pytest.skip("torch starts with one thread here: nothing to limit")
    code = (
        ("import torch\n" if torch_loaded == "before the command" else "")
        + "import click\n"
        "from infrastructure.cli_options import threads_option\n"
        "@click.command()\n"
        "@threads_option()\n"
        "def command(threads):\n"
        "    import torch\n"
        "    print(threads, torch.get_num_threads())\n"
        "command(['--threads', '1'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]


def test_without_threads_a_command_gets_the_cpus_it_may_use() -> None:
    code = (
        "import click\n"
        "from infrastructure.cli_options import threads_option\n"
        "from infrastructure.threads import available_cpus\n"
        "@click.command()\n"
        "@threads_option()\n"
        "def command(threads):\n"
        "    print(threads, available_cpus())\n"
        "command([])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == out[1] and int(out[0]) >= 1
