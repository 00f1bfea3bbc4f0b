"""Folders this process cannot write, made for real (the tests run as root too, where mode bits mean nothing).

- ``under a file``: a folder path below a regular file, which cannot exist;
- ``immutable``: a folder with ``chattr +i`` (root cannot create files there either), where the
  filesystem and the process's capabilities allow it;
- ``sysfs``: ``/sys``, where nobody can create files, though ``os.access`` says root may.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

KINDS = ("under a file", "immutable", "sysfs")


def _cannot_create_in(folder: Path) -> bool:
    try:
        fd, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        return True
    os.close(fd)
    os.unlink(probe)
    return False


@contextlib.contextmanager
def unwritable_folder(kind: str, tmp_path: Path) -> Iterator[Path]:
    """A folder of ``kind`` (:data:`KINDS`) that nothing can be written into; skips where none can be made."""
    if kind == "under a file":
        (tmp_path / "a-file").write_text("not a folder\n")
        yield tmp_path / "a-file" / "sub"
    elif kind == "immutable":
        folder = tmp_path / "immutable"
        folder.mkdir()
        try:
            made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        except FileNotFoundError:
            made = False
        if not made or not _cannot_create_in(folder):
            pytest.skip("chattr +i is not available here (needs CAP_LINUX_IMMUTABLE on ext4/xfs/btrfs)")
        try:
            yield folder
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    elif kind == "sysfs":
        folder = Path("/sys")
        if not folder.is_dir() or not _cannot_create_in(folder):
            pytest.skip("no read-only /sys here")
        yield folder
    else:
        raise ValueError(kind)
