"""Opening files (stdin, gzip by content, named pipes), atomic writes, input positions, and one run
per output."""

from __future__ import annotations

import errno
import fcntl
import gzip
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import unwritable
from held_output import held_by_another_process
from infrastructure import files
from infrastructure.files import (
    InUseError,
    OutputPlaceError,
    atomic_output,
    check_output_place,
    check_outputs_are_not_inputs,
    exclusive_use,
    files_replaced_together,
    lock_path,
    open_input,
    open_output,
    outputs_of_a_run,
    write_json,
)
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


def test_write_json_is_one_format_and_replaces_only_when_complete(tmp_path: Path, monkeypatch) -> None:
    """A resumed run reads the record the killed one wrote: a failure while the new one is written (here the
    fsync before the rename, as a full disk would) keeps the old record whole and leaves no temp file."""
    dest = tmp_path / "progress.json"
    write_json(dest, {"lines": 3, "z": "été", "a": [1, 2]})
    assert dest.read_bytes() == b'{\n "lines": 3,\n "z": "\\u00e9t\\u00e9",\n "a": [\n  1,\n  2\n ]\n}\n'
    before = dest.read_bytes()

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_json(dest, {"lines": 4})
    monkeypatch.undo()
    with pytest.raises(TypeError):  # not JSON: found before anything is written
        write_json(dest, {"lines": 5, "bad": {1, 2}})
    assert dest.read_bytes() == before and os.listdir(tmp_path) == ["progress.json"]
    write_json(dest, {"z": 1, "a": 2}, sort_keys=True)
    assert dest.read_bytes() == b'{\n "a": 2,\n "z": 1\n}\n'


def test_files_replaced_together_replace_the_set_only_when_the_block_ends(tmp_path: Path) -> None:
    """Interrupted, the folder keeps the previous set byte for byte and nothing beside it; finished, the
    new set replaces it whole: a name of the set the block did not write goes too."""
    folder = tmp_path / "out"
    folder.mkdir()
    for name in ("page", "a", "b", "mine"):
        (folder / name).write_text(f"old {name}")
    with pytest.raises(KeyboardInterrupt), files_replaced_together(folder, ("page", "a", "b")) as staging:
        (staging / "a").write_text("new a")
        raise KeyboardInterrupt
    assert {p.name: p.read_text() for p in folder.iterdir()} == {n: f"old {n}" for n in ("page", "a", "b", "mine")}
    with files_replaced_together(folder, ("page", "a", "b")) as staging:
        (staging / "a").write_text("new a")
        (staging / "page").write_text("new page")
    assert {p.name: p.read_text() for p in folder.iterdir()} == {"page": "new page", "a": "new a", "mine": "old mine"}


def _report_writer_in_another_process(folder: Path) -> subprocess.Popen:
    """A process inside ``files_replaced_together(folder, ...)``, one file staged, until it is killed."""
    return _writing_in_another_process(folder, "from infrastructure.files import files_replaced_together\n"
                                               "with files_replaced_together(sys.argv[1], ['page']) as staging:\n"
                                               "    (staging / 'page').write_text('half')\n")


def test_the_next_report_removes_the_staging_folder_a_sigkilled_run_left(tmp_path: Path) -> None:
    """SIGKILL leaves files_replaced_together's temporary folder in the user's folder; the next run into
    it removes it, and keeps a running writer's and the user's own hidden folders."""
    folder = tmp_path / "report"
    folder.mkdir()
    (folder / ".new.user_dir").mkdir()
    writer = _report_writer_in_another_process(folder)
    (stale,) = folder.glob(".new.*.tmp")
    writer.kill()
    writer.wait()
    _age(stale, 3600)
    living = _report_writer_in_another_process(folder)
    try:
        (held,) = folder.glob(".new.*.tmp")
        assert held != stale and not stale.exists()
        _age(held, 3600)
        with files_replaced_together(folder, ["page"]) as staging:
            (staging / "page").write_text("whole")
        assert sorted(p.name for p in folder.iterdir()) == sorted([".new.user_dir", held.name, "page"])
    finally:
        living.kill()
        living.wait()
    assert (folder / "page").read_text() == "whole"


def test_atomic_output_plain_and_stdout(tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    with atomic_output(tmp_path / "plain.txt") as fh:
        fh.write(b"x\n")
    assert (tmp_path / "plain.txt").read_bytes() == b"x\n"
    with atomic_output("-") as fh:
        fh.write(b"to stdout\n")
    assert capfdbinary.readouterr().out == b"to stdout\n"
    assert not sys.stdout.closed


def test_a_device_or_a_pipe_is_written_in_place_never_replaced(tmp_path: Path) -> None:
    """``--report /dev/null`` renamed a regular file over ``/dev/null`` (as root, the machine's own). A
    device, a FIFO and a link to one are written straight into and stay what they were; a link to a
    file stays a link, and the file it points to gets the output."""
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)  # hangs if replaced
    reader.start()
    with atomic_output(fifo) as fh:
        fh.write(b"through the pipe\n")
    reader.join(10)
    assert received == [b"through the pipe\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target.name)
    write_json(link, {"new": 1})
    assert link.is_symlink() and '"new"' in target.read_text()
    if os.geteuid() != 0:
        return  # only root makes a device node, and only root can replace /dev/null
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (tmp_path / "to-null").symlink_to(null)
    for out in (null, tmp_path / "to-null"):
        check_output_place(out)
        with atomic_output(out) as fh:
            fh.write(b"gone\n")
        write_json(out, {"gone": True})
        assert stat.S_ISCHR(null.stat().st_mode) and null.stat().st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.json", "null", "target.json", "to-null"]


def _writer_in_another_process(dest: Path) -> subprocess.Popen:
    """A process inside ``atomic_output(dest)``, its temp file half written, until it is killed."""
    return _writing_in_another_process(dest, "from infrastructure.files import atomic_output\n"
                                             "with atomic_output(sys.argv[1]) as fh:\n"
                                             "    fh.write(b'half')\n    fh.flush()\n")


def _writing_in_another_process(target: Path, opening: str) -> subprocess.Popen:
    """A process that runs ``opening`` (a ``with`` line and its first body lines; ``sys.argv[1]`` is ``target``),
    then says so and waits inside the block until it is killed."""
    code = f"import sys, time\n{opening}    print('writing', flush=True)\n    time.sleep(60)\n"
    writer = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert writer.stdout.readline() == "writing\n"
    return writer


def _temps(dest: Path) -> list[Path]:
    """``dest``'s temp files: mkstemp's 8 random characters between its name and ``.tmp``."""
    pattern = rf"\.{re.escape(dest.name)}\.[a-z0-9_]{{8}}\.tmp"
    return sorted(p for p in dest.parent.iterdir() if re.fullmatch(pattern, p.name))


def _age(path: Path, seconds: float) -> None:
    past = path.stat().st_mtime - seconds
    os.utime(path, (past, past))


def test_the_rerun_removes_what_a_sigkilled_writer_left_and_no_live_writers_file(tmp_path: Path) -> None:
    """SIGKILL gives a writer no chance to remove its temp file; the next write of the same output
    does, while a writer still running keeps its own, and another output's temp files stay."""
    dest, other = tmp_path / "table.gz", tmp_path / "table.gz.more"
    writer = _writer_in_another_process(dest)
    (stale,) = _temps(dest)
    writer.kill()
    writer.wait()
    _age(stale, 3600)  # a later session
    living = _writer_in_another_process(dest)  # the rerun
    try:
        (held,) = _temps(dest)
        assert held != stale and not stale.exists()  # the rerun removed the dead writer's temp
        _age(held, 3600)
        other.with_name(f".{other.name}.abcdefgh.tmp").write_bytes(b"not table.gz's")
        _age(other.with_name(f".{other.name}.abcdefgh.tmp"), 3600)
        files._swept.clear()  # a new run in this process
        with atomic_output(dest) as fh:
            fh.write(b"whole")
        assert _temps(dest) == [held]  # a live writer's temp is kept, however old
        assert other.with_name(f".{other.name}.abcdefgh.tmp").exists()
    finally:
        living.kill()
        living.wait()
    assert dest.read_bytes()[:2] == b"\x1f\x8b"


def test_a_young_unlocked_temp_is_not_taken_for_a_dead_writers(tmp_path: Path) -> None:
    """A writer locks its temp file just after creating it: one seconds old may be that moment."""
    dest = tmp_path / "out.txt"
    young = tmp_path / ".out.txt.abcd1234.tmp"
    young.write_bytes(b"")
    assert files.remove_dead_temps(dest) == []
    assert young.exists()
    _age(young, files.STALE_TEMP_SECONDS + 1)
    files._swept.clear()
    assert files.remove_dead_temps(dest) == [young] and not young.exists()


def test_input_position_counts_compressed_bytes(tmp_path):
    from infrastructure.files import input_position

    data = b"".join(b"w%d ||| v%d ||| 0.5 0.5\n" % (i, i) for i in range(20000))
    gz = tmp_path / "t.gz"
    gz.write_bytes(gzip.compress(data))
    with open_input(gz) as fh:
        assert input_position(fh) == 0
        fh.read()
        assert input_position(fh) == gz.stat().st_size


def test_a_second_run_on_a_held_output_stops_and_names_the_holder(tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    name = re.escape(str(out))
    with held_by_another_process(out) as holder:
        assert lock_path(out) == tmp_path / ".model.pt.lock"
        message = rf"^{name} is in use by pid {holder.pid} on .*, started .*: -c {name}; "
        with pytest.raises(InUseError, match=message), exclusive_use(out):
            pytest.fail("entered an output another process holds")
    assert not lock_path(out).exists()  # the holder removed its lock file on exit
    with exclusive_use(out):
        assert f"pid {os.getpid()} on " in lock_path(out).read_text()
        with pytest.raises(InUseError, match=f"pid {os.getpid()} "), exclusive_use(out):
            pytest.fail("a second hold within one process")
    assert not lock_path(out).exists() and not out.exists()


def test_a_killed_holder_leaves_nothing_that_blocks_the_rerun(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with held_by_another_process(work) as holder:
        assert lock_path(work) == work / ".lock" and lock_path(work).exists()
        holder.kill()
        holder.wait()
        assert lock_path(work).exists()  # SIGKILL: nothing was cleaned up, but the kernel dropped the lock
        with exclusive_use(work):
            assert f"pid {os.getpid()} on " in lock_path(work).read_text()
    with exclusive_use("-"):  # stdout: nothing to hold
        assert not (tmp_path / ".-.lock").exists()


def test_a_lock_file_removed_under_a_waiting_run_is_not_the_one_it_holds(tmp_path: Path, monkeypatch) -> None:
    """The holder ends (and removes its lock file) between this run's open() and flock(), and a third
    run creates the next file: locking the removed file would let this run and the third both in."""
    out = tmp_path / "table.gz"
    lock = lock_path(out)
    real_flock, calls = fcntl.flock, []

    def flock(fd: int, operation: int) -> None:
        if not calls:
            lock.unlink()
            lock.write_text("")
        calls.append(fd)
        real_flock(fd, operation)

    monkeypatch.setattr(files.fcntl, "flock", flock)
    with exclusive_use(out):
        assert f"pid {os.getpid()} on " in lock.read_text()  # written into the file now at the path
    assert len(calls) == 2


def test_a_filesystem_without_locks_runs_unguarded_with_a_warning(tmp_path: Path, monkeypatch, capsys) -> None:
    def refuse(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(files.fcntl, "flock", refuse)
    with exclusive_use(tmp_path / "out.gz"):
        (tmp_path / "out.gz").write_bytes(b"written")
    assert "does not support file locks (No locks available)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gz"]


def test_an_output_in_a_folder_not_made_yet_is_held(tmp_path: Path) -> None:
    """``rescorer train TABLE models/new/m.pt`` made its folders before the hold existed; it still does."""
    with exclusive_use(tmp_path / "models" / "new" / "m.pt"):
        assert lock_path(tmp_path / "models" / "new" / "m.pt").exists()
    assert list((tmp_path / "models" / "new").iterdir()) == []


# ------------------------------------------------------------------ places that can be written


def test_an_unwritable_place_is_refused_naming_the_users_path(tmp_path: Path, unwritable_folder: Path) -> None:
    for folder in (False, True):
        target = unwritable_folder / "new" / "out.gz"
        with pytest.raises(OutputPlaceError) as caught:
            check_output_place(target, folder=folder)
        message = str(caught.value)
        assert str(target) in message and "\n" not in message and ".write-test" not in message
        with pytest.raises(OutputPlaceError, match=re.escape(str(unwritable_folder / "x"))):
            check_output_place(unwritable_folder / "x", folder=folder)


def test_os_access_alone_would_let_an_unwritable_folder_through(tmp_path: Path) -> None:
    """Why the check creates a file: to root, ``os.access`` grants /sys, where nothing can be created."""
    import os

    with unwritable.unwritable_folder("sysfs", tmp_path) as sysfs:
        if os.geteuid() != 0:
            pytest.skip("os.access answers truly for a user other than root")
        if not os.access(sysfs, os.W_OK):  # /sys mounted read-only (a container build): os.access is right there
            pytest.skip("/sys is mounted read-only here, so os.access already says no")
        assert os.access(sysfs, os.W_OK)
        with pytest.raises(OutputPlaceError, match="nothing can be created in /sys"):
            check_output_place(sysfs / "out.txt")


def test_a_writable_place_passes_and_the_check_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_text("old")
    for path, folder in [(tmp_path / "out.gz", False), (tmp_path / "old.txt", False),
                         (tmp_path / "a" / "b" / "c", False),
                         (tmp_path / "work", True), (tmp_path, True), ("-", False)]:
        check_output_place(path, folder=folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]  # no probe left, no folder made


def test_an_immutable_output_file_is_refused_before_any_work(tmp_path: Path) -> None:
    """The final rename would fail on it (EPERM, even for root) after all the work."""
    import subprocess

    old = tmp_path / "out.gz"
    old.write_text("old")
    if subprocess.run(["chattr", "+i", str(old)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible here (not root, or the filesystem has no such flag)")
    try:
        (tmp_path / "new").write_text("new")
        with pytest.raises(PermissionError):  # what the run would meet at its end
            os.replace(tmp_path / "new", old)
        with pytest.raises(OutputPlaceError, match=re.escape(f"cannot replace {old}: the file is immutable")):
            check_output_place(old)
    finally:
        subprocess.run(["chattr", "-i", str(old)], check=True)
    assert old.read_text() == "old"
    check_output_place(old)


def test_a_folder_for_a_file_and_a_file_for_a_folder_are_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputPlaceError, match="is a folder"):
        check_output_place(tmp_path)
    with pytest.raises(OutputPlaceError, match="is a file, not a folder"):
        check_output_place(tmp_path / "f", folder=True)


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


class Failed(Exception):
    pass


@pytest.mark.parametrize("keeps_progress", [False, True])
def test_a_failed_run_leaves_no_folder_it_made_and_no_empty_one(tmp_path: Path, keeps_progress: bool) -> None:
    """``cslm train EMPTY out/m.pt`` made ``out/m.pt.data/`` and left it; now nothing of it stays."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "kept.txt").write_text("mine")
    before = _listing(tmp_path)
    with pytest.raises(Failed), outputs_of_a_run([tmp_path / "mine" / "m.pt", tmp_path / "new" / "deeper" / "m.pt"],
                                                 keeps_progress=keeps_progress):
        assert (tmp_path / "new" / "deeper").is_dir()  # made before the work, as training always did
        (tmp_path / "mine" / "m.pt.data" / "train").mkdir(parents=True)
        (tmp_path / "new" / "deeper" / "m.pt.data").mkdir()
        raise Failed
    assert _listing(tmp_path) == before


def test_a_failed_run_that_keeps_no_progress_leaves_none_of_its_files(tmp_path: Path) -> None:
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "old.tok").write_text("from an earlier run")
    (tmp_path / "report.json").write_text("old report")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(KeyboardInterrupt), outputs_of_a_run(
            [tmp_path / "report.json", tmp_path / "new.png", tmp_path / "made" / "x.png"],
            [tmp_path / "eval", tmp_path / "work"]):
        (tmp_path / "eval" / "old.tok").write_text("rewritten")  # a file it did not create stays
        (tmp_path / "eval" / "system.run1.tok").write_text("decoded")
        (tmp_path / "eval" / "detok").mkdir()
        (tmp_path / "eval" / "detok" / "a").write_text("a")
        (tmp_path / "new.png").write_bytes(b"png")
        (tmp_path / "made" / "x.png").write_bytes(b"png")
        (tmp_path / "work" / "run1").mkdir(parents=True)
        (tmp_path / "work" / "run1" / "weights").write_text("1")
        (tmp_path / "unrelated.txt").write_text("another program's")  # beside the outputs: not ours to judge
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["eval", "old.tok", "report.json", "unrelated.txt"]
    assert (tmp_path / "report.json").read_bytes() == before[tmp_path / "report.json"]


def test_a_failed_run_that_keeps_progress_keeps_the_files_a_rerun_continues_from(tmp_path: Path) -> None:
    with pytest.raises(Failed), outputs_of_a_run([tmp_path / "new" / "out.gz"], [tmp_path / "work"],
                                                 keeps_progress=True):
        (tmp_path / "new" / ".out.gz.partial").write_bytes(b"chunk")
        (tmp_path / "new" / "empty").mkdir()
        (tmp_path / "work" / "stamps").mkdir(parents=True)
        (tmp_path / "work" / "stamps" / "data.json").write_text("{}")
        (tmp_path / "work" / "tmp").mkdir()
        raise Failed
    assert _listing(tmp_path) == ["new", "new/.out.gz.partial", "work", "work/stamps", "work/stamps/data.json"]


def test_a_run_that_succeeds_keeps_its_outputs_and_drops_folders_it_made_for_nothing(tmp_path: Path) -> None:
    with outputs_of_a_run([tmp_path / "a" / "out.gz", tmp_path / "unused" / "m.pt", "-", None]):
        (tmp_path / "a" / "out.gz").write_bytes(b"table")
    assert _listing(tmp_path) == ["a", "a/out.gz"]


def test_an_output_is_refused_when_it_is_an_input_by_any_name(tmp_path: Path) -> None:
    """By file identity: the same name, a hard link, a symlink, a path through ``..``; and two outputs."""
    model = tmp_path / "m.pt"
    model.write_bytes(b"model")
    os.link(model, tmp_path / "hard")
    (tmp_path / "soft").symlink_to(model)
    for name in ("m.pt", "hard", "soft", "sub/../m.pt"):
        with pytest.raises(OutputPlaceError, match=rf"^output {tmp_path / name} \(OUT\) is the input --model {model};"):
            check_outputs_are_not_inputs([("OUT", tmp_path / name)], [("--model", model)])
    with pytest.raises(OutputPlaceError, match=r"output .*new \(--b\) is also the output --a .*new; give each"):
        check_outputs_are_not_inputs([("--a", tmp_path / "new"), ("--b", tmp_path / "sub" / ".." / "new")], [])
    # what is not refused: other files, missing inputs, stdio, devices (nothing of theirs can be lost)
    check_outputs_are_not_inputs([("OUT", tmp_path / "other"), ("--x", "-"), ("--y", None)],
                                 [("--model", model), ("IN", "-"), ("--gone", tmp_path / "gone")])
    check_outputs_are_not_inputs([("OUT", "/dev/null"), ("--also", "/dev/null")], [("IN", "/dev/null")])


def test_standard_input_a_folder_output_and_temp_names_count_as_inputs_at_risk(tmp_path: Path, monkeypatch) -> None:
    """The file on stdin is the input ``-``; an input inside a folder the command fills (spelled with a
    trailing ``/``) or named as an output's temp file (which the next write removes) is refused."""
    partial = tmp_path / ".out.gz.partial"
    partial.write_bytes(b"kept")
    with open(partial, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(OutputPlaceError, match=rf"^output {partial} \(partial\) is the input IN \(standard "
                                                   rf"input\) {partial}; write it elsewhere$"):
            check_outputs_are_not_inputs([("partial", partial)], [("IN", "-")])
        check_outputs_are_not_inputs([("OUT", tmp_path / "other")], [("IN", "-")])
    inside = tmp_path / "m.pt.data" / "pairs.txt"
    inside.parent.mkdir()
    inside.write_bytes(b"pairs")
    with pytest.raises(OutputPlaceError, match=r"^output folder .*m\.pt\.data/ \(data\) holds the input IN "):
        check_outputs_are_not_inputs([("data", f"{tmp_path / 'm.pt.data'}/")], [("IN", inside)])
    check_outputs_are_not_inputs([("data", tmp_path / "m.pt.data")], [("IN", inside)])  # a file output holds nothing
    temp = tmp_path / ".out.gz.abcd1234.tmp"
    temp.write_bytes(b"table")
    with pytest.raises(OutputPlaceError, match=r"is named as a temporary file of the output .*out\.gz \(OUT\)"):
        check_outputs_are_not_inputs([("OUT", tmp_path / "out.gz")], [("IN", temp)])
    check_outputs_are_not_inputs([("OUT", tmp_path / "other.gz")], [("IN", temp)])
