"""The Table 1 pipeline: raw text to four tuned systems, one restartable step at a time.

Each step (``data``, ``prepare``, ``baseline``, ``rnn``, ``cslm``, ``tune``, ``eval``) writes its
outputs under the work folder atomically and then a stamp ``stamps/<step>.json`` with its wall
time; a rerun skips every stamped step, and long steps (model training, tuning runs) resume
inside themselves. So ``make table1`` can be interrupted at any point and simply run again,
in a later session if need be. ``tune`` and ``eval`` stamp each configuration's run separately:
the CSLM rows can be added later without redoing Baseline and +RNN.

Every tool call is appended, command line first, to ``logs/<step>.log``; wall times also go to
``timings.tsv``, which the report copies next to the table.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mert.evaluate import decode_test_set
from mert.features import read_sidecar
from mert.tune import read_state
from moses_integration.decoder import decode
from moses_integration.files import atomic_output
from moses_integration.lines import text_lines
from moses_integration.moses_ini import MosesIni
from moses_integration.nplm import neural_lm_feature_line
from table1 import wmt14
from table1.analysis import analysis_document, column_leverage, tuning_trajectory
from table1.data_selection import SelectionSettings, select_lines
from table1.report import TunedRun, build_table, score_runs, write_report
from table1.settings import SCALES, Configuration, RunPlan, ScaleSettings, SelectionBudget, TextSlice
from table1.system_training import (
    MosesInstall,
    build_language_model,
    eflomal_align,
    filter_for_input,
    run_logged,
    symmetrize,
    train_model_command,
)
from table1.text_prep import (
    CleanRules,
    clean_corpus_files,
    tokenize_lines,
    train_truecaser,
    truecase_lines,
    write_text_lines,
)

STAMPS = "stamps"
TABLE2_KINDS = ("frequent", "rare")
SETTINGS_FILE = "settings.json"
TIMINGS_FILE = "timings.tsv"


class ExperimentError(RuntimeError):
    """The pipeline cannot go on (missing input, a previous step not done, settings changed)."""


def _log(message: str) -> None:
    print(f"[table1 {_dt.datetime.now(_dt.timezone.utc):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def _write_json(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as fh:
        fh.write((json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"))


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
        return self.path("prepared", f"lm.sel.{self.tgt}") if self.settings.selection else self.prepared("lm", self.tgt)

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

    def tuned_system(self, plan: RunPlan) -> Path:
        """The moses.ini a run tunes: with the CSLM in the decoder where its row has it."""
        return self.cslm_ini if plan.config.cslm_in_search else self.rnn_ini

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
            before.update({k: None for k, v in current.items() if v is None and k not in before})
            if before != json.loads(json.dumps(current)):
                changed = sorted(k for k in current if before.get(k) != json.loads(json.dumps(current[k])))
                raise ExperimentError(
                    f"{self.work} was made with other settings ({', '.join(changed)} differ, see {path}); "
                    "use another WORK folder"
                )
        else:
            _write_json(path, current)

    def stamp_path(self, name: str) -> Path:
        return self.path(STAMPS, name.replace("/", "--") + ".json")

    def done(self, name: str) -> bool:
        return self.stamp_path(name).exists()

    def step(self, name: str, body: Callable[[], dict[str, object] | None]) -> bool:
        """Run ``body`` unless ``name`` is stamped; stamp it with its wall time. True if it ran."""
        stamp = self.stamp_path(name)
        if stamp.exists():
            info = json.loads(stamp.read_text(encoding="utf-8"))
            _log(f"{name}: done already ({info.get('seconds', 0):.0f} s, {info.get('finished')}); skipped")
            return False
        _log(f"{name}: starting")
        started = time.perf_counter()
        details = body() or {}
        seconds = time.perf_counter() - started
        finished = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        _write_json(stamp, {"step": name, "seconds": round(seconds, 1), "finished": finished, **details})
        with open(self.path(TIMINGS_FILE), "a", encoding="utf-8") as fh:
            fh.write(f"{name}\t{seconds:.1f}\t{finished}\n")
        _log(f"{name}: done in {seconds:.0f} s")
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


# --------------------------------------------------------------------------------------------
# data: the raw text slices


def _slice_lines(data: Path, piece: TextSlice, lang: str):
    path = data / piece.path.format(lang=lang)
    if not path.exists():
        raise ExperimentError(f"missing input {path} (see README, 'The experiment', for the expected files)")
    return text_lines(path, first=piece.first, last=piece.last)


def _write_slices(data: Path, pieces: list[TextSlice], lang: str, out: Path) -> int:
    def lines():
        for piece in pieces:
            yield from _slice_lines(data, piece, lang)

    return write_text_lines(out, lines())


def _data_parts(exp: Experiment) -> list[tuple[str, list[TextSlice], tuple[str, ...]]]:
    """``(raw file stem, slices, languages)`` of every text the scale reads from ``DATA``."""
    s, both = exp.settings, (exp.src, exp.tgt)
    return [("train", s.train, both), ("dev", s.dev, both), ("test", [s.test], both),
            ("lm", s.lm, (exp.tgt,)), ("lm-valid", [s.lm_valid], (exp.tgt,))]


def missing_inputs(exp: Experiment) -> list[str]:
    """The files of ``DATA`` (relative paths) that the scale reads and that are not there."""
    assert exp.data is not None
    wanted = {piece.path.format(lang=lang) for _, pieces, langs in _data_parts(exp) for piece in pieces
              for lang in langs}
    return sorted(p for p in wanted if not (exp.data / p).exists())


def step_data(exp: Experiment, mirror: str = wmt14.STATMT) -> None:
    """Copy the slices the scale names from ``DATA`` into ``raw/`` (untokenised text).

    Files of the WMT'14 data that ``DATA`` lacks are fetched first from their official sources
    (:mod:`table1.wmt14`; ``mirror`` stands for ``https://www.statmt.org/``); any other missing
    file is an error that names it.
    """
    if exp.data is None:
        raise ExperimentError("give DATA= (the folder of the raw text; SCALE=small: ../shared/data)")

    def body() -> dict[str, object]:
        missing = missing_inputs(exp)
        fetched: dict[str, object] = {}
        if missing:
            if not all(wmt14.provides(p) for p in missing):
                raise ExperimentError(f"missing input(s) in {exp.data}: {', '.join(missing)} (see README, "
                                      "'The experiment', for the expected files)")
            _log(f"data: fetching {', '.join(missing)} into {exp.data}")
            try:
                fetched = wmt14.fetch(exp.data, missing, mirror=mirror)  # type: ignore[arg-type]
            except wmt14.DataFetchError as exc:
                raise ExperimentError(str(exc)) from exc
        raw = exp.path("raw")
        raw.mkdir(parents=True, exist_ok=True)
        counts: dict[str, int] = {}
        for name, pieces, langs in _data_parts(exp):
            for lang in langs:
                counts[f"{name}.{lang}"] = _write_slices(exp.data, pieces, lang, raw / f"{name}.{lang}")  # type: ignore[arg-type]
        for name in ("train", "dev", "test"):
            if counts[f"{name}.{exp.src}"] != counts[f"{name}.{exp.tgt}"]:
                raise ExperimentError(f"{name}: {counts[f'{name}.{exp.src}']} {exp.src} lines but "
                                      f"{counts[f'{name}.{exp.tgt}']} {exp.tgt} lines")
        return {"lines": counts, **({"fetched": fetched} if fetched else {})}

    exp.step("data", body)


# --------------------------------------------------------------------------------------------
# prepare: tokenise, truecase, clean


def step_prepare(exp: Experiment) -> None:
    """Moses' preprocessing: tokenise (escaped), truecaser trained on the training side, clean."""
    exp.require("data")
    raw, prep = exp.path("raw"), exp.path("prepared")
    prep.mkdir(parents=True, exist_ok=True)
    sets = {exp.src: ("train", "dev", "test"), exp.tgt: ("train", "dev", "test", "lm", "lm-valid")}

    for lang, names in sets.items():
        for name in names:
            exp.step(f"prepare/tokenize.{name}.{lang}", lambda n=name, lg=lang: {"lines": write_text_lines(
                prep / f"{n}.tok.{lg}", tokenize_lines(text_lines(raw / f"{n}.{lg}"), lg, jobs=exp.jobs))})
        exp.step(f"prepare/truecaser.{lang}",
                 lambda lg=lang: train_truecaser(prep / f"train.tok.{lg}", prep / f"truecase-model.{lg}"))
        for name in names:
            exp.step(f"prepare/truecase.{name}.{lang}", lambda n=name, lg=lang: {"lines": write_text_lines(
                exp.prepared(n, lg), truecase_lines(text_lines(prep / f"{n}.tok.{lg}"),
                                                    prep / f"truecase-model.{lg}", jobs=exp.jobs))})

    def clean() -> dict[str, object]:
        read, kept = clean_corpus_files(
            exp.prepared("train", exp.src), exp.prepared("train", exp.tgt),
            prep / f"train.clean.{exp.src}", prep / f"train.clean.{exp.tgt}",
            CleanRules(min_words=1, max_words=exp.settings.max_sentence_words),
        )
        return {"pairs_read": read, "pairs_kept": kept}

    exp.step("prepare/clean", clean)
    if exp.settings.selection:
        select_training_text(exp, exp.settings.selection)
    exp.step("prepare", lambda: None)


def select_training_text(exp: Experiment, budget: SelectionBudget) -> None:
    """The paper's data selection: the bitext by Axelrod et al.'s bilingual cross-entropy
    difference, the LM text by Moore & Lewis', both against the dev set (newstest2012+2013)."""

    prep, log = exp.path("prepared"), exp.log_file("selection")
    settings = SelectionSettings(order=budget.order, min_count=budget.min_count)
    langs = (exp.src, exp.tgt)
    exp.step("prepare/select-train", lambda: select_lines(
        exp.moses(), [prep / f"train.clean.{lg}" for lg in langs], [exp.prepared("dev", lg) for lg in langs],
        [Path(f"{exp.train_corpus}.{lg}") for lg in langs], budget.train_words, prep / "selection-train", log,
        settings, progress=_log).to_json())
    exp.step("prepare/select-lm", lambda: select_lines(
        exp.moses(), [exp.prepared("lm", exp.tgt)], [exp.prepared("dev", exp.tgt)], [exp.lm_text], budget.lm_words,
        prep / "selection-lm", log, settings, progress=_log).to_json())


# --------------------------------------------------------------------------------------------
# baseline: alignment, LM, train-model.perl, filtering


def step_baseline(exp: Experiment, aligner: str = "auto") -> None:
    """A Moses system with ``train-model.perl``'s defaults, and its tables filtered for dev+test."""
    exp.require("prepare")
    base, prep = exp.path("baseline"), exp.path("prepared")
    corpus = exp.train_corpus
    log = exp.log_file("baseline")
    if aligner == "auto":
        aligner = "giza" if exp.moses().has_giza() else "eflomal"
    if aligner not in ("giza", "eflomal"):
        raise ExperimentError(f"ALIGNER={aligner}: expected giza, eflomal or auto")
    gdfa = base / "model" / "aligned.grow-diag-final-and"
    src_text, tgt_text = Path(f"{corpus}.{exp.src}"), Path(f"{corpus}.{exp.tgt}")
    if aligner == "eflomal":
        align = base / "align"

        def run_eflomal() -> None:
            align.mkdir(parents=True, exist_ok=True)
            fwd, rev = align / "fwd.partial", align / "rev.partial"
            eflomal_align(src_text, tgt_text, fwd, rev, log)
            os.replace(fwd, align / f"fwd.{exp.src}-{exp.tgt}")
            os.replace(rev, align / f"rev.{exp.src}-{exp.tgt}")

        exp.step("baseline/eflomal", run_eflomal)

        def run_symal() -> None:
            gdfa.parent.mkdir(parents=True, exist_ok=True)
            symmetrize(exp.moses(), src_text, tgt_text, align / f"fwd.{exp.src}-{exp.tgt}",
                       align / f"rev.{exp.src}-{exp.tgt}", gdfa, log)

        exp.step("baseline/symal-gdfa", run_symal)

    lm = base / "lm" / f"lm.{exp.tgt}.binary"
    s = exp.settings
    exp.step("baseline/lm", lambda: {"seconds_tools": build_language_model(
        exp.moses(), exp.lm_text, lm, base / "lm" / "tmp", log,
        order=s.lm_order, prune=s.lm_prune, memory=s.lm_memory)})

    def train_model() -> None:
        model = base / "model"
        for leftover in ("moses.ini", "phrase-table.gz"):
            (model / leftover).unlink(missing_ok=True)
        moses = exp.moses()
        command = train_model_command(moses, base, corpus, exp.src, exp.tgt, lm, lm_order=s.lm_order, jobs=exp.jobs,
                                      first_step=1 if aligner == "giza" else 4)
        run_logged(command, log, cwd=base)
        if not (model / "moses.ini").exists():
            raise ExperimentError(f"train-model.perl wrote no {model / 'moses.ini'}; see {log}")

    exp.step("baseline/train-model", train_model)

    def filtered() -> None:
        devtest = prep / f"devtest.tok.tc.{exp.src}"
        write_text_lines(devtest, (line for name in ("dev", "test")
                                   for line in text_lines(exp.prepared(name, exp.src))))
        filter_for_input(exp.moses(), base / "model" / "moses.ini", devtest, base / "filtered", log)

    exp.step("baseline/filter", filtered)
    exp.step("baseline", lambda: {"aligner": aligner})


def _tool(command: list, log: Path, stdout: Path | None = None) -> dict[str, object]:
    """Run one of the project's commands as a step body; its log is ``log``. With ``stdout``, the
    command's output is kept there (renamed into place only when the command succeeds)."""
    partial = None if stdout is None else stdout.with_name(stdout.name + ".partial")
    seconds = run_logged(command, log, stdout=partial)
    if partial is not None:
        partial.replace(stdout)
    return {"command": " ".join(map(str, command)), "tool_seconds": round(seconds, 1)}


def single_phrase_table(ini_path: Path) -> tuple[str, str, int]:
    """(feature name, path, number of scores) of the one phrase table of a moses.ini."""
    tables = MosesIni.read(ini_path).phrase_tables()
    if len(tables) != 1 or tables[0].path is None or tables[0].num_features is None:
        raise ExperimentError(f"{ini_path}: expected exactly one phrase table with path= and num-features=")
    return tables[0].name, tables[0].path, tables[0].num_features


# --------------------------------------------------------------------------------------------
# rnn: train on the full table, score the filtered one


def step_rnn(exp: Experiment) -> None:
    """``rescorer train`` on the baseline's full table, then ``rescore-phrase-table`` on the filtered one."""
    exp.require("baseline")
    r = exp.settings.rnn
    out = exp.path("rnn")
    out.mkdir(parents=True, exist_ok=True)
    log = exp.log_file("rnn")
    model = out / "model.pt"
    full_table = exp.path("baseline", "model", "phrase-table.gz")
    sizes = ["--hidden", str(r.hidden), "--embedding", str(r.embedding), "--maxout-units", str(r.maxout_units),
             "--output-rank", str(r.output_rank), "--shortlist", str(r.shortlist), "--init-std", str(r.init_std)]
    exp.step("rnn/train", lambda: _tool(
        [exp.console("rescorer"), "train", full_table, model, *sizes, "--max-time", str(r.max_time),
         # shortlists: the most frequent words of the training text, as in the paper
         "--vocab-corpus-src", f"{exp.train_corpus}.{exp.src}",
         "--vocab-corpus-tgt", f"{exp.train_corpus}.{exp.tgt}",
         "--patience", str(r.patience), "--device", exp.device, "--resume", "--quiet"], log))

    filtered_ini = exp.path("baseline", "filtered", "moses.ini")
    _, table, _ = single_phrase_table(filtered_ini)
    table = str(filtered_ini.parent / table)  # an absolute path= stays as it is
    exp.step("rnn/rescore", lambda: _tool(
        [exp.console("rescore-phrase-table"), table, out / "phrase-table.rnn.gz", "--model", model,
         "--moses-ini", filtered_ini, "--moses-ini-out", exp.rnn_ini, "--device", exp.device, "--resume",
         "--workers", str(exp.jobs), "--quiet"], log))
    for kind in TABLE2_KINDS:  # the paper's Table 2, which its argument for the RNN rests on
        exp.step(f"rnn/compare-{kind}", lambda k=kind: _tool(
            [exp.console("rescorer"), "compare", model, full_table, f"--{k}", "--device", exp.device, "--quiet"],
            log, exp.table2_path(k)))
    exp.step("rnn", lambda: None)


# --------------------------------------------------------------------------------------------
# cslm: the continuous-space LM on the LM text


def step_cslm(exp: Experiment) -> None:
    """``cslm train`` (self-normalised) on the prepared LM text, early-stopped on held-out
    news text, then ``export-nplm`` for the decoder."""
    exp.require("prepare")
    c = exp.settings.cslm
    exp.cslm_model.parent.mkdir(parents=True, exist_ok=True)
    exp.step("cslm", lambda: _tool(
        [exp.console("cslm"), "train", exp.lm_text, exp.cslm_model,
         "--valid", exp.prepared("lm-valid", exp.tgt), "--max-time", str(c.max_time), "--embedding", str(c.embedding),
         "--hidden", ",".join(map(str, c.hidden)), "--shortlist", str(c.shortlist),
         "--self-normalize", str(c.self_normalize), "--device", exp.device,
         "--threads", str(exp.jobs), "--resume", "--quiet"], exp.log_file("cslm")))
    exp.step("cslm/export", lambda: _tool(
        [exp.console("cslm"), "export-nplm", exp.cslm_model, exp.cslm_nplm], exp.log_file("cslm")))


def cslm_system(exp: Experiment) -> Path:
    """The CSLM rows' moses.ini, written once (stamped ``cslm/ini``) from the exported CSLM."""
    exp.require("cslm", "cslm/export")
    exp.step("cslm/ini", lambda: write_cslm_ini(exp))
    return exp.cslm_ini


def write_cslm_ini(exp: Experiment) -> None:
    """The CSLM rows' system: the 6-column ini plus ``NeuralLM name=CSLM0`` at weight 0 (the start
    is the + RNN system, as for every extra column)."""
    ini = MosesIni.read(exp.rnn_ini)
    ini.add_feature(neural_lm_feature_line(exp.cslm_nplm, "CSLM0"), [0.0])
    ini.write(exp.cslm_ini)


# --------------------------------------------------------------------------------------------
# speed: how fast each system decodes, measured before the tuning runs are sized by it

#: Dev sentences decoded (1 thread, the tuning n-best size) to measure each system's speed.
SPEED_SENTENCES = 40


def step_speed(exp: Experiment, configs: list[Configuration]) -> None:
    """Decoding speed of the systems the chosen rows tune: the 6-column system, and with the CSLM
    in the decoder where a row has it. One thread, the first dev sentences, n-best lists as in
    tuning; Moses' loading time is measured apart (on an empty input), since every MERT iteration
    and every evaluation starts the decoder again. The report turns these into the budget."""
    exp.require("rnn")
    systems = {"rnn": exp.rnn_ini}
    if any(c.cslm_in_search for c in configs):
        systems["cslm"] = cslm_system(exp)
    for name, ini in systems.items():
        exp.step(f"speed/{name}", lambda n=name, i=ini: measure_decoding(exp, n, i))


def measure_decoding(exp: Experiment, name: str, ini: Path) -> dict[str, object]:
    folder = exp.path("speed")
    folder.mkdir(parents=True, exist_ok=True)
    empty, head = folder / "empty.txt", folder / f"dev-head.{exp.src}"
    empty.write_text("", encoding="utf-8")
    sentences = write_text_lines(head, itertools.islice(text_lines(exp.prepared("dev", exp.src)), SPEED_SENTENCES))
    timed = {}
    for label, source in (("load", empty), ("decode", head)):
        started = time.perf_counter()
        decode(exp.moses().bin_dir, ini, source, folder / f"{name}.{label}.out", nbest_path=folder / f"{name}.nbest",
               nbest_size=exp.settings.nbest_size, threads=1)
        timed[label] = time.perf_counter() - started
    per_sentence = max(timed["decode"] - timed["load"], 0.0) / sentences
    return {"sentences": sentences, "load_seconds": round(timed["load"], 2),
            "seconds_per_sentence": round(per_sentence, 4)}


def budget_notes(exp: Experiment, configs: list[Configuration], runs: int) -> list[str]:
    """The tuning budget from the measured speeds: decoding time of one MERT iteration and of a row's
    runs at the iteration cap, with ``jobs`` decoder threads (optimisation time not counted)."""
    measured = [(c, "cslm" if c.cslm_in_search else "rnn") for c in configs]
    measured = [(c, system) for c, system in measured if exp.done(f"speed/{system}")]
    if not measured:
        return []
    dev = sum(1 for _ in text_lines(exp.prepared("dev", exp.src)))
    test = sum(1 for _ in text_lines(exp.prepared("test", exp.src)))
    notes = []
    for config, system in measured:
        speed = json.loads(exp.stamp_path(f"speed/{system}").read_text(encoding="utf-8"))
        per_iteration = speed["load_seconds"] + dev * speed["seconds_per_sentence"] / exp.jobs
        cap = exp.settings.tune_max_iterations
        evaluation = 2 * speed["load_seconds"] + (dev + test) * speed["seconds_per_sentence"] / exp.jobs
        notes.append(
            f"Budget, {config.label}: {speed['seconds_per_sentence']:.3f} s per dev sentence on 1 thread and "
            f"{speed['load_seconds']:.0f} s to load (measured on {speed['sentences']} sentences); one MERT "
            f"iteration decodes {dev} sentences with {exp.jobs} threads in ~{per_iteration / 60:.1f} min, so "
            f"{runs} runs at the {cap}-iteration cap take ≤ {runs * cap * per_iteration / 3600:.1f} h of decoding, "
            f"and their dev + test evaluation ({dev} + {test} sentences) {runs * evaluation / 3600:.1f} h.")
    return notes


# --------------------------------------------------------------------------------------------
# tune: every configuration, RUNS times


def tune_command(exp: Experiment, plan: RunPlan) -> list[str]:
    """The ``mert tune`` call of one run: 6-column system, columns outside the row fixed at 0."""
    table_feature, _, num_scores = single_phrase_table(exp.rnn_ini)
    s = exp.settings
    command = [
        exp.console("mert"), "tune", "--moses-ini", str(exp.tuned_system(plan)),
        "--src", str(exp.prepared("dev", exp.src)), "--ref", str(exp.prepared("dev", exp.tgt)),
        "--work-dir", str(exp.tune_dir(plan)), "--threads", str(exp.jobs), "--seed", str(plan.seed),
        "--max-iterations", str(s.tune_max_iterations), "--nbest-size", str(s.nbest_size),
        "--restarts", str(s.restarts), "--continue",
    ]
    command += ["--moses-bin-dir", str(exp.moses().bin_dir)]
    for column in plan.config.fixed_columns(table_feature, num_scores):
        command += ["--fixed", column]
    for spec in plan.config.feature_specs(str(exp.cslm_model)):
        command += ["--feature", spec]
    return command


def check_start_weights(exp: Experiment, config: Configuration) -> None:
    """Fixed columns stay at their start weight: it must be 0, or Baseline is not the original system."""
    table_feature, _, num_scores = single_phrase_table(exp.rnn_ini)
    weights = MosesIni.read(exp.rnn_ini).weights().get(table_feature, [])
    for column in config.fixed_columns(table_feature, num_scores):
        value = weights[int(column.rsplit("_", 1)[1])]
        if value != 0.0:
            raise ExperimentError(f"{exp.rnn_ini}: {column} starts at {value}, but {config.label} holds it fixed; "
                                  "its start weight must be 0 (rescore-phrase-table --rnn-weight 0 --wp-weight 0)")


def tuned_seed(exp: Experiment, plan: RunPlan) -> int | None:
    """The seed a run was tuned with, from its tuning state (None: not started)."""

    return state_seed(read_state(exp.tune_dir(plan)) or {})


def state_seed(state: dict[str, object]) -> int | None:
    """``mert tune``'s seed as its tuning state records it (None: no state, or random seeds)."""
    fingerprint = state.get("fingerprint")
    seed = fingerprint.get("seed") if isinstance(fingerprint, dict) else None
    return seed if isinstance(seed, int) else None


def check_run_current(exp: Experiment, plan: RunPlan) -> None:
    """Refuse to reuse a run made under other rules: tuned with another seed (work folders from
    before run seeds became 1000, 1001, ...), or decoded before its tuning last finished.

    Nothing is removed: the message says what to move aside so that the run is done again.
    """
    name = f"tune/{plan.name}"
    evals = [f"eval/{plan.name}/{split}" for split in ("dev", "test")]
    stamps = ", ".join(exp.stamp_path(n).name for n in (name, *evals))
    aside = f"move {exp.tune_dir(plan)} and the stamps {stamps} (in {exp.path(STAMPS)}) aside"
    seed = tuned_seed(exp, plan)
    if seed is not None and seed != plan.seed:
        raise ExperimentError(f"{exp.tune_dir(plan)}: tuned with seed {seed}, but run {plan.run} is tuned with seed "
                              f"{plan.seed} now (run seeds 1000 k shared restart points across iterations); "
                              f"{aside} to tune it again")
    if not exp.done(name):
        return
    tuned = _stamp_finished(exp, name)
    for ev in evals:
        if exp.done(ev) and _stamp_finished(exp, ev) < tuned:
            raise ExperimentError(f"{exp.stamp_path(ev)}: decoded before {name} last finished ({tuned}); "
                                  f"move that stamp aside to decode the tuned system again")


def _stamp_finished(exp: Experiment, name: str) -> str:
    """When a step finished (ISO 8601 UTC, as stamped: compares as text)."""
    return str(json.loads(exp.stamp_path(name).read_text(encoding="utf-8")).get("finished", ""))


def step_tune(exp: Experiment, configs: list[Configuration], runs: int) -> None:
    """Tune each configuration ``runs`` times (seeds 1000, 1001, ...); each run resumes by itself."""
    exp.require("rnn")
    for config in configs:
        if config.cslm_nbest:
            exp.require("cslm", "cslm/export")
        elif config.cslm_in_search:
            cslm_system(exp)
        for k in range(1, runs + 1):
            plan = RunPlan(config, k)
            check_run_current(exp, plan)
            if not exp.done(f"tune/{plan.name}"):  # finished runs are kept whatever the ini says now
                check_start_weights(exp, config)
            exp.tune_dir(plan).parent.mkdir(parents=True, exist_ok=True)
            exp.step(f"tune/{plan.name}", lambda p=plan: _tool(
                tune_command(exp, p), exp.log_file(f"tune-{p.config.key}-run{p.run}")))


# --------------------------------------------------------------------------------------------
# eval: decode dev and test with every tuned system


def step_eval(exp: Experiment, configs: list[Configuration], runs: int) -> None:
    """Decode dev and test with each tuned config (the CSLM in the decoder, or by n-best rescoring)."""

    for config in configs:
        for k in range(1, runs + 1):
            plan = RunPlan(config, k)
            exp.require(f"tune/{plan.name}")
            check_run_current(exp, plan)
            for split in ("dev", "test"):
                exp.step(f"eval/{plan.name}/{split}", lambda p=plan, sp=split: decode_test_set(
                    exp.tune_dir(p) / "moses.ini", exp.prepared(sp, exp.src), exp.eval_output(p, sp),
                    moses_bin_dir=exp.moses().bin_dir, threads=exp.jobs, nbest_size=exp.settings.nbest_size,
                    keep_nbest=True,
                ) and {"output": str(exp.eval_output(p, sp))})


def load_experiment(work: str | os.PathLike[str], scale: str, **kwargs: object) -> Experiment:
    if scale not in SCALES:
        raise ExperimentError(f"SCALE={scale}: expected one of {', '.join(SCALES)}")
    exp = Experiment(work=Path(work).resolve(), settings=SCALES[scale], **kwargs)  # type: ignore[arg-type]
    exp.work.mkdir(parents=True, exist_ok=True)
    exp.check_settings()
    return exp



# --------------------------------------------------------------------------------------------
# table1: the report


def run_weights(tuned_ini: Path) -> dict[str, list[float]]:
    """The tuned weights of a run: moses.ini's tuneable ones plus the extra n-best features'."""

    weights = dict(MosesIni.read(tuned_ini).weights())
    weights.pop("UnknownWordPenalty0", None)
    weights.update({e.name: list(e.weights) for e in read_sidecar(tuned_ini)})
    return weights


def step_timings(exp: Experiment) -> dict[str, float]:
    """Wall seconds of each stamped step, plus ``STEP (total)`` summing a step's parts."""
    timings: dict[str, float] = {}
    for stamp in sorted(exp.path(STAMPS).glob("*.json")):
        info = json.loads(stamp.read_text(encoding="utf-8"))
        timings[info["step"]] = float(info["seconds"])
    totals: dict[str, float] = {}
    for name, seconds in timings.items():
        top = name.split("/", 1)[0]
        totals[f"{top} (total)"] = totals.get(f"{top} (total)", 0.0) + seconds
    return {**timings, **{k: round(v, 1) for k, v in totals.items()}}


def training_notes(exp: Experiment) -> list[str]:
    """What the RNN and CSLM trainings reached, from the last lines their logs hold (the report
    states it beside the BLEU scores: a weak model explains a small gain)."""
    wanted = {
        "rnn": ("RNN training", (r"trained \d+ steps ", r"step \d+: valid ")),
        "cslm": ("CSLM training", (r"stopped by ", r"epoch \d+: valid perplexity ")),
    }
    notes = []
    for name, (label, patterns) in wanted.items():
        log = exp.path("logs", f"{name}.log")
        if not log.exists():
            continue
        last: dict[str, str] = {}
        # Progress bars (older runs logged them) end their updates with \r, not \n.
        for line in re.split(r"[\r\n]+", log.read_text(encoding="utf-8", errors="replace")):
            for pattern in patterns:
                if re.match(pattern, line):
                    last[pattern] = line.strip()
        found = [last[p] for p in patterns if p in last]
        if found:
            notes.append(f"{label}: " + "; last validation: ".join(found) + ".")
    return notes


def leverage_document(exp: Experiment, collected: list, table_feature: str, ini: MosesIni) -> dict[str, object]:
    """Per run: dev BLEU of its n-best pool, and what each of its row's columns (and, for scale,
    p(e|f) and the n-gram LM) moves there (:func:`table1.analysis.column_leverage`)."""

    num_scores = len(ini.weights()[table_feature])
    lm = next((name for name in ini.weights() if name.startswith("LM")), "LM0")
    labels = {f"{table_feature}_{num_scores - 2}": "p_RNN", f"{table_feature}_{num_scores - 1}": "WP",
              "CSLM0_0": "CSLM", f"{table_feature}_2": "p(e|f)", f"{lm}_0": "n-gram LM"}
    keys = list(labels)
    runs: dict[str, list[dict[str, object]]] = {}
    for config, found in collected:
        chosen = [keys[0]] * config.rnn + [keys[1]] * config.wp + [keys[2]] * config.cslm + keys[3:]
        for tuned in found:
            lists = sorted(exp.tune_dir(RunPlan(config, tuned.run)).glob("run*.nbest.gz"),
                           key=lambda p: int(p.name[3:].split(".", 1)[0]))
            if not lists:
                continue
            pool, columns = column_leverage(lists, [exp.prepared("dev", exp.tgt)], tuned.weights, chosen)
            entry: dict[str, object] = {"run": tuned.run, "pool_bleu": pool, "columns": [c.__dict__ for c in columns]}
            test_nbest = tuned.test_output.with_name(tuned.test_output.name + ".nbest.gz")
            if test_nbest.exists():  # the same on the test set's n-best list, decoded with the tuned weights
                test_pool, test_columns = column_leverage([test_nbest], [exp.prepared("test", exp.tgt)],
                                                          tuned.weights, chosen)
                entry["test"] = {"pool_bleu": test_pool, "columns": [c.__dict__ for c in test_columns]}
            runs.setdefault(config.label, []).append(entry)
    return {"labels": labels, "runs": runs}


def step_report(
    exp: Experiment, configs: list[Configuration], runs: int, out_dir: Path, command: str = ""
) -> list[Path]:
    """results/table1.{md,json,png} from every run whose dev and test outputs exist (never stamped:
    it is cheap and is redone as runs are added). Also copies the step timings beside it."""

    collected, tuning = [], {}
    for config in configs:
        found = []
        for k in range(1, runs + 1):
            plan = RunPlan(config, k)
            if not (exp.done(f"eval/{plan.name}/dev") and exp.done(f"eval/{plan.name}/test")):
                continue
            check_run_current(exp, plan)
            state = read_state(exp.tune_dir(plan)) or {}
            found.append(TunedRun(k, state_seed(state), exp.eval_output(plan, "dev"), exp.eval_output(plan, "test"),
                                  run_weights(exp.tune_dir(plan) / "moses.ini"), state.get("completed_iterations"),
                                  state.get("stop_reason")))
            tuning.setdefault(config.label, []).append({"run": k, "dev_bleu_1best": tuning_trajectory(state)})
        collected.append((config, found))
    if not any(found for _, found in collected):
        raise ExperimentError(f"no evaluated run in {exp.work} yet: run the eval step first")
    scored, signature, detectable = score_runs(
        collected, dev_tok_ref=exp.prepared("dev", exp.tgt), test_ref=exp.path("raw", f"test.{exp.tgt}"),
        test_tok_ref=exp.prepared("test", exp.tgt), lang=exp.tgt,
    )
    timings = step_timings(exp)
    notes = [
        f"SCALE={exp.settings.name}; data and sizes differ from the paper's (see Settings and README).",
        "The CSLM rows run the CSLM inside Moses' search (NeuralLM, trained self-normalised), as the paper did; "
        f"rows marked (n-best) rescore {exp.settings.nbest_size}-best lists with it as an extra MERT feature instead.",
        "Columns outside a configuration are fixed at weight 0 during MERT (same 6-column table for every row).",
        *training_notes(exp),
        *budget_notes(exp, configs, runs),
    ]
    doc = build_table(scored, settings={"scale": exp.settings.to_json(), "runs": runs}, signature=signature,
                      detectable=detectable,
                      runs_requested=runs, timings=timings, notes=notes)
    table_feature, table_path, _ = single_phrase_table(exp.rnn_ini)
    if Path(table_path).exists():
        doc["analysis"] = analysis_document(
            Path(table_path), {config.label: [(t.run, t.weights) for t in found] for config, found in collected},
            table_feature,
        )
    else:
        doc["notes"].append(f"No analysis of the RNN column: {table_path} (the 6-column table) is missing.")
    doc["leverage"] = leverage_document(exp, collected, table_feature, MosesIni.read(exp.rnn_ini))
    doc["tuning"] = tuning
    doc["table2"] = {k: exp.table2_path(k).read_text(encoding="utf-8") for k in TABLE2_KINDS
                     if exp.table2_path(k).exists()}
    paths = write_report(doc, out_dir, command)
    shutil.copyfile(exp.path(TIMINGS_FILE), out_dir / "timings.tsv")
    return paths


# --------------------------------------------------------------------------------------------
# The steps in order: the one list the CLI, the Makefile (``all``) and the report's command share

STEPS = ("data", "prepare", "baseline", "rnn", "cslm", "speed", "tune", "eval", "report")


@dataclass(frozen=True)
class StepOptions:
    """What the steps take beyond the experiment itself (the ``table1`` command's options)."""

    configs: list[Configuration]
    runs: int
    aligner: str = "auto"
    mirror: str = wmt14.STATMT
    results: Path = Path("results")
    command: str = ""


def run_step(exp: Experiment, step: str, options: StepOptions) -> list[Path]:
    """Run one step of :data:`STEPS` (a finished one is skipped inside); returns the files the report wrote."""
    if step == "data":
        step_data(exp, options.mirror)
    elif step == "prepare":
        step_prepare(exp)
    elif step == "baseline":
        step_baseline(exp, options.aligner)
    elif step == "rnn":
        step_rnn(exp)
    elif step == "cslm":
        if any(c.cslm for c in options.configs):
            step_cslm(exp)
        else:
            _log("cslm: no chosen configuration uses the CSLM; skipped")
    elif step == "speed":
        step_speed(exp, options.configs)
    elif step == "tune":
        step_tune(exp, options.configs, options.runs)
    elif step == "eval":
        step_eval(exp, options.configs, options.runs)
    elif step == "report":
        return step_report(exp, options.configs, options.runs, options.results, options.command)
    else:
        raise ExperimentError(f"unknown step {step!r}: expected one of {', '.join(STEPS)}")
    return []
