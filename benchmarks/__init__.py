"""Throughput benchmarks, run from the repository root as ``python -m benchmarks.NAME``.

A package so that one benchmark imports another's helpers (``benchmarks.shared_data``,
``benchmarks.machine_peak``) without editing ``sys.path``, and so that the smoke tests in
tests/benchmarks/ run each one the way the docs do.
"""

from infrastructure.threads import before_torch_loads

before_torch_loads()  # each benchmark runs as the commands do (infrastructure.cli_options): before torch loads
