"""Opening files (stdin, gzip by content, named pipes), atomic writes and input positions."""

from __future__ import annotations

import gzip
import os
import sys
import threading
from pathlib import Path

import pytest

from moses_integration.files import atomic_output, open_input, open_output
from moses_integration.phrase_table import iter_lines
from table_lines import GOOD, write_bytes, write_lines


def test_open_output_plain_and_gzip_by_suffix(tmp_path: Path) -> None:
    for name, is_gzip in [("t.gz", True), ("t.txt", False)]:
        with open_output(tmp_path / name) as fh:
            write_lines(fh, GOOD)
        data = (tmp_path / name).read_bytes()
        assert (data[:2] == b"\x1f\x8b") is is_gzip
        assert [raw for _, raw in iter_lines(tmp_path / name)] == GOOD


def test_gzip_is_detected_by_magic_bytes_not_suffix(tmp_path: Path) -> None:
    gz_named_txt = write_bytes(tmp_path / "table.txt", GOOD, gz=True)
    plain_named_gz = write_bytes(tmp_path / "table.gz", GOOD)
    assert [raw for _, raw in iter_lines(gz_named_txt)] == GOOD
    assert [raw for _, raw in iter_lines(plain_named_gz)] == GOOD


def test_multi_member_gzip_is_read_as_one_stream(tmp_path: Path) -> None:
    lines = [b"w%d ||| m%d ||| 0.5 0.5 0.5 0.5" % (i, i) for i in range(300)]
    members = [gzip.compress(b"".join(x + b"\n" for x in lines[i : i + 100])) for i in range(0, 300, 100)]
    path = tmp_path / "multi.gz"
    path.write_bytes(b"".join(members))
    got = list(iter_lines(path))
    assert [raw for _, raw in got] == lines
    assert got[-1][0] == 300


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_named_pipe_is_read_once_without_losing_the_sniffed_bytes(tmp_path: Path, gz: bool) -> None:
    """``<(zcat t.gz)`` and FIFOs cannot be reopened: the magic-byte probe must not eat data."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    data = b"".join(x + b"\n" for x in GOOD)
    payload = gzip.compress(data) if gz else data

    def feed() -> None:
        with open(fifo, "wb") as fh:
            fh.write(payload)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        got = [raw for _, raw in iter_lines(fifo)]
    finally:
        writer.join(timeout=10)
    assert got == GOOD


def test_open_input_closes_its_file(tmp_path: Path) -> None:
    path = write_bytes(tmp_path / "t.gz", GOOD, gz=True)
    fh = open_input(path)
    inner = fh.fileobj  # type: ignore[attr-defined]
    fh.close()
    assert inner.closed


def test_atomic_output_replaces_only_on_success(tmp_path: Path) -> None:
    dest = tmp_path / "out.gz"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_output(dest) as fh:
        write_lines(fh, GOOD)
        raise RuntimeError("scoring failed half-way")
    assert dest.read_bytes() == b"old"
    assert sorted(os.listdir(tmp_path)) == ["out.gz"]  # no temp file left behind

    with atomic_output(dest) as fh:
        write_lines(fh, GOOD)
    assert gzip.decompress(dest.read_bytes()) == b"".join(x + b"\n" for x in GOOD)
    assert sorted(os.listdir(tmp_path)) == ["out.gz"]
    umask = os.umask(0)
    os.umask(umask)
    assert dest.stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_output_plain_and_stdout(tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    with atomic_output(tmp_path / "plain.txt") as fh:
        fh.write(b"x\n")
    assert (tmp_path / "plain.txt").read_bytes() == b"x\n"
    with atomic_output("-") as fh:
        fh.write(b"to stdout\n")
    assert capfdbinary.readouterr().out == b"to stdout\n"
    assert not sys.stdout.closed


def test_input_position_counts_compressed_bytes(tmp_path):
    from moses_integration.files import input_position

    data = b"".join(b"w%d ||| v%d ||| 0.5 0.5\n" % (i, i) for i in range(20000))
    gz = tmp_path / "t.gz"
    gz.write_bytes(gzip.compress(data))
    with open_input(gz) as fh:
        assert input_position(fh) == 0
        fh.read()
        assert input_position(fh) == gz.stat().st_size
