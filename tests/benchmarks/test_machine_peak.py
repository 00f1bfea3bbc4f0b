"""The benchmarks' matmul peaks: each precision measured in its own dtype, so that a bf16 run's share
is of the CPU's bf16 units, not of its fp32 ones."""

from __future__ import annotations

import pytest
import torch

from benchmarks import machine_peak


def test_each_precision_is_measured_in_its_own_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[torch.dtype] = []

    def probe(device, size, seconds, clock, dtype):
        calls.append(dtype)
        return {torch.float32: 1e11, torch.bfloat16: 7e11, torch.float16: 3e11}[dtype]

    monkeypatch.setattr(machine_peak, "matmul_peak_flops", probe)
    peaks = machine_peak.matmul_peaks("cpu", ["fp32", "bf16", "tf32", "fp16"])
    assert peaks == {"fp32": 1e11, "bf16": 7e11, "tf32": 1e11, "fp16": 3e11}
    assert calls == [torch.float32, torch.bfloat16, torch.float16]  # the CPU's tf32 is its fp32: measured once


def test_the_bf16_probe_multiplies_bf16_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """What reaches oneDNN's bf16 kernels is a plain mm of bf16 tensors (no autocast, no fp32 operand)."""
    seen: set[tuple[torch.dtype, ...]] = set()
    real_mm = torch.mm

    def mm(a, b, **kwargs):
        seen.add((a.dtype, b.dtype, kwargs["out"].dtype))
        return real_mm(a, b, **kwargs)

    monkeypatch.setattr(torch, "mm", mm)
    peaks = machine_peak.matmul_peaks("cpu", ["bf16"], size=64, seconds=0.01)
    assert seen == {(torch.bfloat16,) * 3}
    assert peaks["bf16"] > 0


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="int8"):
        machine_peak.matmul_peaks("cpu", ["int8"], size=8, seconds=0.0)


@pytest.mark.parametrize(("value", "expected"), [(None, machine_peak.WINDOW_SECONDS), ("0.25", 0.25)])
def test_the_environment_sets_the_window_each_yardstick_is_timed_for(
        monkeypatch: pytest.MonkeyPatch, value: str | None, expected: float) -> None:
    """The smoke tests time each yardstick briefly through the environment; a caller's own window wins."""
    if value is None:
        monkeypatch.delenv(machine_peak.WINDOW_ENV, raising=False)
    else:
        monkeypatch.setenv(machine_peak.WINDOW_ENV, value)
    windows: list[float] = []

    def best_rate(work, amount, device, seconds, clock):
        windows.append(seconds)
        return 1.0

    monkeypatch.setattr(machine_peak, "best_rate", best_rate)
    machine_peak.matmul_peaks("cpu", ["fp32"], size=64)
    machine_peak.memory_bandwidth("cpu", elements=64)
    machine_peak.matmul_peak_flops("cpu", size=64, seconds=0.5)
    assert windows == [expected, expected, 0.5]


@pytest.mark.parametrize("value", ["soon", "0", "-1"])
def test_a_window_that_is_not_a_positive_number_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(machine_peak.WINDOW_ENV, value)
    with pytest.raises(SystemExit, match=rf"^BENCHMARK_PEAK_SECONDS='{value}': "):
        machine_peak.memory_bandwidth("cpu", elements=64)
