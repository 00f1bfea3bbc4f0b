"""Where a rescoring run writes, and why a stopped run loses nothing it had finished.

The output goes to a hidden partial file beside the destination (rejected lines to another), one
finished chunk at a time, each followed by fsync and a progress record (:mod:`rescorer.pipeline.resume`)
that says how many bytes are durable. When a run stops for any reason the partial files are cut
back to those bytes, so ``--resume`` continues from them; when it completes they are renamed into
place. A run that writes to stdout keeps nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import BinaryIO

from infrastructure.files import STDIO_NAME, compress_member, streamed_output
from infrastructure.interrupts import Interrupted
from moses_integration.phrase_table import PhraseTableError
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.resume import save_progress
from rescorer.pipeline.shards import ShardError
from rescorer.tables.chunks import UnreadableInputError


@dataclass
class ChunkProgress:
    """The progress record after a chunk: what a killed run had made durable, and what the next chunk
    needs from the ones before. Its fields are the record's keys (beside the run's identity).

    ``output_bytes`` and ``rejects_bytes`` are filled in by :meth:`DurableWriter.write` as it makes
    the chunk's bytes durable; :meth:`OutputFiles.counted_partials` says which file each counts.
    """

    lines_done: int = 0  # input lines done
    chunks_done: int = 0
    summary: dict | None = None  # the RescoreSummary so far, as a dict (None: an empty one)
    shard_state: dict | None = None  # rescorer.pipeline.shards.ShardFilter's state (--shard)
    prev_source: str | None = None  # the last source phrase written (distinct sources across chunks)
    num_scores: int | None = None  # score columns every line must have, once fixed
    # Each scorer's token budget after the chunk (the forward model's, then the reverse one's): an
    # out-of-memory error halves it for the rest of the run, and a resume goes on with it, as the
    # budget decides the groups and so the printed digits.
    token_budgets: list[int] | None = None
    output_bytes: int = 0
    rejects_bytes: int = 0

    @classmethod
    def from_record(cls, record: dict) -> ChunkProgress:
        """The progress held in a saved record (its identity keys left out)."""
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


@dataclass
class OutputFiles:
    """Where a run writes: the partial output, the rejects beside it and the progress record."""

    output: str
    partial: Path
    rejects: Path
    rejects_partial: Path
    progress: Path

    @classmethod
    def beside(cls, output_path: str) -> OutputFiles:
        """The files of a run writing ``output_path``. An output that is a symlink is written where it
        points: the partial file must be on the target's file system for the final rename, which
        replaces the target (the link stays); a partial beside the link, on another file system, could
        not be renamed there ("Invalid cross-device link") after the whole table was scored."""
        if streamed_output(output_path):  # never written: a stream is written in place, as stdout is
            return cls(output_path, Path.cwd() / ".-.partial", Path.cwd() / "-.rejects",
                       Path.cwd() / ".-.rejects.partial", Path.cwd() / ".-.progress.json")
        target = Path(os.path.realpath(output_path))
        folder, name = target.parent, target.name
        output = str(target) if os.path.islink(output_path) else output_path
        return cls(output, folder / f".{name}.partial", folder / f"{name}.rejects",
                   folder / f".{name}.rejects.partial", folder / f".{name}.progress.json")

    def written(self) -> list[Path]:
        """Every file a run writes or removes beside its output: an input there would be lost (the
        rejects file goes at the end of a run that rejected nothing, as one from an earlier run would
        mislead)."""
        return [self.partial, self.rejects, self.rejects_partial, self.progress]

    def counted_partials(self) -> dict[str, Path]:
        """The partial files :class:`ChunkProgress` counts, by its counter's name (the main one first)."""
        return {"output_bytes": self.partial, "rejects_bytes": self.rejects_partial}

    def discard(self) -> None:
        for path in (self.partial, self.rejects_partial, self.progress):
            path.unlink(missing_ok=True)


def default_model_path(output_path: str, save_model: str | None = None) -> str:
    """Where a model trained by ``rescore-phrase-table`` without ``--model`` is saved."""
    return save_model or (output_path + ".model.pt" if not streamed_output(output_path) else "rescorer.model.pt")


#: What a run that read its table from standard input says when it stops: nothing is kept, as a rerun
#: cannot read that input again (``--resume`` needs the table as a file), so say what can be done.
FROM_STDIN = ("nothing kept: the table came from standard input, which a rerun cannot read again; run again, "
              "or give the table as a file, which a stopped run can continue with --resume")


def stop_error(exc: BaseException, writer: DurableWriter, files: OutputFiles, to_stdout: bool,
               from_stdin: bool = False) -> BaseException:
    """The exception to raise when a run stops, after leaving the partial files in a sane state.

    * Disk full (or any write error): the partial files are cut back to their durable bytes and
      the message says how much is kept and that ``--resume`` continues once there is space.
    * A malformed line: what is durable is kept, and ``--skip-bad-lines --resume`` continues
      (a plain ``--resume`` would stop at the same line, so it is not suggested).
    * Input that cannot be read (truncated gzip, bad settings): nothing is kept, since a rerun
      would stop at the same place.
    * Anything else (Ctrl-C, SIGTERM, a crash): what is durable is kept for ``--resume``; an
      interruption becomes :class:`~infrastructure.interrupts.Interrupted`, which says so.
    In every case a partial file holding no good byte is removed. A run that read standard input
    (``from_stdin``) keeps nothing: ``--resume`` needs the table as a file, and a partial output no run
    can continue would only stop the next run (which refuses to start over one without ``--resume``).
    """
    if to_stdout:
        return exc
    kept = writer.close_and_cut()
    malformed_line = isinstance(exc, PhraseTableError) and not isinstance(exc, UnreadableInputError)
    input_error = isinstance(exc, (PhraseTableError, ShardError, RescoreError))
    if (input_error and not malformed_line) or kept == 0 or from_stdin:
        files.discard()
        kept = 0
    if isinstance(exc, OSError) and not input_error:
        what = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else f"writing failed ({exc})"
        if kept:
            return RescoreError(
                f"{what}: {kept} good bytes of output kept in {files.partial} (cut back to the last complete chunk); "
                f"free space and run again with --resume to continue"
            )
        return RescoreError(f"{what}: nothing of {files.output} could be written; free space and run again")
    if malformed_line and kept:
        sys.stderr.write(f"rescore-phrase-table: stopped; {kept} good bytes kept in {files.partial} (run again "
                         f"with --skip-bad-lines --resume to move malformed lines to {files.rejects} and continue)\n")
    elif not input_error and kept:
        what = f"{kept} good bytes kept in {files.partial} (run again with --resume to continue)"
        if isinstance(exc, KeyboardInterrupt):  # Ctrl-C or SIGTERM: the command says it in one line
            return Interrupted(what)
        sys.stderr.write(f"rescore-phrase-table: stopped; {what}\n")
    elif from_stdin and not input_error:
        if isinstance(exc, KeyboardInterrupt):
            return Interrupted(FROM_STDIN)
        sys.stderr.write(f"rescore-phrase-table: stopped; {FROM_STDIN}\n")
    return exc


def check_partial_output(output_path: str, resume: bool) -> bool:
    """Before any work: whether ``output_path`` is finished already (a ``--resume`` then has nothing to
    do), after refusing to start over a stopped run's partial output without ``resume``.

    A rerun without ``--resume`` would overwrite hours of scored chunks, as ``rescorer train`` refuses
    to overwrite a model; an output in place without a partial file or a progress record beside it is
    one that a run completed, and a ``--resume`` of it must not score the table again.
    """
    if streamed_output(output_path):
        return False
    files = OutputFiles.beside(output_path)
    if not resume and files.partial.exists():
        raise RescoreError(f"{files.partial} holds {files.partial.stat().st_size} bytes of a stopped run's output: "
                           f"run again with --resume to continue it, or remove it and {files.progress} to start over")
    return resume and os.path.isfile(files.output) and not files.partial.exists() and not files.progress.exists()


class DurableWriter:
    """Appends finished chunks to the partial output (and rejects) and records them as durable.

    ``durable`` is the output size the progress record holds: what a resume may trust. A write
    that fails half-way (disk full) leaves bytes past it, which :meth:`close_and_cut` removes.
    The rejects file is created by the first rejected line, so a run without one never has it.
    """

    def __init__(self, files: OutputFiles, to_stdout: bool, identity: dict, done: ChunkProgress) -> None:
        self.files, self.to_stdout, self.identity = files, to_stdout, identity
        self.durable = done.output_bytes
        self.durable_rejects = done.rejects_bytes
        resuming = done.output_bytes > 0 or done.chunks_done > 0
        self.rejects: BinaryIO | None = None
        if to_stdout:  # stdout, or a device or pipe written in place (streamed_output)
            self.out: BinaryIO = sys.stdout.buffer if files.output == STDIO_NAME else open(files.output, "wb")  # noqa: SIM115
            return
        self.out = _open_at(files.partial, self.durable, resuming)
        if resuming and self.durable_rejects:
            self.rejects = _open_at(files.rejects_partial, self.durable_rejects, resuming)
        else:  # nothing rejected so far: a rejects file from an interrupted run holds no good byte
            files.rejects_partial.unlink(missing_ok=True)

    def _streams(self) -> list[BinaryIO]:
        return [self.out] if self.rejects is None else [self.out, self.rejects]

    def write(self, data: bytes, rejects: bytes, progress: ChunkProgress) -> None:
        self.out.write(data)
        if self.to_stdout:
            return
        if rejects:
            if self.rejects is None:
                self.rejects = _open_at(self.files.rejects_partial, self.durable_rejects, False)
            self.rejects.write(rejects)
        for stream in self._streams():
            stream.flush()
            os.fsync(stream.fileno())
        self.durable, self.durable_rejects = self.durable + len(data), self.durable_rejects + len(rejects)
        # The bytes are on disk: count them before the record says so. Ctrl-C or SIGTERM between the
        # two (the record's rename is done, its folder's fsync is not) then leaves the partial files
        # as long as the record or longer, which --resume cuts back; never shorter, which it refuses.
        durable = replace(progress, output_bytes=self.durable, rejects_bytes=self.durable_rejects)
        save_progress(self.files.progress, {**self.identity, **asdict(durable)})

    def finish(self, gzip_output: bool) -> None:
        """Complete the run: rename the partial files into place, drop the progress record."""
        if self.durable == 0 and gzip_output:
            self.write(compress_member(b""), b"", ChunkProgress())  # an empty table is still a valid gzip file
        self.out.flush()
        if self.to_stdout:
            if self.out is not sys.stdout.buffer:
                self.out.close()
            return
        for stream in self._streams():
            os.fsync(stream.fileno())
            stream.close()
        os.replace(self.files.partial, self.files.output)
        if self.durable_rejects:
            os.replace(self.files.rejects_partial, self.files.rejects)
        else:  # no rejects this time: a rejects file from an earlier run would mislead
            self.files.rejects_partial.unlink(missing_ok=True)
            self.files.rejects.unlink(missing_ok=True)
        self.files.progress.unlink(missing_ok=True)

    def close_and_cut(self) -> int:
        """Close the partial files cut back to their durable sizes; returns the output's.

        A rejects file with no durable byte is removed: it holds nothing a resume needs.
        """
        for stream, path, size in ((self.out, self.files.partial, self.durable),
                                   (self.rejects, self.files.rejects_partial, self.durable_rejects)):
            if stream is None or stream.closed:
                continue
            with contextlib.suppress(OSError):  # the buffered tail that failed to write is cut below
                stream.close()
            if path.exists():
                os.truncate(path, size)
        if not self.to_stdout and not self.durable_rejects:
            self.files.rejects_partial.unlink(missing_ok=True)
        return self.durable


def _open_at(path: Path, size: int, resuming: bool) -> BinaryIO:
    """A partial file opened for appending at ``size`` (its durable bytes), created if new."""
    stream = open(path, "r+b" if resuming and path.exists() else "wb")  # noqa: SIM115 - closed by the writer
    stream.truncate(size)
    stream.seek(size)
    return stream
