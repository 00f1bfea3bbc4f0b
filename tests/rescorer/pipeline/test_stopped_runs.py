"""A parallel ``rescore-phrase-table`` stopped from outside, as a user or a scheduler stops it.

Each test runs the real command in a subprocess with a mark in its environment
(:mod:`leftovers`), so that every process it starts can be found afterwards, also once re-parented.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from leftovers import marked_env, marked_processes, wait_until_gone

from moses_integration.processes import process_tag
from rescorer.model.checkpoint import save_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.model.vocab import EOS, UNK, Vocab

WORDS = ["la", "maison", "the", "house", "a", "b", "c"]
RESCORE = str(Path(sys.executable).parent / "rescore-phrase-table")
SPOOL_BASES = [Path("/dev/shm"), Path(tempfile.gettempdir())]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    vocab = Vocab([EOS, UNK, *WORDS])
    config = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), hidden=8, embedding=4,
                         maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "tiny.pt"
    save_checkpoint(path, model=RNNEncoderDecoder(config).eval(), config=config, src_vocab=vocab, tgt_vocab=vocab)
    return path


@pytest.fixture(scope="module")
def long_table(tmp_path_factory) -> Path:
    """Long enough (in 200-line chunks) that a run is still going when it is stopped."""
    lines = []
    for i in range(60_000):
        src = f"{WORDS[(i // 3) % 4]} {WORDS[(i // 12) % 7]}{i // 84}"
        lines.append(f"{src} ||| {WORDS[i % 3]} {WORDS[(i // 3) % 5]} ||| 0.5 0.5 0.5 0.5\n")
    path = tmp_path_factory.mktemp("table") / "pt.txt"
    path.write_text("".join(lines))
    return path


def spools_of(pid: int) -> list[Path]:
    return [p for base in SPOOL_BASES if base.is_dir() for p in base.glob(f"rescore-spool-{pid}-*")]


def start_and_wait_for_workers(cmd: list[str], out: Path, env: dict, mark: str) -> subprocess.Popen:
    """Start ``cmd``; return once a chunk is durable and the reader and two workers run."""
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    progress = out.parent / f".{out.name}.progress.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.exists() and len(marked_processes(mark)) >= 4:  # the run, its reader, two workers
            with_chunks = json.loads(progress.read_text() or "{}").get("chunks_done", 0)
            if with_chunks >= 1:
                break
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be stopped: {proc.stderr.read()}"
    return proc


def rescore_cmd(table: Path, out: Path, model: Path, *extra: str) -> list[str]:
    return [RESCORE, str(table), str(out), "--model", str(model), "-j", "2", "--chunk-lines", "200",
            "--token-budget", "64", "--device", "cpu", "-q", *extra]


def test_sigkill_of_a_parallel_run_leaves_no_process_and_no_spool(tmp_path, model_file, long_table) -> None:
    out = tmp_path / "out.gz"
    env, mark = marked_env()
    proc = start_and_wait_for_workers(rescore_cmd(long_table, out, model_file), out, env, mark)
    assert spools_of(proc.pid), "the run has no spool to leave behind"
    proc.kill()
    proc.wait()
    left = wait_until_gone(mark, 5)
    assert not left, f"still running 5 s after the run was killed: {left}"
    assert not spools_of(proc.pid)


def test_a_spool_whose_owner_is_dead_is_removed_by_the_next_run(tmp_path, model_file) -> None:
    dead = subprocess.run([sys.executable, "-c", "from moses_integration.processes import process_tag; "
                           "print(process_tag())"], capture_output=True, text=True, check=True).stdout.strip()
    base = next(b for b in SPOOL_BASES if b.is_dir() and os.access(b, os.W_OK))
    abandoned = Path(tempfile.mkdtemp(prefix=f"rescore-spool-{dead}-", dir=base))
    (abandoned / "0.chunk").write_bytes(b"x" * 1000)
    live = Path(tempfile.mkdtemp(prefix=f"rescore-spool-{process_tag()}-", dir=base))  # this test's own: kept
    table = tmp_path / "pt.txt"
    table.write_text("the house ||| la maison ||| 0.5 0.5 0.5 0.5\n")
    try:
        subprocess.run(rescore_cmd(table, tmp_path / "out.gz", model_file), check=True)
        assert not abandoned.exists()
        assert live.exists()
    finally:
        for folder in (abandoned, live):
            if folder.exists():
                for f in folder.iterdir():
                    f.unlink()
                folder.rmdir()
