"""Cross-entropy difference data selection (Moore & Lewis 2010; bilingual: Axelrod et al. 2011).

Why: the paper did not train on all of WMT'14. It kept the 348M of 850M parallel words and the
418M of 2G language-model words that look most like the news it translates, "using newstest2012
and 2013 for data selection" (Cho et al. 2014, section 5.1). Each line is scored by

    H_in(line) - H_general(line)

the per-word cross-entropy under a language model of the in-domain text minus that under a model
of an equally sized random sample of the corpus itself (Moore & Lewis); for a bitext the two
sides' differences are added (Axelrod et al.). The lowest-scoring lines are kept until the word
budget (counted on one side, as the paper counts French words) is spent, in their original order.

As Moore & Lewis do, both models share one vocabulary, the in-domain words seen at least twice;
every other word becomes ``<oov>`` in training and scoring, so a rare word costs the same under
both models and does not decide the selection. The models are KenLM's (``lmplz``, scored with
``query``), from the Moses installation the rest of the system uses.

Every pass streams the corpus; memory is a few bytes per line (scores and word counts).
"""

from __future__ import annotations

import array
import math
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infrastructure.files import atomic_path
from infrastructure.lines import text_lines
from moses_integration.tokens import split_tokens
from table1.system_training import MosesInstall, MosesToolError, run_logged
from table1.text_prep import write_text_lines

#: The token every word outside the in-domain vocabulary becomes (a tokenised, escaped corpus
#: cannot contain it: Moses' tokenizer writes ``<`` as ``&lt;``; KenLM refuses ``<unk>`` in text).
OOV_TOKEN = "<oov>"


@dataclass(frozen=True)
class SelectionSettings:
    """How lines are scored and how many words are kept."""

    order: int = 4  # n-gram order of both selection LMs
    min_count: int = 2  # in-domain words seen fewer times become <oov> (Moore & Lewis)
    seed: int = 1  # which random lines make the general model's sample
    lm_memory: str = "1G"  # lmplz -S for the (small) selection models


@dataclass(frozen=True)
class SelectionResult:
    lines_read: int
    lines_kept: int
    words_read: int  # on the budget side
    words_kept: int
    score_threshold: float | None  # the highest score kept (None: nothing kept)

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


def in_domain_vocabulary(lines: Iterable[str], min_count: int = 2) -> frozenset[str]:
    """The words seen at least ``min_count`` times in the in-domain text."""
    counts = Counter(word for line in lines for word in split_tokens(line))
    return frozenset(word for word, n in counts.items() if n >= min_count)


def restrict(line: str, vocabulary: frozenset[str]) -> str:
    """``line`` with every word outside ``vocabulary`` replaced by :data:`OOV_TOKEN`."""
    return " ".join(w if w in vocabulary else OOV_TOKEN for w in split_tokens(line))


def parse_query_totals(lines: Iterable[str]) -> Iterator[float]:
    """The ``Total:`` log10 probability of each sentence in ``query -v sentence`` output.

    ``query`` prints one ``Total: LOGPROB OOV: N`` line per input line (its own ``</s>`` included),
    then perplexity summaries, which are skipped.
    """
    for line in lines:
        if line.startswith("Total:"):
            yield float(line.split()[1])


def cross_entropies(install: MosesInstall, lm: Path, lines: Iterable[str], vocabulary: frozenset[str],
                    log: Path) -> np.ndarray:
    """Per-word cross-entropy (nats, ``</s>`` counted) of each line under ``lm``, streamed through ``query``."""
    lengths = array.array("i")  # words + </s> per line: 4 bytes a line, not a Python int
    failure: list[BaseException] = []
    with open(log, "a", encoding="utf-8") as log_fh:
        log_fh.write(f"$ {install.binary('query')} -v sentence {lm}\n")
        log_fh.flush()
        proc = subprocess.Popen([str(install.binary("query")), "-v", "sentence", str(lm)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log_fh, text=True, encoding="utf-8", bufsize=1 << 20)
        assert proc.stdin is not None and proc.stdout is not None

        def feed() -> None:
            try:
                for line in lines:
                    restricted = restrict(line, vocabulary)
                    lengths.append(len(split_tokens(restricted)) + 1)
                    proc.stdin.write(restricted + "\n")  # type: ignore[union-attr]
            except BrokenPipeError:
                pass  # query died: its exit status says why
            except BaseException as exc:  # handed to the caller below
                failure.append(exc)
            finally:
                proc.stdin.close()  # type: ignore[union-attr]

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        totals = np.fromiter(parse_query_totals(proc.stdout), dtype=np.float64)
        writer.join()
        code = proc.wait()
    if failure:
        raise failure[0]
    if code != 0:
        raise MosesToolError(f"query exited with {code} on {lm}; see {log}")
    if len(totals) != len(lengths):
        raise MosesToolError(f"query scored {len(totals)} of {len(lengths)} lines with {lm}; see {log}")
    return -totals * math.log(10) / np.frombuffer(lengths, dtype=np.intc)


def train_selection_lm(install: MosesInstall, lines: Iterable[str], vocabulary: frozenset[str], arpa: Path,
                       settings: SelectionSettings, log: Path) -> None:
    """An ARPA model of ``lines`` restricted to ``vocabulary`` (small text: Kneser-Ney discounts
    may not be estimable, so ``--discount_fallback``)."""
    text = arpa.with_suffix(".txt")
    write_text_lines(text, (restrict(line, vocabulary) for line in lines))
    with atomic_path(arpa) as partial:
        run_logged([install.binary("lmplz"), "-o", str(settings.order), "--discount_fallback",
                    "-S", settings.lm_memory, "-T", arpa.parent], log, stdin=text, stdout=partial)
    text.unlink()


def choose_within_budget(scores: np.ndarray, words: np.ndarray, budget_words: int) -> np.ndarray:
    """A mask of the lowest-scoring lines whose words add up to at most ``budget_words``.

    Lines are taken in score order (ties: the earlier line first) until the next one would
    exceed the budget.
    """
    order = np.argsort(scores, kind="stable")
    within = np.cumsum(words[order], dtype=np.int64) <= budget_words
    keep = np.zeros(len(scores), dtype=bool)
    keep[order[within]] = True
    return keep


def sample_mask(words: np.ndarray, target_words: int, seed: int) -> np.ndarray:
    """A random set of lines with about ``target_words`` words: the general model's text."""
    order = np.random.default_rng(seed).permutation(len(words))
    taken = np.cumsum(words[order], dtype=np.int64)
    count = int(np.searchsorted(taken, target_words, side="left")) + 1
    mask = np.zeros(len(words), dtype=bool)
    mask[order[:count]] = True
    return mask


def _word_counts(path: Path) -> np.ndarray:
    return np.fromiter((len(split_tokens(line)) for line in text_lines(path)), dtype=np.int32)


def _lines_where(path: Path, mask: np.ndarray) -> Iterator[str]:
    return (line for i, line in enumerate(text_lines(path)) if mask[i])


def select_lines(
    install: MosesInstall,
    corpus: Sequence[Path],
    in_domain: Sequence[Path],
    out: Sequence[Path],
    budget_words: int,
    work: Path,
    log: Path,
    settings: SelectionSettings = SelectionSettings(),
    *,
    budget_side: int = -1,
    progress: Callable[[str], None] = lambda _: None,
) -> SelectionResult:
    """Keep the lines of ``corpus`` (one file per side, line-aligned) that look most like
    ``in_domain`` (the same sides), up to ``budget_words`` words on side ``budget_side``; write
    them to ``out`` in their original order."""
    if not len(corpus) == len(in_domain) == len(out) > 0:
        raise ValueError("corpus, in_domain and out need one file per side")
    work.mkdir(parents=True, exist_ok=True)
    side_words = [_word_counts(path) for path in corpus]
    words = side_words[budget_side]
    for path, counts in zip(corpus, side_words, strict=True):
        if len(counts) != len(words):
            raise MosesToolError(f"{path}: {len(counts)} lines, but {corpus[budget_side]} has {len(words)}")
    scores = np.zeros(len(words), dtype=np.float64)
    for side, (text, domain) in enumerate(zip(corpus, in_domain, strict=True)):
        vocabulary = in_domain_vocabulary(text_lines(domain), settings.min_count)
        in_lm, general_lm = work / f"in-domain.{side}.arpa", work / f"general.{side}.arpa"
        train_selection_lm(install, text_lines(domain), vocabulary, in_lm, settings, log)
        sample = sample_mask(side_words[side], int(_word_counts(domain).sum()), settings.seed + side)
        train_selection_lm(install, _lines_where(text, sample), vocabulary, general_lm, settings, log)
        progress(f"selection: scoring {text.name} ({len(words):,} lines)")
        scores += cross_entropies(install, in_lm, text_lines(text), vocabulary, log)
        scores -= cross_entropies(install, general_lm, text_lines(text), vocabulary, log)
    keep = choose_within_budget(scores, words, budget_words)
    for text, dest in zip(corpus, out, strict=True):
        write_text_lines(dest, _lines_where(text, keep))
    kept_scores = scores[keep]
    return SelectionResult(
        lines_read=len(words), lines_kept=int(keep.sum()), words_read=int(words.sum()),
        words_kept=int(words[keep].sum()),
        score_threshold=round(float(kept_scores.max()), 6) if kept_scores.size else None,
    )
