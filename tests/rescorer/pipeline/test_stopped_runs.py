"""Runs stopped from outside, as a user (Ctrl-C) or a scheduler (SIGTERM, SIGKILL) stops them.

Each test that stops a run starts the real command in a subprocess with a mark in its environment
(:mod:`leftovers`), so that every process it starts can be found afterwards, also once re-parented.
A run that only has to start or end (a resume, the next run a spool waits for) runs in this process
through click's runner, unless the test needs it to be another process than the test's own.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from leftovers import GONE_SECONDS, marked_env, marked_processes, wait_until_gone
from rescore_runs import RESCORE_SCRIPT, assert_ran, run_command
from waiting import SAFETY_SECONDS, wait_until

from infrastructure.processes import process_tag
from neural.vocab import EOS, UNK, Vocab
from rescorer.model.checkpoint import save_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline.spool import Spool
from shared_paths import shared_file

WORDS = ["la", "maison", "the", "house", "a", "b", "c"]
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


def write_table(path: Path, n: int) -> Path:
    """``n`` sorted lines over :data:`WORDS`, a few targets per source."""
    lines = []
    for i in range(n):
        src = f"{WORDS[(i // 3) % 4]} {WORDS[(i // 12) % 7]}{i // 84}"
        lines.append(f"{src} ||| {WORDS[i % 3]} {WORDS[(i // 3) % 5]} ||| 0.5 0.5 0.5 0.5\n")
    path.write_text("".join(lines))
    return path


@pytest.fixture(scope="module")
def long_table(tmp_path_factory) -> Path:
    """Long enough (in 200-line chunks) that a run is still going when it is stopped."""
    return write_table(tmp_path_factory.mktemp("table") / "pt.txt", 60_000)


@pytest.fixture(scope="module")
def resumable_table(tmp_path_factory) -> Path:
    """A quarter of :func:`long_table`: still 75 chunks, seconds of work after the first is durable, so
    a run is still going when it is stopped; short enough that a test may resume it to the end."""
    return write_table(tmp_path_factory.mktemp("table") / "pt.txt", 15_000)


def spools_of(pid: int) -> list[Path]:
    return [p for base in SPOOL_BASES if base.is_dir() for p in base.glob(f"rescore-spool-{pid}-*")]


def as_from_a_terminal() -> None:
    """The command's Ctrl-C as a terminal gives it: a test suite started as a background job of a
    non-interactive shell (``make test &``) ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_and_wait_for_workers(cmd: list[str], out: Path, env: dict, mark: str) -> subprocess.Popen:
    """Start ``cmd``; return once a chunk is durable and the reader and two workers run."""
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    progress = out.parent / f".{out.name}.progress.json"

    def under_way() -> bool:
        if not progress.exists() or len(marked_processes(mark)) < 4:  # the run, its reader, two workers
            return False
        return json.loads(progress.read_text() or "{}").get("chunks_done", 0) >= 1

    wait_until(under_way, "durable chunk with the reader and two workers running", proc=proc, poll=0.02)
    return proc


def rescore_cmd(table: Path, out: Path, model: Path, *extra: str) -> list[str]:
    return [RESCORE_SCRIPT, *rescore_args(table, out, model, *extra)]


def rescore_args(table: Path, out: Path, model: Path, *extra: str) -> list[str]:
    """The arguments of :func:`rescore_cmd`, for the command run in this process."""
    return [str(table), str(out), "--model", str(model), "-j", "2", "--chunk-lines", "200",
            "--token-budget", "64", "--device", "cpu", "-q", *extra]


def test_sigkill_of_a_parallel_run_leaves_no_process_and_no_spool(tmp_path, model_file, long_table) -> None:
    out = tmp_path / "out.gz"
    env, mark = marked_env()
    proc = start_and_wait_for_workers(rescore_cmd(long_table, out, model_file), out, env, mark)
    assert spools_of(proc.pid), "the run has no spool to leave behind"
    proc.kill()
    proc.wait()
    left = wait_until_gone(mark)
    assert not left, f"still running {GONE_SECONDS:.0f} s after the run was killed: {left}"
    assert not spools_of(proc.pid)


def semaphores_of(mark: str) -> set[Path]:
    """The named semaphores (``/dev/shm/sem.*``) the marked processes have open."""
    found = set()
    for pid in marked_processes(mark):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # gone meanwhile
            continue
        found |= {Path(line.split(maxsplit=5)[5]) for line in maps.splitlines()
                  if "/dev/shm/sem." in line and not line.endswith("(deleted)")}
    return found


def test_a_process_group_killed_leaves_no_semaphore_for_good(tmp_path, model_file, long_table) -> None:
    """SIGKILL of the whole group (the run, its workers, multiprocessing's resource tracker): nobody is
    left to remove the semaphores they shared; the next run removes them with the dead run's spool."""
    out = tmp_path / "out.gz"
    env, mark = marked_env()
    proc = start_and_wait_for_workers(rescore_cmd(long_table, out, model_file), out, env, mark)
    semaphores, spools = semaphores_of(mark), spools_of(proc.pid)
    assert semaphores and spools
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not wait_until_gone(mark, 5)
    assert all(semaphore.exists() for semaphore in semaphores)
    minute_ago = time.time() - 60
    for spool in spools:  # past the grace a spool seconds old gets
        os.utime(spool, (minute_ago, minute_ago))
    Spool().close()  # what the next run does as it starts and ends
    assert not [spool for spool in spools if spool.exists()]
    assert not [semaphore for semaphore in semaphores if semaphore.exists()]


def dead_tag() -> str:
    """The process tag of a process that has ended."""
    return subprocess.run([sys.executable, "-c", "from infrastructure.processes import process_tag; "
                           "print(process_tag())"], capture_output=True, text=True, check=True).stdout.strip()


def old_spool(tag: str) -> Path:
    """A spool folder named for ``tag``, with a chunk in it, a minute old (past the young-spool grace)."""
    base = next(b for b in SPOOL_BASES if b.is_dir() and os.access(b, os.W_OK))
    folder = Path(tempfile.mkdtemp(prefix=f"rescore-spool-{tag}-", dir=base))
    (folder / "0.chunk").write_bytes(b"x" * 1000)
    minute_ago = time.time() - 60
    os.utime(folder, (minute_ago, minute_ago))
    return folder


def remove_spools(*folders: Path) -> None:
    for folder in folders:
        if folder.exists():
            for f in folder.iterdir():
                f.unlink()
            folder.rmdir()


def test_a_spool_whose_owner_is_dead_is_removed_by_the_next_run(tmp_path, model_file) -> None:
    """The run is a process of its own: the spool kept is a live process's other than the run's."""
    abandoned = old_spool(dead_tag())
    live = old_spool(process_tag())  # this test's own: kept
    table = tmp_path / "pt.txt"
    table.write_text("the house ||| la maison ||| 0.5 0.5 0.5 0.5\n")
    try:
        subprocess.run(rescore_cmd(table, tmp_path / "out.gz", model_file), check=True)
        assert not abandoned.exists()
        assert live.exists()
    finally:
        remove_spools(abandoned, live)


def test_a_spool_locked_by_an_owner_in_another_pid_namespace_is_kept(tmp_path, model_file) -> None:
    """Containers sharing /dev/shm but not their PIDs: the tag names a process this namespace does not
    have, but the owner's lock is held (here by a helper standing in for it), so the run is alive."""
    shared = old_spool(dead_tag())
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(shared / '.owner')!r}, os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    table = tmp_path / "pt.txt"
    table.write_text("the house ||| la maison ||| 0.5 0.5 0.5 0.5\n")
    try:
        assert holder.stdout.readline() == "locked\n"
        os.utime(shared, (time.time() - 60, time.time() - 60))  # old: only the lock keeps it
        assert_ran(run_command(rescore_args(table, tmp_path / "out.gz", model_file)))
        assert (shared / "0.chunk").exists(), "a live run's spool was removed"
        holder.kill()
        holder.wait()
        assert_ran(run_command(rescore_args(table, tmp_path / "out2.gz", model_file)))
        assert not shared.exists()  # its owner gone, the next run frees it
    finally:
        holder.kill()
        holder.wait()
        remove_spools(shared)


def test_a_young_spool_is_kept_even_when_its_owner_looks_dead(tmp_path, model_file) -> None:
    """Seconds old, a spool's owner may not hold its lock yet: never removed then."""
    young = old_spool(dead_tag())
    in_an_hour = time.time() + 3600
    os.utime(young, (in_an_hour, in_an_hour))  # young at the run's start and at its end, however slow the machine
    table = tmp_path / "pt.txt"
    table.write_text("the house ||| la maison ||| 0.5 0.5 0.5 0.5\n")
    try:
        assert_ran(run_command(rescore_args(table, tmp_path / "out.gz", model_file)))
        assert young.exists()
    finally:
        remove_spools(young)


def test_a_spool_too_young_to_judge_when_a_run_starts_is_removed_when_it_ends() -> None:
    """A whole process group killed (janitor too) and the run resumed at once: the dead run's spool is
    seconds old then, so it is kept; by the time the resumed run ends it is not, and it goes."""
    dead = old_spool(dead_tag())
    os.utime(dead, None)  # written up to the kill, a moment ago
    spool = Spool()
    try:
        assert dead.exists()
        minute_ago = time.time() - 60
        os.utime(dead, (minute_ago, minute_ago))
        spool.close()
        assert not dead.exists() and not spool.folder.exists()
    finally:
        spool.close()
        remove_spools(dead)


# ---- Ctrl-C and SIGTERM: one line that says what was kept, and the shell's exit status ----------

STOPS = {"ctrl-c": (signal.SIGINT, 130, "Ctrl-C"), "sigterm": (signal.SIGTERM, 143, "SIGTERM")}


def stop(proc: subprocess.Popen, how: str) -> None:
    """Ctrl-C as a terminal sends it (to the whole process group), SIGTERM as ``kill`` does (the main
    process only)."""
    number = STOPS[how][0]
    if number == signal.SIGINT:
        os.killpg(proc.pid, number)
    else:
        proc.send_signal(number)


def assert_one_stop_line(stderr: str, how: str, kept: str) -> None:
    """The run's stderr ends with the one line naming the signal, what was kept and ``--resume``."""
    assert "Traceback" not in stderr and "Aborted" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    stopped = [line for line in stderr.splitlines() if "stopped by" in line]
    assert len(stopped) == 1 and stderr.rstrip("\n").splitlines()[-1] == stopped[0], stderr
    assert f"stopped by {STOPS[how][2]}; " in stopped[0] and kept in stopped[0], stopped[0]
    assert "run again with --resume to continue" in stopped[0], stopped[0]


@pytest.mark.parametrize("how", sorted(STOPS))
def test_a_stopped_parallel_rescore_says_what_it_kept_in_one_line(tmp_path, model_file, resumable_table,
                                                                  how) -> None:
    out = tmp_path / "out.gz"
    env, mark = marked_env()
    cmd = rescore_cmd(resumable_table, out, model_file)
    proc = start_and_wait_for_workers(cmd, out, env, mark)
    stop(proc, how)
    _, stderr = proc.communicate(timeout=SAFETY_SECONDS)
    assert proc.returncode == STOPS[how][1], stderr
    assert_one_stop_line(stderr, how, f"good bytes kept in {out.parent / '.out.gz.partial'}")
    assert not wait_until_gone(mark)
    if how == "sigterm":  # what the line says holds: --resume completes the table
        assert_ran(run_command([*cmd[1:], "--resume"]))
        with gzip.open(out) as fh:
            assert sum(1 for _ in fh) == sum(1 for _ in resumable_table.open("rb"))


def workers_starting(mark: str) -> int:
    """How many processes of a run are spawned multiprocessing children (its workers and reader)."""
    return sum("spawn_main" in command for command in marked_processes(mark).values())


@pytest.mark.parametrize("how", sorted(STOPS))
def test_a_rescore_stopped_while_its_workers_start_says_one_line(tmp_path, model_file, long_table, how) -> None:
    """Stopped the moment its first worker process exists, while the others start: no child's
    traceback (a semaphore the parent removed as it ended, a Ctrl-C in a child's start-up), the one
    line, and no process left."""
    out = tmp_path / "out.gz"
    env, mark = marked_env()
    cmd = [*rescore_cmd(long_table, out, model_file)]
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs 2 CPUs: -j is cut to the CPUs, and one worker starts no pool")
    cmd[cmd.index("-j") + 1] = str(min(4, cpus))  # more would be cut to the CPUs, with a warning line
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    while proc.poll() is None and not workers_starting(mark):
        time.sleep(0.005)
    assert proc.poll() is None, proc.stderr.read()
    stop(proc, how)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == STOPS[how][1], stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == [
        line for line in stderr.splitlines() if f"stopped by {STOPS[how][2]}" in line], stderr
    assert not wait_until_gone(mark, 10)


def stop_when_said(cmd: list[str], said: str, how: str, tmp_path: Path) -> tuple[int, str]:
    """Run ``cmd``, stop it ``how`` as soon as its stderr holds a line matching ``said``, and return
    its exit status and stderr.

    ``said`` is a validation after an update: printed inside the training loop, so the stop lands
    there however slowly the run got to it (the first validation's line comes before the loop)."""
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stderr=err, start_new_session=True, preexec_fn=as_from_a_terminal)
        try:
            wait_until(lambda: re.search(said, log.read_text(), re.MULTILINE), f"line {said!r} on stderr",
                       proc=proc, poll=0.05)
        except AssertionError as exc:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{exc}\n{log.read_text()}") from None
        stop(proc, how)
        proc.wait(timeout=SAFETY_SECONDS)
    return proc.returncode, log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(STOPS))
def test_a_stopped_rescorer_training_says_resume_continues(tmp_path, how) -> None:
    model = tmp_path / "m.pt"
    cmd = [str(Path(sys.executable).parent / "rescorer"), "train",
           str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz")), str(model), "--max-steps", "1000000",
           "--valid-every", "1", "--patience", "1000000", "--hidden", "16", "--embedding", "8",
           "--maxout-units", "8", "--output-rank", "8", "--shortlist", "500", "--device", "cpu", "-q"]
    status, stderr = stop_when_said(cmd, r"^step [1-9]\d*: valid", how, tmp_path)
    assert status == STOPS[how][1], stderr
    assert_one_stop_line(stderr, how, f"kept in {model}.last")
    assert Path(f"{model}.last").exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", sorted(STOPS))
def test_a_stopped_cslm_training_says_resume_continues(tmp_path, how) -> None:
    corpus = tmp_path / "fr.txt"
    with gzip.open(shared_file("data/hansard/hansard.fr.gz"), "rt", encoding="utf-8") as fh:
        corpus.write_text("".join(itertools.islice(fh, 2000)), encoding="utf-8")
    model = tmp_path / "lm.pt"
    cmd = [str(Path(sys.executable).parent / "cslm"), "train", str(corpus), str(model), "--order", "3",
           "--embedding", "8", "--hidden", "16", "--shortlist", "500", "--max-epochs", "100000",
           "--epoch-size", "256", "--patience", "100000", "--device", "cpu", "-q"]
    status, stderr = stop_when_said(cmd, r"^epoch [1-9]\d*: valid", how, tmp_path)
    assert status == STOPS[how][1], stderr
    assert_one_stop_line(stderr, how, f"kept in {model}.last")
    assert Path(f"{model}.last").exists()
