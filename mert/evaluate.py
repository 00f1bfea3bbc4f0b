"""Test-set evaluation of a tuned Moses system: decode, post-process, sacrebleu (``mert evaluate``).

MERT tunes on tokenized, truecased, XML-escaped text (SPEC §4), but results are reported the way
WMT and the paper do: on detokenized text with sacrebleu and its signature, so that anyone can
reproduce them. Post-processing therefore undoes the pre-processing in reverse order:

1. detruecase: uppercase the first letter of each sentence (Moses' ``detruecase.perl`` rule: the
   first token, and the token after ``. : ? !``, skipping opening brackets and quotes);
2. detokenize and unescape (``&apos;`` → ``'``) with sacremoses' ``MosesDetokenizer`` for the
   target language.

Tokenized BLEU (``tokenize='none'`` against the tokenized reference, what Moses' ``evaluator``
and ``multi-bleu.perl`` report) is printed too, because that is the number MERT optimised and
the one the fixture's README quotes. MERT is unstable, so several tuning runs are summarised by
mean ± standard deviation and two systems are compared with sacrebleu's paired bootstrap
resampling (Clark et al. 2011; SPEC §4).

A system with extra n-best features (a ``.extra-features`` sidecar beside its ``moses.ini``) is
decoded to an n-best list, the features are added, and each sentence's argmax under *all*
weights is its output: Moses alone cannot apply those features.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from infrastructure.errors import UserError
from infrastructure.files import (
    PathArg,
    atomic_output,
    check_output_place,
    check_outputs_are_not_inputs,
    display_name,
    write_json,
)
from infrastructure.lines import read_text_lines
from infrastructure.resume_record import check_same_options, content_identity, file_identity
from mert.bleu import ReferenceFileError, read_reference_lines
from mert.features import (
    add_features,
    decoder_flags,
    load_feature,
    model_names,
    read_sidecar,
    sidecar_path,
    system_files_record,
)
from mert.rerank import one_best
from moses_integration.decoder import decode, find_moses_bin_dir
from moses_integration.moses_ini import MosesIni
from moses_integration.nbest import load_nbest_arrays

DEFAULT_BOOTSTRAP_SAMPLES = 1000
DEFAULT_RESCORE_NBEST = 100

_SENTENCE_END = frozenset({".", ":", "?", "!"})
_DELAYED_START = frozenset({"(", "[", '"', "'", "&quot;", "&apos;", "&#91;", "&#93;"})


class EvaluationError(UserError):
    """Inputs that cannot be evaluated together (e.g. a decoded file for another test set)."""


# --------------------------------------------------------------------------------------------
# Post-processing


def detruecase(line: str) -> str:
    """Uppercase the first letter of each sentence of a tokenized line.

    Truecasing lowercased sentence-initial words to their most frequent form; for output we put
    the sentence-initial capital back. A sentence starts at the first token and after a token
    ``. : ? !``; opening brackets and quotes pass the start on to the next token. Tokens are
    rejoined with single spaces (as ``detruecase.perl`` does).
    """
    words = line.split()
    start = True
    for i, word in enumerate(words):
        if start:
            words[i] = word[:1].upper() + word[1:]
        if word in _SENTENCE_END:
            start = True
        elif word not in _DELAYED_START:
            start = False
    return " ".join(words)


#: The languages sacremoses segments with rules of their own, beyond those it has non-breaking prefixes for.
CJK_LANGUAGES = ("ja", "ko", "cjk")


class PostProcessor:
    """detruecase → detokenize → unescape, for one target language.

    One sacremoses detokenizer is built per language and reused: building it compiles dozens of
    regular expressions.
    """

    def __init__(self, lang: str) -> None:
        from sacremoses import MosesDetokenizer
        from sacremoses.corpus import NonbreakingPrefixes

        if lang not in {*NonbreakingPrefixes().available_langs.values(), *CJK_LANGUAGES}:
            warnings.warn(f"--lang {lang}: sacremoses has no rules for it, so its generic rules detokenize "
                          "(a typo? the codes are ISO 639-1: fr, en, de…)", stacklevel=2)
        self.lang = lang
        self._detok = MosesDetokenizer(lang=lang)

    def __call__(self, line: str) -> str:
        return self._detok.detokenize(detruecase(line).split(), unescape=True)

    def lines(self, lines: Sequence[str]) -> list[str]:
        return [self(line) for line in lines]


# --------------------------------------------------------------------------------------------
# Scoring



def check_same_length(
    hyp_path: PathArg, hyp_count: int, ref_paths: Sequence[PathArg], ref_counts: Sequence[int]
) -> None:
    """Every reference must have as many lines as the hypothesis file; the message names both files.

    sacrebleu would raise on a mismatch too, but without saying which file is wrong, and a
    reference one line short is the classic way to score a system against the wrong test set.
    """
    for path, count in zip(ref_paths, ref_counts, strict=True):
        if count != hyp_count:
            line = min(count, hyp_count) + 1
            raise ReferenceFileError(
                display_name(path),
                line,
                f"reference has {count} lines but the hypotheses {display_name(hyp_path)} have {hyp_count}",
            )


@dataclass
class SystemScore:
    """BLEU of one output: detokenized sacrebleu (with its signature) and tokenized BLEU."""

    name: str
    bleu: float
    bleu_text: str  # sacrebleu's one-line summary ("BLEU = 17.81 51.2/…")
    signature: str
    detokenized: list[str]
    tokenized_bleu: float | None = None
    tokenized_signature: str | None = None


def score_system(
    name: str,
    hyp_path: PathArg,
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str]],
    ref_paths: Sequence[PathArg],
    *,
    lang: str,
    tokenized_references: Sequence[Sequence[str]] = (),
    tokenized_ref_paths: Sequence[PathArg] = (),
    already_detokenized: bool = False,
    processor: PostProcessor | None = None,
) -> SystemScore:
    """Score tokenized Moses output (or detokenized text with ``already_detokenized``).

    ``references`` are raw (detokenized) reference streams for sacrebleu's default 13a
    tokenization; ``tokenized_references``, when given, are the tokenized (escaped, truecased)
    references for BLEU with ``tokenize='none'``, compared with the hypotheses as decoded.
    """
    check_same_length(hyp_path, len(hypotheses), ref_paths, [len(r) for r in references])
    check_same_length(hyp_path, len(hypotheses), tokenized_ref_paths, [len(r) for r in tokenized_references])
    detok = list(hypotheses) if already_detokenized else (processor or PostProcessor(lang)).lines(hypotheses)
    metric = BLEU()
    score = metric.corpus_score(detok, [list(r) for r in references])
    result = SystemScore(name, float(score.score), str(score), str(metric.get_signature()), detok)
    if tokenized_references and not already_detokenized:
        tok_metric = BLEU(tokenize="none", force=True)
        tok = tok_metric.corpus_score(list(hypotheses), [list(r) for r in tokenized_references])
        result.tokenized_bleu = float(tok.score)
        result.tokenized_signature = str(tok_metric.get_signature())
    return result


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n−1; None for a single run), as Clark et al. report."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


@dataclass
class BootstrapResult:
    """sacrebleu's paired bootstrap of ``system`` against ``baseline`` (BLEU 0..100)."""

    baseline: str
    system: str
    baseline_bleu: float
    system_bleu: float
    p_value: float
    system_mean: float
    system_ci: float
    samples: int
    signature: str

    @property
    def delta(self) -> float:
        return self.system_bleu - self.baseline_bleu


def paired_bootstrap(
    baseline: tuple[str, Sequence[str]],
    system: tuple[str, Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
) -> BootstrapResult:
    """Paired bootstrap resampling with sacrebleu's own implementation (detokenized text).

    sacrebleu's test replicates Moses' ``bootstrap-hypothesis-difference-significance.pl``; its
    seed comes from ``$SACREBLEU_SEED`` (12345 unless set), so results are reproducible and the
    seed is part of the printed signature. The p-value is (c+1)/(n+1), hence in (0, 1]; for
    identical outputs it is 1 without resampling (see the comment in the code).
    """
    if samples < 1:
        raise ValueError("bootstrap needs at least one sample")
    if list(baseline[1]) == list(system[1]):
        # sacrebleu counts resamples whose centred difference is strictly above the observed
        # one; for identical outputs every difference is exactly 0, nothing is "above", and it
        # returns the smallest p-value, 1/(n+1), as if the systems differed significantly.
        # Identical outputs cannot differ: p = 1.
        score = BLEU().corpus_score(list(system[1]), [list(r) for r in references]).score
        return BootstrapResult(
            baseline[0], system[0], score, score, 1.0, score, 0.0, samples, "identical outputs: no test run"
        )
    test = PairedTest(
        [(baseline[0], list(baseline[1])), (system[0], list(system[1]))],
        {"BLEU": BLEU()},
        [list(r) for r in references],
        test_type="bs",
        n_samples=samples,
    )
    signatures, scores = test()
    bl, sys_ = scores["BLEU"][0], scores["BLEU"][1]
    return BootstrapResult(
        baseline=baseline[0],
        system=system[0],
        baseline_bleu=float(bl.score),  # type: ignore[union-attr]
        system_bleu=float(sys_.score),  # type: ignore[union-attr]
        p_value=float(sys_.p_value),  # type: ignore[union-attr, arg-type]
        system_mean=float(sys_.mean),  # type: ignore[union-attr, arg-type]
        system_ci=float(sys_.ci),  # type: ignore[union-attr, arg-type]
        samples=samples,
        signature=str(signatures["BLEU"]),
    )


# --------------------------------------------------------------------------------------------
# Checks before any decode


def check_inputs_agree(
    *,
    references: Sequence[PathArg],
    tokenized_references: Sequence[PathArg] = (),
    hypotheses: Sequence[PathArg] = (),
    source: PathArg | None = None,
) -> None:
    """Every file has one line per test sentence, and there is at least one: checked before decoding.

    A test set decodes for half an hour; a reference one line short, or a ``--hyp`` of another test
    set, found only afterwards, costs that half hour. The count is the source's when there is one,
    else the first hypothesis file's; the message names the file and its first missing or extra line.
    """
    counted = [*([source] if source is not None else []), *hypotheses]
    if not counted:
        raise EvaluationError("no system output to evaluate")
    first = counted[0]
    n = len(read_text_lines(first))
    against = (f"the source {display_name(first)} has {n}" if source is not None
               else f"the hypotheses {display_name(first)} have {n}")
    if n == 0:
        raise EvaluationError(f"{display_name(first)}: empty: no sentence to score")
    for path in counted[1:]:
        count = len(read_text_lines(path))
        if count != n:
            raise EvaluationError(f"{display_name(path)}:{min(count, n) + 1}: hypotheses have {count} lines "
                                  f"but {against}")
    for path in [*references, *tokenized_references]:
        count = len(read_reference_lines(path))
        if count != n:
            raise ReferenceFileError(display_name(path), min(count, n) + 1,
                                     f"reference has {count} lines but {against}")


def decoded_files(output: PathArg) -> list[Path]:
    """Every file :func:`decode_test_set` writes or replaces for ``output``, beside it: the output, the
    decoder's log, with n-best features Moses' own 1-best, its log and the n-best lists, and the record
    of what it was decoded from (:func:`decode_record_path`)."""
    output = Path(output)
    return [output, *(output.with_name(output.name + suffix)
                      for suffix in (".log", ".moses-1best", ".moses-1best.log", ".nbest", ".nbest.gz", ".json"))]


def decode_record_path(output: PathArg) -> Path:
    """``OUTPUT.json``: what a finished decode was made from, which ``mert evaluate --resume`` compares."""
    return Path(f"{os.fspath(output)}.json")


def decode_record(ini: PathArg, source: PathArg, nbest_size: int,
                  decoder_cwd: PathArg | None = None) -> dict[str, object]:
    """What a test-set decode depends on that a user may change between two runs: the ini and its extra
    features by content, the source by path, size and time, every file the system reads
    (:func:`system_files_record`), the n-best size extra features rescore."""
    extras = sidecar_path(ini)
    specs = [extra.spec for extra in read_sidecar(ini)]
    return {"moses_ini": content_identity(ini), "extra_features": content_identity(extras) if extras.exists() else None,
            "src": file_identity(source), "nbest_size": nbest_size if extras.exists() else None,
            **system_files_record(MosesIni.read(ini), decoder_cwd, specs)}


def finished_decode(ini: PathArg, source: PathArg, output: PathArg, *, nbest_size: int,
                    decoder_cwd: PathArg | None = None) -> bool:
    """Whether ``output`` is a decode an earlier run finished from this ini, its extra features, its model
    files and this source (its :func:`decode_record`), which ``mert evaluate --resume`` keeps.

    A test set takes half an hour per run to decode, and ``mert evaluate`` decodes several: a run stopped
    in its third decode, resumed, decodes only what is left. A decode of another ini, source or model is
    refused in one line naming what differs, never reused.
    """
    record_path = decode_record_path(output)
    if not (Path(output).is_file() and record_path.is_file()):
        return False
    try:
        then = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(then, dict):
        return False
    now = decode_record(ini, source, nbest_size, decoder_cwd)
    check_same_options(then, now, record_path, error=EvaluationError,
                       names=model_names(then, now),
                       advice="decode it again: run without --resume, or give another --output-dir")
    return True


def decode_and_record(ini: PathArg, source: PathArg, output: PathArg, *, nbest_size: int,
                      decoder_cwd: PathArg | None = None, **decode_args: object) -> Path:
    """:func:`decode_test_set`, then the record :func:`finished_decode` reads (none while it decodes)."""
    record_path = decode_record_path(output)
    record_path.unlink(missing_ok=True)
    decode_test_set(ini, source, output, nbest_size=nbest_size, decoder_cwd=decoder_cwd,  # type: ignore[arg-type]
                    **decode_args)
    write_json(record_path, decode_record(ini, source, nbest_size, decoder_cwd))
    return Path(output)


def run_names(paths: Sequence[PathArg]) -> list[str]:
    """The name of each scored file in the report, and of its ``NAME.detok`` (``detok_dir``): its file
    name, with ``#2``, ``#3``… where two files share one."""
    used: set[str] = set()
    names = []
    for path in paths:
        base = Path(os.fspath(path)).name
        name, k = base, 2
        while name in used:
            name, k = f"{base}#{k}", k + 1
        used.add(name)
        names.append(name)
    return names


def detok_name(run_name: str) -> str:
    """The file a run's post-processed output is written to in ``detok_dir``."""
    return f"{run_name.replace('#', '.')}.detok"


def decode_plan(
    output_dir: PathArg,
    hyps: Sequence[PathArg],
    inis: Sequence[PathArg],
    baselines: Sequence[PathArg],
    baseline_inis: Sequence[PathArg],
) -> tuple[list[Path], list[Path], list[Path]]:
    """Where ``mert evaluate`` decodes each ``--moses-ini`` and ``--baseline-ini`` (``LABEL.runK.tok`` in
    ``output_dir``), and every file the run writes there: known before any decode, so that one which is
    an input is refused first (a decode replaces its output, and the report its ``.detok`` files)."""
    folder = Path(output_dir)
    system = [folder / f"system.run{k}.tok" for k in range(1, len(inis) + 1)]
    baseline = [folder / f"baseline.run{k}.tok" for k in range(1, len(baseline_inis) + 1)]
    written = [f for out in [*system, *baseline] for f in decoded_files(out)]
    written += [folder / detok_name(name) for name in run_names([*hyps, *system, *baselines, *baseline])]
    return system, baseline, written


# --------------------------------------------------------------------------------------------
# Decoding a test set


def rescore_one_best(nbest_path: PathArg, weights: dict[str, Sequence[float]], num_sentences: int) -> list[str]:
    """Each sentence's highest-scoring hypothesis under ``weights`` (every n-best feature needs one).

    Features absent from the list (untuneable ones) are constant per sentence and so cannot
    change the argmax; a list feature without a weight is an error, since ignoring it would
    silently change the system.
    """
    arrays = load_nbest_arrays(nbest_path, expected_sentences=num_sentences)
    vector: list[float] = []
    for name, count in arrays.feature_names:
        if name not in weights or len(weights[name]) != count:
            raise EvaluationError(f"{arrays.path}: no {count} weight(s) for n-best feature {name}")
        vector.extend(weights[name])
    return one_best(arrays, np.asarray(vector, dtype=np.float64))


def decode_test_set(
    ini: PathArg,
    source: PathArg,
    output: PathArg,
    *,
    moses_bin_dir: PathArg | None = None,
    threads: int = 1,
    nbest_size: int = DEFAULT_RESCORE_NBEST,
    decoder_cwd: PathArg | None = None,
    keep_nbest: bool = False,
    details: PathArg | None = None,
) -> Path:
    """Decode ``source`` with ``ini``; write the (tokenized) output to ``output`` and return it.

    Without a sidecar this is Moses' 1-best. With one, the decoder writes an ``nbest_size``-best
    list, the extra features are added and the argmax under all weights is the output.
    ``decoder_cwd`` defaults to the ini's folder (Moses resolves relative model paths there).
    The n-best list (with the extra features) is kept as ``OUTPUT.nbest.gz`` with a sidecar, and
    without one when ``keep_nbest``: the Table 1 report reranks it to see what each column is worth.
    ``details`` also writes Moses' ``-translation-details`` (each 1-best's phrase segmentation); it
    describes Moses' 1-best, so a sidecar's features, which pick another output, refuse it.
    """
    bin_dir = find_moses_bin_dir(moses_bin_dir)
    output = Path(output)
    extras = read_sidecar(ini)
    if extras and details is not None:
        raise EvaluationError(f"{ini}: its n-best features ({', '.join(e.name for e in extras)}) rerank Moses' "
                              "1-best, which its translation details describe; decode it without them")
    features = [load_feature(e.spec) for e in extras]  # before decoding: a feature that cannot load is one line
    for feature, extra in zip(features, extras, strict=True):
        if feature.name != extra.name or feature.num_values != len(extra.weights):
            raise EvaluationError(f"feature {extra.spec!r} now builds {feature.name} with {feature.num_values} values")
    output.parent.mkdir(parents=True, exist_ok=True)
    if not extras and not keep_nbest:
        decode(bin_dir, ini, source, output, threads=threads, cwd=decoder_cwd, details_path=details)
        return output
    moses_out = output.with_name(output.name + ".moses-1best") if extras else output
    nbest = output.with_name(output.name + ".nbest")
    decode(
        bin_dir,
        ini,
        source,
        moses_out,
        nbest_path=nbest,
        nbest_size=nbest_size,
        distinct=True,
        threads=threads,
        cwd=decoder_cwd,
        details_path=details,
        extra_args=decoder_flags(features),
    )
    rescored = output.with_name(output.name + ".nbest.gz")
    source_lines = read_text_lines(source)
    add_features(nbest, rescored, source_lines, features)
    os.unlink(nbest)
    if not extras:
        return output
    weights: dict[str, Sequence[float]] = dict(MosesIni.read(ini).weights())
    weights.update({e.name: e.weights for e in extras})
    best = rescore_one_best(rescored, weights, len(source_lines))
    with atomic_output(output) as fh:
        fh.write("".join(f"{h}\n" for h in best).encode("utf-8"))
    return output


# --------------------------------------------------------------------------------------------
# A whole evaluation: one system (several tuning runs), optionally against a baseline


@dataclass
class EvaluationReport:
    """Scores of every run of the system (and of the baseline), and the bootstrap comparisons."""

    system: list[SystemScore]
    baseline: list[SystemScore]
    bootstrap: list[BootstrapResult]
    postprocessing: str

    def lines(self) -> list[str]:
        """The human-readable report ``mert evaluate`` prints."""
        out = [f"# hypotheses post-processed: {self.postprocessing}"]
        for label, runs in (("system", self.system), ("baseline", self.baseline)):
            for score in runs:
                out.append(f"{label} {score.name}: {score.bleu_text}")
                if score.tokenized_bleu is not None:
                    out.append(f"  tokenized BLEU (tok:none, tokenized reference) = {score.tokenized_bleu:.2f}")
            if len(runs) > 1:
                mean, std = mean_std([s.bleu for s in runs])
                line = f"{label}: BLEU {mean:.2f} ± {std:.2f} (mean ± std over {len(runs)} runs)"
                toks = [s.tokenized_bleu for s in runs if s.tokenized_bleu is not None]
                if len(toks) == len(runs):
                    tmean, tstd = mean_std(toks)
                    line += f"; tokenized {tmean:.2f} ± {tstd:.2f}"
                out.append(line)
        for b in self.bootstrap:
            out.append(
                f"paired bootstrap ({b.samples} samples): {b.system} vs {b.baseline}: BLEU {b.system_bleu:.2f} vs "
                f"{b.baseline_bleu:.2f} (Δ {b.delta:+.2f}; system {b.system_mean:.2f} ± {b.system_ci:.2f} 95% CI), "
                f"p = {b.p_value:.4f}"
            )
        signature = (self.system or self.baseline)[0].signature
        out.append(f"signature: {signature}")
        if self.bootstrap:
            out.append(f"bootstrap signature: {self.bootstrap[0].signature}")
        return out

    def to_json(self) -> dict[str, object]:
        def run(s: SystemScore) -> dict[str, object]:
            return {
                "name": s.name,
                "bleu": s.bleu,
                "text": s.bleu_text,
                "signature": s.signature,
                "tokenized_bleu": s.tokenized_bleu,
                "tokenized_signature": s.tokenized_signature,
            }

        doc: dict[str, object] = {
            "postprocessing": self.postprocessing,
            "system": [run(s) for s in self.system],
            "baseline": [run(s) for s in self.baseline],
            "bootstrap": [
                {
                    "system": b.system,
                    "baseline": b.baseline,
                    "system_bleu": b.system_bleu,
                    "baseline_bleu": b.baseline_bleu,
                    "p_value": b.p_value,
                    "samples": b.samples,
                    "signature": b.signature,
                }
                for b in self.bootstrap
            ],
        }
        for key, runs in (("system_mean_std", self.system), ("baseline_mean_std", self.baseline)):
            if runs:
                doc[key] = list(mean_std([s.bleu for s in runs]))
        return doc


def evaluate(
    system_hyps: Sequence[PathArg],
    references: Sequence[PathArg],
    *,
    lang: str,
    tokenized_references: Sequence[PathArg] = (),
    baseline_hyps: Sequence[PathArg] = (),
    already_detokenized: bool = False,
    bootstrap_samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    detok_dir: PathArg | None = None,
) -> EvaluationReport:
    """Score each hypothesis file (one per tuning run) and bootstrap every run against the baseline.

    With several baseline runs, run k of the system is compared with baseline run k (or the
    last baseline run when there are fewer): Clark et al. recommend comparing whole tuning
    runs, not only the best one. ``detok_dir`` receives each post-processed output as
    ``<name>.detok`` for inspection.
    """
    check_inputs_agree(references=references, tokenized_references=tokenized_references,
                       hypotheses=[*system_hyps, *baseline_hyps])
    refs = [read_reference_lines(p) for p in references]
    tok_refs = [read_reference_lines(p) for p in tokenized_references]
    processor = None if already_detokenized else PostProcessor(lang)
    names = iter(run_names([*system_hyps, *baseline_hyps]))

    def score_all(paths: Sequence[PathArg]) -> list[SystemScore]:
        scores = []
        for path in paths:
            score = score_system(
                next(names),
                path,
                read_text_lines(path),
                refs,
                references,
                lang=lang,
                tokenized_references=tok_refs,
                tokenized_ref_paths=tokenized_references,
                already_detokenized=already_detokenized,
                processor=processor,
            )
            if detok_dir is not None:
                Path(detok_dir).mkdir(parents=True, exist_ok=True)
                with atomic_output(Path(detok_dir) / detok_name(score.name)) as fh:
                    fh.write("".join(f"{line}\n" for line in score.detokenized).encode("utf-8"))
            scores.append(score)
        return scores

    system = score_all(system_hyps)
    baseline = score_all(baseline_hyps)
    comparisons = []
    for k, score in enumerate(system):
        if baseline:
            base = baseline[min(k, len(baseline) - 1)]
            comparisons.append(
                paired_bootstrap(
                    (base.name, base.detokenized), (score.name, score.detokenized), refs, samples=bootstrap_samples
                )
            )
    steps = (
        "none (already detokenized)"
        if already_detokenized
        else (f"detruecase, detokenize + unescape (sacremoses MosesDetokenizer, lang={lang})")
    )
    return EvaluationReport(system, baseline, comparisons, steps)


@dataclass(frozen=True)
class Decodes:
    """What ``mert evaluate`` decodes before scoring: ``source`` with each ``inis`` (the system's runs) and
    ``baseline_inis``, into ``output_dir``, with these Moses settings; ``resume`` keeps the decodes an
    earlier run finished (:func:`finished_decode`)."""

    source: Path
    inis: tuple[Path, ...] = ()
    baseline_inis: tuple[Path, ...] = ()
    output_dir: Path = Path("eval")
    moses_bin_dir: Path | None = None
    threads: int = 1
    decoder_cwd: Path | None = None
    nbest_size: int = DEFAULT_RESCORE_NBEST
    resume: bool = False


def evaluate_test_set(
    hyps: Sequence[Path],
    references: Sequence[Path],
    *,
    lang: str,
    tokenized_references: Sequence[Path] = (),
    baselines: Sequence[Path] = (),
    decodes: Decodes | None = None,
    already_detokenized: bool = False,
    bootstrap_samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    say: Callable[[str], None] = lambda message: print(message, file=sys.stderr, flush=True),
) -> EvaluationReport:
    """``mert evaluate``: decode what ``decodes`` asks for, then :func:`evaluate` the ``hyps`` and decodes
    against the ``baselines`` and baseline decodes. Everything that would fail after a decode (an output
    that is an input, a file of another length) is refused before the first; ``say`` tells each decode."""
    system, baseline = list(hyps), list(baselines)
    if decodes is not None:
        system_out, baseline_out = _check_decodes(decodes, references, tokenized_references, hyps, baselines)
        system += _decode_all(decodes, decodes.inis, system_out, say)
        baseline += _decode_all(decodes, decodes.baseline_inis, baseline_out, say)
    return evaluate(system, references, lang=lang, tokenized_references=tokenized_references,
                    baseline_hyps=baseline, already_detokenized=already_detokenized,
                    bootstrap_samples=bootstrap_samples, detok_dir=decodes.output_dir if decodes else None)


def _check_decodes(decodes: Decodes, references: Sequence[Path], tokenized_references: Sequence[Path],
                   hyps: Sequence[Path], baselines: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """Where each decode goes, once the folder, the outputs and the inputs' lengths are checked; scoring
    ``--hyp`` files alone needs none of it (:func:`evaluate` checks their lengths as it starts)."""
    check_output_place(decodes.output_dir, folder=True)
    system_out, baseline_out, written = decode_plan(decodes.output_dir, hyps, decodes.inis, baselines,
                                                    decodes.baseline_inis)
    inputs = [("--ref", p) for p in references] + [("--tok-ref", p) for p in tokenized_references] + \
        [("--hyp", p) for p in hyps] + [("--baseline", p) for p in baselines] + [("--src", decodes.source)] + \
        [("--moses-ini", p) for p in decodes.inis] + [("--baseline-ini", p) for p in decodes.baseline_inis] + \
        [("the extra features of --moses-ini", sidecar_path(p)) for p in [*decodes.inis, *decodes.baseline_inis]]
    check_outputs_are_not_inputs([("written in --output-dir", p) for p in written], inputs)
    check_inputs_agree(references=references, tokenized_references=tokenized_references,
                       hypotheses=[*hyps, *baselines], source=decodes.source)
    return system_out, baseline_out


def _decode_all(decodes: Decodes, inis: Sequence[Path], outputs: Sequence[Path],
                say: Callable[[str], None]) -> list[Path]:
    for ini, out in zip(inis, outputs, strict=True):
        if decodes.resume and finished_decode(ini, decodes.source, out, nbest_size=decodes.nbest_size,
                                              decoder_cwd=decodes.decoder_cwd):
            say(f"kept {out}: decoded by an earlier run from the same ini and source")
            continue
        say(f"decoding {decodes.source} with {ini} -> {out}")
        decode_and_record(ini, decodes.source, out, moses_bin_dir=decodes.moses_bin_dir, threads=decodes.threads,
                          nbest_size=decodes.nbest_size, decoder_cwd=decodes.decoder_cwd)
    return list(outputs)
