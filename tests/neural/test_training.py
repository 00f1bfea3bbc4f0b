"""The one training loop (neural/training.py), driven with a run that trains nothing.

The RNN's and the CSLM's own tests (tests/rescorer/training, tests/cslm) check the loop with real
models: resume to the same result, stop reasons, interruption. These pin what the loop itself
promises to both, and that both trainings run it rather than a loop of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from infrastructure.interrupts import Interrupted
from infrastructure.progress import progress_bar
from neural.training import run_training

ROOT = Path(__file__).resolve().parents[2]


class _Model:
    def __init__(self) -> None:
        self.training = False

    def train(self) -> None:
        self.training = True


class _CountingRun:
    """Validates every ``every`` updates; stops after ``stop_after`` updates, or on Ctrl-C at ``interrupt_at``."""

    def __init__(self, tmp_path: Path, *, every: int = 3, stop_after: int = 7, interrupt_at: int | None = None,
                 done: int = 0) -> None:
        self.model_out = tmp_path / "model"
        self.state: dict[str, Any] = {"step": done, "elapsed": 0.0}
        self.history: list[int] = [0] if done else []
        self.started = 0.0
        self.model = _Model()
        self.every, self.stop_after, self.interrupt_at = every, stop_after, interrupt_at
        self.events: list[str] = []

    @property
    def last_path(self) -> Path:
        return Path(str(self.model_out) + ".last")

    def first_validation(self) -> None:
        self.events.append("first validation")
        self.history.append(self.state["step"])

    def progress_bar(self, show: bool) -> Any:
        return progress_bar(total=self.stop_after, show=show)

    def update(self, bar: Any) -> None:
        assert self.model.training
        if self.state["step"] == self.interrupt_at:
            raise KeyboardInterrupt
        self.state["step"] += 1
        bar.update(1)

    def validation_due(self) -> bool:
        return self.state["step"] % self.every == 0 or self.state["step"] >= self.stop_after

    def validate(self) -> bool:
        self.events.append(f"validate {self.state['step']}")
        self.history.append(self.state["step"])
        return True

    def save(self, improved: bool) -> None:
        self.events.append(f"save {self.state['step']} {improved}")
        self.model_out.write_text(str(self.state["step"]))

    def reason_to_stop(self) -> str | None:
        return "max_steps" if self.state["step"] >= self.stop_after else None

    def position(self) -> str:
        return f"step {self.state['step']}"


def test_validations_and_saves_come_when_the_run_says_and_the_stop_reason_is_the_runs(tmp_path):
    run = _CountingRun(tmp_path)
    assert run_training(run, progress=False) == "max_steps"
    assert run.events == ["first validation", "validate 3", "save 3 True", "validate 6", "save 6 True",
                          "validate 7", "save 7 True"]


def test_a_run_with_its_budget_spent_takes_no_update(tmp_path):
    run = _CountingRun(tmp_path, done=7)
    assert run_training(run, progress=False) == "max_steps"
    assert run.state["step"] == 7
    assert run.events == ["save 7 False"]  # the model file written, since there was none


def test_ctrl_c_saves_the_state_and_says_where_it_is(tmp_path):
    run = _CountingRun(tmp_path, interrupt_at=4)
    with pytest.raises(Interrupted) as caught:
        run_training(run, progress=False)
    assert run.events[-1] == "save 4 False"
    assert caught.value.kept == (f"training state at step 4 kept in {run.last_path}, the best model so far in "
                                 f"{run.model_out} (run again with --resume to continue)")


@pytest.mark.parametrize("module", ["rescorer/training/train.py", "cslm/train.py"])
def test_both_trainings_run_the_one_loop(module):
    """Neither training keeps a loop of its own: none catches Ctrl-C, both call ``run_training``."""
    tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    handlers = [ast.unparse(node.type) for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler) and node.type]
    assert "run_training" in calls
    assert not [h for h in handlers if "KeyboardInterrupt" in h]
