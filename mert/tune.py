"""The MERT tuning loop that drives the real Moses decoder (``mert tune``).

This is what Moses' ``mert-moses.pl`` does, with the optimiser of this package (SPEC §4):

1. decode the dev source with the current weights (``-n-best-list FILE 100 distinct``; the first
   time with the ini's weights L1-normalised, as ``mert-moses.pl`` does);
2. optionally append extra n-best features that Moses cannot compute (:mod:`mert.features`);
3. merge the list with those of all earlier iterations, dropping repeats;
4. optimise (Och's line search, the previous weights plus 20 seeded random restarts);
5. write the new weights into a ``moses.ini``;
6. repeat until no weight moves by more than 1e-5, no new hypotheses appear, or 25 iterations.

Everything an iteration produces stays in the working directory (``runN.moses.ini``,
``runN.out``, ``runN.nbest.gz``, ``runN.weights``, a ``tuning.tsv`` log), because MERT is
unstable (README of the fixture: iteration 2 collapses to ~1 BLEU) and a user has to be able to
see *which* iteration went wrong. A state file written atomically after every iteration lets
``--resume`` pick up after a crash (a decode of a real test set takes hours) and give exactly
the weights an uninterrupted run would: the seeds are per iteration and the weights are stored
exactly. ``--engine moses`` instead hands the whole job to Moses' own ``mert-moses.pl``
(:mod:`mert.mert_moses`).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from infrastructure.errors import UserError
from infrastructure.files import atomic_output, copy_compressed, exclusive_use, same_file, write_json
from infrastructure.lines import read_text_lines
from infrastructure.resume_record import check_same_options, content_identity, file_identity, options_record
from mert.bleu import References, bleu_stats_batch, corpus_bleu, read_references
from mert.features import (
    ExtraFeatureWeights,
    NBestFeature,
    add_features,
    decoder_flags,
    load_features,
    model_names,
    read_source_sentences,
    system_files_record,
    write_sidecar,
)
from mert.nbest_set import NBestSet, build_mert_data, fixed_mask, merge_nbest_lists
from mert.optimizer import DEFAULT_RESTARTS, l1_normalised, optimize_runs
from moses_integration.decoder import DecoderError, DecodeResult, decode, find_moses_bin_dir
from moses_integration.moses_ini import MosesIni, format_weight
from moses_integration.nbest import FeatureNames, load_nbest_arrays

STATE_FILE = "tuning-state.json"
LOG_FILE = "tuning.tsv"
FINAL_INI = "moses.ini"
STATE_FORMAT = "mert-tune-state/1"
DEFAULT_MAX_ITERATIONS = 25
DEFAULT_NBEST_SIZE = 100
DEFAULT_MIN_WEIGHT_CHANGE = 1e-5
#: Moses' ``mert-moses.pl --predictable-seeds`` seeds iteration ``n`` with ``1000 n``; we do the
#: same (offset by ``--seed``), so a run is reproducible and a resumed run equals a fresh one.
SEED_STRIDE = 1000


STOP_CONVERGED = "weights converged"
STOP_NO_NEW = "no new hypotheses"
STOP_MAX = "maximum iterations"

#: Options a resumed tuning may change, as the weights it finds stay the same: where it works and writes,
#: how fast it decodes, when it stops (a larger --max-iterations goes on from a finished run), and the
#: folder Moses is run from (the same decoder installed elsewhere). Every other option is recorded in the
#: state (:func:`_options_record`) and a resume with another one is refused.
RESUME_MAY_DIFFER = frozenset({"work_dir", "moses_bin_dir", "threads", "max_iterations", "min_weight_change",
                               "output_ini", "resume"})
#: The command-line names of recorded options whose field is named otherwise.
_OPTION_NAMES = {"ini": "--moses-ini", "source": "--src", "references": "--ref", "feature_specs": "--feature",
                 "features": "--feature"}
#: What a state written before every option was recorded (only a "fingerprint") is compared on.
_FINGERPRINT_KEYS = {"ini": "ini", "source": "source", "references": "references", "features": "feature_specs",
                     "nbest_size": "nbest_size"}

_LOG_COLUMNS = (
    "iteration",
    "decode_seconds",
    "hypotheses",
    "new_hypotheses",
    "merged_hypotheses",
    "dev_bleu_1best",
    "optimised_bleu",
    "optimise_seconds",
    "max_weight_change",
    "weights",
)


class TuneError(UserError):
    """A tuning run that cannot start or continue (bad options, a working-directory conflict)."""


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class TuneOptions:
    """Everything ``mert tune`` needs; paths may be relative to the current directory.

    ``seed`` None draws fresh random restarts (not reproducible, and then ``--resume`` only
    continues, it cannot reproduce). ``fixed`` names features or columns (``LM0_0``) to keep at
    their start values. ``decoder_cwd`` is the folder the relative model paths of ``ini`` refer
    to, where Moses must run (default: the ini's folder).
    """

    ini: Path
    source: Path
    references: list[Path]
    work_dir: Path
    moses_bin_dir: Path | None = None
    feature_specs: list[str] = field(default_factory=list)
    nbest_size: int = DEFAULT_NBEST_SIZE
    threads: int = 1
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    restarts: int = DEFAULT_RESTARTS
    seed: int | None = 0
    min_weight_change: float = DEFAULT_MIN_WEIGHT_CHANGE
    fixed: list[str] = field(default_factory=list)
    output_ini: Path | None = None
    decoder_flags: list[str] = field(default_factory=list)
    resume: bool = False
    decoder_cwd: Path | None = None


@dataclass
class IterationRecord:
    """One line of ``tuning.tsv`` (BLEU 0..100; ``optimised_bleu`` None when MERT was not run)."""

    iteration: int
    decode_seconds: float
    hypotheses: int
    new_hypotheses: int
    merged_hypotheses: int
    dev_bleu_1best: float
    optimised_bleu: float | None
    optimise_seconds: float
    max_weight_change: float | None
    weights: dict[str, list[float]]


@dataclass
class TuneResult:
    """Where the tuned config is and how the run went."""

    ini: Path
    sidecar: Path | None
    weights: dict[str, list[float]]
    iterations: list[IterationRecord]
    stop_reason: str

    @property
    def best_optimised_bleu(self) -> float | None:
        values = [r.optimised_bleu for r in self.iterations if r.optimised_bleu is not None]
        return max(values) if values else None


# --------------------------------------------------------------------------------------------
# Weights and configs


def weights_vector(weights: dict[str, list[float]], names: FeatureNames, *, where: str) -> np.ndarray:
    """Weights in n-best column order; every n-best feature needs a weight of the right length."""
    values: list[float] = []
    for name, count in names:
        if name not in weights:
            raise TuneError(f"{where} has no weights for the n-best feature {name}")
        if len(weights[name]) != count:
            raise TuneError(f"{where}: {name} has {len(weights[name])} weights, the n-best lists {count} values")
        values.extend(weights[name])
    return np.asarray(values, dtype=np.float64)


def weights_dict(vector: np.ndarray, names: FeatureNames) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    pos = 0
    for name, count in names:
        out[name] = [float(v) for v in vector[pos : pos + count]]
        pos += count
    return out


def config_with_weights(
    original: Path, weights: dict[str, list[float]], *, base: Path | None = None, comment: Sequence[str] = ()
) -> MosesIni:
    """The original config with model paths made absolute (against ``base``, default its folder) and ``weights``."""
    folder = base.resolve() if base is not None else original.resolve().parent
    ini = MosesIni.read(original).absolutize_paths(folder)
    known = set(ini.weights())
    for name, values in weights.items():
        if name not in known:
            raise TuneError(f"{original}: no [weight] line for {name}")
        ini.set_weights(name, values)
    if comment:
        top = ini.sections[0]
        top.lines[0:0] = [f"# {line}\n" for line in comment]
    return ini


def format_weight_lines(weights: dict[str, list[float]]) -> list[str]:
    """``Name= v v`` lines with exact values (a resumed run must read back the same numbers)."""
    return [f"{name}= " + " ".join(format_weight(v) for v in values) for name, values in weights.items()]


# --------------------------------------------------------------------------------------------
# State and log


def _options_record(options: TuneOptions) -> dict[str, object]:
    """What a resume must match: every option but :data:`RESUME_MAY_DIFFER`, the files by their absolute paths."""
    return options_record(options, RESUME_MAY_DIFFER, recorded_as={
        "ini": str(options.ini.resolve()), "source": str(options.source.resolve()),
        "references": [str(p.resolve()) for p in options.references],
        "decoder_cwd": str(options.decoder_cwd.resolve()) if options.decoder_cwd is not None else None,
    })


def _inputs_record(options: TuneOptions, ini: MosesIni, decoder_cwd: Path) -> dict[str, object]:
    """What the kept n-best lists were decoded from, which a path does not tell: the ini by content, the
    source by path, size and time, and every file the system reads (:func:`system_files_record`, the extra
    features' too). A resume merges the new lists with the kept ones, so a source edited in place or a
    table retrained in place would mix two systems' lists in one MERT."""
    return {"--moses-ini": content_identity(options.ini), "--src": file_identity(options.source),
            **system_files_record(ini, decoder_cwd, options.feature_specs)}


def read_state(work_dir: Path) -> dict[str, object] | None:
    """The state of an earlier run in ``work_dir``, or None."""
    path = work_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TuneError(f"{path}: unreadable state file ({exc}); remove it to start afresh") from exc
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise TuneError(f"{path}: not a mert tune state file")
    return doc


def iteration_path(work_dir: Path, iteration: int, suffix: str) -> Path:
    """What iteration ``iteration`` left in ``work_dir``: ``runN.SUFFIX`` (``moses.ini``, the ini it
    decoded with; ``nbest.gz``; ``out``; ``weights``, those MERT chose after it)."""
    return work_dir / f"run{iteration}.{suffix}"


#: The files of an iteration in the working directory (:func:`iteration_path`): its ini, n-best list (plain while
#: the decoder writes it), 1-best output and decoder log, and the weights MERT chose.
_ITERATION_FILE = re.compile(r"run[0-9]+\.(moses\.ini|nbest|nbest\.gz|out|out\.log|weights)")


def kept_in_work_dir(path: Path, work_dir: Path) -> bool:
    """Whether ``path`` is a file a tuning keeps in ``work_dir`` besides the tuned ini: the state and log a
    ``--resume`` reads, the iterations' files. Another output there would replace one of them at the end
    (``--moses-ini-out WORK/run1.nbest.gz`` did: the next resume failed on that list)."""
    if not same_file(path.parent, work_dir):
        return False
    return path.name in {STATE_FILE, LOG_FILE} or _ITERATION_FILE.fullmatch(path.name) is not None


def _format_bleu(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _log_row(record: IterationRecord) -> str:
    cells = [
        str(record.iteration),
        f"{record.decode_seconds:.1f}",
        str(record.hypotheses),
        str(record.new_hypotheses),
        str(record.merged_hypotheses),
        _format_bleu(record.dev_bleu_1best),
        _format_bleu(record.optimised_bleu),
        f"{record.optimise_seconds:.1f}",
        "-" if record.max_weight_change is None else f"{record.max_weight_change:.6g}",
        " ".join(format_weight_lines(record.weights)),
    ]
    return "\t".join(cells)


def _write_log(work_dir: Path, records: Sequence[IterationRecord]) -> None:
    """Rewrite ``tuning.tsv`` from the records (atomic, so a resume never duplicates rows)."""
    text = "\t".join(_LOG_COLUMNS) + "\n" + "".join(_log_row(r) + "\n" for r in records)
    with atomic_output(work_dir / LOG_FILE) as fh:
        fh.write(text.encode("utf-8"))


# --------------------------------------------------------------------------------------------
# One iteration


def one_best_bleu(nbest_path: Path, weights: np.ndarray, names: FeatureNames, references: References) -> float:
    """BLEU of the argmax of each sentence's list under ``weights`` (the rescored 1-best).

    With extra features this is the system's real output (Moses' own 1-best ignores them).
    """
    arrays = load_nbest_arrays(nbest_path, expected_sentences=len(references))
    if arrays.feature_names != names:
        raise TuneError(f"{nbest_path}: features differ from the merged lists'")
    scores = np.append(arrays.features @ weights, -np.inf)
    offsets = arrays.offsets
    best = [offsets[s] + int(np.argmax(scores[offsets[s] : offsets[s + 1]])) for s in range(len(references))]
    hyps = [arrays.hypotheses[i].split() for i in best]
    stats = bleu_stats_batch(hyps, np.arange(len(references)), references)
    return float(corpus_bleu(stats.sum(axis=0)))


def _bleu_of_lines(lines: list[str], references: References) -> float:
    stats = bleu_stats_batch([line.split() for line in lines], np.arange(len(references)), references)
    return float(corpus_bleu(stats.sum(axis=0)))


class Tuner:
    """One tuning run in a working directory (see the module doc)."""

    def __init__(self, options: TuneOptions, *, log: Callable[[str], None] = log_to_stderr) -> None:
        self.options = options
        self.log = log
        self.sparse_reported = False
        self.work = options.work_dir
        self.ini_path = options.ini
        if not self.ini_path.is_file():
            raise TuneError(f"moses.ini not found: {self.ini_path}")
        if not options.references:
            raise TuneError("at least one reference file is needed")
        if options.max_iterations < 1:
            raise TuneError("--max-iterations must be at least 1")
        if options.output_ini is not None and kept_in_work_dir(options.output_ini, self.work):
            raise TuneError(f"--moses-ini-out {options.output_ini} is a file the tuning keeps in --work-dir "
                            f"{self.work}; write it elsewhere")
        self.base_ini = MosesIni.read(self.ini_path)
        self.decoder_cwd = (options.decoder_cwd or self.ini_path.parent).resolve()
        if not self.decoder_cwd.is_dir():
            raise TuneError(f"decoder working directory not found: {self.decoder_cwd}")
        self.sources = read_source_sentences(options.source)
        if not self.sources:
            raise TuneError(f"{options.source}: the dev source is empty")
        self.references = read_references(
            options.references, expected_sentences=len(self.sources), expected_from=f"the source {options.source}"
        )
        self.features: list[NBestFeature] = load_features(options.feature_specs)
        clash = {f.name for f in self.features} & set(self.base_ini.weights())
        if clash:
            raise TuneError(f"extra feature name(s) {', '.join(sorted(clash))} already used in {self.ini_path}")

    # ---- paths ------------------------------------------------------------------------------

    def run_path(self, iteration: int, suffix: str) -> Path:
        return iteration_path(self.work, iteration, suffix)

    # ---- state ------------------------------------------------------------------------------

    def _initial_weights(self) -> dict[str, list[float]]:
        """The start: the ini's weights, and 0 for extra features (the start is the baseline).

        As ``mert-moses.pl``, the tuneable weights are L1-normalised before the first decode (by
        :func:`l1_normalised`'s rule, the one every optimised point follows): the decoder's beam
        threshold sees the weights' scale, so the first n-best list is decoded at the same scale as
        every later one. Untuneable features (``UnknownWordPenalty0``) keep their weights.
        """
        weights = {name: list(values) for name, values in self.base_ini.weights().items()}
        for feature in self.features:
            weights[feature.name] = [0.0] * feature.num_values
        untuneable = {line.name for line in self.base_ini.feature_lines() if not line.tuneable}
        names: FeatureNames = [(name, len(values)) for name, values in weights.items() if name not in untuneable]
        try:
            held = fixed_mask(names, self.options.fixed)
        except UserError as exc:
            raise TuneError(f"{self.ini_path}: {exc}") from exc
        start = weights_vector(weights, names, where=f"the start weights of {self.ini_path}")
        weights.update(weights_dict(l1_normalised(start, held), names))
        return weights

    def _load_or_start(self) -> tuple[dict[str, list[float]], list[IterationRecord], int, str | None]:
        state = read_state(self.work)
        if state is None:
            if self.options.resume:
                self.log(f"no {STATE_FILE} in {self.work}: starting from iteration 1")
            return self._initial_weights(), [], 0, None
        if not self.options.resume:
            raise TuneError(
                f"{self.work} already holds a tuning run ({STATE_FILE}): pass --resume to continue it "
                "or choose another --work-dir"
            )
        record = _options_record(self.options)
        then = state.get("options")
        if not isinstance(then, dict):  # a state of before the options record: the options it holds count
            old = state.get("fingerprint")
            then = {key: old.get(key) for key in _FINGERPRINT_KEYS} if isinstance(old, dict) else {}
            record = {key: record[field] for key, field in _FINGERPRINT_KEYS.items()}
        check_same_options(then, record, self.work / STATE_FILE, names=_OPTION_NAMES, error=TuneError,
                           advice="resume with the same options, or choose another --work-dir")
        self._check_same_inputs(state.get("inputs"))
        records = [IterationRecord(**r) for r in state["iterations"]]  # type: ignore[arg-type, union-attr]
        weights = {k: [float(x) for x in v] for k, v in state["weights"].items()}  # type: ignore[union-attr]
        completed = int(state["completed_iterations"])  # type: ignore[arg-type]
        stop = state.get("stop_reason")
        self.log(f"resuming {self.work} after iteration {completed}" + (f" ({stop})" if stop else ""))
        return weights, records, completed, stop if isinstance(stop, str) else None

    def _check_same_inputs(self, then: object) -> None:
        """Refuse a resume whose source, ini or models changed since the kept lists were decoded (a state
        written before inputs were recorded has none to compare)."""
        if not isinstance(then, dict):
            return
        now = _inputs_record(self.options, self.base_ini, self.decoder_cwd)
        check_same_options(then, now, self.work / STATE_FILE, error=TuneError,
                           names={**{key: key for key in {*then, *now} if key.startswith("--")},
                                  **model_names(then, now)},
                           advice="its n-best lists were decoded from the files then: choose another --work-dir")

    def _save_state(
        self, weights: dict[str, list[float]], records: list[IterationRecord], completed: int, stop: str | None
    ) -> None:
        _write_log(self.work, records)
        write_json(
            self.work / STATE_FILE,
            {
                "format": STATE_FORMAT,
                "options": _options_record(self.options),
                "inputs": _inputs_record(self.options, self.base_ini, self.decoder_cwd),
                "completed_iterations": completed,
                "stop_reason": stop,
                "weights": weights,
                "merged_hypotheses": records[-1].merged_hypotheses if records else 0,
                "iterations": [asdict(r) for r in records],
            },
        )

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> TuneResult:
        """Tune, holding the work directory (:func:`exclusive_use`): its state is this run's alone."""
        bin_dir = find_moses_bin_dir(self.options.moses_bin_dir)
        self.work.mkdir(parents=True, exist_ok=True)
        with exclusive_use(self.work):
            return self._tune(bin_dir)

    def _tune(self, bin_dir: Path) -> TuneResult:
        opts = self.options
        weights, records, completed, stop = self._load_or_start()
        if stop == STOP_MAX and completed < opts.max_iterations:
            stop = None  # a larger --max-iterations continues a run that only ran out of iterations
        merged_count = records[-1].merged_hypotheses if records else 0
        iteration = completed
        while stop is None and iteration < opts.max_iterations:
            iteration += 1
            record, new_weights, stop = self._iteration(bin_dir, iteration, weights, merged_count)
            records.append(record)
            merged_count = record.merged_hypotheses
            weights = new_weights
            if stop is None and iteration >= opts.max_iterations:
                stop = STOP_MAX
            self._save_state(weights, records, iteration, stop)
        if stop is None:
            stop = STOP_MAX
            self._save_state(weights, records, iteration, stop)
        return self._finish(weights, records, stop)

    def _iteration(
        self, bin_dir: Path, iteration: int, weights: dict[str, list[float]], merged_before: int
    ) -> tuple[IterationRecord, dict[str, list[float]], str | None]:
        """Decode with ``weights``, merge the n-best pool, optimise: one MERT iteration."""
        result, hyps, nbest_gz = self._decode(bin_dir, iteration, weights)
        merged = self._merged_pool(iteration)
        names = merged.feature_names
        current = weights_vector(weights, names, where=f"the weights of iteration {iteration}")
        new_count = len(merged.hypotheses) - merged_before
        base = dict(
            iteration=iteration,
            decode_seconds=round(result.seconds, 3),
            hypotheses=hyps,
            new_hypotheses=new_count,
            merged_hypotheses=len(merged.hypotheses),
            dev_bleu_1best=self._one_best_bleu(result, nbest_gz, current, names),
        )
        if iteration > 1 and new_count == 0:
            record = IterationRecord(
                **base, optimised_bleu=None, optimise_seconds=0.0, max_weight_change=None, weights=weights
            )
            self._progress(record)
            return record, weights, STOP_NO_NEW

        new_weights, bleu, seconds = self._optimise(merged, current, iteration)
        new_dict = dict(weights)
        new_dict.update(weights_dict(new_weights, names))
        change = float(np.max(np.abs(new_weights - current))) if len(current) else 0.0
        record = IterationRecord(
            **base, optimised_bleu=bleu, optimise_seconds=round(seconds, 3), max_weight_change=change, weights=new_dict
        )
        self._write_weights_file(iteration, new_dict, record)
        self._progress(record)
        stop = STOP_CONVERGED if change <= self.options.min_weight_change else None
        return record, new_dict, stop

    def _decode(self, bin_dir: Path, iteration: int, weights: dict[str, list[float]]) -> tuple[DecodeResult, int, Path]:
        """Decode the dev set with ``weights``; the n-best list (extra features added) gzipped."""
        opts = self.options
        moses_weights = {k: v for k, v in weights.items() if k not in {f.name for f in self.features}}
        run_ini = self.run_path(iteration, "moses.ini")
        comment = [f"mert tune: weights of iteration {iteration}"]
        config_with_weights(self.ini_path, moses_weights, base=self.decoder_cwd, comment=comment).write(run_ini)
        plain_nbest = self.run_path(iteration, "nbest")
        nbest_gz = self.run_path(iteration, "nbest.gz")
        result = decode(
            bin_dir,
            run_ini,
            opts.source,
            self.run_path(iteration, "out"),
            nbest_path=plain_nbest,
            nbest_size=opts.nbest_size,
            distinct=True,
            threads=opts.threads,
            cwd=self.decoder_cwd,
            extra_args=decoder_flags(self.features, opts.decoder_flags),
        )
        if self.features:
            hyps = add_features(plain_nbest, nbest_gz, self.sources, self.features)
        else:
            copy_compressed(plain_nbest, nbest_gz)
            with open(plain_nbest, "rb") as fh:
                hyps = sum(1 for _ in fh)
        plain_nbest.unlink()
        return result, hyps, nbest_gz

    def _merged_pool(self, iteration: int) -> NBestSet:
        """Every iteration's n-best list so far, merged (what MERT optimises on)."""
        merged = merge_nbest_lists(
            [self.run_path(i, "nbest.gz") for i in range(1, iteration + 1)], expected_sentences=len(self.sources)
        )
        if merged.sparse_names and not self.sparse_reported:
            self.sparse_reported = True
            shown = ", ".join(merged.sparse_names[:5]) + (" ..." if len(merged.sparse_names) > 5 else "")
            self.log(f"the n-best lists have {len(merged.sparse_names)} sparse feature(s) ({shown}): MERT tunes "
                     "the dense weights; sparse weights stay as moses.ini sets them, as with Moses' mert")
        return merged

    def _one_best_bleu(self, result: DecodeResult, nbest_gz: Path, current: np.ndarray, names: FeatureNames) -> float:
        """Dev BLEU of this iteration's 1-best: the decoder's output, or, with extra n-best
        features the decoder did not see, the best of the n-best list under all the weights."""
        if self.features:
            return one_best_bleu(nbest_gz, current, names, self.references)
        out_lines = read_text_lines(result.output)
        if len(out_lines) != len(self.sources):
            raise DecoderError(f"{result.output}: {len(out_lines)} lines for {len(self.sources)} source sentences")
        return _bleu_of_lines(out_lines, self.references)

    def _optimise(self, merged: NBestSet, current: np.ndarray, iteration: int) -> tuple[np.ndarray, float, float]:
        opts = self.options
        started = time.monotonic()
        data = build_mert_data(merged, self.references)
        seed = None if opts.seed is None else opts.seed + SEED_STRIDE * iteration
        result = optimize_runs(
            data,
            current[None, :],
            restarts=opts.restarts,
            fixed=fixed_mask(merged.feature_names, opts.fixed),
            seed=seed,
            threads=opts.threads,
        )
        return result.weights, result.bleu, time.monotonic() - started

    def _write_weights_file(self, iteration: int, weights: dict[str, list[float]], record: IterationRecord) -> None:
        lines = format_weight_lines(weights)
        lines.append(
            f"# iteration {iteration}: optimised BLEU {record.optimised_bleu:.4f} on {record.merged_hypotheses} "
            f"merged hypotheses; dev BLEU of the decoder 1-best {record.dev_bleu_1best:.4f}"
        )
        with atomic_output(self.run_path(iteration, "weights")) as fh:
            fh.write(("\n".join(lines) + "\n").encode("utf-8"))

    def _progress(self, r: IterationRecord) -> None:
        opt = (
            "not run (no new hypotheses)"
            if r.optimised_bleu is None
            else (f"{r.optimised_bleu:.2f} ({r.optimise_seconds:.1f} s), max weight change {r.max_weight_change:.3g}")
        )
        self.log(
            f"iteration {r.iteration}: decode {r.decode_seconds:.1f} s, {r.hypotheses} hypotheses "
            f"({r.new_hypotheses} new, {r.merged_hypotheses} merged), dev BLEU of the 1-best {r.dev_bleu_1best:.2f}, "
            f"optimised BLEU {opt}"
        )

    # ---- outputs ----------------------------------------------------------------------------

    def _finish(self, weights: dict[str, list[float]], records: list[IterationRecord], stop: str) -> TuneResult:
        extra_names = {f.name for f in self.features}
        moses_weights = {k: v for k, v in weights.items() if k not in extra_names}
        last_bleu = next((r.optimised_bleu for r in reversed(records) if r.optimised_bleu is not None), None)
        comment = [
            f"tuned by mert tune: {len(records)} iteration(s), stopped: {stop}; "
            f"optimised dev BLEU {_format_bleu(last_bleu)} (on the merged n-best lists)",
            f"model paths made absolute; started from {self.ini_path.resolve()}",
        ]
        if self.features:
            comment.append("extra n-best features (weights in the .extra-features file): " + " ".join(extra_names))
        ini = config_with_weights(self.ini_path, moses_weights, base=self.decoder_cwd, comment=comment)
        extras = [
            ExtraFeatureWeights(spec, f.name, tuple(weights[f.name]))
            for spec, f in zip(self.options.feature_specs, self.features, strict=True)
        ]
        final = self.work / FINAL_INI
        targets = [final] + ([self.options.output_ini] if self.options.output_ini is not None else [])
        sidecar = None
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            ini.write(target)
            written = write_sidecar(target, extras)
            sidecar = sidecar or written
        self.log(f"stopped after {len(records)} iteration(s): {stop}; tuned config in {', '.join(map(str, targets))}")
        return TuneResult(final, sidecar, weights, records, stop)


def tune(options: TuneOptions, *, log: Callable[[str], None] = log_to_stderr) -> TuneResult:
    """Run (or with ``options.resume`` continue) the tuning loop; see the module doc."""
    return Tuner(options, log=log).run()
