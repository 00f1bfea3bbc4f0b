"""The training base: what every model's training shares, so that a model brings only its update,
its validation and its schedule.

Defined here once, for ``rescorer train``, ``cslm train``, ``nmt train`` and any model after them:

- the files of a training: ``MODEL`` the best model so far (the one to use), ``MODEL.last`` the latest
  state, which ``--resume`` continues from, ``MODEL.data/`` the prepared data a rerun reuses
  (:func:`last_checkpoint_path`, :func:`data_folder`, :func:`training_files`);
- the device and precision a run trains in (:func:`training_device`, :func:`announce`);
- resuming: which file (:func:`resume_source`), the checks that it continues this very run
  (:func:`check_resumable`, :func:`check_same_data`, :func:`check_same_recipe`), and the typed state
  ``MODEL.last`` keeps (:class:`TrainingState`: the clock, the best metric, patience, the validations,
  the data's fingerprint);
- the loop (:meth:`Training.run`): a first validation, the clock ``max_time`` reads (kept across
  ``--resume``), a validation and a save of ``MODEL.last`` (and of ``MODEL`` when better) whenever the
  model says one is due, a save of ``MODEL.last`` alone every ``checkpoint_every`` seconds between
  them (a killed run, which no signal handler sees, loses at most that much), the stop reason asked
  before the first update and after each validation,
  Ctrl-C and SIGTERM (``MODEL.last`` saved, one :class:`~infrastructure.interrupts.Interrupted` line);
- a loss or validation that is not a number: training stops in one line (:class:`DivergedError`),
  and ``MODEL`` and ``MODEL.last`` keep the last finite state;
- what a run returns (:class:`TrainResult`: why it stopped, its clock, its validations and the best of them).

A model subclasses :class:`TrainingState` with its position in the data, and :class:`Training` with
what only it knows::

    @dataclass
    class MyState(TrainingState):
        step: int = 0                                  # where the run stands: all --resume needs
        best: float = math.inf                         # the metric falls: perplexity

    @dataclass
    class MyTraining(Training):
        state: MyState
        cfg: MyConfig

        def update(self, bar):                         # one update, its loss watched
            loss = self.train_step(batch_at(self.state.step))
            self.state.step += 1
            self.state.elapsed = self.clock()
            self.watch_loss(loss, self.state.step)
            bar.update(1)

        def validation_due(self):                      # the schedule
            return self.state.step % self.cfg.valid_every == 0

        def measure(self):                             # the validation: its record and its metric
            ppl = perplexity(self.model, self.valid)
            return MyValidation(self.state.step, ppl), ppl

        def improves(self, metric):
            return metric < self.state.best - 1e-9

        def reason_to_stop(self):                      # patience and budget
            if self.patience_spent(self.cfg.patience):
                return "early_stopping"
            return "max_steps" if self.state.step >= self.cfg.max_steps else None

        def write(self, path):                         # one model file, the state as self.state.to_dict()
            save_my_model(path, self.model, optimizer_state=self.optimizer.state_dict(),
                          train_state=self.state.to_dict())

        def progress_bar(self, show):
            return progress_bar(total=self.cfg.max_steps, initial=self.state.step, show=show)

        def position(self):                            # for the lines an interruption or a NaN prints
            return f"step {self.state.step}"

    with training_files(model_out, resume):                # check_same_recipe(..., cfg.RESUME_MAY_DIFFER) on resume
        run = MyTraining(model_out, dev, amp_dtype, model, optimizer, state, cfg)
        stopped_by = run.run(progress=True, checkpoint_every=cfg.checkpoint_every)

Nothing here imports torch at module level: the command lines read :data:`MODEL_ALSO_WRITES`
while ``--help`` must stay instant.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from tqdm import tqdm

from infrastructure.errors import UserError
from infrastructure.files import FOLDER_MARK, exclusive_use, removed_when_the_disk_fills
from infrastructure.interrupts import Interrupted, held_while_starting_children
from infrastructure.resume_record import check_same_options, options_record

if TYPE_CHECKING:
    import torch

LAST_SUFFIX = ".last"
DATA_SUFFIX = ".data"

#: What a training writes beside its model (``MODEL.last``, the state ``--resume`` continues from, and
#: ``MODEL.data/``, the prepared data it fills: a folder, spelled with its trailing separator), as
#: ``also_writes`` of a model output (:class:`infrastructure.cli_options.OutputPath`).
MODEL_ALSO_WRITES = ("{}" + LAST_SUFFIX, "{}" + DATA_SUFFIX + FOLDER_MARK)


def last_checkpoint_path(model_out: str | Path) -> Path:
    """Where the latest training state lives, beside the best model ``model_out``."""
    return Path(str(model_out) + LAST_SUFFIX)


def data_folder(model_out: str | Path) -> Path:
    """Where a training keeps its prepared data, beside the model, so that a ``--resume`` need not prepare it again."""
    return Path(str(model_out) + DATA_SUFFIX)


def refuse_to_overwrite(model_out: Path, resume: bool) -> None:
    """A fresh training would overwrite a model that took hours at its first save: without
    ``resume``, an existing model or training state under ``model_out`` is an error, not a restart."""
    if resume:
        return
    for path in (model_out, last_checkpoint_path(model_out)):
        if path.exists():
            raise UserError(f"{path} already exists: pass --resume to continue that training, "
                            "or remove it to train from scratch")


@contextmanager
def training_files(model_out: Path, resume: bool) -> Iterator[None]:
    """The block owns a training's files: one run per model (:func:`exclusive_use`: a second training
    into it stops before touching the model, its ``.last`` or its ``.data``), no model overwritten without
    ``resume`` (:func:`refuse_to_overwrite`), and a ``.data`` folder it made removed if it fills the disk."""
    with exclusive_use(model_out):
        refuse_to_overwrite(model_out, resume)
        with removed_when_the_disk_fills(data_folder(model_out)):
            yield


def resume_source(model_out: Path, resume: bool) -> Path | None:
    """The file a ``--resume`` continues from: ``MODEL.last``, else ``MODEL``; None for a fresh run."""
    last = last_checkpoint_path(model_out)
    path = last if last.exists() else model_out
    return path if resume and path.exists() else None


def check_resumable(path: Path, train_state: Mapping[str, Any] | None, optimizer_state: Any) -> None:
    """A model file without a training state (one saved for use only) cannot be resumed."""
    if train_state is None or optimizer_state is None:
        raise UserError(f"{path}: the model file holds no training state to resume from")


def check_same_data(path: Path, train_state: Mapping[str, Any], fingerprint: object, source: object) -> None:
    """A run resumes on the data it was trained on, or not at all: the order of the updates depends on it."""
    if train_state.get("data") != fingerprint:
        raise UserError(f"{path}: trained on other data (or other settings) than {source}; cannot resume")


def check_same_recipe(path: Path, recorded: Mapping[str, Any] | None, config: Any,
                      may_differ: Collection[str]) -> None:
    """A run resumes with the recipe it started with: every option of ``config`` (a training config) but
    ``may_differ`` (the stops, how an update runs, how often the state is saved) must be the one ``path``
    recorded, or the resumed updates would be another training's, spliced onto this one's. One line names
    each that differs (``infrastructure.resume_record``). A recipe written before an option existed ran
    at its default."""
    now = options_record(config, may_differ)
    then = {**options_record(type(config)(), may_differ), **{k: v for k, v in (recorded or {}).items() if k in now}}
    check_same_options(then, now, path, advice="resume with the same options, or train into another MODEL")


def training_device(device: str, precision: str,
                    width: int | None = None) -> tuple[torch.device, str, torch.dtype | None, str]:
    """The device a run trains on, its precision, autocast dtype, and why that precision where ``auto``
    chose it on a CPU (else ""). ``auto`` is bf16 on a GPU; on a CPU it is bf16 where this CPU's bf16
    matmuls at the model's ``width`` are fast enough to pay (:func:`neural.device.training_precision`)."""
    from neural.config import CPU_BF16_PAYS_AT
    from neural.device import autocast_dtype, cpu_bf16_speedup, select_device, training_precision

    dev = select_device(device)
    resolved = training_precision(dev, precision, width)
    why = ""
    if precision == "auto" and dev.type == "cpu" and width is not None:
        speedup = cpu_bf16_speedup(width)
        why = (f" (auto: this CPU's bf16 matmuls at width {width} run {speedup:.1f}x its fp32 ones; "
               f"{CPU_BF16_PAYS_AT:g}x pays)" if speedup else " (auto: this CPU has no native bf16 matmuls)")
    return dev, resolved, autocast_dtype(dev, resolved), why


def announce(state: TrainingState, dev: torch.device, precision: str, train_step: str, why: str = "") -> None:
    """Record in ``state`` how this run's updates run (the config keeps what was asked), and say it,
    with ``why`` the precision (:func:`training_device`)."""
    from neural.device import describe_precision

    state.train_step, state.precision = train_step, precision
    print(f"training on {dev} in {precision}{why}: {describe_precision(precision)}", file=sys.stderr)


class DivergedError(UserError):
    """The training loss or a validation is not a number (NaN or inf): the model diverged."""


@dataclass
class TrainingState:
    """What ``MODEL.last`` keeps for ``--resume`` besides the weights and the optimiser, typed.

    A model subclasses it with its position in the data (fields before these in its files) and
    the default of ``best`` (``-inf`` for a metric that grows, ``inf`` for one that falls). It is
    stored as a plain dict (:meth:`to_dict`) so that a model file loads with ``weights_only``;
    :attr:`FILE_NAMES` keeps the names a model's files already use.
    """

    elapsed: float = 0.0  # seconds trained so far, validations included: what max_time reads
    best: float = math.nan  # the best validation metric so far
    bad_validations: int = 0  # validations since the best: what patience counts
    history: list[Any] = field(default_factory=list)  # one VALIDATION record per validation
    data: Any = None  # the fingerprint of the prepared data, which --resume compares
    train_step: str | None = None  # how this run's updates ran (eager, static, captured)
    precision: str | None = None  # the precision they ran in
    _stored_keys: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    #: Field name → key in the model files, where they name it otherwise.
    FILE_NAMES: ClassVar[Mapping[str, str]] = {}
    #: The dataclass of one validation, which ``history`` holds.
    VALIDATION: ClassVar[type] = dict

    def to_dict(self) -> dict[str, Any]:
        """The state as a model file stores it: the model's own fields first, then the shared ones."""
        shared = [f.name for f in fields(TrainingState) if f.init]
        names = [f.name for f in fields(self) if f.init and f.name not in shared] + shared
        keys = self._stored_keys
        out = {}
        for name in names:
            value = getattr(self, name)
            if name == "history":
                value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
            elif name in ("train_step", "precision") and value is None:
                continue  # not set: a state that no run has started
            out[keys.get(name, self.FILE_NAMES.get(name, name))] = value
        return out

    @classmethod
    def from_dict(cls, stored: Mapping[str, Any]) -> Self:
        """The state a model file holds (:meth:`to_dict`, or an older file without the newer keys)."""
        names = {cls.FILE_NAMES.get(f.name, f.name): f.name for f in fields(cls) if f.init}
        values = {names[key]: value for key, value in stored.items() if key in names}
        values["history"] = [cls.VALIDATION(**v) for v in values.get("history", [])]
        state = cls(**values)
        # The keys themselves, as read: pickle writes a string it has already written in a file as a
        # reference to it, and the optimiser state read from the same file shares some of them
        # ("step"), so writing these objects back keeps a resumed run's files the bytes they always were.
        state._stored_keys = {names[key]: key for key in stored if key in names}
        return state


class LossWatch:
    """Notices a loss that is not a number without making a GPU wait after each update.

    Each update adds its loss; whether one was NaN or inf, and the first, stay on the device until
    :meth:`first_bad` reads them, at a save. (On a CPU, :meth:`Training.watch_loss` reads each loss at once.)
    """

    def __init__(self) -> None:
        self.at: torch.Tensor | None = None  # where the first bad loss came (-1: none yet)
        self.loss: torch.Tensor | None = None  # that loss

    def add(self, loss: torch.Tensor, at: int) -> None:
        import torch

        loss = loss.detach().float()
        if self.at is None or self.loss is None:
            self.at = torch.full((), -1, dtype=torch.int64, device=loss.device)
            self.loss = torch.zeros((), device=loss.device)
        first = torch.logical_and(~torch.isfinite(loss), self.at < 0)
        self.at = torch.where(first, at, self.at)
        self.loss = torch.where(first, loss, self.loss)

    def first_bad(self) -> tuple[int, float] | None:
        """Where the first NaN or inf loss came and its value, or None if every loss was finite."""
        if self.at is None or self.loss is None or int(self.at) < 0:
            return None
        return int(self.at), float(self.loss)


@dataclass
class TrainResult:
    """What a finished training returns: why it stopped, its clock and its validations. A model's subclass
    adds where the run stands (updates, examples) and says by which field of its validations the best one,
    the model file's, is chosen (``BEST_BY``: the field, and whether lower is better)."""

    stopped_by: str
    elapsed: float
    history: list[Any] = field(default_factory=list)

    BEST_BY: ClassVar[tuple[str, bool]] = ("perplexity", True)

    @property
    def best(self) -> Any:
        """The best validation so far (the one ``MODEL`` holds), or None before any."""
        key, lower_is_better = self.BEST_BY
        choose = min if lower_is_better else max
        return choose(self.history, key=lambda v: getattr(v, key), default=None)


@dataclass
class Training:
    """One model's training run, driven by :meth:`run`; see the module's docstring for what a model provides.

    ``started`` is the monotonic time the run would have started had it never stopped (set by
    :meth:`run`; :meth:`clock` reads it), so that ``--resume`` keeps counting toward ``max_time``.
    """

    model_out: Path
    dev: torch.device
    amp_dtype: torch.dtype | None
    model: Any  # a torch module
    optimizer: Any  # its torch optimiser
    state: TrainingState
    started: float = field(default=0.0, init=False)
    last_save: float = field(default=0.0, init=False)  # monotonic time of the last save, or of the run's start
    losses: LossWatch = field(default_factory=LossWatch, init=False)

    #: What a user can change when the loss diverges, for the line that says so.
    DIVERGED_HINT: ClassVar[str] = "train again with a smaller learning rate"

    # ---- what a model provides

    def update(self, bar: tqdm) -> None:
        """One update with its progress (and whatever a run does between validations)."""
        raise NotImplementedError

    def validation_due(self) -> bool:
        """Whether the last :meth:`update` ended a stretch between validations."""
        raise NotImplementedError

    def measure(self) -> tuple[Any, float]:
        """One validation: its record for ``state.history`` (said on stderr too), and its metric."""
        raise NotImplementedError

    def improves(self, metric: float) -> bool:
        """Whether ``metric`` is better than ``state.best``."""
        raise NotImplementedError

    def reason_to_stop(self) -> str | None:
        """Why training ends now, or None to go on; asked before the first update and after each validation."""
        raise NotImplementedError

    def write(self, path: Path) -> None:
        """One model file at ``path``: the model, its optimiser and ``state.to_dict()``."""
        raise NotImplementedError

    def progress_bar(self, show: bool) -> tqdm:
        """The run's bar, starting where the run stands."""
        raise NotImplementedError

    def position(self) -> str:
        """Where the run stands, in words, for the lines an interruption or a diverged loss prints."""
        raise NotImplementedError

    def where(self, at: int) -> str:
        """The update that :meth:`watch_loss` was given ``at``, in words."""
        return f"update {at}"

    def first_validation(self) -> None:
        """The validation of the untrained (or freshly loaded) model: recorded, not saved, by default."""
        self.validate()

    def checkpoint_line(self) -> str:
        """The line a save between validations prints, taken just before it: in a ``--quiet`` log it is
        the run's heartbeat, and it says where a ``--resume`` will pick up."""
        return (f"saved {last_checkpoint_path(self.model_out)}: {self.position()}, "
                f"{self.state.elapsed:.0f} s trained")

    # ---- what the base gives a model

    def clock(self) -> float:
        """Seconds trained so far, this process and those before it: what ``state.elapsed`` holds."""
        return time.monotonic() - self.started

    def watch_loss(self, loss: torch.Tensor, at: int) -> None:
        """Watch an update's loss (``at``: where it came, for :meth:`where`); one that is NaN or inf stops the run."""
        if self.dev.type != "cpu":
            self.losses.add(loss, at)  # read at the next save: a GPU need not wait for it now
            return
        value = float(loss)  # on a CPU the loss is there already: the update itself is named, at once
        if not math.isfinite(value):
            raise self.diverged(value, at)

    def check_losses(self) -> None:
        """Stop in one line if a watched loss was NaN or inf: nothing of the diverged model is saved."""
        bad = self.losses.first_bad()
        if bad is not None:
            raise self.diverged(bad[1], bad[0])

    def diverged(self, loss: float, at: int) -> DivergedError:
        """The one line that stops a run whose loss became ``loss`` at ``at``."""
        return DivergedError(f"the training loss became {loss} at {self.where(at)}: the model diverged; "
                             f"{self.kept()}; {self.DIVERGED_HINT}")

    def kept(self) -> str:
        """What the last saves kept, for a line that stops the run."""
        if self.model_out.exists():
            return f"{self.model_out} and {last_checkpoint_path(self.model_out)} keep the last finite state"
        return "nothing was saved"

    def patience_spent(self, patience: int | None) -> bool:
        """Whether ``patience`` validations in a row have not improved on the best."""
        return patience is not None and self.state.bad_validations >= patience

    def out_of_time(self, max_time: float | None) -> bool:
        """Whether the run has trained ``max_time`` seconds."""
        return max_time is not None and self.state.elapsed >= max_time

    def validate(self) -> bool:
        """Record a validation; True if it is the best so far. One that is not a number stops the run."""
        self.check_losses()  # a diverged update, named, before the validation it spoils
        record, metric = self.measure()
        if not math.isfinite(metric):
            raise DivergedError(f"the validation at {self.position()} gave {metric}: the model's weights are not "
                                f"finite numbers; {self.kept()}; {self.DIVERGED_HINT}")
        self.state.history.append(record)
        improved = self.improves(metric)
        if improved:
            self.state.best, self.state.bad_validations = metric, 0
        else:
            self.state.bad_validations += 1
        return improved

    def save(self, improved: bool) -> None:
        """The latest state to ``MODEL.last``; to ``MODEL`` too if improved or not written yet.
        Never a diverged one: a NaN or inf loss since the last save stops the run instead."""
        self.check_losses()
        last = last_checkpoint_path(self.model_out)
        # Ctrl-C or SIGTERM during torch.save turns into a zip writer's RuntimeError traceback in place
        # of the one-line stop: they are held while the files are written, and come right after.
        with held_while_starting_children():
            for path in (last, self.model_out) if improved or not self.model_out.exists() else (last,):
                self.write(path)
        self.last_save = time.monotonic()

    def checkpoint(self) -> None:
        """A save of ``MODEL.last`` between validations, and its line (:meth:`checkpoint_line`)."""
        line = self.checkpoint_line()
        self.save(False)
        tqdm.write(line, file=sys.stderr)

    def run(self, *, progress: bool, checkpoint_every: float | None = None) -> str:
        """Updates, validations and saves until the model gives a reason to stop; returns that reason.
        ``MODEL.last`` is saved also whenever ``checkpoint_every`` seconds have passed since the last save.

        A run that has a reason to stop before its first update takes none: ``--resume`` after a
        finished RNN training (its budget spent) or a CSLM's last epoch reuses the model as it is.
        """
        if not self.state.history:
            self.first_validation()
        self.model.train()
        self.last_save = time.monotonic()
        self.started = self.last_save - self.state.elapsed
        bar = self.progress_bar(progress)
        try:
            stopped_by = self.reason_to_stop()
            while stopped_by is None:
                self.update(bar)
                if self.validation_due():
                    self.save(self.validate())
                    stopped_by = self.reason_to_stop()
                elif checkpoint_every is not None and time.monotonic() - self.last_save >= checkpoint_every:
                    self.checkpoint()
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: keep the state for --resume, and say so
            self.save(False)
            raise Interrupted(f"training state at {self.position()} kept in {last_checkpoint_path(self.model_out)}, "
                              f"the best model so far in {self.model_out} (run again with --resume to continue)"
                              ) from exc
        finally:
            bar.close()
        if not self.model_out.exists():
            self.save(False)
        return stopped_by
