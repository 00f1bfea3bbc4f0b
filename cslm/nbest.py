"""The CSLM as an n-best feature: for ``mert tune --feature CSLM:…`` and as ``cslm nbest``, the
``--transform-decoded-file`` filter of ``mert-moses.pl``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from cslm.model import CSLM, CSLMError
from cslm.model_file import load_cslm
from cslm.scoring import ScoreStats, sentence_log_probs
from moses_integration.files import PathArg, atomic_output, display_name, open_input
from moses_integration.moses_ini import dense_feature_name_problem
from moses_integration.nbest import FIELD_SEPARATOR, NBestEntry, NBestError, format_value, parse_nbest_line
from moses_integration.tokens import split_tokens
from rescorer.vocab import Vocab

DEFAULT_FEATURE_NAME = "CSLM0"


class CSLMFeature:
    """The CSLM as an n-best feature (``mert tune --feature CSLM:model.pt``): one value per hypothesis.

    The value is the hypothesis' natural-log probability (its words and ``</s>``), which MERT
    weighs against Moses' own ``LM0``. ``model`` may end in ``,name=X`` to use another feature name.
    """

    num_values = 1

    def __init__(self, model: str, name: str = DEFAULT_FEATURE_NAME, device: str = "auto") -> None:
        path, _, option = model.partition(",name=")
        if option:
            name = option
        self.name = dense_feature_name(name)
        self.path = path
        self.loaded = load_cslm(path, device)
        self.stats = ScoreStats()

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        sentences = [split_tokens(e.hypothesis) for e in entries]
        return sentence_log_probs(self.loaded.model, self.loaded.vocab, sentences, stats=self.stats)[:, None]


def dense_feature_name(name: str) -> str:
    """``name`` if Moses and MERT can use it as a dense feature name, else a ValueError saying why."""
    problem = dense_feature_name_problem(name)
    if problem:
        raise CSLMError(f"feature name {name!r} {problem}")
    return name


def _nbest_sentence_chunks(lines: Iterable[bytes], size: int) -> Iterator[list[bytes]]:
    """Raw n-best lines grouped in runs of whole sentences of about ``size`` lines."""
    chunk: list[bytes] = []
    prev_id = b""
    for raw in lines:
        sent_id = raw.split(b"|||", 1)[0]
        if len(chunk) >= size and sent_id != prev_id:
            yield chunk
            chunk = []
        chunk.append(raw)
        prev_id = sent_id
    if chunk:
        yield chunk


def add_cslm_to_nbest(
    model: CSLM,
    vocab: Vocab,
    nbest_in: PathArg,
    nbest_out: PathArg,
    *,
    name: str = DEFAULT_FEATURE_NAME,
    chunk_lines: int = 2000,
    normalize: bool = True,
    stats: ScoreStats | None = None,
) -> int:
    """Append `` NAME= v`` to every line's feature field, keeping every other byte; return the line count.

    This is the ``--transform-decoded-file`` filter for ``mert-moses.pl``: values are written as
    Moses writes its own (6 significant digits), the hypothesis, the other features, the total
    and any further fields stay byte for byte. Lines are checked with the project's n-best parser,
    so a broken list fails with its file and line. The output is written atomically.
    """
    where = display_name(nbest_in)
    marker = f"{name}=".encode()
    line_no = 0
    with open_input(nbest_in) as fh, atomic_output(nbest_out) as out:
        for chunk in _nbest_sentence_chunks(fh, chunk_lines):
            parsed: list[tuple[bytes, list[bytes]]] = []
            sentences: list[list[str]] = []
            for raw in chunk:
                line_no += 1
                ending = b"\n" if raw.endswith(b"\n") else b""
                body = raw[: len(raw) - len(ending)]
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise NBestError(where, line_no, f"not valid UTF-8 ({exc.reason})") from None
                entry = parse_nbest_line(text.rstrip("\r"), path=where, line_no=line_no)
                if any(n == name for n, _ in entry.features):
                    raise NBestError(where, line_no, f"the list already has feature {name}")
                fields = body.split(FIELD_SEPARATOR.encode())
                parsed.append((ending, fields))
                sentences.append(split_tokens(entry.hypothesis))
            scores = sentence_log_probs(model, vocab, sentences, normalize=normalize, stats=stats)
            for (ending, fields), value in zip(parsed, scores.tolist(), strict=True):
                feats = fields[2]
                kept = feats.rstrip(b" ")
                fields[2] = kept + b" " + marker + b" " + format_value(value).encode() + feats[len(kept):]
                out.write(FIELD_SEPARATOR.encode().join(fields) + ending)
    return line_no
