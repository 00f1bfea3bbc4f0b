"""Files as the project reads and writes them: ``-`` for stdin/stdout, gzip by content on input and
by the ``.gz`` suffix on output, and atomic writes.

Every output (tables, models, n-best lists, reports) goes to a temporary file beside its target and
is renamed over it only when complete (:func:`atomic_output`, :func:`atomic_path`): a killed run
never leaves a half-written file under the real name, and never loses the one that was there. The
one place for this, so that every command keeps the rule the same way. A resumable command also
holds its output for the whole run (:func:`exclusive_use`), so that a second run with the same
output stops at once instead of interleaving its progress with the first one's.

Two rules hold for every output of every command, kept here so that each command keeps them the same
way (``infrastructure.cli_options`` applies them to every output option): a place that cannot be
written is found while the command line is read (:func:`check_output_place`), and a failed run
leaves nothing it created (:func:`outputs_of_a_run`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import gzip
import io
import json
import os
import shutil
import socket
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from isal import igzip, igzip_threaded, isal_zlib

from infrastructure.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
STDIO_NAME = "-"

_READ_BUFFER = 1 << 20
_GZIP_STEP = 32 << 10  # compressed bytes ISA-L's reader takes at a time (_OwningGzipFile)

PathArg = str | os.PathLike[str]

#: What reading a truncated or corrupt gzip raises, from zlib's reader or ISA-L's.
CORRUPT_GZIP_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, isal_zlib.error, OSError)
#: Levels of :func:`compress_member` (zlib's, gzip's -1 .. -9; 0 stores) and the default: level 1 writes a
#: scored table 4% larger than ISA-L's level 1 did, at a third of its speed, which the workers never
#: notice; zlib gives the same bytes for the same data on every run, ISA-L did not (docs/rescore.md).
MEMBER_LEVELS = range(0, 10)
DEFAULT_MEMBER_LEVEL = 1


def first_unreadable_line(path: PathArg, fallback: int) -> int:
    """The 1-based line at which a damaged gzip ``path`` stops being readable: its complete lines + 1.

    Every reader of the project reports a truncated or corrupt gzip through this, so that all commands
    name the same line for the same file: what a reader has handed over when the decompressor fails
    depends on its buffers (ISA-L's and zlib's readers, threaded or not, each hold back a different
    amount), so each reader's own count is short of the truth by a different number of lines. This
    reads the file again, in small steps, and counts the newlines of everything that decompresses;
    only an error pays for the second pass. ``fallback`` (the reader's own count) is the answer for
    stdin, pipes and files that are not gzip.
    """
    name = os.fspath(path)
    if name == STDIO_NAME or not os.path.isfile(name):
        return fallback
    newlines = 0
    with open(name, "rb") as fh:
        if fh.read(2) != GZIP_MAGIC:
            return fallback
        fh.seek(0)
        stream = zlib.decompressobj(wbits=31)
        while block := fh.read(1 << 14):
            while block:
                try:
                    newlines += stream.decompress(block).count(b"\n")
                except zlib.error:
                    return newlines + 1
                if not stream.eof:
                    break
                block = stream.unused_data.lstrip(b"\0")  # the next member (concatenated gzip)
                stream = zlib.decompressobj(wbits=31)
    return newlines + 1


def read_twice(path: PathArg) -> bool:
    """Whether an input can be read twice, a first pass that checks every line before the long work
    and then the work: a regular file. Standard input, a pipe (``<(zcat x.gz)``, a FIFO) or a device
    gives its lines once, and a first pass over it would leave the work nothing to read."""
    name = os.fspath(path)
    return name != STDIO_NAME and os.path.isfile(name)


def display_name(path: PathArg) -> str:
    """The name used in error messages: ``<stdin>`` is clearer than a bare ``-``."""
    name = os.fspath(path)
    return "<stdin>" if name == STDIO_NAME else name


# --------------------------------------------------------------------------------------------
# Opening files


class _PrefixedRaw(io.RawIOBase):
    """A raw stream that first returns ``prefix`` and then reads from ``inner``.

    Used for stdin and other non-seekable inputs (pipes, ``<(zcat ...)``): we must look at the
    first two bytes to detect gzip, and a pipe can be neither rewound nor reopened. ``owns``
    is False for stdin, so that ``with open_input("-")`` does not close the process's stdin.
    """

    def __init__(self, prefix: bytes, inner: BinaryIO, *, owns: bool) -> None:
        super().__init__()
        self._prefix = prefix
        self._inner = inner
        self._owns = owns

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._prefix:
            n = min(len(view), len(self._prefix))
            view[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        reader = getattr(self._inner, "read1", None) or self._inner.read
        data = reader(len(view))
        n = len(data)
        view[:n] = data
        return n

    def close(self) -> None:
        if not self.closed and self._owns:
            self._inner.close()
        super().close()


class _OwningGzipFile(igzip.IGzipFile):
    """A reading GzipFile that also closes the stream it reads from (GzipFile leaves it open).

    ISA-L's reader (``isal.igzip``): the same stream API as :mod:`gzip`, decompressing a phrase table
    at 2-3 times zlib's speed, which is what bounds the reader of ``rescore-phrase-table``."""

    def __init__(self, owned: BinaryIO) -> None:
        super().__init__(fileobj=owned, mode="rb")
        self._owned = owned
        # ISA-L's reader takes the file in steps of 512 KB, so how far the file was read (what
        # input_position tells the progress bar) runs up to ~3 MB of text ahead of the lines
        # given out, unevenly. Steps of _GZIP_STEP keep it within a few hundred lines, as fast.
        self._buffer = io.BufferedReader(isal_zlib._GzipReader(self.fileobj, _GZIP_STEP))

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._owned.close()


class _NonClosingWriter(io.RawIOBase):
    """Writes through to ``inner`` (stdout) and flushes on close instead of closing it."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._inner.write(data)
        return len(data)

    def flush(self) -> None:
        if not self.closed:
            self._inner.flush()

    def close(self) -> None:
        if not self.closed:
            self._inner.flush()
        super().close()


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes, looping because a pipe may hand them over one at a time."""
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def open_input(path: PathArg, *, decompress_thread: bool = False) -> BinaryIO:
    """Open a table for binary reading: ``"-"`` is stdin; gzip is detected by its magic bytes.

    Detection by content rather than suffix because tables are often renamed or piped, and
    Moses itself does not care about the suffix either. Multi-member gzip (concatenated members,
    as written by parallel compressors) is read as one stream. The file is opened once, so
    named pipes and ``/dev/stdin`` work too. ``decompress_thread``: a gzip file is decompressed in a
    thread of its own, which runs without the GIL (ISA-L's ``igzip_threaded``), so that the reader
    that cuts the lines has its core to itself; how far the file was read then runs ahead of the
    lines by its buffers (:func:`input_position` is a progress bar's measure, not a line's place).
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        return _wrap_unseekable(sys.stdin.buffer, owns=False)
    fh = open(name, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 - handed to the caller, who closes it
    try:
        if not fh.seekable():
            return _wrap_unseekable(fh, owns=True)
        magic = fh.read(2)
        fh.seek(0)
        if magic == GZIP_MAGIC and decompress_thread:
            fh.close()
            return igzip_threaded.open(name, "rb", threads=1)
        return _OwningGzipFile(fh) if magic == GZIP_MAGIC else fh
    except BaseException:
        fh.close()
        raise


def input_position(stream: BinaryIO) -> int | None:
    """Bytes of the file (compressed, for gzip) that a stream from :func:`open_input` has consumed.

    A progress bar in input bytes is the only honest one for gzip, whose decompressed size is
    unknown until the end. None for pipes and stdin, which have no position.
    """
    # ISA-L's threaded reader is a buffered reader whose raw stream holds the file as ``raw``.
    threaded_file = getattr(getattr(stream, "raw", None), "raw", None)
    raw = stream._owned if isinstance(stream, _OwningGzipFile) else threaded_file or stream
    try:
        return raw.tell() if raw.seekable() else None
    except (OSError, ValueError):
        return None


def _wrap_unseekable(inner: BinaryIO, *, owns: bool) -> BinaryIO:
    """Sniff the gzip magic of a pipe and hand the two bytes back in front of the rest."""
    prefix = _read_exactly(inner, 2)
    stream: BinaryIO = io.BufferedReader(_PrefixedRaw(prefix, inner, owns=owns), _READ_BUFFER)  # type: ignore[arg-type]
    return _OwningGzipFile(stream) if prefix == GZIP_MAGIC else stream  # type: ignore[return-value]


def compress_member(data: bytes | bytearray | memoryview, compress_level: int = DEFAULT_MEMBER_LEVEL) -> bytes:
    """``data`` as one complete gzip member, the same bytes for the same data and level on every run
    (no time stamp, no name). Members concatenate into a valid gzip file, which is how the scored
    table is written chunk by chunk in parallel, and the same bytes are what makes a resumed run's or
    a sharded run's output the uninterrupted run's, byte for byte.

    zlib, not ISA-L: ISA-L's level-1 igzip (three times faster) now and then encoded the same bytes
    differently within one run (docs/rescore.md, "Compressed bytes"). ``compress_level`` is one of
    :data:`MEMBER_LEVELS`; ``--compress-level`` checks it where the user gives it.
    """
    return zlib.compress(data, compress_level, wbits=16 + zlib.MAX_WBITS)


def open_output(path: PathArg, zlib_level: int = 6) -> BinaryIO:
    """Open a table for binary writing: ``"-"`` is stdout, a ``.gz`` suffix means gzip.

    Here the suffix decides (there is no content yet). Level 6 (gzip's own default) gives up a
    little size for a much faster write than level 9, which matters on 100M-line outputs.
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        return io.BufferedWriter(_NonClosingWriter(sys.stdout.buffer), _READ_BUFFER)  # type: ignore[return-value]
    if name.endswith(".gz"):
        return gzip.open(name, "wb", compresslevel=zlib_level)  # type: ignore[return-value]
    return open(name, "wb", buffering=_READ_BUFFER)


def _current_umask() -> int:
    """The process umask, so an atomically written file gets the permissions a plain open() gives."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: mkstemp's random part: 8 characters of this alphabet (no dot), so ``.NAME.XXXXXXXX.tmp`` names
#: the temp files of ``NAME`` and of no other file.
_TEMP_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
_TEMP_RANDOM = 8
#: A temp file younger than this is never taken for a dead run's: its writer may not have locked it yet.
STALE_TEMP_SECONDS = 10.0
_swept: set[tuple[str, str]] = set()  # (folder, name): the outputs whose dead temps this process removed


def _temp_of(name: str, candidate: str) -> bool:
    """Whether ``candidate`` is one of :func:`atomic_path`'s temp files for an output named ``name``."""
    prefix = f".{name}."
    random_part = candidate[len(prefix):-len(".tmp")]
    return (candidate.startswith(prefix) and candidate.endswith(".tmp") and len(random_part) == _TEMP_RANDOM
            and set(random_part) <= _TEMP_CHARACTERS)


def remove_dead_temps(dest: Path) -> list[Path]:
    """Remove the temp files of ``dest`` that no running writer holds; return them.

    A writer holds a lock on its temp file from its first moment to the rename
    (:func:`atomic_path`), and a process's locks go with it, so a temp file nobody holds is what a
    killed run (SIGKILL, power loss) left: nothing else could remove it, and a resumed run would
    add one of its own beside it. Checked once per output and process, at its first atomic write;
    where the file system has no locks, nothing is removed.
    """
    folder = dest.parent
    key = (os.fspath(folder.absolute()), dest.name)
    if key in _swept:
        return []
    _swept.add(key)
    removed = []
    try:
        entries = [e for e in os.scandir(folder) if _temp_of(dest.name, e.name)]
    except OSError:
        return []
    now = _dt.datetime.now().timestamp()
    for entry in entries:
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_TEMP_SECONDS or not entry.is_file(
                    follow_symlinks=False):
                continue
        except OSError:
            continue
        if lock_held(entry.path) is False:  # free: its writer is gone (held, or no locks here: not ours to judge)
            Path(entry.path).unlink(missing_ok=True)
            removed.append(Path(entry.path))
    return removed


def lock_held(path: PathArg) -> bool | None:
    """Whether a live process holds ``flock`` on ``path``; None where that cannot be told (the file
    is gone, or its file system refuses locks).

    The project marks what a running process owns with a held lock (:func:`atomic_path`'s temps, the
    RAM spool's owner file) because the kernel drops it however the process dies, and, unlike a PID,
    it means the same in every PID namespace that shares the file. The probe takes the lock and
    drops it at once; nobody else locks an abandoned file, so what it saw stays true.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # also drops the lock this probe took
    return False


def streamed_output(path: PathArg) -> bool:
    """Whether an output is a stream, written in place and never replaced: ``-`` (stdout), or a path that
    is (or points to) a device, a pipe or a socket (``/dev/null``, ``/dev/stdout`` on a pipe, a FIFO).

    A rename over such a path puts a regular file where the device was: as root, over ``/dev/null``
    itself, which every program on the machine then writes into. A stream cannot be written all or
    nothing anyway, as stdout cannot.
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        return True
    try:
        mode = os.stat(name).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def replaced_path(path: PathArg) -> Path:
    """The file an output's new content is renamed over: ``path``, or for a symlink the file it points
    to, so that the link stays (and the temp file is made on the target's file system, where the
    rename can happen: ``/dev/stdout`` redirected to a file is that file)."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)


@contextlib.contextmanager
def atomic_path(path: PathArg) -> Iterator[Path]:
    """The project's one atomic write: a temp file beside ``path``, fsync, then rename over it.

    Yields the temp file's path, for writers that want a file name (pyarrow, torch.save); the
    file exists and is empty. If the block raises, the temp file is removed and ``path`` is left
    as it was, so a kill, a full disk or a bug never leaves a half-written file under the final
    name. The temp file lives in the destination folder so the rename is an atomic
    same-filesystem ``os.replace``; the file gets the permissions a plain ``open()`` would give.
    The temp file is locked while it is written, so that the next write of ``path`` (a rerun)
    removes what a SIGKILLed writer left (:func:`remove_dead_temps`). A symlink is written where it
    points (:func:`replaced_path`); a device or a pipe (:func:`streamed_output`) is yielded as it is,
    and written straight into.
    """
    if streamed_output(path) and os.fspath(path) != STDIO_NAME:
        yield Path(path)
        return
    dest = replaced_path(path)
    remove_dead_temps(dest)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: the temp is only unprotected
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield tmp
        with open(tmp, "rb") as written:  # by name: a writer may have put another file there (os.replace)
            os.fsync(written.fileno())
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    fsync_directory(dest.parent)


@contextlib.contextmanager
def atomic_output(path: PathArg, zlib_level: int = 6) -> Iterator[BinaryIO]:
    """Write ``path`` all-or-nothing through :func:`atomic_path`, as an open binary stream.

    A rescoring run over a huge table can die hours in; a half-written table that Moses then
    loads (or that a rerun mistakes for finished output) is worse than none. Compression follows
    the destination's suffix (``zlib_level``: zlib's 0..9, as in :func:`open_output`). ``"-"`` passes
    stdout through unchanged.
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        fh = open_output(name)
        try:
            yield fh
        finally:
            fh.close()
        return
    with atomic_path(name) as tmp, open(tmp, "wb", buffering=_READ_BUFFER) as raw:
        if name.endswith(".gz"):
            # filename="" keeps the temp name out of the gzip header (and stays reproducible).
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=zlib_level, mtime=0) as gz:
                yield gz  # type: ignore[misc]
        else:
            yield raw


@contextlib.contextmanager
def files_replaced_together(folder: PathArg, names: Iterable[str]) -> Iterator[Path]:
    """Write a set of files of ``folder`` (a report's page and its figures) that replace the set there as one.

    Yields an empty temporary folder inside ``folder``, where the block writes those of ``names`` it
    makes. When the block ends, each is renamed over its namesake in ``folder`` and those of ``names``
    it did not make are removed from ``folder``: a page and the figures of another run side by side
    would show one model's figures under another's page. When the block raises (an error, Ctrl-C) only
    the temporary folder goes: ``folder`` keeps the previous set, every file byte for byte. ``folder``
    is made if missing; the renames stay on its file system, as :func:`atomic_path`'s do. The temporary
    folder is locked while the block runs, so that the next run into ``folder`` removes those a SIGKILLed
    run left (:func:`_remove_dead_staging`), as :func:`atomic_path` does with its temp files.
    """
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    _remove_dead_staging(target)
    staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, suffix=".tmp", dir=target))
    fd = os.open(staging, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: the folder is only unprotected
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield staging
        wanted = list(names)
        made = [name for name in wanted if (staging / name).is_file()]
        for name in wanted:
            if name not in made:
                (target / name).unlink(missing_ok=True)
        for name in made:
            os.replace(staging / name, target / name)
        fsync_directory(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)


#: The start of :func:`files_replaced_together`'s temporary folders' names (then mkdtemp's 8 characters, ``.tmp``).
_STAGING_PREFIX = ".new."


def _remove_dead_staging(folder: Path) -> list[Path]:
    """Remove the temporary folders of :func:`files_replaced_together` in ``folder`` that no running
    writer holds; return them. Those a writer holds, those younger than :data:`STALE_TEMP_SECONDS` (its
    lock may be a moment away) and anything else in ``folder`` stay."""
    removed = []
    try:
        entries = [e for e in os.scandir(folder) if _temp_of(_STAGING_PREFIX[1:-1], e.name)]
    except OSError:
        return []
    now = _dt.datetime.now().timestamp()
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or now - entry.stat(
                    follow_symlinks=False).st_mtime < STALE_TEMP_SECONDS:
                continue
        except OSError:
            continue
        if lock_held(entry.path) is False:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def copy_compressed(src: PathArg, dest: PathArg) -> None:
    """``src`` copied to ``dest`` atomically, gzipped for a ``.gz`` name (:func:`atomic_output`): how a
    decoder's plain n-best list is kept, a tenth of its size, without a half-written copy on a crash."""
    with open(src, "rb") as fin, atomic_output(dest) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def atomic_write_bytes(path: PathArg, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (small files: progress records, weights)."""
    with atomic_output(path) as fh:
        fh.write(data)


def write_json(path: PathArg, doc: object, *, sort_keys: bool = False) -> None:
    """Replace ``path`` with ``doc`` as JSON, atomically: the one way the project writes a JSON file.

    Progress records, training and tuning states, stamps and reports are read back by a resumed run
    or a later step; written any other way, a kill mid-write leaves a file that neither the old run
    nor the new one can read. One format, so that the same document is always the same bytes:
    indented by one space (readable, diffable when committed), ASCII only (non-ASCII characters as
    ``\\uXXXX``), a final newline; keys in the document's order, or sorted with ``sort_keys``. A
    ``.gz`` name is compressed, as every output (:func:`atomic_output`).
    """
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=sort_keys) + "\n").encode("ascii"))


def fsync_directory(folder: Path) -> None:
    """Persist the rename itself; best effort, since some filesystems refuse directory fsync."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------------------------
# One run per output


#: flock's errors on filesystems without locks (the call is refused, not contended).
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class InUseError(UserError):
    """Another running process holds the output (or work folder) this command would write."""


def lock_path(target: PathArg) -> Path:
    """The lock file of ``target``: ``.lock`` inside a folder, ``.NAME.lock`` beside a file."""
    path = Path(target)
    return path / ".lock" if path.is_dir() else path.parent / f".{path.name}.lock"


@contextlib.contextmanager
def exclusive_use(target: PathArg) -> Iterator[None]:
    """Hold ``target`` (an output file or a work folder) for this process while the block runs.

    Resumable commands keep their progress beside their output (``MODEL.last``, a partial table and
    its progress record, a work folder's stamps and state). Two runs on the same output, say the
    same ``make table1`` started twice, or a ``--resume`` while the first run is still going, would
    write the same files in turn, each resuming from the other's half-state, and lose hours of
    work. So the second one raises :class:`InUseError`, naming the process that holds it, before
    it writes anything. The lock is ``flock`` on :func:`lock_path`: the kernel drops it when the
    holder dies, so a killed run never leaves a lock behind that blocks the rerun. The file is
    removed on exit; ``-`` (stdout) needs no lock. On a filesystem that refuses ``flock`` (some
    network and FUSE mounts) the run goes on unguarded, with a warning on stderr.
    """
    if os.fspath(target) == STDIO_NAME:
        yield
        return
    lock = lock_path(target)
    lock.parent.mkdir(parents=True, exist_ok=True)  # training into a new folder made it, and still does
    fd = _hold_lock_file(lock, target)
    if fd is None:
        yield
        return
    started = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    command = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}: {command}\n".encode())
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)


def _hold_lock_file(lock: Path, target: PathArg) -> int | None:
    """The descriptor holding ``lock`` (the file now at that path), or None where locks are refused."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise InUseError(f"{target} is in use by {holder}; wait for that run to end or stop it") from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_LOCKING:
                raise
            lock.unlink(missing_ok=True)
            print(f"warning: {lock.parent} does not support file locks ({exc.strerror}): a second run writing "
                  f"{target} at the same time would not be stopped", file=sys.stderr)
            return None
        try:
            current = os.stat(lock).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        os.close(fd)  # the holder we met removed this file on exit: lock the one now at the path


# --------------------------------------------------------------------------------------------
# Places that can be written, and nothing left behind by a failed run


class OutputPlaceError(UserError):
    """An output's place cannot be written (found before any work starts, as one line)."""


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (``/`` at worst)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_place(path: PathArg, *, folder: bool = False) -> None:
    """Refuse an output (a file, or with ``folder`` a folder) that this process cannot write.

    Tried, not guessed: a temporary file is created and removed in the nearest folder that exists
    (the output's own folder, or where its missing folders would be made). ``os.access`` says yes
    to root on a read-only mount's mode bits or in ``/sys``, and knows nothing of network
    filesystems' own rules; creating a file is the one test that means what the run will do. Raises
    :class:`OutputPlaceError` naming the user's path (never a temporary name). ``-`` is stdout.
    """
    name = os.fspath(path)
    if name == STDIO_NAME:
        return
    if not folder and streamed_output(name):  # written in place (atomic_path): only the stream itself counts
        if not os.access(name, os.W_OK):
            raise OutputPlaceError(f"cannot write {name}: permission denied")
        return
    target = Path(os.path.abspath(name))
    if folder and target.exists() and not target.is_dir():
        raise OutputPlaceError(f"{name} is a file, not a folder")
    if not folder and target.is_dir():
        raise OutputPlaceError(f"{name} is a folder; give a file path")
    place = nearest_existing(target if folder else target.parent)
    if not place.is_dir():
        raise OutputPlaceError(f"cannot write {name}: {place} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-test.", dir=place)
    except OSError as exc:
        raise OutputPlaceError(f"cannot write {name}: nothing can be created in {place} ({exc.strerror})") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    if not folder and target.is_file() and _immutable(target):
        raise OutputPlaceError(f"cannot replace {name}: the file is immutable or append-only (lsattr shows i or a; "
                               "chattr -i/-a lifts it)")


#: The errors of a write to a full disk (or a full quota).
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def disk_full_error(exc: BaseException) -> OSError | None:
    """The full-disk :class:`OSError` behind ``exc`` (``exc`` itself, or what it was raised from or while
    handling), else None. ``torch.save`` reports a full disk as a ``RuntimeError`` about
    ``inline_container.cc`` raised while handling the ``OSError``; the user needs the one line that says
    the disk is full, not that."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _DISK_FULL:
            return current
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def removed_when_the_disk_fills(folder: PathArg) -> Iterator[None]:
    """Run the block; if it fails on a full disk and ``folder`` was made by it, remove ``folder``.

    Training keeps its prepared data in a work folder beside the model (``MODEL.data/``) so that a
    ``--resume`` need not prepare it again; a rerun rebuilds it when it is gone. On a full disk that
    folder is what fills it: left there, it keeps the disk full for the rerun the message asks for.
    """
    made = not os.path.lexists(folder)
    try:
        yield
    except BaseException as exc:
        if made and disk_full_error(exc) is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def same_file(a: PathArg, b: PathArg) -> bool:
    """Whether ``a`` and ``b`` name one file: by identity where both exist (``st_dev`` + ``st_ino``, so
    symlinks and hard links count), else by their real paths (``out/../x`` and a new name that a symlinked
    folder makes the same)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


#: How an output that a command fills as a folder is spelled among the outputs checked by
#: :func:`check_outputs_are_not_inputs` (``MODEL.data/``): an input anywhere inside it is at risk too.
FOLDER_MARK = os.sep
STDIN_LABEL = "standard input"


def stdin_file() -> str | None:
    """A path naming the regular file on standard input (``cmd - < FILE``), else None (a terminal, a
    pipe, or a stdin without a descriptor, as under click's test runner).

    ``-`` names no file, but the file the shell opened for it is as much an input as a named one: a
    command that writes over it (``rescore-phrase-table - out.gz < .out.gz.partial``) destroys it.
    ``/proc/self/fd/N`` stats as that file, so identity and real-path comparisons see it.
    """
    try:
        fd = sys.stdin.fileno()
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    return f"/proc/self/fd/{fd}" if regular and os.path.exists(f"/proc/self/fd/{fd}") else None


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` is (or will be) somewhere under ``folder``, by real paths."""
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real.startswith(top.rstrip(os.sep) + os.sep)


def _a_temp_of(path: str, output: str) -> bool:
    """Whether ``path`` is where :func:`atomic_path` keeps its temp files for ``output``: such a file,
    unlocked, is what the next write of ``output`` removes (:func:`remove_dead_temps`)."""
    real, out = os.path.realpath(path), os.path.realpath(output)
    return os.path.dirname(real) == os.path.dirname(out) and _temp_of(os.path.basename(out), os.path.basename(real))


def check_outputs_are_not_inputs(outputs: Iterable[tuple[str, PathArg | None]],
                                 inputs: Iterable[tuple[str, PathArg | None]]) -> None:
    """Refuse a command whose output is one of its inputs, or whose two outputs are one file.

    ``outputs`` and ``inputs`` are ``(how the command line names it, path)`` pairs. Every output replaces
    its file at the end (or is written over during the run): an output that is the input ``--model``,
    through a symlink or a hard link too, destroys the model the user had, and two outputs on one file
    leave only the one written last. Found here, before any work, as one line naming both (an
    :class:`OutputPlaceError`). Outputs are everything the command creates, truncates or removes: its
    lock and partial files too, each given by the caller; an output spelled with a trailing
    :data:`FOLDER_MARK` is a folder the command fills, and an input anywhere inside it is refused; an
    input named as one of an output's temp files (which a rerun removes) is refused. The input ``-``
    is the file on standard input, if it is one (:func:`stdin_file`). ``None`` and ``-`` outputs
    (stdout) are skipped, and so are inputs that do not exist and devices, pipes and sockets
    (``/dev/stdin`` and ``/dev/stdout`` on one terminal, ``/dev/null`` twice): nothing of theirs can be lost.
    """

    def is_data(path: str) -> bool:
        return os.path.isfile(path) or os.path.isdir(path)

    def named(label: str, path: PathArg | None) -> tuple[str, str] | None:
        if path is None:
            return None
        if os.fspath(path) == STDIO_NAME:
            stdin = stdin_file()
            return (f"{label} ({STDIN_LABEL})", stdin) if stdin is not None else None
        return label, os.fspath(path)

    outs = [(label, os.fspath(path)) for label, path in outputs if path is not None and os.fspath(path) != STDIO_NAME
            and (is_data(path) or not os.path.exists(path))]
    ins = [pair for label, path in inputs if (pair := named(label, path)) is not None and is_data(pair[1])]
    for k, (label, path) in enumerate(outs):
        for in_label, in_path in ins:
            shown = display_name(in_path) if not in_path.startswith("/proc/self/fd/") else os.path.realpath(in_path)
            if same_file(path, in_path):
                raise OutputPlaceError(f"output {path} ({label}) is the input {in_label} {shown}; write it elsewhere")
            if path.endswith(FOLDER_MARK) and _inside(in_path, path):
                raise OutputPlaceError(f"output folder {path} ({label}) holds the input {in_label} {shown}; "
                                       "write it elsewhere")
            if _a_temp_of(in_path, path):
                raise OutputPlaceError(f"the input {in_label} {shown} is named as a temporary file of the output "
                                       f"{path} ({label}), which the next run removes; rename it")
        for other_label, other in outs[:k]:
            if same_file(path, other):
                raise OutputPlaceError(f"output {path} ({label}) is also the output {other_label} {other}; "
                                       "give each output its own path")


#: Linux's FS_IOC_GETFLAGS and the inode flags that forbid replacing a file (linux/fs.h).
_FS_IOC_GETFLAGS = 0x80086601
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20


def _immutable(path: Path) -> bool:
    """Whether an existing file carries the immutable or append-only flag (``chattr +i``/``+a``).

    Outputs replace their file by a rename at the very end; the kernel refuses that rename for such
    a file, even to root, and the mkstemp probe does not see it (the folder itself is writable).
    Where the filesystem has no such flags (the ioctl fails) nothing is refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        flags = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4)
    except OSError:
        return False
    finally:
        os.close(fd)
    return bool(int.from_bytes(flags, sys.byteorder) & (_FS_IMMUTABLE_FL | _FS_APPEND_FL))


def _remove_empty_folders(folder: Path) -> None:
    """Remove ``folder`` and the folders under it that hold no file; files (and their folders) stay."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for root, _, _ in sorted(os.walk(folder), key=lambda walked: -len(walked[0])):
        with contextlib.suppress(OSError):
            os.rmdir(root)  # refused where a file is left


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry, ignore_errors=True)
    else:
        entry.unlink(missing_ok=True)


@contextlib.contextmanager
def outputs_of_a_run(files: Iterable[PathArg | None], folders: Iterable[PathArg | None] = (), *,
                     keeps_progress: bool = False) -> Iterator[None]:
    """Run the block as a command writing ``files`` and ``folders``: a failed run leaves nothing it created.

    Before the block, the missing folders of ``files`` are made (an output in a folder not made yet
    is written there, as training into a new folder always did). When the block raises (an error,
    Ctrl-C), what the run created goes again:

    - folders it made, with their content; new empty folders beside the files and inside the
      folders (``cslm train``'s ``MODEL.data/`` on an empty corpus);
    - a command that keeps no progress (``keeps_progress`` False) also loses the files it created:
      its output files, and new entries of its output folders;
    - a command that keeps progress for a rerun (``--resume``, ``table1``'s stamps) keeps the files it
      wrote, since they are what the rerun continues from; only folders that hold no file go.

    Folders it made and left empty are removed after a successful run too (an option given but not
    used, such as ``--save-model`` with ``--model``). Temporary and lock files are
    :func:`atomic_path`'s and :func:`exclusive_use`'s to remove; ``None`` and ``-`` are skipped.
    """
    out_files = [Path(os.path.abspath(f)) for f in files if f is not None and os.fspath(f) != STDIO_NAME]
    out_folders = [Path(os.path.abspath(f)) for f in folders if f is not None and os.fspath(f) != STDIO_NAME]
    made = set()
    for place in [f.parent for f in out_files] + out_folders:
        top = place
        while not top.parent.exists() and top.parent != top.parent.parent:
            top = top.parent
        if not top.exists():
            made.add(top)
    made = {m for m in made if not any(other in m.parents for other in made)}  # the topmost ones only
    for f in out_files:
        f.parent.mkdir(parents=True, exist_ok=True)

    def made_by_run(path: Path) -> bool:
        return any(path == m or m in path.parents for m in made)

    new_files = {f for f in out_files if not os.path.lexists(f)}
    watched = {folder: set(os.listdir(folder)) for folder in {*(f.parent for f in out_files), *out_folders}
               if folder.is_dir() and not made_by_run(folder)}
    try:
        yield
    except BaseException:
        for folder, before in watched.items():
            with contextlib.suppress(OSError):
                for entry in (folder / name for name in set(os.listdir(folder)) - before):
                    if not keeps_progress and (folder in out_folders or entry in new_files):
                        _remove(entry)
                    elif entry.is_dir() and not entry.is_symlink():
                        _remove_empty_folders(entry)
        for top in made:
            if keeps_progress:
                _remove_empty_folders(top)
            else:
                _remove(top)
        raise
    for top in made:
        _remove_empty_folders(top)
