"""Pytest setup shared by every test module."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from shared_paths import shared_file

# Two cores: keep torch from oversubscribing when pytest runs alongside other work.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture
def fixture_dir() -> Path:
    """The real Moses system in ../shared/fixtures/hansard-enfr."""
    return shared_file("fixtures/hansard-enfr")
