"""Where ../shared and the Moses binaries are: the one helper every test uses to find them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    """The read-only ../shared folder: $SHARED_DATA_DIR, else ../shared beside the repository."""
    env = os.environ.get("SHARED_DATA_DIR")
    path = Path(env) if env else REPO_ROOT.parent / "shared"
    return path if path.is_dir() else None


def shared_file(relative: str) -> Path:
    """A file under ../shared, or skip the calling test with the reason it is missing."""
    root = shared_data_dir()
    if root is None:
        pytest.skip("../shared not found (set SHARED_DATA_DIR to the shared data folder)")
    path = root / relative
    if not path.exists():
        pytest.skip(f"shared file {relative} is missing from {root}")
    return path


def moses_bin_dir() -> Path:
    """Directory with the real Moses binaries, or skip: tests never build Moses themselves."""
    env = os.environ.get("MOSES_BIN_DIR")
    if not env:
        pytest.skip("MOSES_BIN_DIR is not set: these tests need a real Moses build")
    path = Path(env)
    if not (path / "moses").exists():
        pytest.skip(f"MOSES_BIN_DIR={env} has no 'moses' binary")
    return path


def has_neural_lm(bin_dir: Path) -> bool:
    """Whether this Moses was built with NPLM: without ``-f`` it lists its feature functions on stderr."""
    proc = subprocess.run([str(bin_dir / "moses")], capture_output=True, text=True, check=False,
                          stdin=subprocess.DEVNULL)
    return "NeuralLM" in proc.stderr.split()
