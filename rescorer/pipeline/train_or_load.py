"""What ``rescore-phrase-table`` scores with: :class:`Models`, loaded, checked, or trained first, in one place.

Given no forward model, the command does what the paper did: it trains a model on the unique pairs of
the input table, to a budget (:meth:`TrainConfig.for_budget`), saves it beside the output (or at
``--save-model``) and scores with it. A ``--resume`` of a run that had started scoring reuses that
model as it is: training it further would change the model under the partial output.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from infrastructure.files import streamed_output
from rescorer.model.checkpoint import Checkpoint, load_checkpoint
from rescorer.model.config import DEFAULT_SHORTLIST, ModelSizes, TrainConfig
from rescorer.pipeline.columns.base import ScoringModel
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.partial_output import OutputFiles, default_model_path
from rescorer.training.train import train_on_phrase_table

if TYPE_CHECKING:
    from rescorer.pipeline.rescore import RescoreOptions


@dataclass
class TrainingWithoutModel:
    """How ``rescore-phrase-table`` trains when it is given no ``--model`` (its options of the same names).

    ``max_steps`` (``--train-steps``) and ``max_time`` (``--train-time``) are the budget; with neither,
    :data:`~rescorer.model.config.DEFAULT_TRAIN_TIME` seconds. ``save_model``: where the model goes
    (:func:`~rescorer.pipeline.partial_output.default_model_path` when None).
    """

    save_model: str | None = None
    max_steps: int | None = None
    max_time: float | None = None
    sizes: ModelSizes = field(default_factory=ModelSizes)
    shortlist: int = DEFAULT_SHORTLIST
    seed: int = TrainConfig.seed
    train_step: str = TrainConfig.train_step

    def train_config(self) -> TrainConfig:
        return TrainConfig.for_budget(max_steps=self.max_steps, max_time=self.max_time, seed=self.seed,
                                      train_step=self.train_step)


#: A model as :class:`Models` takes it: loaded, its file, or (a benchmark's stand-in) a scorer of one's own.
ModelGiven = Checkpoint | str | os.PathLike | ScoringModel


@dataclass
class Models:
    """What a run scores with: the forward model, p(e|f), whose columns every run has, and a reverse
    one, p(f|e), whose column follows (``--reverse-model``). Without a forward model one is trained
    first on the input table, as ``training`` says (the table must then be a file, not stdin)."""

    forward: ModelGiven | None = None
    reverse: ModelGiven | None = None
    training: TrainingWithoutModel = field(default_factory=TrainingWithoutModel)

    def __post_init__(self) -> None:
        """A model given loaded is checked now (:func:`check_directions`), before a caller's long work
        (``rescorer propose``'s search); one given as a file, when :meth:`load` reads it: each once."""
        check_directions(_unless_file(self.forward), _unless_file(self.reverse))

    def load(self, input_path: str, output_path: str, options: RescoreOptions) -> tuple[ModelGiven, ModelGiven | None]:
        """Both models, each file read once: a model in the other's place is refused before any
        training (:func:`check_directions`); then, without a forward model, the one a ``--resume``d
        run had finished training, or one trained now."""
        forward, reverse = _loaded(self.forward), _loaded(self.reverse)
        read_now = (forward if forward is not self.forward else None, reverse if reverse is not self.reverse else None)
        if any(model is not None for model in read_now):
            check_directions(*read_now)  # those given loaded were checked when given
        if forward is None:
            forward = load_checkpoint(self._trained(input_path, output_path, options))
        return forward, reverse

    def _trained(self, input_path: str, output_path: str, options: RescoreOptions) -> str:
        """The file of the model to score with when none is given (trained now unless a resume reuses it)."""
        if options.resume:
            model_path = finished_training_of(output_path, self.training.save_model)
            if model_path is not None:
                print(f"--resume: scoring had started, so the model {model_path} is reused as it is", file=sys.stderr)
                return model_path
        model_path = default_model_path(output_path, self.training.save_model)
        print(f"no --model: training on the unique pairs of {input_path} into {model_path}", file=sys.stderr)
        train_on_phrase_table(
            input_path, Path(model_path), model_sizes=self.training.sizes, train_config=self.training.train_config(),
            shortlist=self.training.shortlist, device=options.device, precision=options.precision,
            resume=options.resume, progress=options.progress,
        )
        return model_path


def _loaded(model: ModelGiven | None) -> ModelGiven | None:
    return load_checkpoint(model) if isinstance(model, (str, os.PathLike)) else model


def _unless_file(model: ModelGiven | None) -> ModelGiven | None:
    """``model`` when it is given loaded, None when it is a file (or not given)."""
    return None if isinstance(model, (str, os.PathLike)) else model


#: What a reverse model given as a command's forward model is told, where the command has no ``--reverse-model``.
FORWARD_ONLY = "MODEL must be a forward model (rescorer train without --reverse)"


def check_directions(model: ModelGiven | None, reverse: ModelGiven | None, model_name: str | None = None,
                     reverse_name: str | None = None, *,
                     advice: str = "give it to --reverse-model, not --model") -> None:
    """A forward model (p(e|f)) for ``--model`` and a reverse one (p(f|e), ``rescorer train --reverse``)
    for ``--reverse-model``: either one in the other's place would give a column that means the
    opposite of its name, which nothing downstream could notice. ``advice`` ends the message of a reverse
    model given as the forward one (:data:`FORWARD_ONLY` for a command that takes no other)."""
    if model is not None and not isinstance(model, ScoringModel) and model.config.direction != "forward":
        raise RescoreError(f"{model_name or model.path}: a reverse model (it scores p(f|e), from rescorer train "
                           f"--reverse): {advice}")
    if reverse is not None and not isinstance(reverse, ScoringModel) and reverse.config.direction != "reverse":
        raise RescoreError(f"{reverse_name or reverse.path}: a forward model (it scores p(e|f)): --reverse-model "
                           "needs one trained with rescorer train --reverse")


def finished_training_of(output_path: str, save_model: str | None = None) -> str | None:
    """The model an interrupted run trained, if that run got as far as scoring; else None.

    Scoring starts only after training has finished, so a progress record beside the output
    means the saved model is final: ``--resume`` must reuse it, not train it further (which would
    also change the model file and make the partial output unusable).
    """
    model = default_model_path(output_path, save_model)
    if not streamed_output(output_path) and OutputFiles.beside(output_path).progress.exists() and Path(model).exists():
        return model
    return None
