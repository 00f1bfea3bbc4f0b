"""Preparing raw text the way a Moses system expects it: tokenise, truecase, clean.

These are the first steps of every Moses system (the fixture README, step 1): Moses'
``tokenizer.perl`` (default escaping), ``train-truecaser.perl`` / ``truecase.perl`` and
``clean-corpus-n.perl``. The tokeniser and truecaser are sacremoses' ports of the Perl scripts, so
no Perl is needed; the cleaning rules are re-stated here from ``clean-corpus-n.perl`` because they
are a dozen lines and the experiment must run where only the Moses binaries are installed.

Every output is written all-or-nothing (:func:`atomic_output`), so an interrupted step leaves
either the finished file or nothing.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from joblib import Parallel, delayed

from infrastructure.errors import UserError
from infrastructure.files import atomic_output, atomic_path
from infrastructure.lines import text_lines
from moses_integration.tokens import split_tokens

PathArg = str | os.PathLike[str]

#: Lines handed to a worker process at a time (large enough to amortise pickling).
BATCH_LINES = 2000
#: Batches per process held at once (input and output): memory bound and pause at each window's end.
WINDOW_BATCHES = 8


def write_text_lines(path: PathArg, lines: Iterable[str]) -> int:
    """Write ``lines`` (each gets a ``\\n``) atomically; returns the number of lines."""
    count = 0
    with atomic_output(path) as fh:
        for line in lines:
            fh.write(line.encode("utf-8") + b"\n")
            count += 1
    return count


def _batches(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(lines)
    while batch := list(itertools.islice(it, size)):
        yield batch


def _map_batches(work: Callable[[list[str]], list[str]], lines: Iterable[str], jobs: int,
                 temp_folder: PathArg | None) -> Iterator[str]:
    """``work`` over batches of lines, in order, on ``jobs`` joblib (loky) processes, with bounded memory.

    A full-scale LM text does not fit in memory, and joblib has no back-pressure: given the whole input,
    even as a generator, it dispatches all of it as fast as the workers take it while the results wait
    for the reader. So the batches go in windows of :data:`WINDOW_BATCHES` per process, each a
    ``Parallel`` call on the same worker pool (the ``with`` keeps it, and each worker its tokeniser),
    yielded in order as they come.

    Left to itself, joblib makes a ``joblib_memmapping_folder_*`` in ``/dev/shm`` (or the system temp
    folder) for every ``Parallel``, at once, and removes it only when the process ends normally: a killed
    run leaves them there. So with ``jobs`` > 1 the caller names ``temp_folder``, a folder of its own
    (the experiment's work folder), and memmapping is off (``max_nbytes=None``: the batches are lists of
    strings, never the large arrays it is for), so joblib writes nothing, there or anywhere. The
    setting also keeps joblib from reusing a worker pool made by a ``Parallel`` with the defaults,
    whose temporary folder would still be ``/dev/shm``.
    """
    if jobs != 1 and temp_folder is None:
        raise ValueError("text preparation on several processes needs a temp_folder of the caller's")
    batches = _batches(lines, BATCH_LINES)
    folder = None if temp_folder is None else os.fspath(temp_folder)
    with Parallel(n_jobs=jobs, return_as="generator", temp_folder=folder, max_nbytes=None) as parallel:
        while window := list(itertools.islice(batches, WINDOW_BATCHES * jobs)):
            for done in parallel(delayed(work)(batch) for batch in window):
                yield from done


# --------------------------------------------------------------------------------------------
# Tokenisation (tokenizer.perl, default options: escaping on, no aggressive hyphen splitting)

_TOKENIZERS: dict[str, object] = {}


def _tokenize_batch(lang: str, lines: list[str]) -> list[str]:
    from sacremoses import MosesTokenizer

    tok = _TOKENIZERS.get(lang)
    if tok is None:
        tok = _TOKENIZERS[lang] = MosesTokenizer(lang=lang)
    return [tok.tokenize(line, escape=True, return_str=True) for line in lines]  # type: ignore[attr-defined]


def tokenize_lines(lines: Iterable[str], lang: str, *, jobs: int = 1,
                   temp_folder: PathArg | None = None) -> Iterator[str]:
    """Moses tokenisation of each line (``tokenizer.perl -l LANG``: escaped, as Moses reads text).

    ``jobs`` > 1 spreads batches over processes; the order of the lines is kept. It needs
    ``temp_folder``, the caller's folder for joblib's temporary files (:func:`_map_batches`).
    """
    yield from _map_batches(partial(_tokenize_batch, lang), lines, jobs, temp_folder)


# --------------------------------------------------------------------------------------------
# Truecasing (train-truecaser.perl / truecase.perl)


def train_truecaser(tokenized: PathArg | Sequence[PathArg], model_out: PathArg) -> None:
    """Learn the most frequent casing of each word from a tokenised corpus (one file or several,
    read in order as one); Moses' model format.

    As ``train-truecaser.perl``: the first word of a sentence and words after sentence-ending
    punctuation do not count, since their case is forced.
    """
    from sacremoses import MosesTruecaser

    paths = [tokenized] if isinstance(tokenized, (str, os.PathLike)) else list(tokenized)
    truecaser = MosesTruecaser()
    truecaser.train((split_tokens(line) for path in paths for line in text_lines(path)),
                    possibly_use_first_token=False)
    with atomic_path(model_out) as partial:
        truecaser.save_model(partial)


_TRUECASERS: dict[str, object] = {}


def _truecase_batch(model: str, lines: list[str]) -> list[str]:
    from sacremoses import MosesTruecaser

    tc = _TRUECASERS.get(model)
    if tc is None:
        tc = _TRUECASERS[model] = MosesTruecaser(load_from=model)
    return [tc.truecase(line, return_str=True) for line in lines]  # type: ignore[attr-defined]


def truecase_lines(lines: Iterable[str], model: PathArg, *, jobs: int = 1,
                   temp_folder: PathArg | None = None) -> Iterator[str]:
    """``truecase.perl --model MODEL`` over ``lines`` (order kept; ``jobs`` processes, which need
    ``temp_folder`` as :func:`tokenize_lines`)."""
    yield from _map_batches(partial(_truecase_batch, os.fspath(model)), lines, jobs, temp_folder)


# --------------------------------------------------------------------------------------------
# Cleaning (clean-corpus-n.perl)

_SPACES = re.compile(r"\s+")


@dataclass(frozen=True)
class CleanRules:
    """``clean-corpus-n.perl CORPUS L1 L2 OUT MIN MAX`` with its defaults (-ratio 9, -mwl 1000)."""

    min_words: int = 1
    max_words: int = 80
    ratio: float = 9.0
    max_word_length: int = 1000


def _normalise(line: str, factored: bool) -> str:
    if not factored:
        line = line.replace("|", "")
    return _SPACES.sub(" ", line).strip(" ")


def clean_pairs(pairs: Iterable[tuple[str, str]], rules: CleanRules = CleanRules()) -> Iterator[tuple[int, str, str]]:
    """The pairs ``clean-corpus-n.perl`` keeps, as ``(1-based input line, l1, l2)``.

    Its rules, in its order: ``|`` is removed unless the first line looks factored; whitespace
    runs become one space and the ends are trimmed (Perl's ``\\s``, which is what ``re``'s ``\\s``
    matches on ``str``); empty sides are dropped; a side with more than ``max_words`` or fewer
    than ``min_words`` words, a length ratio above ``ratio`` either way, or a word longer than
    ``max_word_length`` characters drops the pair. Words are split on single spaces, as the
    script's ``split(/ /)``.
    """
    long_word = re.compile(r"[^\s|]{" + str(rules.max_word_length + 1) + "}")
    factored: bool | None = None
    for line_no, (f, e) in enumerate(pairs, start=1):
        if factored is None:
            factored = "|" in e or "|" in f
        f, e = _normalise(f, factored), _normalise(e, factored)
        if not f or not e:
            continue
        fc, ec = len(f.split(" ")), len(e.split(" "))
        if max(fc, ec) > rules.max_words or min(fc, ec) < rules.min_words:
            continue
        if ec / fc > rules.ratio or fc / ec > rules.ratio:
            continue
        if long_word.search(e) or long_word.search(f):
            continue
        yield line_no, f, e


def clean_corpus_files(
    src_in: PathArg, tgt_in: PathArg, src_out: PathArg, tgt_out: PathArg, rules: CleanRules = CleanRules()
) -> tuple[int, int]:
    """Clean a parallel corpus file pair into two new files; returns ``(pairs read, pairs kept)``.

    Streams (a full-scale corpus has millions of lines); both outputs appear together or not at all.
    """
    read = kept = 0

    def pairs() -> Iterator[tuple[str, str]]:
        nonlocal read
        src_lines, tgt_lines = text_lines(src_in), text_lines(tgt_in)
        for f, e in itertools.zip_longest(src_lines, tgt_lines):
            if f is None or e is None:
                short = src_in if f is None else tgt_in
                raise UserError(f"{os.fspath(short)}:{read + 1}: file ends before its parallel file")
            read += 1
            yield f, e

    with atomic_output(src_out) as src_fh, atomic_output(tgt_out) as tgt_fh:
        for _, f, e in clean_pairs(pairs(), rules):
            src_fh.write(f.encode("utf-8") + b"\n")
            tgt_fh.write(e.encode("utf-8") + b"\n")
            kept += 1
    return read, kept
