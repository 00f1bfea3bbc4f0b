"""Running the real ``moses`` decoder: 1-best and n-best decoding with clear failures.

Moses is not a library: we run the binary as a process. Two of its habits shape this module.
It resolves relative paths in ``moses.ini`` against its *working directory*, not the ini's folder,
so by default we run it from the ini's folder (where relocatable systems keep their models). And a
failed decode usually says why only at the end of a long stderr, so errors carry that tail.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from infrastructure.errors import UserError
from infrastructure.files import atomic_path
from infrastructure.processes import ends_with_this_process

STDERR_TAIL_LINES = 25


#: Where a user without Moses is sent: every "Moses not found" message (and the Makefile's) ends with it.
GETTING_MOSES = "to get Moses, see docs/moses-nplm.md (build it) or docker/README.md (an image with it)"


class DecoderError(UserError):
    """Moses could not be found, or exited with an error (the message holds its stderr tail)."""


def find_moses_bin_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding ``moses``: ``explicit`` (e.g. ``--moses-bin-dir``), else ``$MOSES_BIN_DIR``."""
    value = explicit if explicit is not None else os.environ.get("MOSES_BIN_DIR")
    if not value:
        raise DecoderError("Moses not found: pass --moses-bin-dir or set MOSES_BIN_DIR to the folder with 'moses'; "
                           + GETTING_MOSES)
    path = Path(value)
    if not (path / "moses").is_file():
        raise DecoderError(f"no 'moses' binary in {path} (from --moses-bin-dir or MOSES_BIN_DIR); {GETTING_MOSES}")
    return path


def format_weight_overwrite(weights: Mapping[str, Sequence[float]]) -> str:
    """Moses' ``-weight-overwrite`` argument: ``"Name0= v v Name1= v"``."""
    return " ".join(f"{name}= " + " ".join(f"{v:.9g}" for v in values) for name, values in weights.items())


@dataclass
class DecodeResult:
    output: Path  # 1-best translations, one per input line
    nbest: Path | None
    seconds: float
    log: Path  # Moses' stderr
    details: Path | None = None  # -translation-details: each 1-best's phrase segmentation


def decode(
    moses_bin_dir: str | os.PathLike[str],
    ini: str | os.PathLike[str],
    input_path: str | os.PathLike[str],
    output_path: str | os.PathLike[str],
    *,
    nbest_path: str | os.PathLike[str] | None = None,
    nbest_size: int = 100,
    distinct: bool = True,
    threads: int = 1,
    weights: Mapping[str, Sequence[float]] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    details_path: str | os.PathLike[str] | None = None,
) -> DecodeResult:
    """Decode ``input_path`` with ``moses -f ini``; optionally write an n-best list, and with
    ``details_path`` Moses' ``-translation-details`` report of each 1-best (source span -> target
    phrase, read by :mod:`moses_integration.translation_details`).

    ``cwd`` defaults to the ini's folder (see module doc). All paths are made absolute first so the
    change of directory does not move them. ``weights`` overrides dense weights without rewriting
    the ini. Every output is written to a temporary name and renamed on success, so a killed decode
    never leaves a plausible-looking but short file behind.
    """
    moses = Path(moses_bin_dir).absolute() / "moses"  # moses runs in workdir: a relative bin dir would move
    ini = Path(ini).resolve()
    input_path = Path(input_path).resolve()
    output_path = Path(output_path).resolve()
    workdir = Path(cwd).resolve() if cwd is not None else ini.parent
    log_path = output_path.with_name(output_path.name + ".log")
    nbest_path = Path(nbest_path).resolve() if nbest_path is not None else None
    details_path = Path(details_path).resolve() if details_path is not None else None
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp_out = stack.enter_context(atomic_path(output_path))
        cmd = [str(moses), "-f", str(ini), "-threads", str(threads)]
        if nbest_path is not None:
            tmp_nbest = stack.enter_context(atomic_path(nbest_path))
            cmd += ["-n-best-list", str(tmp_nbest), str(nbest_size)] + (["distinct"] if distinct else [])
        if details_path is not None:
            cmd += ["-translation-details", str(stack.enter_context(atomic_path(details_path)))]
        if weights:
            cmd += ["-weight-overwrite", format_weight_overwrite(weights)]
        cmd += list(extra_args)
        with open(input_path, "rb") as stdin, open(tmp_out, "wb") as stdout, open(log_path, "wb") as stderr:
            try:
                proc = subprocess.run(cmd, stdin=stdin, stdout=stdout, stderr=stderr, cwd=workdir, check=False,
                                      **ends_with_this_process())  # type: ignore[call-overload]
            except OSError as exc:
                raise DecoderError(f"cannot run {moses}: {exc}") from exc
        if proc.returncode != 0:  # raising inside the block removes every temp file
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:])
            raise DecoderError(
                f"moses failed (exit {proc.returncode}) on {input_path} with {ini}; last lines of {log_path}:\n{tail}"
            )
    return DecodeResult(output_path, nbest_path, time.monotonic() - started, log_path, details_path)
