"""The training base (neural/training.py), driven with a run that trains nothing, and its typed state
read from model files that earlier code wrote.

The RNN's and the CSLM's own tests (tests/rescorer/training, tests/cslm) check the base with real
models: resume to the same result, stop reasons, interruption; tests/neural/test_stored_runs.py
resumes stored runs. These pin what the base itself promises to every model, and that both
trainings are built on it rather than on a loop of their own.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from click.testing import CliRunner

from cslm.cli import main as cslm_main
from cslm.model_file import load_cslm
from cslm.train import CSLMTrainingState
from infrastructure.interrupts import Interrupted
from infrastructure.progress import progress_bar
from neural.training import DivergedError, Training, TrainingState, last_checkpoint_path
from rescorer.cli import main as rescorer_main
from rescorer.training.train import RNNTrainingState

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "tests" / "data" / "old_checkpoints"


class _Model:
    def __init__(self) -> None:
        self.training = False

    def train(self) -> None:
        self.training = True


@dataclass
class _CountingState(TrainingState):
    step: int = 0
    best: float = -math.inf


@dataclass
class _CountingRun(Training):
    """Validates every ``every`` updates; stops after ``stop_after`` updates, on Ctrl-C at ``interrupt_at``;
    its loss is NaN at update ``nan_at``. Its model file is the step it was saved at."""

    every: int = 3
    stop_after: int = 7
    interrupt_at: int | None = None
    nan_at: int | None = None
    events: list[str] = field(default_factory=list)

    DIVERGED_HINT: ClassVar[str] = "train again with a smaller --init-std"

    @classmethod
    def make(cls, tmp_path: Path, *, done: int = 0, device: str = "cpu", **kw: Any) -> _CountingRun:
        state = _CountingState(step=done, history=[0] if done else [])
        return cls(tmp_path / "model", torch.device(device), None, _Model(), None, state, **kw)

    def progress_bar(self, show: bool) -> Any:
        return progress_bar(total=self.stop_after, show=show)

    def update(self, bar: Any) -> None:
        assert self.model.training
        if self.state.step == self.interrupt_at:
            raise KeyboardInterrupt
        self.state.step += 1
        self.watch_loss(torch.tensor(math.nan if self.state.step == self.nan_at else 1.0), self.state.step)
        bar.update(1)

    def validation_due(self) -> bool:
        return self.state.step % self.every == 0 or self.state.step >= self.stop_after

    def measure(self) -> tuple[int, float]:
        self.events.append(f"validate {self.state.step}")
        return self.state.step, float(self.state.step)

    def improves(self, metric: float) -> bool:
        return metric > self.state.best

    def write(self, path: Path) -> None:
        self.events.append(f"save {path.name} {self.state.step}")
        path.write_text(str(self.state.step))

    def reason_to_stop(self) -> str | None:
        return "max_steps" if self.state.step >= self.stop_after else None

    def position(self) -> str:
        return f"step {self.state.step}"


def test_validations_and_saves_come_when_the_run_says_and_the_stop_reason_is_the_runs(tmp_path):
    run = _CountingRun.make(tmp_path)
    assert run.run(progress=False) == "max_steps"
    assert run.events == ["validate 0", "validate 3", "save model.last 3", "save model 3", "validate 6",
                          "save model.last 6", "save model 6", "validate 7", "save model.last 7", "save model 7"]
    assert run.state.history == [0, 3, 6, 7] and run.state.best == 7


def test_between_validations_the_latest_state_is_saved_when_checkpoint_every_has_passed(tmp_path, capsys):
    """A run killed outright (SIGKILL, the end of a session) loses what it trained since its last save:
    with ``checkpoint_every`` seconds passed (0: always) ``MODEL.last`` alone is saved after an update
    that ends no stretch between validations (``MODEL`` too while there is none), and a line says where a
    resume picks up."""
    run = _CountingRun.make(tmp_path)
    assert run.run(progress=False, checkpoint_every=0) == "max_steps"
    assert run.events == ["validate 0", "save model.last 1", "save model 1", "save model.last 2", "validate 3",
                          "save model.last 3",
                          "save model 3", "save model.last 4", "save model.last 5", "validate 6", "save model.last 6",
                          "save model 6", "validate 7", "save model.last 7", "save model 7"]
    assert capsys.readouterr().err.splitlines() == [f"saved {run.model_out}.last: step {n}, 0 s trained"
                                                    for n in (1, 2, 4, 5)]
    (tmp_path / "seldom").mkdir()
    seldom = _CountingRun.make(tmp_path / "seldom")
    assert seldom.run(progress=False, checkpoint_every=3600) == "max_steps"
    assert seldom.events == ["validate 0", "validate 3", "save model.last 3", "save model 3", "validate 6",
                             "save model.last 6", "save model 6", "validate 7", "save model.last 7", "save model 7"]
    assert capsys.readouterr().err == ""


def test_a_run_with_its_budget_spent_takes_no_update(tmp_path):
    run = _CountingRun.make(tmp_path, done=7)
    assert run.run(progress=False) == "max_steps"
    assert run.state.step == 7
    assert run.events == ["save model.last 7", "save model 7"]  # the model file written, since there was none


def test_ctrl_c_saves_the_state_and_says_where_it_is(tmp_path):
    run = _CountingRun.make(tmp_path, interrupt_at=4)
    with pytest.raises(Interrupted) as caught:
        run.run(progress=False)
    assert run.events[-1] == "save model.last 4"
    assert caught.value.kept == (f"training state at step 4 kept in {run.model_out}.last, the best model so far in "
                                 f"{run.model_out} (run again with --resume to continue)")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_nan_loss_stops_the_run_in_one_line_and_saves_nothing_of_it(tmp_path, device):
    """On a CPU the update that went NaN stops the run at once; on a GPU, where reading the loss
    would make it wait, at the next save, which it never makes: either way the files keep update 3."""
    run = _CountingRun.make(tmp_path, nan_at=5, device=device)
    with pytest.raises(DivergedError) as caught:
        run.run(progress=False)
    assert str(caught.value) == (f"the training loss became nan at update 5: the model diverged; {run.model_out} and "
                                 f"{run.model_out}.last keep the last finite state; train again with a smaller "
                                 "--init-std")
    assert run.state.step == (5 if device == "cpu" else 6)
    assert run.model_out.read_text() == last_checkpoint_path(run.model_out).read_text() == "3"


@pytest.mark.parametrize("module", ["rescorer/training/train.py", "cslm/train.py"])
def test_both_trainings_are_built_on_the_base(module):
    """Neither training keeps a loop of its own: none catches Ctrl-C, both subclass ``Training``."""
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    bases = {ast.unparse(base) for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for base in node.bases}
    handlers = [ast.unparse(node.type) for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler) and node.type]
    assert {"Training", "TrainingState"} <= bases
    assert not [h for h in handlers if "KeyboardInterrupt" in h]


@pytest.mark.parametrize(("state_type", "path"), [
    (RNNTrainingState, "rnn/m.pt.last"), (RNNTrainingState, "rnn/straight.pt.last"),
    (CSLMTrainingState, "cslm/m.pt.last"), (CSLMTrainingState, "cslm/straight.pt.last")])
def test_the_typed_state_reads_and_writes_what_earlier_files_hold(state_type, path):
    """A state read from a stored file and written back is that file's state, key for key in its order:
    a resumed run's files are laid out as earlier code wrote them."""
    stored = torch.load(STORED / path, weights_only=True)["train_state"]
    state = state_type.from_dict(stored)
    assert state.to_dict() == stored and list(state.to_dict()) == list(stored)
    assert state.history and state.best == stored.get("best_ll", stored.get("best"))
    fresh = state_type(data="x", train_step="eager", precision="fp32")
    assert list(fresh.to_dict()) == list(stored)


def test_a_model_with_infinite_initial_weights_is_refused_before_any_file(tmp_path):
    """``--init-std 1e308`` would make weights of inf (a NaN model, exit 0): it is refused while the command
    line is read, in one line, before any file is made."""
    table = STORED / "rnn" / "table.txt"
    res = CliRunner().invoke(rescorer_main, ["train", str(table), str(tmp_path / "m.pt"), "--init-std", "1e308",
                                             "--hidden", "6", "--embedding", "4", "--maxout-units", "4",
                                             "--output-rank", "3", "--shortlist", "20", "--max-steps", "4",
                                             "--device", "cpu", "--threads", "1", "-q"])
    assert res.exit_code == 1
    last = res.output.splitlines()[-1]
    assert last.startswith("Error:") and "--init-std" in last and "range" in last, res.output
    assert list(tmp_path.iterdir()) == []


def test_a_cslm_that_diverges_keeps_its_last_finite_files(tmp_path):
    """A learning rate of 1e30 sends the loss to NaN in a few updates: the run stops there, and the
    model files are those of the last save before it, every weight a finite number."""
    res = CliRunner().invoke(cslm_main, ["train", str(STORED / "cslm" / "fr.txt"), str(tmp_path / "c.pt"),
                                         "--order", "3", "--embedding", "4", "--hidden", "6", "--shortlist", "30",
                                         "--optimizer", "sgd", "--lr", "1e30", "--max-epochs", "2", "--epoch-size",
                                         "256", "--batch-size", "32", "--device", "cpu", "--threads", "1", "-q"])
    assert res.exit_code == 1
    assert re.fullmatch(rf"Error: the training loss became (nan|inf|-inf) at the update that reached \d+ n-grams: "
                        rf"the model diverged; {re.escape(str(tmp_path / 'c.pt'))} and "
                        rf"{re.escape(str(tmp_path / 'c.pt.last'))} keep the last finite state; train again with a "
                        r"smaller --lr", res.output.splitlines()[-1]), res.output
    for name in ("c.pt", "c.pt.last"):
        kept = load_cslm(tmp_path / name)
        assert kept.train_state["examples"] == 0
        assert all(torch.isfinite(w).all() for w in kept.model.state_dict().values())
