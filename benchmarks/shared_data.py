"""Where the benchmarks find ../shared: ``$SHARED_DATA_DIR``, else ``../shared`` beside the repository."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def shared_dir() -> Path:
    env = os.environ.get("SHARED_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared"


def shared_path(relative: str, what: str) -> Path:
    """``../shared/relative``, or exit with one line saying what the benchmark needs it for."""
    path = shared_dir() / relative
    if not path.exists():
        sys.exit(f"{path} not found: the benchmark needs {what} (set SHARED_DATA_DIR)")
    return path
