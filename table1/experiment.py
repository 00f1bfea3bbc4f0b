"""The Table 1 pipeline: raw text to tuned systems and the report, one restartable step at a time.

The steps, in :data:`STEPS` order: ``data``, ``prepare``, ``baseline``, ``rnn``, ``proposals``,
``cslm`` (:mod:`table1.systems`), ``speed``, ``tune``, ``eval`` (:mod:`table1.tuning`) and ``report``
(:mod:`table1.collect`); each is stamped in its work folder (:mod:`table1.workspace`) and skipped
on a rerun, and long steps (model training, tuning runs) resume inside themselves. So
``make table1`` can be interrupted at any point and simply run again, in a later session if need
be. ``tune`` and ``eval`` stamp each configuration's run separately: the CSLM rows can be added
later without redoing Baseline and +RNN.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from infrastructure.files import exclusive_use
from moses_integration.decoder import GETTING_MOSES
from table1 import wmt14
from table1.beside import BesideRun
from table1.collect import step_report
from table1.reranking import SPLITS, available_sets, list_stamp, step_reranking
from table1.reranking_models import step_reranking_models
from table1.reranking_report import write_reranking_report
from table1.settings import Configuration, RunPlan
from table1.system_training import MosesToolError
from table1.systems import step_baseline, step_cslm, step_data, step_prepare, step_proposals, step_rnn, step_rnn_both
from table1.tuning import speed_systems, step_eval, step_speed, step_tune
from table1.workspace import RERANKING_STEP, STAMPS, Experiment, ExperimentError, open_work, say

#: The steps in order: the one list the CLI, the Makefile (``all``) and the report's command share.
STEPS = ("data", "prepare", "baseline", "rnn", "proposals", "cslm", "speed", "tune", "eval", "report")
#: The reranking experiment's steps (docs/table1.md): named on their own, never part of ``all``,
#: since they train for many hours what Table 1's rows do not need.
RERANKING_STEPS = ("reranking-models", "reranking")


def expand_steps(steps: Sequence[str]) -> list[str]:
    """The steps to run, in order: with ``all``, every one of :data:`STEPS` in its order, then the other
    names given (``all reranking-models`` is Table 1 and then the reranking's models); else as given."""
    if "all" not in steps:
        return list(dict.fromkeys(steps))
    return [*STEPS, *dict.fromkeys(s for s in steps if s != "all" and s not in STEPS)]


@dataclass(frozen=True)
class StepOptions:
    """What the steps take beyond the experiment itself (the ``table1`` command's options)."""

    configs: list[Configuration]
    runs: int
    aligner: str = "auto"
    mirror: str = wmt14.STATMT
    results: Path = Path("results")
    command: str = ""
    beside: tuple[BesideRun, ...] = ()  # other runs' reports, put beside this one's (table1.beside)


def run_steps(exp: Experiment, steps: Sequence[str], options: StepOptions) -> list[Path]:
    """Run ``steps`` in order, holding the work folder (:func:`exclusive_use`): the same ``make table1``
    started twice would run one step twice at once on the same files. The Moses tools the steps
    still to run need are checked first (:func:`check_tools`), before anything is written; the work
    folder is opened (:func:`open_work`) once held. A work folder this run made is removed again if
    the run fails before any step is stamped (e.g. ``report`` on a folder that holds no experiment):
    a failed run leaves nothing it created, while stamped work stays for the rerun to resume.
    Returns the files written."""
    written: list[Path] = []
    check_tools(exp, steps, options)
    made = not exp.work.exists()
    with exclusive_use(exp.work):
        try:
            open_work(exp)
            for step in steps:
                written += run_step(exp, step, options)
        except BaseException:
            if made and not any((exp.work / STAMPS).glob("*.json")):
                shutil.rmtree(exp.work, ignore_errors=True)
            raise
    return written


def step_stamps(exp: Experiment, step: str, options: StepOptions) -> list[str]:
    """The stamps that mark ``step`` done for the chosen configurations and runs."""
    plans = [RunPlan(config, k) for config in options.configs for k in range(1, options.runs + 1)]
    if step == "speed":
        return [f"speed/{name}" for name in speed_systems(options.configs)]
    if step == "rnn":
        return ["rnn"] + (["rnn-both"] if any(c.reverse for c in options.configs) else [])
    if step == "proposals":
        return proposal_systems(options.configs)
    if step == "tune":
        return [f"tune/{plan.name}" for plan in plans]
    if step == "eval":
        return [f"eval/{plan.name}/{split}" for plan in plans for split in ("dev", "test")]
    if step == "reranking-models":
        return [RERANKING_STEP]
    if step == "reranking":  # its lists; what is scored and tuned on them grows as models are trained
        return [list_stamp(k, split) for k in range(1, options.runs + 1) for split in SPLITS]
    return [step]


def proposal_systems(configs: Sequence[Configuration]) -> list[str]:
    """The completed tables the chosen rows decode with: ``proposals`` and/or ``proposals-both``."""
    return list(dict.fromkeys(c.table_system for c in configs if c.proposals))


def check_tools(exp: Experiment, steps: Sequence[str], options: StepOptions) -> None:
    """Refuse to start when a Moses program or script that a step still to run needs is missing.

    Checked before the first step, so that ``make table1`` without Moses stops at once with where to
    get it, rather than after an hour of ``data`` and ``prepare`` (and 134 MB written). Steps whose
    stamps are all there need nothing: a finished experiment's report is rebuilt without Moses.
    """
    pending = [s for s in steps if not all(exp.done(stamp) for stamp in step_stamps(exp, s, options))]
    binaries: list[str] = []
    scripts: list[str] = []
    if "prepare" in pending and exp.settings.selection:
        binaries += ["lmplz", "query"]  # the data selection's n-gram models
    if "baseline" in pending:
        binaries += ["lmplz", "build_binary"]
        scripts += ["training/train-model.perl", "training/filter-model-given-input.pl"]
    if any(s in pending for s in ("speed", "tune", "eval", "reranking")):
        binaries.append("moses")
    if not binaries and not scripts:
        return
    moses = exp.moses()  # "Moses not found", with where to get it
    if "baseline" in pending and (options.aligner == "eflomal" or (options.aligner == "auto" and not moses.has_giza())):
        binaries.append("symal")  # eflomal's two directions are symmetrised by Moses' symal
    missing = moses.missing(dict.fromkeys(binaries), dict.fromkeys(scripts))
    if missing:
        raise MosesToolError(f"steps {', '.join(pending)} need Moses tools that are missing: {', '.join(missing)}; "
                             + GETTING_MOSES)


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
        if any(c.reverse for c in options.configs):
            step_rnn_both(exp)
    elif step == "proposals":
        for system in proposal_systems(options.configs):
            step_proposals(exp, system)
        if not proposal_systems(options.configs):
            say("proposals: no chosen configuration has proposals; skipped")
    elif step == "cslm":
        if any(c.cslm for c in options.configs):
            step_cslm(exp)
        else:
            say("cslm: no chosen configuration uses the CSLM; skipped")
    elif step == "speed":
        step_speed(exp, options.configs)
    elif step == "tune":
        step_tune(exp, options.configs, options.runs)
    elif step == "eval":
        step_eval(exp, options.configs, options.runs)
    elif step == "report":
        return step_report(exp, options.configs, options.runs, options.results, options.command, options.beside)
    elif step == "reranking-models":
        step_reranking_models(exp)
    elif step == "reranking":
        sets = step_reranking(exp, options.runs)
        return write_reranking_report(exp, options.runs, sets, available_sets(exp)[1], options.results,
                                      options.command)
    else:
        raise ExperimentError(f"unknown step {step!r}: expected one of {', '.join(STEPS + RERANKING_STEPS)}")
    return []
