"""Training a phrase-based Moses system with Moses' own tools: alignment, LM, tables, filtering.

We drive Moses' programs rather than re-implementing them, so the system is the one a Moses user
gets (the fixture README in ``../shared`` is the recipe): ``train-model.perl`` steps 4-9 with its
defaults (grow-diag-final-and, msd-bidirectional-fe, phrases up to 7 words), ``lmplz`` +
``build_binary`` for the KenLM model and ``filter-model-given-input.pl`` for the dev+test tables.

Word alignment uses GIZA++/mgiza through ``train-model.perl`` steps 1-3 where the Moses
installation has them; many builds (including the one this project is tested against) have not,
so ``eflomal`` (``eflomal-align``) aligns both directions and Moses' ``symal`` symmetrises them
with grow-diag-final-and, fed in the format ``giza2bal.pl`` would give it (see
:func:`symal_input`). This reproduces ``train-model.perl`` step 3 exactly from other alignments.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from infrastructure.errors import UserError
from infrastructure.files import atomic_path
from infrastructure.lines import text_lines
from infrastructure.processes import run_as_group
from moses_integration.decoder import GETTING_MOSES
from moses_integration.tokens import split_tokens
from table1.text_prep import write_text_lines

PathArg = str | os.PathLike[str]
STDERR_TAIL_LINES = 25


class MosesToolError(UserError):
    """A Moses program or script is missing or failed (the message holds its log tail)."""


@dataclass(frozen=True)
class MosesInstall:
    """Where the Moses binaries (``moses``, ``symal``, ``lmplz``, ...) and ``scripts/`` are."""

    bin_dir: Path
    scripts_dir: Path

    @classmethod
    def locate(cls, bin_dir: PathArg | None = None, home: PathArg | None = None) -> MosesInstall:
        """From arguments, else ``$MOSES_BIN_DIR`` / ``$MOSES_HOME``; scripts are ``HOME/scripts``
        (or ``BIN/../scripts``), binaries ``BIN`` (or ``HOME/bin``)."""
        bin_value = bin_dir or os.environ.get("MOSES_BIN_DIR")
        home_value = home or os.environ.get("MOSES_HOME")
        if not bin_value and not home_value:
            raise MosesToolError("Moses not found: give MOSES_BIN_DIR (binaries) or MOSES_HOME (with bin/, scripts/); "
                                 + GETTING_MOSES)
        bins = Path(bin_value) if bin_value else Path(home_value) / "bin"  # type: ignore[arg-type]
        scripts = Path(home_value) / "scripts" if home_value else bins.parent / "scripts"
        if not scripts.is_dir():
            raise MosesToolError(f"no Moses scripts/ folder at {scripts} (set MOSES_HOME to the Moses tree); "
                                 + GETTING_MOSES)
        return cls(bins, scripts)

    def missing(self, binaries: Sequence[str] = (), scripts: Sequence[str] = ()) -> list[str]:
        """Which of ``binaries`` (in BIN) and ``scripts`` (under scripts/) are not there, as BIN/name paths."""
        absent = [path for path in (self.bin_dir / name for name in binaries)
                  if not (path.is_file() and os.access(path, os.X_OK))]
        absent += [path for path in (self.scripts_dir / name for name in scripts) if not path.is_file()]
        return [str(path) for path in absent]

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise MosesToolError(f"Moses program {name!r} is not in {self.bin_dir}")
        return path

    def script(self, relative: str) -> Path:
        path = self.scripts_dir / relative
        if not path.is_file():
            raise MosesToolError(f"Moses script {relative!r} is not in {self.scripts_dir}")
        return path

    def has_giza(self) -> bool:
        """Whether ``train-model.perl`` could align by itself (mgiza or GIZA++ with snt2cooc)."""
        return any((self.bin_dir / n).is_file() for n in ("mgiza", "GIZA++"))


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def run_logged(
    command: Sequence[PathArg],
    log: Path,
    *,
    stdin: PathArg | None = None,
    stdout: PathArg | None = None,
    cwd: PathArg | None = None,
) -> float:
    """Run a tool with its stderr (and stdout unless redirected) appended to ``log``; seconds taken.

    The command line goes first into the log, so a user can rerun any step by hand.
    """
    args = [os.fspath(c) for c in command]
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "a", encoding="utf-8") as log_fh:
        log_fh.write("$ " + " ".join(args) + (f" < {stdin}" if stdin else "") + (f" > {stdout}" if stdout else "")
                     + "\n")
        log_fh.flush()
        in_fh = open(stdin, "rb") if stdin else subprocess.DEVNULL  # noqa: SIM115
        out_fh = open(stdout, "wb") if stdout else log_fh  # noqa: SIM115
        try:
            code = run_as_group(args, stdin=in_fh, stdout=out_fh, stderr=log_fh, cwd=cwd)
        except FileNotFoundError as exc:
            raise MosesToolError(f"cannot run {args[0]}: {exc}") from exc
        finally:
            if stdin:
                in_fh.close()  # type: ignore[union-attr]
            if stdout:
                out_fh.close()
    if code != 0:
        raise MosesToolError(f"{Path(args[0]).name} exited with {code}; log {log}:\n{_tail(log)}")
    return time.perf_counter() - started


# --------------------------------------------------------------------------------------------
# Word alignment: eflomal + symal (grow-diag-final-and)


def find_eflomal() -> Path:
    """``eflomal-align`` on PATH or beside this Python (a venv's bin/)."""
    found = shutil.which("eflomal-align") or shutil.which("eflomal-align", path=str(Path(sys.executable).parent))
    if not found:
        raise MosesToolError("eflomal-align not found: pip install eflomal (the project's 'experiment' extra)")
    return Path(found)


def eflomal_align(src: PathArg, tgt: PathArg, forward: PathArg, reverse: PathArg, log: Path) -> float:
    """Align both directions with eflomal's defaults; outputs are 0-based ``src-tgt`` pairs per line."""
    return run_logged([find_eflomal(), "-v", "-s", src, "-t", tgt, "-f", forward, "-r", reverse], log)


def _links(line: str, where: str) -> list[tuple[int, int]]:
    pairs = []
    for item in line.split():
        i, sep, j = item.partition("-")
        if not sep or not i.isdigit() or not j.isdigit():
            raise UserError(f"{where}: bad alignment link {item!r} (expected i-j)")
        pairs.append((int(i), int(j)))
    return pairs


def symal_input(
    src_lines: Iterable[str], tgt_lines: Iterable[str], forward: Iterable[str], reverse: Iterable[str]
) -> Iterator[str]:
    """The sentences in the format ``giza2bal.pl`` writes for ``symal``, three lines each.

    ``forward`` links each target word to at most one source word and ``reverse`` each source
    word to at most one target word (eflomal's ``-f``/``-r``; 0-based ``src-tgt`` pairs). As
    ``train-model.perl`` step 3 (``giza2bal.pl -d e2f -i f2e``): a line ``1``; the target
    sentence with, per target word, the 1-based source position it is linked to by the forward
    alignment (0: none); then the source sentence with, per source word, its 1-based target
    position in the reverse alignment. ``symal`` then writes ``src-tgt`` pairs, the
    ``aligned.grow-diag-final-and`` file of ``train-model.perl``.
    """
    for n, (src, tgt, fwd, rev) in enumerate(zip(src_lines, tgt_lines, forward, reverse, strict=True), start=1):
        s, t = split_tokens(src), split_tokens(tgt)
        to_src = [0] * len(t)
        for i, j in _links(fwd, f"forward alignment line {n}"):
            if i >= len(s) or j >= len(t):
                raise UserError(f"forward alignment line {n}: link {i}-{j} outside {len(s)}x{len(t)} words")
            to_src[j] = i + 1
        to_tgt = [0] * len(s)
        for i, j in _links(rev, f"reverse alignment line {n}"):
            if i >= len(s) or j >= len(t):
                raise UserError(f"reverse alignment line {n}: link {i}-{j} outside {len(s)}x{len(t)} words")
            to_tgt[i] = j + 1
        yield "1"
        yield f"{len(t)} {' '.join(t)} # {' '.join(map(str, to_src))}"
        yield f"{len(s)} {' '.join(s)} # {' '.join(map(str, to_tgt))}"


def symmetrize(
    install: MosesInstall,
    src: PathArg,
    tgt: PathArg,
    forward: PathArg,
    reverse: PathArg,
    output: PathArg,
    log: Path,
) -> float:
    """grow-diag-final-and of two directional alignments with Moses' ``symal``; output atomically."""

    output = Path(output)
    feed = output.with_name(output.name + ".symal-in")
    write_text_lines(feed, symal_input(*(text_lines(p) for p in (src, tgt, forward, reverse))))
    with atomic_path(output) as partial:
        seconds = run_logged(
            [install.binary("symal"), "-alignment=grow", "-diagonal=yes", "-final=yes", "-both=yes"],
            log, stdin=feed, stdout=partial,
        )
    feed.unlink()
    return seconds


# --------------------------------------------------------------------------------------------
# Language model, phrase and reordering tables, filtering


def build_language_model(
    install: MosesInstall, text: PathArg, binary_out: PathArg, work: Path, log: Path, *,
    order: int = 4, prune: Sequence[int] = (0, 0, 1), memory: str = "1G",
) -> float:
    """``lmplz -o ORDER --prune ...`` then ``build_binary trie``: the KenLM model the decoder loads."""
    work.mkdir(parents=True, exist_ok=True)
    arpa = work / "lm.arpa"
    seconds = run_logged(
        [install.binary("lmplz"), "-o", str(order), "--prune", *map(str, prune), "-S", memory, "-T", work],
        log, stdin=text, stdout=arpa,
    )
    with atomic_path(binary_out) as partial:
        seconds += run_logged([install.binary("build_binary"), "trie", arpa, partial], log)
    arpa.unlink()
    return seconds


def train_model_command(
    install: MosesInstall, root: Path, corpus: Path, src_lang: str, tgt_lang: str, lm: Path, *,
    lm_order: int, jobs: int, first_step: int, alignment: str = "grow-diag-final-and",
    reordering: str = "msd-bidirectional-fe", max_phrase_length: int = 7,
) -> list[str]:
    """``train-model.perl`` with its defaults from ``first_step`` (1 with GIZA, 4 with an alignment)."""
    giza = ["-mgiza", "-mgiza-cpus", str(jobs)] if first_step < 3 and (install.bin_dir / "mgiza").is_file() else []
    return [
        os.fspath(install.script("training/train-model.perl")), *giza,
        "-root-dir", os.fspath(root), "-corpus", os.fspath(corpus), "-f", src_lang, "-e", tgt_lang,
        "-alignment", alignment, "-reordering", reordering, "-max-phrase-length", str(max_phrase_length),
        "-lm", f"0:{lm_order}:{os.fspath(lm)}:8", "-first-step", str(first_step), "-last-step", "9",
        "-cores", str(jobs), "-external-bin-dir", os.fspath(install.bin_dir), "-temp-dir", os.fspath(root / "tmp"),
    ]


def filter_for_input(install: MosesInstall, model_ini: Path, source: Path, out_dir: Path, log: Path) -> float:
    """``filter-model-given-input.pl``: the tables cut down to the phrases of ``source``.

    The script refuses an existing folder, so a leftover from an interrupted run is removed first.
    """
    if out_dir.exists():
        shutil.rmtree(out_dir)
    return run_logged([install.script("training/filter-model-given-input.pl"), out_dir, model_ini, source], log)
