"""Running the rescoring pipeline in tests: one call taking the options the tests vary, its output's
lines, the sharded run whose parts must concatenate to the whole, the command line run in this process,
the command SIGKILLed mid-run (a real process), and the check that two outputs are the same bytes,
which says what differs: lines, members or compressed bytes.

The rescorer is imported where a function needs it: the GPU suite's identity check imports
:func:`assert_same_output` from here in a fresh interpreter per comparison, which then starts in a
fraction of a second instead of importing torch and the pipeline (``rescorer.model.config`` is
torch-free)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from waiting import sigkill_when

from infrastructure.files import GZIP_MAGIC
from rescorer.model.config import ModelSizes, TrainConfig  # torch-free

if TYPE_CHECKING:
    from click.testing import Result

    from rescorer.model.checkpoint import Checkpoint
    from rescorer.pipeline.rescore import RescoreSummary

RESCORE_SCRIPT = str(Path(sys.executable).parent / "rescore-phrase-table")  # the installed command, for a real process
SAMPLE_TABLE = "fixtures/hansard-enfr/phrase-table.sample.gz"  # under the shared data
SMALL = ModelSizes(hidden=32, embedding=16, maxout_units=16, output_rank=16)


def train_small(table: Path, out: Path, direction: str = "forward") -> Path:
    """A :data:`SMALL` model of ``direction`` trained for 30 steps on ``table`` (seconds): scores that
    are the model's own, not a uniform guess."""
    from rescorer.training.train import train_on_phrase_table

    train_on_phrase_table(str(table), out, model_sizes=replace(SMALL, direction=direction),
                          train_config=TrainConfig(max_steps=30, valid_every=30, patience=None),
                          shortlist=3000, device="cpu", progress=False)
    return out


def rescore(inp: Path, out: Path, forward: Checkpoint, reverse: Checkpoint | None = None,
            **kw: object) -> RescoreSummary:
    """``rescore-phrase-table`` on CPU without progress; ``token_budget`` and ``workers`` as given,
    any other :class:`RescoreOptions` field through ``kw``; the run's summary."""
    from rescorer.pipeline.rescore import RescoreOptions
    from rescorer.pipeline.rescore import rescore as rescore_table
    from rescorer.pipeline.scoring import ScoringOptions
    from rescorer.pipeline.train_or_load import Models

    scoring = ScoringOptions(token_budget=kw.pop("token_budget", 4096))
    opts = RescoreOptions(progress=False, device="cpu", workers=kw.pop("workers", 0), scoring=scoring, **kw)
    return rescore_table(str(inp), str(out), Models(forward, reverse), opts)


def run_command(args: list[str], **kw: object) -> Result:
    """``rescore-phrase-table args`` in this process through click's test runner (``kw`` to
    :meth:`CliRunner.invoke`, e.g. ``input``): the command's own parsing, checks, messages and exit
    status without a fresh interpreter importing torch. A test that needs a real process (a signal,
    its stdin file) runs :data:`RESCORE_SCRIPT`."""
    from click.testing import CliRunner

    from rescorer.cli import rescore_phrase_table_command

    return CliRunner().invoke(rescore_phrase_table_command, args, **kw)


def assert_ran(result: Result) -> None:
    """The command exited 0; else its output and the exception that ended it."""
    assert result.exit_code == 0, f"{result.output[-3000:]}\n{result.exception!r}"


def lines_of(path: Path) -> list[bytes]:
    with gzip.open(path) as fh:
        return fh.read().splitlines()


def assert_same_output(actual: Path | bytes, expected: Path | bytes) -> None:
    """The two outputs (files or their bytes; plain or gzip) are the same bytes: the same lines in the
    same gzip members, each compressed the same way.

    On a difference the message is one line that says what differs: how many lines and the first of
    them, the members, or, with both the same, the compressed bytes (what ISA-L's level 1 did now and
    then before members went to zlib: docs/rescore.md, "Compressed bytes"). pytest's own diff of two
    gzip files is pages of compressed bytes that name no line (a CI failure once showed only that).
    """
    got = actual.read_bytes() if isinstance(actual, Path) else actual
    want = expected.read_bytes() if isinstance(expected, Path) else expected
    if got == want:
        return
    got_lines, want_lines = _text(got).splitlines(), _text(want).splitlines()
    if got_lines == want_lines:
        got_members, want_members = _members(got), _members(want)
        if got_members != want_members:
            raise AssertionError(f"the same {len(want_lines)} lines in {len(got_members)} gzip members against "
                                 f"{len(want_members)} expected, or cut at other lines")
        raise AssertionError(f"the same {len(want_lines)} lines in the same {len(want_members)} gzip members, "
                             f"compressed differently ({len(got)} bytes against {len(want)})")
    differ = [i for i, (a, b) in enumerate(zip(got_lines, want_lines, strict=False)) if a != b]
    first = differ[0] if differ else min(len(got_lines), len(want_lines))
    shown = [lines[first][:200] if first < len(lines) else b"<no line>" for lines in (got_lines, want_lines)]
    raise AssertionError(f"{len(got_lines)} lines against {len(want_lines)} expected, {len(differ)} of the shared "
                         f"ones differ; first at line {first + 1}: {shown[0]!r} != {shown[1]!r}")


def _members(data: bytes) -> list[bytes]:
    """The decompressed text of each gzip member of ``data`` (``[data]`` if it is not gzip)."""
    return [text for _, text in gzip_members(data)] if data[:2] == GZIP_MAGIC else [data]


def gzip_members(data: bytes, block: int = 1 << 16) -> list[tuple[bytes, bytes]]:
    """Each gzip member of ``data``: its compressed bytes and its text.

    Fed a block at a time, so that the input left over after a member is at most one block: a table
    of 2.9M lines holds tens of thousands of members, and handing zlib the whole rest each time
    copies it each time (minutes; the GPU suite's identity step once ran out of time so).
    """
    view, members, start = memoryview(data), [], 0
    while start < len(view):
        member, fed, parts = zlib.decompressobj(16 + zlib.MAX_WBITS), start, []
        while not member.eof and fed < len(view):
            parts.append(member.decompress(view[fed:fed + block]))
            fed = min(fed + block, len(view))
        if not member.eof:
            raise ValueError(f"a gzip member that starts at byte {start} is cut off")
        end = fed - len(member.unused_data)
        members.append((bytes(view[start:end]), b"".join(parts) + member.flush()))
        start = end
    return members


def _text(data: bytes) -> bytes:
    """Decompressed ``data`` if gzip (every member), else ``data``."""
    return gzip.decompress(data) if data[:2] == GZIP_MAGIC else data


def shard_outputs(run: Callable[[Path, tuple[int, int] | None], object], folder: Path,
                  shards: int = 3) -> tuple[Path, list[Path]]:
    """The whole run's output and its ``shards`` parts' (``run(out, shard)`` writes one), in order."""
    whole = folder / "whole.gz"
    run(whole, None)
    parts = [folder / f"out.{k}.gz" for k in range(1, shards + 1)]
    for k, part in enumerate(parts, start=1):
        run(part, (k, shards))
    return whole, parts


def sigkill_after_chunks(cmd: list[str], progress: Path, chunks: int = 2) -> None:
    """Start ``cmd`` (a ``rescore-phrase-table`` command line) and SIGKILL it once its progress record
    says ``chunks`` chunks are durable: a run killed mid-way, as a scheduler or the OOM killer does."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)

    def durable() -> bool:
        return progress.exists() and json.loads(progress.read_text())["chunks_done"] >= chunks

    sigkill_when(proc, durable, f"progress record of {chunks} durable chunks")
