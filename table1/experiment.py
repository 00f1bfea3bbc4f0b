"""The Table 1 pipeline: raw text to tuned systems and the report, one restartable step at a time.

The steps, in :data:`STEPS` order: ``data``, ``prepare``, ``baseline``, ``rnn``, ``cslm``
(:mod:`table1.systems`), ``speed``, ``tune``, ``eval`` (:mod:`table1.tuning`) and ``report``
(:mod:`table1.collect`); each is stamped in its work folder (:mod:`table1.workspace`) and skipped
on a rerun, and long steps (model training, tuning runs) resume inside themselves. So
``make table1`` can be interrupted at any point and simply run again, in a later session if need
be. ``tune`` and ``eval`` stamp each configuration's run separately: the CSLM rows can be added
later without redoing Baseline and +RNN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moses_integration.files import exclusive_use
from table1 import wmt14
from table1.collect import step_report
from table1.settings import Configuration
from table1.systems import step_baseline, step_cslm, step_data, step_prepare, step_rnn
from table1.tuning import step_eval, step_speed, step_tune
from table1.workspace import Experiment, ExperimentError, say

#: The steps in order: the one list the CLI, the Makefile (``all``) and the report's command share.
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


def run_steps(exp: Experiment, steps: Sequence[str], options: StepOptions) -> list[Path]:
    """Run ``steps`` in order, holding the work folder (:func:`exclusive_use`): the same ``make table1``
    started twice would run one step twice at once on the same files. Returns the files written."""
    written: list[Path] = []
    with exclusive_use(exp.work):
        for step in steps:
            written += run_step(exp, step, options)
    return written


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
            say("cslm: no chosen configuration uses the CSLM; skipped")
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
