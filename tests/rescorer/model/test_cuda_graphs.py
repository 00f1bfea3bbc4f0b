"""The check a CUDA graph passes before training trusts it (rescorer.model.cuda_graphs), on the CPU."""

from __future__ import annotations

import pytest
import torch

from rescorer.model.cuda_graphs import (
    CudaGraphs,
    optimizer_tensors,
    persistent_grads,
    set_capturable,
    update_difference,
)


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
