"""A Table 1 work folder: its layout, its settings, and the stamps that make every step restartable.

Each step writes its outputs under the work folder atomically and then a stamp
``stamps/<step>.json`` with its wall time, summed over the step's attempts when it was
interrupted and resumed; a rerun skips every stamped step. Every tool call is
appended, command line first, to ``logs/<step>.log``; wall times also go to ``timings.tsv``, which
the report copies next to the table.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infrastructure import files
from infrastructure.errors import UserError
from infrastructure.files import atomic_path
from moses_integration.moses_ini import MosesIni
from table1.settings import SCALES, Configuration, RunPlan, ScaleSettings
from table1.system_training import MosesInstall, run_logged

STAMPS = "stamps"
TABLE2_KINDS = ("frequent", "rare")
SETTINGS_FILE = "settings.json"
#: The step that chooses ``proposals-both``'s rerank weights on dev (table1.systems.rerank_weights).
RERANK_STEP = "proposals-both/weights"
#: The stamp of the reranking experiment's models (table1.reranking_models); its other stamps
#: (lists, scores, tunings: table1.reranking) are all under ``reranking/`` too.
RERANKING_STEP = "reranking/models"
#: Settings that only some steps read, by the stamp of the step that reads them, or a stamp prefix
#: ending in ``/`` for several: until one of them has run, nothing was made with the setting, so a
#: folder takes on its current value (a folder made before the setting existed, or a value changed
#: before its step ran); after that, a change is refused like any other.
STEP_SETTINGS = {"proposals": "proposals", "rerank": RERANK_STEP, "reranking": "reranking/"}
TIMINGS_FILE = "timings.tsv"
#: Under ``stamps/``: the running steps' wall time so far (:class:`StepClock`), not stamps themselves.
RUNNING = "running"
#: How often a running step's wall time is saved: an attempt killed outright loses at most this.
HEARTBEAT_SECONDS = 60.0


class ExperimentError(UserError):
    """The pipeline cannot go on (missing input, a previous step not done, settings changed)."""


def say(message: str) -> None:
    print(f"[table1 {_dt.datetime.now(_dt.timezone.utc):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def write_json(path: Path, doc: object) -> None:
    """A work folder's record (settings, stamps, clocks), its folder made first; keys sorted, so that
    the same settings are the same bytes whatever order they were gathered in."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(path, doc, sort_keys=True)


@dataclass
class Experiment:
    """One work folder of the experiment and where its inputs and tools are."""

    work: Path
    settings: ScaleSettings
    data: Path | None = None
    moses_bin_dir: Path | None = None
    moses_home: Path | None = None
    jobs: int = 2
    device: str = "auto"
    python: str = sys.executable

    # -- layout -------------------------------------------------------------------------------
    def path(self, *parts: str) -> Path:
        return self.work.joinpath(*parts)

    @property
    def src(self) -> str:
        return self.settings.src_lang

    @property
    def tgt(self) -> str:
        return self.settings.tgt_lang

    def prepared(self, name: str, lang: str) -> Path:
        """``prepared/NAME.tok.tc.LANG``: the text the systems are trained and tuned on."""
        return self.path("prepared", f"{name}.tok.tc.{lang}")

    @property
    def train_corpus(self) -> Path:
        """The parallel text the Moses system and the RNN learn from (``CORPUS.LANG``): cleaned,
        then selected where the scale selects."""
        return self.path("prepared", "train.sel" if self.settings.selection else "train.clean")

    @property
    def lm_text(self) -> Path:
        """The target text of the n-gram LM and the CSLM (selected where the scale selects)."""
        selects = self.settings.selection is not None and self.settings.selection.lm_words is not None
        return self.path("prepared", f"lm.sel.{self.tgt}") if selects else self.prepared("lm", self.tgt)

    @property
    def rnn_ini(self) -> Path:
        """The 6-column system (filtered for dev+test) that every configuration tunes."""
        return self.path("rnn", "moses.ini")

    @property
    def cslm_model(self) -> Path:
        return self.path("cslm", "model.pt")

    @property
    def cslm_nplm(self) -> Path:
        """The CSLM in NPLM's format, for Moses' NeuralLM (``cslm export-nplm``)."""
        return self.path("cslm", "model.nplm")

    @property
    def cslm_ini(self) -> Path:
        """The 6-column system plus the CSLM in the decoder (weight 0 to start): the CSLM rows tune it."""
        return self.path("cslm", "moses.ini")

    def system_ini(self, system: str) -> Path:
        """A system's moses.ini, by its name (:attr:`Configuration.decoded_system`): each lives in
        the folder of the step that writes it, ``rnn``, ``rnn-both``, ``proposals``,
        ``proposals-both`` or ``cslm``."""
        return self.path(system, "moses.ini")

    @property
    def proposals_ini(self) -> Path:
        """The 7-column system whose table ``rescorer propose`` completed: the proposals rows tune it."""
        return self.system_ini("proposals")

    def proposals_list(self, system: str = "proposals") -> Path:
        """``rescorer propose --list`` of a proposals system: every proposal as kind, source, target,
        log p (and, reranked, log p(f|e) and the p(e|f) column's ln)."""
        return self.path(system, "proposals.tsv")

    @property
    def rnn_both_ini(self) -> Path:
        """The 7-column system whose table has the reverse RNN column too: the ``reverse`` rows tune it."""
        return self.system_ini("rnn-both")

    @property
    def reverse_model(self) -> Path:
        """The reverse model, p(f|e) (``rescorer train --reverse``), of the ``rnn-both`` step."""
        return self.path("rnn-both", "model.reverse.pt")

    @property
    def rerank_report(self) -> Path:
        """Every (λ, μ)'s figures on dev and the weights chosen for ``proposals-both`` (``rescorer rerank-weights``)."""
        return self.path("proposals-both", "rerank-weights.txt")

    def table_system(self, config: Configuration) -> Path:
        """The system whose phrase table a row decodes with (its columns; the CSLM rows add a feature)."""
        return self.system_ini(config.table_system)

    def tuned_system(self, plan: RunPlan) -> Path:
        """The moses.ini a run tunes: with the CSLM in the decoder where its row has it, with the
        completed table where it has proposals."""
        return self.system_ini(plan.config.decoded_system)

    def table2_path(self, kind: str) -> Path:
        """``rescorer compare``'s Markdown for the ``kind`` (frequent or rare) long source phrases."""
        return self.path("rnn", f"table2-{kind}.md")

    def tune_dir(self, plan: RunPlan) -> Path:
        return self.path("tune", plan.config.key, f"run{plan.run}")

    def eval_output(self, plan: RunPlan, split: str) -> Path:
        return self.path("eval", plan.config.key, f"run{plan.run}.{split}.tok")

    def moses(self) -> MosesInstall:
        return MosesInstall.locate(self.moses_bin_dir, self.moses_home)

    # -- stamps and settings --------------------------------------------------------------------
    def check_settings(self) -> None:
        """A work folder belongs to one scale: refuse to mix steps made with other settings."""
        path = self.path(SETTINGS_FILE)
        current = self.settings.to_json()
        if path.exists():
            before = json.loads(path.read_text(encoding="utf-8"))
            # a setting added since the folder was made, and off (None), changes nothing it holds
            _take_new_offs(before, current)
            # nor does one that only steps not run yet read: it is recorded now, and holds from here on
            taken = {k: v for k, v in current.items() if k in STEP_SETTINGS and not self.read_yet(STEP_SETTINGS[k])
                     and before.get(k) != json.loads(json.dumps(v))}
            if taken:
                before.update(json.loads(json.dumps(taken)))
                write_json(path, before)
            if before != json.loads(json.dumps(current)):
                changed = sorted(k for k in current if before.get(k) != json.loads(json.dumps(current[k])))
                raise ExperimentError(
                    f"{self.work} was made with other settings ({', '.join(changed)} differ, see {path}); "
                    "use another WORK folder"
                )
        else:
            write_json(path, current)

    def stamp_path(self, name: str) -> Path:
        return self.path(STAMPS, name.replace("/", "--") + ".json")

    def done(self, name: str) -> bool:
        return self.stamp_path(name).exists()

    def read_stamp(self, name: str) -> dict[str, object]:
        """What a finished step recorded in its stamp (its details, seconds, finished)."""
        if not self.done(name):
            raise ExperimentError(f"step {name} not done in {self.work}: run it first")
        return json.loads(self.stamp_path(name).read_text(encoding="utf-8"))

    def read_yet(self, stamp: str) -> bool:
        """Whether the step stamped ``stamp`` has run, or with a trailing ``/`` any step stamped under it."""
        if not stamp.endswith("/"):
            return self.done(stamp)
        prefix = self.stamp_path(stamp.rstrip("/")).stem + "--"  # "reranking/" -> reranking--*.json
        return any(self.path(STAMPS).glob(f"{prefix}*.json"))

    def clock_path(self, name: str) -> Path:
        """Where an unfinished step keeps its wall time so far (:class:`StepClock`)."""
        return self.path(STAMPS, RUNNING, self.stamp_path(name).name)

    def seconds_so_far(self, name: str) -> float:
        """The wall seconds an unfinished step's attempts have taken (0: never started, or finished)."""
        path = self.clock_path(name)
        return 0.0 if self.done(name) else StepClock.read(path)[1]

    def step(self, name: str, body: Callable[[], dict[str, object] | None]) -> bool:
        """Run ``body`` unless ``name`` is stamped; stamp it with its wall time. True if it ran.

        A long step (a training, a tuning run) is often interrupted and resumed across sessions;
        its wall time is then the sum of its attempts, which :class:`StepClock` keeps in
        ``stamps/running/``: the stamp says ``seconds`` over all attempts and how many there were.
        """
        stamp = self.stamp_path(name)
        clock_path = self.clock_path(name)
        if stamp.exists():
            info = json.loads(stamp.read_text(encoding="utf-8"))
            say(f"{name}: done already ({info.get('seconds', 0):.0f} s, {info.get('finished')}); skipped")
            StepClock.remove(clock_path)  # left by a run killed between the stamp and its clock's removal
            return False
        clock = StepClock(clock_path)
        say(f"{name}: starting" + (f" (attempt {clock.attempts}; {clock.earlier:.0f} s in the earlier ones)"
                                    if clock.attempts > 1 else ""))
        with clock:
            details = body() or {}
        this_attempt = clock.this_attempt
        seconds = clock.earlier + this_attempt
        finished = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        attempts = {"attempts": clock.attempts, "last_attempt_seconds": round(this_attempt, 1)} \
            if clock.attempts > 1 else {}
        write_json(stamp, {"step": name, "seconds": round(seconds, 1), "finished": finished, **attempts, **details})
        clock.forget()
        with open(self.path(TIMINGS_FILE), "a", encoding="utf-8") as fh:
            fh.write(f"{name}\t{seconds:.1f}\t{finished}\n")
        say(f"{name}: done in {seconds:.0f} s" + (f" over {clock.attempts} attempts" if clock.attempts > 1 else ""))
        return True

    def log_file(self, name: str) -> Path:
        path = self.path("logs", f"{name}.log")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def require(self, *names: str) -> None:
        missing = [n for n in names if not self.done(n)]
        if missing:
            raise ExperimentError(f"step(s) {', '.join(missing)} not done in {self.work}: run them first")

    def console(self, name: str) -> str:
        """A console script of this project, beside the running Python (its venv) or on PATH."""
        beside = Path(self.python).parent / name
        found = str(beside) if beside.exists() else shutil.which(name)
        if not found:
            raise ExperimentError(f"command {name!r} not found beside {self.python} or on PATH")
        return found



class StepClock:
    """The wall time of a step over all its attempts, kept in a small JSON file while it runs.

    While the step runs, a thread rewrites the file every :data:`HEARTBEAT_SECONDS` with the
    attempts so far and their seconds (the earlier attempts' and this one's until now); a failed
    attempt writes its final figure as it ends. An attempt killed outright (SIGKILL, the session's
    end) loses at most the last interval. The next attempt starts from the file's figures; the
    step's stamp gets their sum, and :meth:`forget` removes the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        attempts, self.earlier = self.read(path)
        self.attempts = attempts + 1
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._beating, name=f"clock {path.stem}", daemon=True)

    @staticmethod
    def read(path: Path) -> tuple[int, float]:
        """The attempts a clock file counts and their seconds ((0, 0.0) where there is none)."""
        earlier = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        return int(earlier.get("attempts", 0)), float(earlier.get("seconds", 0.0))

    @property
    def this_attempt(self) -> float:
        return time.monotonic() - self.started

    def write(self) -> None:
        write_json(self.path, {"attempts": self.attempts, "seconds": round(self.earlier + self.this_attempt, 1)})

    def _beating(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self.write()

    def __enter__(self) -> StepClock:
        self.write()
        self._beat.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._stop.set()
        self._beat.join()
        if exc_type is not None:
            self.write()  # a failed attempt's time counts for the next

    def forget(self) -> None:
        """Remove the file once the step is stamped, and its folder when no other step is running."""
        self.remove(self.path)

    @staticmethod
    def remove(path: Path) -> None:
        """Remove a step's clock file, if any, and its folder when no other step is running."""
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()


def _take_new_offs(before: dict, current: dict) -> None:
    """Give ``before`` (a folder's recorded settings) each setting of ``current`` it lacks whose value is None
    (off), at any depth: a field added to a group of settings since the folder was made, and off, changes
    nothing the folder holds."""
    for key, value in current.items():
        if value is None and key not in before:
            before[key] = None
        elif isinstance(value, dict) and isinstance(before.get(key), dict):
            _take_new_offs(before[key], value)


def run_tool(command: list, log: Path, stdout: Path | None = None) -> dict[str, object]:
    """Run one of the project's commands as a step body; its log is ``log``. With ``stdout``, the
    command's output is kept there, through the project's atomic write: only a command that
    succeeds puts it in place, and a killed one leaves no half-written file beside it."""
    if stdout is None:
        seconds = run_logged(command, log)
    else:
        with atomic_path(stdout) as partial:
            seconds = run_logged(command, log, stdout=partial)
    return {"command": " ".join(map(str, command)), "tool_seconds": round(seconds, 1)}


def single_phrase_table(ini_path: Path) -> tuple[str, str, int]:
    """(feature name, path, number of scores) of the one phrase table of a moses.ini."""
    tables = MosesIni.read(ini_path).phrase_tables()
    if len(tables) != 1 or tables[0].path is None or tables[0].num_features is None:
        raise ExperimentError(f"{ini_path}: expected exactly one phrase table with path= and num-features=")
    return tables[0].name, tables[0].path, tables[0].num_features


def new_experiment(work: str | os.PathLike[str], scale: str, **kwargs: object) -> Experiment:
    """The experiment in ``work`` at ``scale``, with nothing written yet (see :func:`open_work`)."""
    if scale not in SCALES:
        raise ExperimentError(f"SCALE={scale}: expected one of {', '.join(SCALES)}")
    resolved = Path(work).resolve()
    check_outside_source_tree(resolved)
    return Experiment(work=resolved, settings=SCALES[scale], **kwargs)  # type: ignore[arg-type]


#: The project's source tree, when this code runs from one (a checkout, or an editable install of it).
SOURCE_TREE = Path(__file__).resolve().parents[1]


def check_outside_source_tree(work: Path) -> None:
    """Refuse a work folder inside the project's source tree: a run keeps gigabytes there (corpora, tables,
    n-best lists, models) that git then lists, a clean clone lacks, and ``make`` or CI copies around; a kept
    work folder lives beside the clone (``make``'s default, ``../table1-work``)."""
    if (SOURCE_TREE / "pyproject.toml").is_file() and work.is_relative_to(SOURCE_TREE):
        raise ExperimentError(f"--work {work} is inside the source tree {SOURCE_TREE}: give a folder outside it "
                              "(make's default is ../table1-work)")


def open_work(exp: Experiment) -> None:
    """Make the work folder and record (or check) its settings: the first write of a run."""
    exp.work.mkdir(parents=True, exist_ok=True)
    exp.check_settings()
