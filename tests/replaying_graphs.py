"""Stand-ins for neural.cuda_graphs.CudaGraphs, to test the captured steps' bookkeeping on a CPU."""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Iterator

import torch


class ReplayByRunning:
    """Stands in for CudaGraphs on the CPU: capturing runs nothing; a replay runs the update again
    from the graph's input buffer and writes its loss into the graph's output tensor, as a CUDA
    graph's replay rewrites its buffers."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.captures, self.replays = 0, 0
        self.on_side_stream = self.replaying = False
        self.graphs_alive_at_capture: list[torch.Tensor] = []
        # Tensors with a history that were alive before this stand-in existed (kept by earlier tests, e.g. in
        # torch.compile's caches) are not the update's: only those made since count.
        self._alive_before = {id(t) for t in self.tensors_holding_a_graph()}

    @staticmethod
    def tensors_holding_a_graph() -> list[torch.Tensor]:
        """Every live tensor with an autograd history: each keeps the gradient-accumulation nodes of
        the parameters it came from alive, with the stream they were made on (neural.cuda_graphs)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance on torch's deprecated module attributes
            return [t for t in gc.get_objects() if _holds_a_graph(t)]

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        self.on_side_stream = True
        try:
            yield
        finally:
            self.on_side_stream = False

    def load(self, buffer: torch.Tensor, host: torch.Tensor) -> None:
        buffer.copy_(host)

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        self.captures += 1
        self.graphs_alive_at_capture += [t for t in self.tensors_holding_a_graph() if id(t) not in self._alive_before]
        out = torch.empty(0)  # its shape comes with the first replay

        def replay() -> None:
            self.replays += 1
            self.replaying = True
            try:
                result = fn()
            finally:
                self.replaying = False
            out.resize_(result.shape).copy_(result)

        return replay, out


class LosesTheOptimiserStep(ReplayByRunning):
    """A capture that went wrong: its replay leaves the model as it was."""

    def capture(self, fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
        return (lambda: None), torch.zeros(())


def _holds_a_graph(obj: object) -> bool:
    """Whether ``obj`` is a tensor with an autograd history. Objects that earlier tests left in torch.compile's
    caches can refuse the question (a weak proxy whose tensor is gone, a view whose base changed in another
    grad mode): those are not the update's tensors."""
    try:
        return isinstance(obj, torch.Tensor) and obj.grad_fn is not None
    except (ReferenceError, RuntimeError):
        return False
