"""How many CPUs a run may use: one answer for ``--threads`` in every command.

``os.cpu_count()`` is the machine's core count, not this process's share: a SLURM job given 4 of
64 cores that starts 64 threads runs them 16 to a core and gets slower, not faster. The CPUs the
process may actually run on (its affinity mask, which SLURM, ``taskset`` and cgroups set) are the
right default.
"""

from __future__ import annotations

import os
import sys


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
        raise ValueError(f"--threads must be a whole number >= 1, got {threads!r}")
    return threads


def limit_threads(threads: int | None) -> int:
    """Use ``threads`` threads (default: the available CPUs) for torch's intra-op pool, if loaded.

    Returns the number chosen so callers size their worker pools from the same figure. torch is
    only configured when the caller has already imported it: this package never imports torch.
    """
    n = resolve_threads(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    return n
