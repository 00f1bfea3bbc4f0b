"""CUDA graphs for training updates: each input shape's whole update captured once, then replayed.

A training update of a small-batch recurrent model is hundreds of short kernels (a 64-pair step of
the paper's 1000-unit GRU: the recurrences' per-step matmuls and element-wise ops, their
backward, clipping, Adadelta), each too short to keep a GPU busy, so the GPU waits on Python and
kernel launches (eager updates measured 33 a second on an H100, 1.6% of its fp32 peak). Replaying a
captured graph launches them all at once.

What a caller provides (``rescorer.training.step`` for the RNN, ``cslm.train`` for the CSLM):

* ``update(inputs, key) -> loss``: one full update (zero the gradients, forward, backward,
  clipping, optimiser step) reading its batch from the device tensor ``inputs`` only, whose shape
  ``key`` fixes, with no host reads of device values (no ``.item()``, no boolean indexing).
  Gradients must live in persistent buffers (:func:`persistent_grads`) and the optimiser must be
  capturable (:func:`set_capturable`), so that a replay updates the very tensors the model and
  the checkpoints see.
* ``state()``: the tensors an update changes (parameters and optimiser state).

The first batch of each shape runs eagerly (the warm-up CUDA graphs need: lazily created
optimiser state, library handles), on the capture stream as torch's CUDA-graph notes prescribe:
autograd's gradient-accumulation node of each parameter remembers the stream it was made on and
lives as long as any autograd history holds it, and one made on the default stream makes a capture
on the side stream synchronise with it, which breaks the capture (torch 2.11 on an H100: "operation
failed due to a previous error during capture" at the first shape, after autograd's warning that an
AccumulateGrad node is on another stream). So nothing here keeps such history: the state snapshots
of the check below are taken without autograd (clones of the parameters made with grad on were
exactly such history, made on the default stream, alive through the capture). The second batch
also runs eagerly, on the capture stream, as the reference; then the same update is captured
from the state before it, replayed, and compared with the eager result: a graph is trusted only
once it has reproduced its eager update (loss and every state tensor). If it does not, or the
capture fails, the eager result is kept and training goes on without graphs, with a warning:
slower, never different. All graphs share one memory pool; that is safe because each is a whole
update whose only output, the loss, is copied out right after its replay, and graphs never run
concurrently.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator

import torch
from torch import Tensor

# A graph's update may differ from the eager one only by the order of atomic additions (CUDA's
# index_add_), i.e. in the last bits: far below this fraction of the update itself.
UPDATE_TOLERANCE = 1e-4
LOSS_TOLERANCE = 1e-5


def persistent_grads(params: Iterable[Tensor]) -> list[Tensor]:
    """Zero-filled ``.grad`` buffers for every parameter that has none, and the list of all.

    Backward accumulates into existing buffers in place, so a captured update writes the same
    tensors at every replay (zero them at the start of each update).
    """
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    return grads


def set_capturable(optimizer: torch.optim.Optimizer, capturable: bool) -> None:
    """Make ``optimizer`` (Adam, Adadelta, ...) capturable or not, whatever state it was loaded with.

    ``load_state_dict`` takes the saved groups' flags, so a checkpoint written by an eager run
    would load a non-capturable optimiser; a capturable one keeps its step counts on the
    parameters' device (no host read per update), a non-capturable one on the CPU.
    """
    for group in optimizer.param_groups:
        group["capturable"] = capturable
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if isinstance(state.get("step"), Tensor):
                state["step"] = state["step"].to(p.device if capturable else "cpu", torch.float32)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The parameters and every state tensor of ``optimizer``: what one update changes."""
    tensors = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            tensors.append(p)
            tensors += [v for v in optimizer.state.get(p, {}).values() if isinstance(v, Tensor)]
    return tensors


class CudaGraphs:
    """Capturing on one CUDA device: a side stream to capture on, one memory pool for all graphs.

    :class:`GraphedUpdates` reaches CUDA only through this (tests give it a stand-in that replays
    by running the update again, to check the bookkeeping on a CPU).
    """

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        """Work on the capture stream, ordered after and before the current stream's."""
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            yield
        current.wait_stream(self.stream)

    def load(self, buffer: Tensor, host: Tensor) -> None:
        """Copy the next batch into a graph's input buffer without waiting for the device: from
        pinned memory, which torch's host allocator keeps until the copy is done, so that the
        host prepares the next batch while the device replays."""
        buffer.copy_(host.pin_memory(), non_blocking=True)

    def capture(self, fn: Callable[[], Tensor]) -> tuple[Callable[[], None], Tensor]:
        """Capture ``fn`` (nothing runs) and return the graph's replay and ``fn``'s output tensor.

        A capture that fails leaves torch's CUDA random generator marked as capturing, and its next
        draw outside a graph raises ("Offset increment outside graph capture", seen on an H100 with
        torch 2.11): an empty capture that succeeds closes that, so that eager training, and
        anything else drawing random numbers, goes on.
        """
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                out = fn()
        except RuntimeError:
            # (The capture's own error is the one to report; torch warns that the graph is empty.)
            with contextlib.suppress(RuntimeError), warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=self.stream):
                    pass
            raise
        return graph.replay, out


class _Graph:
    def __init__(self, replay: Callable[[], None], inputs: Tensor, loss: Tensor) -> None:
        self.replay, self.inputs, self.loss = replay, inputs, loss


class GraphedUpdates:
    """Updates through one CUDA graph per input shape (module doc); eager where no graph is trusted."""

    def __init__(self, update: Callable[[Tensor, Hashable], Tensor], state: Callable[[], list[Tensor]],
                 graphs: CudaGraphs) -> None:
        self.update, self.state, self.backend = update, state, graphs
        self.graphs: dict[Hashable, _Graph] = {}
        self.warmed_up: set[Hashable] = set()
        self.enabled = True

    def __call__(self, key: Hashable, host_inputs: Tensor) -> Tensor:
        """One update on the batch ``host_inputs`` (CPU) of shape ``key``; the loss, on the device."""
        graph = self.graphs.get(key)
        if graph is None:
            inputs = host_inputs.to(self.backend.device)
            if self.enabled and key in self.warmed_up:
                return self._capture(key, inputs)
            self.warmed_up.add(key)
            if not self.enabled:
                return self.update(inputs, key)
            with self.backend.side_stream():  # warm up where the capture runs (module doc)
                return self.update(inputs, key)
        self.backend.load(graph.inputs, host_inputs)
        graph.replay()
        return graph.loss.clone()

    def _capture(self, key: Hashable, inputs: Tensor) -> Tensor:
        """The eager update of this batch, then its graph, kept if it reproduces that update."""
        state = self.state()
        before = _snapshot(state)
        with self.backend.side_stream():
            eager_loss = self.update(inputs, key)  # the reference
            after = _snapshot(state)
            _copy(state, before)
            try:
                replay, loss = self.backend.capture(lambda: self.update(inputs, key))
                replay()
                problem = update_difference(loss, eager_loss, state, before, after)
            except RuntimeError as exc:  # an operation CUDA cannot capture
                problem = f"capture failed: {str(exc).splitlines()[0]}"
            if problem:
                _copy(state, after)
        if problem:
            self.enabled = False
            sys.stderr.write(f"warning: the captured training step for shape {key} {problem}; training goes on "
                             "without CUDA graphs (the same updates, more slowly)\n")
            return eager_loss
        self.graphs[key] = _Graph(replay, inputs, loss)
        return loss.clone()


@torch.no_grad()
def _snapshot(tensors: list[Tensor]) -> list[Tensor]:
    """Copies of ``tensors`` without autograd history. The parameters are among them, and a clone
    made with grad on would hold each one's gradient-accumulation node alive, made on the stream the
    clone ran on; the capture's backward then syncs with that stream and the capture fails (module doc)."""
    return [t.clone() for t in tensors]


@torch.no_grad()
def _copy(tensors: list[Tensor], values: list[Tensor]) -> None:
    for t, v in zip(tensors, values, strict=True):
        t.copy_(v)


@torch.no_grad()
def update_difference(loss: Tensor, eager_loss: Tensor, state: list[Tensor], before: list[Tensor],
                after: list[Tensor]) -> str | None:
    """What differs between a replayed update (``loss``, ``state``) and the eager one from the same
    state ``before`` (``eager_loss``, ``after``), or None. Each state tensor must have moved as the
    eager update moved it, to :data:`UPDATE_TOLERANCE` of that move: a replay that skipped the
    optimiser, or read a stale batch, fails."""
    if not torch.allclose(loss, eager_loss, rtol=LOSS_TOLERANCE, atol=0.0):
        return f"gave loss {loss.tolist()} where the eager step gave {eager_loss.tolist()}"
    for i, (t, b, a) in enumerate(zip(state, before, after, strict=True)):
        if not t.is_floating_point():
            continue
        change = (a - b).abs().max()
        if float((t - a).abs().max()) > UPDATE_TOLERANCE * float(change) + 1e-30 and not torch.equal(t, a):
            return f"changed state tensor {i} {tuple(t.shape)} differently from the eager step"
    return None
