"""``mert tune --engine moses``: the reference path, tuning with Moses' own ``mert-moses.pl``.

Moses' script and its ``mert`` optimiser do the whole job; this module finds them, gives the
script absolute model paths (it runs the decoder from its own working folder) and copies the
tuned ``moses.ini`` to where :func:`mert.tune.tune` would have written it, so the two engines can
be compared on the same system.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from infrastructure.files import PathArg
from infrastructure.processes import run_as_group
from mert.features import write_sidecar
from mert.optimizer import DEFAULT_RESTARTS
from mert.tune import DEFAULT_MAX_ITERATIONS, DEFAULT_NBEST_SIZE, FINAL_INI, TuneError, TuneOptions, log_to_stderr
from moses_integration.decoder import GETTING_MOSES, find_moses_bin_dir
from moses_integration.moses_ini import MosesIni

#: Binaries mert-moses.pl checks for in its --mertdir before doing anything.
MERT_MOSES_TOOLS = ("extractor", "mert", "pro", "kbmira", "evaluator")


def find_moses_scripts_dir(explicit: PathArg | None = None, moses_bin_dir: PathArg | None = None) -> Path:
    """Moses' ``scripts/`` folder: ``explicit``, else ``$MOSES_SCRIPTS_DIR``, else ``<bin>/../scripts``.

    A Moses checkout keeps ``bin/`` and ``scripts/`` side by side, hence the last guess.
    """
    candidates: list[tuple[Path, str]] = []
    if explicit is not None:
        candidates.append((Path(explicit), "--moses-scripts-dir"))
    elif os.environ.get("MOSES_SCRIPTS_DIR"):
        candidates.append((Path(os.environ["MOSES_SCRIPTS_DIR"]), "MOSES_SCRIPTS_DIR"))
    elif moses_bin_dir is not None:
        candidates.append((Path(moses_bin_dir).parent / "scripts", "the folder beside the Moses bin dir"))
    for path, _ in candidates:
        if (path / "training" / "mert-moses.pl").is_file():
            return path
    where = "; ".join(f"{p} ({src})" for p, src in candidates) or "nowhere (nothing given)"
    raise TuneError(
        "--engine moses needs Moses' scripts folder (with training/mert-moses.pl): pass --moses-scripts-dir "
        f"or set MOSES_SCRIPTS_DIR; looked in {where}; {GETTING_MOSES}"
    )


def mert_moses_command(
    scripts_dir: Path,
    moses_bin_dir: Path,
    ini: Path,
    source: Path,
    reference: Path,
    work_dir: Path,
    *,
    nbest_size: int = DEFAULT_NBEST_SIZE,
    threads: int = 1,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    predictable_seeds: bool = True,
    resume: bool = False,
    restarts: int = DEFAULT_RESTARTS,
    decoder_flags: Sequence[str] = (),
) -> list[str]:
    """The ``mert-moses.pl`` command line (all paths absolute: it changes into its working dir), with the
    options of ``mert tune`` it has a counterpart for (``--restarts``, ``--decoder-flags``), which it would
    otherwise tune without."""
    cmd = [
        "perl",
        str((scripts_dir / "training" / "mert-moses.pl").resolve()),
        str(source.resolve()),
        str(reference.resolve()),
        str((moses_bin_dir / "moses").resolve()),
        str(ini.resolve()),
        f"--mertdir={moses_bin_dir.resolve()}",
        f"--working-dir={work_dir.resolve()}",
        f"--nbest={nbest_size}",
        f"--decoder-flags={shlex.join(['-threads', str(threads), *decoder_flags])}",
        f"--random-restarts={restarts}",
        f"--maximum-iterations={max_iterations}",
        "--no-filter-phrase-table",
    ]
    if predictable_seeds:
        cmd.append("--predictable-seeds")
    if resume:
        cmd.append("--continue")
    return cmd


def tune_with_mert_moses(
    options: TuneOptions, *, scripts_dir: PathArg | None = None, log: Callable[[str], None] = log_to_stderr
) -> Path:
    """Tune with Moses' ``mert-moses.pl`` (and Moses' ``mert``); return the tuned ``moses.ini``.

    Extra n-best features are not supported on this path (mert-moses.pl would need a
    ``--transform-decoded-file`` script), nor several reference files (it wants a file stem).
    """
    if options.feature_specs:
        raise TuneError("--engine moses does not support --feature (use the default engine)")
    if len(options.references) != 1:
        raise TuneError("--engine moses takes exactly one reference file")
    if options.fixed:
        raise TuneError("--engine moses does not support --fixed")
    bin_dir = find_moses_bin_dir(options.moses_bin_dir)
    # mert-moses.pl refuses to start unless all of these are executable in --mertdir, even the
    # ones plain MERT never runs (pro, kbmira); say so up front rather than through its log.
    missing = [t for t in MERT_MOSES_TOOLS if not os.access(bin_dir / t, os.X_OK)]
    if missing:
        raise TuneError(f"--engine moses: mert-moses.pl needs {', '.join(missing)} (Moses' mert/ tools) in {bin_dir}")
    scripts = find_moses_scripts_dir(scripts_dir, bin_dir)
    work = options.work_dir
    work.mkdir(parents=True, exist_ok=True)
    # mert-moses.pl runs the decoder from its working dir: give it absolute model paths.
    abs_ini = work / "moses.start.ini"
    base = (options.decoder_cwd or options.ini.parent).resolve()
    MosesIni.read(options.ini).absolutize_paths(base).write(abs_ini)
    mm_dir = work / "mert-moses"
    cmd = mert_moses_command(
        scripts,
        bin_dir,
        abs_ini,
        options.source,
        options.references[0],
        mm_dir,
        nbest_size=options.nbest_size,
        threads=options.threads,
        max_iterations=options.max_iterations,
        predictable_seeds=options.seed is not None,
        resume=options.resume,
        restarts=options.restarts,
        decoder_flags=options.decoder_flags,
    )
    log_path = work / "mert-moses.log"
    log(f"running {' '.join(cmd)} (log: {log_path})")
    with open(log_path, "ab") as fh:
        code = run_as_group(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=work)  # moses and mert end with it
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise TuneError(f"mert-moses.pl failed (exit {code}); last lines of {log_path}:\n{tail}")
    tuned = mm_dir / "moses.ini"
    if not tuned.is_file():
        raise TuneError(f"mert-moses.pl finished without writing {tuned}")
    ini = MosesIni.read(tuned)
    for target in [work / FINAL_INI] + ([options.output_ini] if options.output_ini else []):
        ini.write(target)
        write_sidecar(target, [])
    return work / FINAL_INI
