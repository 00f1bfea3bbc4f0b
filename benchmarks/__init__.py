"""Throughput benchmarks, run from the repository root as ``python -m benchmarks.NAME``.

A package so that one benchmark imports another's helpers (``benchmarks.shared_data``,
``benchmarks.machine_peak``) without editing ``sys.path``, and so that the smoke tests in
tests/benchmarks/ run each one the way the docs do.
"""
