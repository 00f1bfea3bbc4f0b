"""Pytest setup shared by every test module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infrastructure.threads import before_torch_loads

before_torch_loads()  # as the commands run: sleeping OpenMP threads, the same bits whatever the threads

import torch  # noqa: E402

import unwritable  # noqa: E402
from shared_paths import shared_file  # noqa: E402

# Without a GPU, Triton kernels (rescorer.model.lse_kernel) run in Triton's interpreter on the CPU. The
# switch must be set before Triton is first imported: its library functions are wrapped then.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Two cores: keep torch from oversubscribing when pytest runs alongside other work.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def fixture_dir() -> Path:
    """The real Moses system in ../shared/fixtures/hansard-enfr."""
    return shared_file("fixtures/hansard-enfr")


@pytest.fixture(scope="session")
def sample_model(tmp_path_factory) -> Path:
    """The forward model of :func:`rescore_runs.train_small` on the fixture's sample table, trained once
    per test run for every module that rescores the sample with it (read only: copy it to change it)."""
    from rescore_runs import SAMPLE_TABLE, train_small

    return train_small(shared_file(SAMPLE_TABLE), tmp_path_factory.mktemp("sample-model") / "small.pt")


@pytest.fixture(autouse=True)
def torch_threads_restored() -> object:
    """Every test starts with the threads above: a command run in this process through CliRunner sets
    torch's pool to its --threads (default: every CPU the process may use), and on a machine with more
    CPUs than two that would carry into the tests after it, whose in-process references then compute
    on another thread count than the one they were written against."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_torch_thread() -> object:
    """Small matmuls on one thread: on a busy 2-core CI machine, two threads wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=unwritable.KINDS)
def unwritable_folder(request, tmp_path: Path):
    """A folder nothing can be written into, each kind of :mod:`unwritable` in turn (real, also as root)."""
    with unwritable.unwritable_folder(request.param, tmp_path) as folder:
        yield folder
