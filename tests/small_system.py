"""A small decodable Moses system cut from the fixture's filtered one, for the real-Moses tests:
only the table and reordering lines whose source is an n-gram of a few dev sentences, so Moses
loads it in a second."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

from moses_integration.moses_ini import MosesIni
from shared_paths import shared_file


@dataclass
class SmallSystem:
    ini: Path
    table: Path
    sentences: list[str]


def ngrams(sentences: list[str], longest: int = 7) -> set[bytes]:
    """Every n-gram of the sentences up to ``longest`` words (Moses' default phrase length)."""
    out = set()
    for sentence in sentences:
        words = sentence.split()
        for i in range(len(words)):
            out.update(" ".join(words[i:j]).encode() for j in range(i + 1, min(len(words), i + longest) + 1))
    return out


def keep_sources(src: Path, dest: Path, phrases: set[bytes]) -> None:
    """The lines of a table (phrase or reordering) whose source is one of ``phrases``."""
    with gzip.open(src) as fin, gzip.open(dest, "wb") as fout:
        fout.writelines(line for line in fin if line.split(b" ||| ", 1)[0] in phrases)


def small_system(folder: Path, sentences: int = 2) -> SmallSystem:
    """``moses.ini``, ``phrase-table.gz`` and ``reordering-table.gz`` in ``folder`` for the first
    ``sentences`` dev sentences (the language model is the fixture's, by absolute path)."""
    fixture = shared_file("fixtures/hansard-enfr")
    dev = (fixture / "data/dev.tok.tc.en").read_text().splitlines()[:sentences]
    phrases = ngrams(dev)
    table, reordering = folder / "phrase-table.gz", folder / "reordering-table.gz"
    keep_sources(fixture / "filtered/phrase-table.0-0.1.1.gz", table, phrases)
    keep_sources(fixture / "filtered/reordering-table.wbe-msd-bidirectional-fe.0-0.1.gz", reordering, phrases)
    ini = MosesIni.read(fixture / "filtered/moses.ini")
    ini.set_feature_arg("TranslationModel0", "path", str(table))
    ini.set_feature_arg("LexicalReordering0", "path", str(reordering))
    ini.set_feature_arg("LM0", "path", str(fixture / "filtered/lm.fr.binary"))
    ini.write(folder / "moses.ini")
    return SmallSystem(folder / "moses.ini", table, dev)
