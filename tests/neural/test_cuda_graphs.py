"""The check a CUDA graph passes before training trusts it (neural.cuda_graphs), on the CPU."""

from __future__ import annotations

import pytest
import torch

from neural.cuda_graphs import CudaGraphs, optimizer_tensors, persistent_grads, set_capturable, update_difference


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    grads = persistent_grads(model.parameters())
    x, y = torch.randn(8, 5), torch.randn(8, 3)

    def update(batch: torch.Tensor) -> torch.Tensor:
        torch._foreach_zero_(grads)
        loss = ((model(batch) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        return loss.detach()

    update(x)  # the optimiser's state exists from here on, as after a graph's warm-up
    return model, optimizer, update, x


def _eager_then_rewind(update, x, state):
    """One eager update, then the state put back as it was: (state before, eager loss, state after)."""
    before = [t.clone() for t in state]
    eager_loss = update(x)
    after = [t.clone() for t in state]
    with torch.no_grad():
        for t, b in zip(state, before, strict=True):
            t.copy_(b)
    return before, eager_loss, after


def test_a_replay_that_repeats_the_eager_update_passes():
    _, optimizer, update, x = _setup()
    state = optimizer_tensors(optimizer)
    assert len(state) == 2 * 4  # weight and bias, each with its step, square_avg and acc_delta
    before, eager_loss, after = _eager_then_rewind(update, x, state)
    assert update_difference(update(x), eager_loss, state, before, after) is None


def test_a_replay_that_skips_the_optimiser_or_reads_a_stale_batch_fails():
    _, optimizer, update, x = _setup()
    state = optimizer_tensors(optimizer)
    before, eager_loss, after = _eager_then_rewind(update, x, state)
    # The update "replayed" without its optimiser step: the loss is right, the state did not move.
    assert "state tensor" in update_difference(eager_loss.clone(), eager_loss, state, before, after)
    # The update replayed on another batch than the eager one.
    stale = update(x + 1.0)
    assert "loss" in update_difference(stale, eager_loss, state, before, after)


def test_persistent_gradients_and_capturable_optimisers():
    model, optimizer, _, _ = _setup()
    grads = [p.grad for p in model.parameters()]
    assert persistent_grads(model.parameters()) == grads  # existing buffers are kept, not replaced
    set_capturable(optimizer, True)
    assert all(group["capturable"] for group in optimizer.param_groups)
    assert all(optimizer.state[p]["step"].device == p.device for p in model.parameters())
    set_capturable(optimizer, False)
    assert not any(group["capturable"] for group in optimizer.param_groups)
    with pytest.raises(ValueError, match="CUDA device"):
        CudaGraphs(torch.device("cpu"))


def test_no_autograd_history_is_alive_when_the_capture_starts():
    """The check's snapshots of the state (the parameters among it) are taken without autograd: a
    clone made with grad on keeps each parameter's gradient-accumulation node alive, made on the
    stream the snapshot ran on (the default one), and autograd then syncs the capture with that
    stream, which breaks it (the H100's "operation failed due to a previous error during capture",
    after its warning that an AccumulateGrad node is on another stream)."""
    from replaying_graphs import ReplayByRunning

    from neural.cuda_graphs import GraphedUpdates

    model, optimizer, update, x = _setup()
    backend = ReplayByRunning()
    updates = GraphedUpdates(lambda inputs, key: update(inputs), lambda: optimizer_tensors(optimizer), backend)
    for _ in range(3):
        updates("k", x)
    assert backend.captures == 1 and updates.enabled
    assert backend.graphs_alive_at_capture == []


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU)")


@needs_cuda
def test_a_real_capture_of_the_training_step_is_trusted(capsys):
    """On a GPU, the static training step's graph is captured and passes its check against the eager
    update. (On an H100 it failed at the first shape until the check's state snapshots stopped keeping
    default-stream autograd history alive: results/gpu-h100/README.md, runs 8 and 9.)"""
    from rescorer.model.config import ModelConfig, TrainConfig
    from rescorer.model.network import RNNEncoderDecoder
    from rescorer.training.step import StaticStep
    from rescorer.training.train import make_optimizer

    torch.manual_seed(0)
    device = torch.device("cuda")
    config = ModelConfig(src_vocab_size=60, tgt_vocab_size=70, hidden=32, embedding=16, maxout_units=16,
                         output_rank=8)
    cfg = TrainConfig(batch_size=8)
    model = RNNEncoderDecoder(config).to(device)
    step = StaticStep(model, make_optimizer(model, cfg), cfg, device, None, CudaGraphs(device))
    batch = (torch.randint(2, 60, (8, 4)), torch.full((8,), 4), torch.randint(2, 70, (8, 3)), torch.full((8,), 3))
    losses = [float(step(batch)) for _ in range(4)]
    assert step.graphs.enabled and list(step.graphs.graphs) == [(4, 3)], capsys.readouterr().err
    assert "without CUDA graphs" not in capsys.readouterr().err
    assert losses[3] < losses[0]  # the replays train: the same batch's loss falls


@needs_cuda
def test_a_failed_capture_leaves_random_numbers_working(capsys):
    """An update that reads a value on the host cannot be captured: training goes on eagerly with a
    warning, and the CUDA generator still draws (it raised "Offset increment outside graph capture")."""
    from neural.cuda_graphs import GraphedUpdates

    device = torch.device("cuda")
    weight = torch.zeros(3, device=device, requires_grad=True)
    grads = persistent_grads([weight])

    def update(inputs: torch.Tensor, key: object) -> torch.Tensor:
        torch._foreach_zero_(grads)
        loss = (weight * inputs).sum()
        if float(loss) > 1e9:  # a host read: not capturable
            raise AssertionError
        loss.backward()
        with torch.no_grad():
            weight.sub_(0.1 * weight.grad)
        return loss.detach()

    updates = GraphedUpdates(update, lambda: [weight], CudaGraphs(device))
    for _ in range(3):
        updates("k", torch.ones(3))
    assert not updates.enabled and "training goes on without CUDA graphs" in capsys.readouterr().err
    assert torch.randn(4, device=device).shape == (4,)
    assert torch.allclose(weight, torch.full((3,), -0.3, device=device))
