"""The bitext: read and checked before any work, encoded into subword ids, cut into length-bucketed batches.

The checks come first because a training runs for hours: sides of different line counts or an
empty line (which a pair of sentences cannot be) are one line naming the file and line before
sentencepiece is trained. A batch holds pairs of similar target length (little padding), the
batches of an epoch a pure function of (seed, epoch), so that a resumed run trains on exactly the
batches the uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infrastructure.errors import FileLineError
from infrastructure.files import PathArg, display_name
from infrastructure.lines import iter_text_lines

#: Batches of an epoch are formed within pools of this many batches of pairs sorted by length:
#: little padding, and still a different mix of sentences in every epoch.
POOL_BATCHES = 100
#: The most words a training sentence may have. A batch's memory grows with its longest pair's length
#: squared (attention) and times the vocabulary (the output layer): one pair of 15,000 words asked for
#: 480 GB after the data was prepared. The paper trained on sentences of at most 50 words, table1 cleans
#: its bitext to 80.
MAX_TRAINING_WORDS = 250


class BitextError(FileLineError):
    """A bitext line that cannot be a training pair."""


def read_bitext(src_path: PathArg, tgt_path: PathArg, *, allow_empty: bool = False) -> tuple[list[str], list[str]]:
    """Both sides' lines, checked: the same number of lines, and unless ``allow_empty`` (scoring: a
    hypothesis may be empty) none empty (only blanks counts as empty) and none longer than
    :data:`MAX_TRAINING_WORDS`."""
    src_lines: list[str] = []
    tgt_lines: list[str] = []
    for path, lines in ((src_path, src_lines), (tgt_path, tgt_lines)):
        for line_no, line in iter_text_lines(path, error=BitextError):
            if not allow_empty and not line.strip():
                raise BitextError(display_name(path), line_no, "empty line: every line of a bitext must be a sentence")
            if not allow_empty and len(words := line.split()) > MAX_TRAINING_WORDS:
                raise BitextError(display_name(path), line_no, f"{len(words)} words: a training sentence has at most "
                                  f"{MAX_TRAINING_WORDS} (clean the bitext: Moses' clean-corpus-n.perl … 1 80)")
            lines.append(line)
    if len(src_lines) != len(tgt_lines):
        shorter, longer = ((src_path, tgt_path) if len(src_lines) < len(tgt_lines) else (tgt_path, src_path))
        n = min(len(src_lines), len(tgt_lines))
        raise BitextError(display_name(longer), n + 1, f"line {n + 1} has no counterpart: {display_name(shorter)} "
                          f"has {n} lines, {display_name(longer)} {max(len(src_lines), len(tgt_lines))}")
    if not src_lines and not allow_empty:
        raise BitextError(display_name(src_path), 1, "the bitext is empty")
    return src_lines, tgt_lines


@dataclass
class EncodedBitext:
    """Subword ids of pairs (no EOS; the batch adds it)."""

    sources: list[list[int]]
    targets: list[list[int]]

    def __len__(self) -> int:
        return len(self.sources)

    def subset(self, rows: np.ndarray) -> EncodedBitext:
        return EncodedBitext([self.sources[i] for i in rows], [self.targets[i] for i in rows])

    @property
    def target_tokens(self) -> int:
        """Target units with EOS, what perplexity and tokens/s count."""
        return sum(len(t) + 1 for t in self.targets)


def epoch_batches(bitext: EncodedBitext, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """The rows of each batch of ``epoch``, in training order: a pure function of its arguments.

    Pairs are shuffled, sorted by (target, source) length within pools of :data:`POOL_BATCHES`
    batches, cut into batches of ``batch_size`` pairs, and the batches shuffled.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(bitext))
    lengths = np.array([len(t) * 1000 + len(s) for s, t in zip(bitext.sources, bitext.targets, strict=True)])
    pool = batch_size * POOL_BATCHES
    batches: list[np.ndarray] = []
    for start in range(0, len(order), pool):
        rows = order[start : start + pool]
        rows = rows[np.argsort(lengths[rows], kind="stable")]
        batches += [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]
