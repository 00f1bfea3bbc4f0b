"""The one training loop: the RNN Encoder–Decoder (``rescorer train``) and the CSLM (``cslm train``) both run it.

What the loop owns is what a user sees the same way in both commands: a first validation before any
update, the clock that ``max_time`` reads (kept across ``--resume``: the time already spent counts),
a validation and a save whenever the run says one is due, the stop reason asked for before the first
update and after each validation, Ctrl-C and SIGTERM (``MODEL.last`` saved, then one
:class:`~infrastructure.interrupts.Interrupted` line that says where), and a best model on disk at the end.

What it leaves to the run (:class:`TrainingRun`) is what differs between the models: one update and its
progress (the RNN counts updates, the CSLM n-grams of an epoch), when a validation is due (the RNN every
``valid_every`` updates, the CSLM at the end of each epoch of ``epoch_size`` n-grams), what a validation
measures, what a save writes, and which stop reasons exist (``early_stopping``, ``max_time``, and
``max_steps`` or ``max_epochs``).

It lives here, not in ``rescorer.training``, because the CSLM may use of ``rescorer`` only the model's
envelope (tests/architecture/test_imports.py), and because it needs no torch: a run brings its model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from infrastructure.errors import UserError
from infrastructure.interrupts import Interrupted

#: What a training writes beside its model (``MODEL.last``, the state ``--resume`` continues from), as
#: ``also_writes`` of a model output.
MODEL_ALSO_WRITES = ("{}.last",)


def last_checkpoint_path(model_out: str | Path) -> Path:
    """Where the latest training state lives, beside the best model ``model_out``."""
    return Path(str(model_out) + ".last")


def refuse_to_overwrite(model_out: Path, resume: bool) -> None:
    """A fresh training would overwrite a model that took hours at its first save: without
    ``resume``, an existing model or training state under ``model_out`` is an error, not a restart."""
    if resume:
        return
    for path in (model_out, last_checkpoint_path(model_out)):
        if path.exists():
            raise UserError(f"{path} already exists: pass --resume to continue that training, "
                             "or remove it to train from scratch")


class TrainingRun(Protocol):
    """One model's training run, as :func:`run_training` drives it.

    ``state`` is what ``MODEL.last`` keeps for ``--resume``; it holds at least ``elapsed``, the
    seconds trained so far. ``started`` is the monotonic time the run would have started had it never
    stopped, set by the loop: ``step`` sets ``state["elapsed"]`` from it.
    """

    model_out: Path
    state: dict[str, Any]
    history: list[Any]
    started: float

    @property
    def model(self) -> Any:  # a torch module: put in training mode before the first update
        ...

    @property
    def last_path(self) -> Path:
        """``MODEL.last``, where :meth:`save` always writes the latest state."""
        ...

    def first_validation(self) -> None:
        """The validation of the untrained (or freshly loaded) model, before any update."""

    def progress_bar(self, show: bool) -> tqdm:
        """The run's bar, starting where the run stands."""
        ...

    def update(self, bar: tqdm) -> None:
        """One update with its progress (and whatever a run does between validations)."""

    def validation_due(self) -> bool:
        """Whether the last :meth:`update` ended a stretch between validations."""
        ...

    def validate(self) -> bool:
        """Record a validation; True if it is the best so far."""
        ...

    def save(self, improved: bool) -> None:
        """The latest state to ``MODEL.last``; to ``MODEL`` too if improved or not written yet."""

    def reason_to_stop(self) -> str | None:
        """Why training ends now, or None to go on; asked before the first update and after each validation."""
        ...

    def position(self) -> str:
        """Where the run stands, in words, for the line an interruption prints."""
        ...


def run_training(run: TrainingRun, *, progress: bool) -> str:
    """Updates, validations and saves until the run gives a reason to stop; returns that reason.

    A run that has a reason to stop before its first update takes none: ``--resume`` after a
    finished RNN training (its budget spent) or a CSLM's last epoch reuses the model as it is.
    """
    if not run.history:
        run.first_validation()
    run.model.train()
    run.started = time.monotonic() - run.state["elapsed"]
    bar = run.progress_bar(progress)
    try:
        stopped_by = run.reason_to_stop()
        while stopped_by is None:
            run.update(bar)
            if run.validation_due():
                run.save(run.validate())
                stopped_by = run.reason_to_stop()
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: keep the state for --resume, and say so
        run.save(False)
        raise Interrupted(f"training state at {run.position()} kept in {run.last_path}, the best model so far in "
                          f"{run.model_out} (run again with --resume to continue)") from exc
    finally:
        bar.close()
    if not run.model_out.exists():
        run.save(False)
    return stopped_by
