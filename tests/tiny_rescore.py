"""A tiny hand-built RNN over seven words and the small tables, runs and CLI calls the rescorer's
pipeline tests share: each runs in seconds (tests/rescorer/pipeline/conftest.py holds the fixtures)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from click.testing import CliRunner

from moses_integration.phrase_table import PhraseTableError
from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import Checkpoint, load_checkpoint
from rescorer.pipeline import partial_output
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.scoring import ScoringOptions
from rescorer.pipeline.train_or_load import Models

WORDS = ["la", "maison", "the", "house", "a", "b", "c"]


def run(inp: Path, out: Path, ck: Checkpoint, **kw):
    kw.setdefault("scoring", ScoringOptions(token_budget=512))
    kw.setdefault("workers", 0)
    opts = RescoreOptions(progress=False, device="cpu", **kw)
    return rescore(str(inp), str(out), Models(ck), opts)


def added_columns(path: Path) -> list[list[float]]:
    lines = gzip.decompress(path.read_bytes()).decode().splitlines() if path.suffix == ".gz" else \
        path.read_text(encoding="utf-8").splitlines()
    return [[float(x) for x in line.split(" ||| ")[2].split(" ")[-2:]] for line in lines]


def table_lines(n: int, scores: str = "0.5 0.5 0.5 0.5") -> list[bytes]:
    """``n`` sorted lines over the tiny model's words, a few targets per source."""
    lines = []
    for i in range(n):
        src = f"{WORDS[(i // 3) % 4]} {WORDS[(i // 12) % 7]}{i // 84}"
        lines.append(f"{src} ||| {WORDS[i % 3]} {WORDS[(i // 3) % 5]} ||| {scores}".encode())
    return lines


def write_table(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def cli(*args: str):
    return CliRunner().invoke(rescore_phrase_table_command, [*args, "-q", "-j", "0", "--device", "cpu"])


def ini_text(tables: list[tuple[str, int, str]], weights: dict[str, int] | None = None) -> str:
    """A moses.ini with the given (name, num-features, type) phrase tables and matching weights."""
    features = "\n".join(f"{kind} name={name} num-features={n} path=/nowhere/{name}.gz input-factor=0 output-factor=0"
                         for name, n, kind in tables)
    counts = weights or {name: n for name, n, _ in tables}
    weight_lines = "\n".join(f"{name}= " + " ".join(["0.2"] * counts[name]) for name, _, _ in tables)
    return f"[feature]\nWordPenalty\n{features}\n\n[weight]\nWordPenalty0= -1\n{weight_lines}\n"


def kill_after_two_chunks(monkeypatch) -> None:
    """Ctrl-C as the third chunk is being written: two chunks are durable, the rest is not."""
    real_write = partial_output.DurableWriter.write
    calls = []

    def killed_after_two_chunks(self, *a):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_write(self, *a)

    monkeypatch.setattr(partial_output.DurableWriter, "write", killed_after_two_chunks)


def counted(monkeypatch, module, name: str) -> list[tuple]:
    """The calls to ``module``'s function ``name``."""
    calls: list[tuple] = []
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def interrupted_run(tmp_path: Path, model_file: Path, **kw) -> tuple[Path, Checkpoint]:
    """A run stopped by a malformed line 251 of 300 after its first chunks (100 lines each)."""
    lines = table_lines(300)
    lines[250] = b"a ||| b ||| 0.5 oops 0.5 0.5"
    table = write_table(tmp_path / "pt.txt", lines)
    ck = load_checkpoint(model_file)
    with pytest.raises(PhraseTableError):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100, **kw)
    return table, ck


def listing(folder: Path) -> list[str]:
    """Every file and folder under ``folder``, hidden ones included."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def cli_last(*args: str):
    """The CLI with ``args`` last, so that they win over the test defaults (``-j 0``)."""
    return CliRunner().invoke(rescore_phrase_table_command, ["-q", "-j", "0", "--device", "cpu", *args])


def assert_refused(res, *names: str) -> None:
    """Exit 1 with one ``Error:`` line naming ``names``, and no exception escaped (no traceback)."""
    assert isinstance(res.exception, SystemExit) and res.exit_code == 1, (res.exception, res.output)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert all(name in lines[0] for name in names), res.output
    assert "Traceback" not in res.output
