"""NPLM's text model format: what Moses' ``NeuralLM`` feature loads (``moses-smt/nplm``, ``src/model.cpp``).

A file is a series of sections, each a ``\\name`` line followed by its lines and closed by an empty
line; ``\\end`` ends the file::

    \\config            key value lines (version 1, ngram_size, input_vocab_size, ...)
    \\input_vocab       one word per line; the line number is the word's id
    \\output_vocab      the same for the output layer
    \\input_embeddings  [input_vocab_size, input_embedding_dimension]
    \\hidden_weights 1  [num_hidden, (ngram_size - 1) * input_embedding_dimension]
    \\hidden_biases 1   [num_hidden], one value per line
    \\hidden_weights 2  [output_embedding_dimension, num_hidden]
    \\hidden_biases 2   [output_embedding_dimension]
    \\output_weights    [output_vocab_size, output_embedding_dimension]
    \\output_biases     [output_vocab_size]

Matrices are written one row per line, values separated by single spaces. The network is
``h1 = act(W1 · [e(w_1); …; e(w_{n-1})] + b1)``, ``h2 = act(W2 · h1 + b2)`` and the score of word
``w`` is ``O[w] · h2 + o[w]``; with ``num_hidden 0`` the first layer maps straight to the output
embedding and the second is skipped. Moses' ``NeuralLM`` adds that raw score (natural log) without
normalising it, and reads only the input vocabulary (the output ids must be the same list).
Unknown words map to ``<unk>``; a history shorter than the order is padded with ``<s>`` when it
starts with ``<s>``, else with ``<null>``.

Fields are split on ASCII space and tab, as Moses' own tokens are, so every vocabulary word is
one Moses token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infrastructure.errors import FileLineError
from infrastructure.files import PathArg, atomic_output, display_name
from infrastructure.lines import iter_text_lines

#: The words NPLM and Moses' NeuralLM look up by name.
UNK, BOS, NULL = "<unk>", "<s>", "<null>"
ACTIVATIONS = ("identity", "rectifier", "tanh", "hardtanh")
#: The matrix sections of a model file, in the order NPLM writes them (vectors one value per line).
MATRIX_SECTIONS: tuple[str, ...] = (
    "input_embeddings",
    "hidden_weights 1",
    "hidden_biases 1",
    "hidden_weights 2",
    "hidden_biases 2",
    "output_weights",
    "output_biases",
)
#: How numbers are written: 9 significant digits round-trip a float32 exactly.
NUMBER_FORMAT = "%.9g"


class NPLMError(FileLineError):
    """A file that is not a model NPLM can load, with its path and line."""


@dataclass(frozen=True)
class NPLMConfig:
    """The ``\\config`` section of a model file."""

    ngram_size: int
    input_vocab_size: int
    output_vocab_size: int
    input_embedding_dimension: int
    num_hidden: int
    output_embedding_dimension: int
    activation_function: str = "rectifier"

    def lines(self) -> list[str]:
        return ["version 1"] + [f"{key} {getattr(self, key)}" for key in self.__dataclass_fields__]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each matrix section's shape (vectors as one dimension), as NPLM's ``model::resize`` sets them."""
        context_width = (self.ngram_size - 1) * self.input_embedding_dimension
        first = self.num_hidden or self.output_embedding_dimension
        second = (self.output_embedding_dimension, self.num_hidden) if self.num_hidden else (1, 1)
        return {
            "input_embeddings": (self.input_vocab_size, self.input_embedding_dimension),
            "hidden_weights 1": (first, context_width),
            "hidden_biases 1": (first,),
            "hidden_weights 2": second,
            "hidden_biases 2": (second[0],),
            "output_weights": (self.output_vocab_size, self.output_embedding_dimension),
            "output_biases": (self.output_vocab_size,),
        }


@dataclass
class NPLMModel:
    """A whole model file: config, one vocabulary (input = output, as Moses reads it) and the matrices."""

    config: NPLMConfig
    vocab: list[str]
    matrices: dict[str, np.ndarray]


def check_vocab(vocab: Sequence[str], where: str) -> None:
    """A vocabulary NeuralLM can use: the special words present, each word one Moses token, no repeats."""
    missing = [w for w in (UNK, BOS, NULL) if w not in vocab]
    if missing:
        raise NPLMError(where, None, f"vocabulary lacks {', '.join(missing)}, which NeuralLM looks up")
    seen: set[str] = set()
    for i, word in enumerate(vocab):
        if not word or any(c in word for c in " \t\r\n"):
            raise NPLMError(where, None, f"vocabulary word {i} ({word!r}) is not one Moses token")
        if word in seen:
            raise NPLMError(where, None, f"vocabulary word {word!r} appears twice")
        seen.add(word)


def write_nplm(path: PathArg, model: NPLMModel) -> None:
    """Write ``model`` atomically in NPLM's text format (``-`` for stdout)."""
    where = display_name(path)
    check_vocab(model.vocab, where)
    shapes = model.config.shapes()
    if len(model.vocab) != model.config.input_vocab_size or len(model.vocab) != model.config.output_vocab_size:
        raise NPLMError(where, None, f"{len(model.vocab)} vocabulary words but the config says "
                        f"{model.config.input_vocab_size} in, {model.config.output_vocab_size} out")
    for name in MATRIX_SECTIONS:
        if model.matrices[name].shape != shapes[name]:
            raise NPLMError(where, None, f"\\{name} has shape {model.matrices[name].shape}, expected {shapes[name]}")
    with atomic_output(path) as fh:
        def section(name: str, lines: Sequence[str]) -> None:
            fh.write(("\\" + name + "\n").encode())
            fh.write("".join(line + "\n" for line in lines).encode("utf-8"))
            fh.write(b"\n")

        section("config", model.config.lines())
        section("input_vocab", model.vocab)
        section("output_vocab", model.vocab)
        for name in MATRIX_SECTIONS:
            matrix = np.asarray(model.matrices[name], dtype=np.float32)
            fh.write(("\\" + name + "\n").encode())
            np.savetxt(fh, matrix.reshape(len(matrix), -1), fmt=NUMBER_FORMAT, delimiter=" ")
            fh.write(b"\n")
        fh.write(b"\\end\n")


def _sections(path: PathArg) -> Iterator[tuple[str, int, list[str]]]:
    """``(name, line of its header, its lines)`` for each section up to ``\\end``.

    Matrix sections come with no lines: only the header is read here, and a paper-size model's
    matrices are hundreds of megabytes of text.
    """
    where = display_name(path)
    lines = iter_text_lines(path, error=NPLMError)
    for line_no, line in lines:
        if line == "":
            continue
        if line == "\\end":
            return
        if not line.startswith("\\"):
            raise NPLMError(where, line_no, f"expected a section header such as \\config, found {line[:40]!r}")
        body: list[str] = []
        keep = line[1:] not in MATRIX_SECTIONS
        for _, inner in lines:
            if inner == "":
                break
            if keep:
                body.append(inner)
        yield line[1:], line_no, body
    raise NPLMError(where, None, "no \\end line: the file is incomplete")


def _parse_config(where: str, line_no: int, body: list[str]) -> NPLMConfig:
    values: dict[str, str] = {}
    for offset, line in enumerate(body, start=1):
        fields = line.split()
        if len(fields) != 2:
            raise NPLMError(where, line_no + offset, f"expected 'key value', found {line!r}")
        values[fields[0]] = fields[1]
    if values.pop("version", "1") != "1":
        raise NPLMError(where, line_no, "only version 1 of the format exists")
    if "vocab_size" in values:
        size = values.pop("vocab_size")
        values.setdefault("input_vocab_size", size)
        values.setdefault("output_vocab_size", size)
    try:
        ints = {k: int(values.pop(k)) for k in ("ngram_size", "input_vocab_size", "output_vocab_size",
                                                "input_embedding_dimension", "num_hidden",
                                                "output_embedding_dimension")}
    except KeyError as exc:
        raise NPLMError(where, line_no, f"\\config lacks {exc.args[0]}") from None
    except ValueError as exc:
        raise NPLMError(where, line_no, f"\\config: {exc}") from None
    activation = values.pop("activation_function", "rectifier")
    if activation not in ACTIVATIONS:
        raise NPLMError(where, line_no, f"unknown activation_function {activation!r}")
    if values:
        raise NPLMError(where, line_no, f"unknown \\config keys: {', '.join(sorted(values))}")
    return NPLMConfig(**ints, activation_function=activation)


def read_nplm_header(path: PathArg) -> tuple[NPLMConfig, list[str]]:
    """The config and vocabulary of a model file, checked as NeuralLM will use them (matrices are skipped).

    This is what ``moses.ini`` editing checks before any work: the order Moses must be told, and
    that the special words are there.
    """
    where = display_name(path)
    config: NPLMConfig | None = None
    vocab: list[str] | None = None
    output_vocab: list[str] | None = None
    for name, line_no, body in _sections(path):
        if name == "config":
            config = _parse_config(where, line_no, body)
        elif name in ("input_vocab", "vocab"):
            vocab = body
        elif name == "output_vocab":
            output_vocab = body
        elif name not in MATRIX_SECTIONS:
            raise NPLMError(where, line_no, f"unknown section \\{name}")
    if config is None or vocab is None:
        raise NPLMError(where, None, "no \\config or no \\input_vocab section")
    if output_vocab is not None and output_vocab != vocab:
        raise NPLMError(where, None, "\\output_vocab differs from \\input_vocab; Moses' NeuralLM reads only one list")
    if len(vocab) != config.input_vocab_size:
        raise NPLMError(where, None, f"{len(vocab)} vocabulary words, config says {config.input_vocab_size}")
    check_vocab(vocab, where)
    return config, vocab


def neural_lm_feature_line(path: PathArg, name: str = "CSLM0") -> str:
    """The ``moses.ini`` ``[feature]`` line that loads the model at ``path`` as Moses' ``NeuralLM``.

    The order is read from the file (Moses refuses a mismatch only once it has loaded everything
    else); the path is made absolute, since Moses resolves relative paths against its working
    directory.
    """
    config, _ = read_nplm_header(path)
    return f"NeuralLM factor=0 name={name} order={config.ngram_size} path={Path(path).resolve()}"
