"""``nmt translate``: batched beam search over a text, one translation (or Moses n-best lines) per line.

Lines are read in chunks, each chunk's sentences sorted by length into batches (little padding; the
search's results do not depend on the batch, :mod:`nmt.search`), and written back in input order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from infrastructure.files import PathArg, atomic_output
from moses_integration.nbest import FIELD_SEPARATOR, format_value, nbest_hypothesis
from nmt.model_file import NMTFile
from nmt.search import Hypothesis, beam_search

#: Lines read before their batches are formed: enough for batches of similar lengths.
CHUNK_LINES = 1024


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def translations(loaded: NMTFile, lines: Iterable[str], *, beam: int, nbest: int = 1, normalize: bool = False,
                 batch_size: int = 32) -> Iterator[tuple[list[str], list[Hypothesis]]]:
    """For each input line, in order: the target texts and hypotheses of its ``nbest`` best, best first."""
    for chunk in _chunks(lines, CHUNK_LINES):
        ids = loaded.src_subwords.encode([line.strip() for line in chunk])
        order = sorted(range(len(chunk)), key=lambda i: len(ids[i]))
        found: list[list[Hypothesis]] = [[] for _ in chunk]
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            for row, hypotheses in zip(rows, beam_search(loaded.model, [ids[r] for r in rows], beam, nbest=nbest,
                                                         normalize=normalize), strict=True):
                found[row] = hypotheses
        for hypotheses in found:
            yield loaded.tgt_subwords.decode([h.ids for h in hypotheses]), hypotheses


def write_translations(loaded: NMTFile, lines: Iterable[str], out: PathArg, *, beam: int, nbest: int | None = None,
                       normalize: bool = False, name: str = "NMT0", batch_size: int = 32) -> int:
    """The best translation of each line, or with ``nbest`` Moses' n-best format
    (``id ||| hypothesis ||| NAME= log p ||| total``); returns the lines translated."""
    count = 0
    sep = f" {FIELD_SEPARATOR} "
    with atomic_output(out) as stream:
        for count, (texts, hypotheses) in enumerate(
                translations(loaded, lines, beam=beam, nbest=nbest or 1, normalize=normalize,
                             batch_size=batch_size), start=1):
            if nbest is None:
                stream.write((texts[0] + "\n").encode("utf-8"))
                continue
            for text, hypothesis in zip(texts, hypotheses, strict=True):
                value = format_value(hypothesis.log_prob)
                stream.write(f"{count - 1}{sep}{nbest_hypothesis(text)}{sep}{name}= {value}{sep}{value}\n".encode())
    return count
