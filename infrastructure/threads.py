"""How many CPUs a run may use: one answer for ``--threads`` in every command.

``os.cpu_count()`` is the machine's core count, not this process's share: a SLURM job given 4 of
64 cores that starts 64 threads runs them 16 to a core and gets slower, not faster. The CPUs the
process may actually run on (its affinity mask, which SLURM, ``taskset`` and cgroups set) are the
right default.
"""

from __future__ import annotations

import ctypes
import os
import sys

from infrastructure.errors import UserError
from infrastructure.interrupts import hold_interrupts_while_torch_loads


def prefer_passive_waits() -> None:
    """Let torch's idle OpenMP threads sleep rather than spin, unless ``OMP_WAIT_POLICY`` is set.

    libgomp's default keeps a thread that waits at the end of a parallel region spinning on its
    core. A training step is ~1,500 such regions (every matmul and every element-wise operation
    of a 64-row GRU step), and when another process holds one of the cores the spinning thread
    and the descheduled one wait on each other for a whole scheduler time slice at each region:
    measured on this project's 2-core machine at a load of ~4 (2026-11-26), a paper-size training
    step took 11.7 s with the default against 0.5 s with ``OMP_WAIT_POLICY=PASSIVE``, while the
    2048² matmul peak, a few long regions, hardly moved. On an idle machine sleeping costs a
    wake-up per region (microseconds); ``OMP_WAIT_POLICY=ACTIVE`` in the environment restores
    spinning. The variable is read when OpenMP starts, i.e. when torch is imported: this is
    called before that (``infrastructure.cli_options`` on import, the benchmarks first).
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def same_sums_whatever_the_threads() -> None:
    """Make MKL's matrix products give the same bits whatever the thread count, unless ``MKL_CBWR`` is set.

    MKL cuts a product of few rows (the 5-source decoder groups of a filtered table, a bias gradient)
    differently for each thread count, so it sums in another order: a table scored with ``--threads 1``
    and ``--threads 2`` differed in the last printed digit on 627 of 253,257 lines (a d = 128 model on the
    fixture's filtered table), and a model trained with either differed in its biases, so a ``--resume``
    or a shard on another CPU allocation spliced two computations. MKL's strict reproducibility mode
    (``MKL_CBWR=AUTO,STRICT``: the processor's best code path, with products that do not depend on the
    threads) removes both; GPUs never read it. MKL reads the variable when it starts, i.e. at torch's
    first matrix product: this is called before that, where :func:`prefer_passive_waits` is.
    """
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")


def huge_pages_for_large_tensors() -> None:
    """Back torch's large CPU tensors with transparent huge pages, unless ``THP_MEM_ALLOC_ENABLE`` is set.

    A training update allocates hundreds of MB of saved activations and frees them again (the NMT
    decoder's attention keeps [steps, batch, source, units] values for its backward: 85 MB for one
    batch of 64 pairs at d = 256). The C library hands such blocks back to the kernel when they are
    freed, so each update touches fresh pages, and every 4 KiB page is a fault: measured on this
    project's 2-core machine (2026-11-29), writing the attention's values took 7.4 ms a decoder step
    in fresh memory against 3.4 ms in memory touched before, and 2.0 ms with torch's THP allocation
    (``THP_MEM_ALLOC_ENABLE=1``: blocks of 2 MB and more are advised as huge pages, one fault per
    2 MB and fewer TLB misses). The kernel's ``transparent_hugepage`` setting must allow it
    (``madvise`` or ``always``); with ``never`` this changes nothing. Read at torch's first CPU
    allocation, i.e. when it is imported: this is called before that, where
    :func:`prefer_passive_waits` is; ``THP_MEM_ALLOC_ENABLE=0`` in the environment turns it off.
    """
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


# Where the C library serves allocations from its heap instead of fresh mappings, and how much freed
# memory it keeps there (keep_freed_memory): 1 GiB each.
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> None:
    """Let the C library keep freed blocks of up to :data:`KEEP_FREED_BYTES` for the next allocation,
    unless ``MALLOC_MMAP_THRESHOLD_`` is set (glibc's own setting wins then; other C libraries: nothing).

    glibc serves a block of more than its *mmap threshold* (128 KiB, raised to at most 32 MiB as blocks
    are freed) by a fresh mapping of its own, which it unmaps when the block is freed: the next update's
    block of that size is fresh memory again, and every page of it a fault and a page the kernel zeroes,
    huge pages (:func:`huge_pages_for_large_tensors`) included. The output layer's kept softmax blocks
    are such a block (42 MB at SCALE=small's sizes, 75 MB for the NMT model's 8,000 units), and so are
    the NMT attention's kept values. Measured on this project's 2-core machine (2026-12-07, AVX2, one
    thread, fresh processes alternated five times, docs/performance.md): a d = 256 RNN update took a
    median 84 CPU-ms against 97 (lower in all five pairs), with 140 minor faults against 286; a
    medium NMT update 1,035 against 1,096 CPU-ms, 194 faults against 3,205, system time 5–26 ms
    against 36–143; the same losses; peak memory 812 MB against 793. Not every block is refilled in
    place: a small allocation placed where a freed block was sends the next one to fresh memory, so
    the gain is an average, not a guarantee. The cost: a process keeps up to that much freed memory
    mapped, at its peak.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library to ask, or one without mallopt (macOS, musl)
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, KEEP_FREED_BYTES)
    mallopt(m_trim_threshold, KEEP_FREED_BYTES)


def before_torch_loads() -> None:
    """The process settings torch (and the C library's allocator) read, as every command runs with them: called by
    :mod:`infrastructure.cli_options` on import (every command imports it before torch), the tests'
    conftest and the benchmarks, before they import torch."""
    prefer_passive_waits()
    same_sums_whatever_the_threads()
    huge_pages_for_large_tensors()
    keep_freed_memory()
    hold_interrupts_while_torch_loads()


def available_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``), ``os.cpu_count()`` where absent."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads: int | None) -> int:
    """``--threads N`` checked (N >= 1), or the available CPUs when not given."""
    if threads is None:
        return available_cpus()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise UserError(f"--threads must be a whole number >= 1, got {threads!r}")
    return threads


def limit_threads(threads: int | None) -> int:
    """Use ``threads`` threads (default: the available CPUs) for torch's intra-op pool, now or when it loads.

    Every command's ``--threads`` option calls it while the command line is read
    (:func:`infrastructure.cli_options.use_threads`). Returns the number chosen so callers size their
    worker pools from the same figure. This package
    never imports torch: a command that has loaded it gets ``torch.set_num_threads``; one that loads it
    later (``mert tune`` or ``mert evaluate`` scoring n-best lists with the CSLM) gets ``OMP_NUM_THREADS``,
    which torch reads for its pool when it starts, so ``--threads`` holds there too.
    """
    n = resolve_threads(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    else:
        os.environ["OMP_NUM_THREADS"] = str(n)
    return n
