"""What ``rescore-phrase-table`` scores with: the ``--model`` it is given, or a model it trains first.

Given no ``--model``, the command does what the paper did: it trains a model on the unique pairs of
the input table, to a budget (:meth:`TrainConfig.for_budget`), saves it beside the output (or at
``--save-model``) and scores with it. A ``--resume`` of a run that had started scoring reuses that
model as it is: training it further would change the model under the partial output.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from rescorer.model.checkpoint import Checkpoint, load_checkpoint
from rescorer.model.config import DEFAULT_SHORTLIST, ModelSizes, TrainConfig
from rescorer.pipeline.partial_output import check_partial_output, default_model_path
from rescorer.pipeline.rescore import (
    RescoreOptions,
    RescoreSummary,
    check_directions,
    check_options,
    finished_training_of,
    rescore_checked,
)
from rescorer.training.train import train_on_phrase_table


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


def rescore_with_model_or_training(input_table: str, output_table: str, model_path: str | None,
                                   training: TrainingWithoutModel, options: RescoreOptions,
                                   reverse: Checkpoint | None = None) -> RescoreSummary:
    """Score ``input_table`` into ``output_table`` with ``model_path``, or with a model trained first.

    With ``reverse`` (a model of p(f|e)), its column follows.
    The options are checked once, before any training, and so is the output: a stopped run's partial
    output is refused without ``--resume`` (:func:`check_partial_output`), and a ``--resume`` of a finished
    output does nothing but say so (the summary's ``finished_already``). Training reads ``input_table`` as a file: the
    caller refuses ``-`` (stdin) without a model.
    """
    check_options(input_table, output_table, options)
    if check_partial_output(output_table, options.resume):
        return RescoreSummary(finished_already=output_table)
    # A model given in the other's place is refused before any training (each file read once).
    given = load_checkpoint(model_path) if model_path is not None else None
    check_directions(given, reverse)
    if model_path is None and options.resume:
        model_path = finished_training_of(output_table, training.save_model)
        if model_path is not None:
            print(f"--resume: scoring had started, so the model {model_path} is reused as it is", file=sys.stderr)
    if model_path is None:
        model_path = default_model_path(output_table, training.save_model)
        print(f"no --model: training on the unique pairs of {input_table} into {model_path}", file=sys.stderr)
        train_on_phrase_table(
            input_table, Path(model_path), model_sizes=training.sizes, train_config=training.train_config(),
            shortlist=training.shortlist, device=options.device, precision=options.precision, resume=options.resume,
            progress=options.progress,
        )
    return rescore_checked(input_table, output_table, given or load_checkpoint(model_path), options, reverse)
