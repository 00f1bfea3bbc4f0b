"""ChunkedAdadelta is torch.optim.Adadelta, bit for bit, in state and in updates."""

from __future__ import annotations

import copy

import pytest
import torch

from neural.adadelta import ChunkedAdadelta


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(37, 11), (5,), (1000,), (3, 4, 5)]  # larger and smaller than the chunk used below
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _set_grads(params: list[torch.nn.Parameter], step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 10.0 ** (step % 3 - 2)


def test_updates_are_bit_identical_to_torch_adadelta() -> None:
    reference, chunked = _params(0), _params(0)
    ref_opt = torch.optim.Adadelta(reference, lr=1.0, rho=0.95, eps=1e-6)
    opt = ChunkedAdadelta(chunked, lr=1.0, rho=0.95, eps=1e-6, chunk=64)
    for step in range(5):
        _set_grads(reference, step)
        _set_grads(chunked, step)
        ref_opt.step()
        opt.step()
    for a, b in zip(reference, chunked, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(ref_opt.state[a]["square_avg"], opt.state[b]["square_avg"])
        assert torch.equal(ref_opt.state[a]["acc_delta"], opt.state[b]["acc_delta"])
        assert float(opt.state[b]["step"]) == 5


def test_state_moves_between_torch_and_chunked_adadelta() -> None:
    """Checkpoints written by earlier versions (torch's optimiser) resume with the chunked one."""
    reference = _params(1)
    ref_opt = torch.optim.Adadelta(reference, lr=1.0, rho=0.95, eps=1e-6)
    for step in range(3):
        _set_grads(reference, step)
        ref_opt.step()
    resumed = copy.deepcopy(reference)
    opt = ChunkedAdadelta(resumed, lr=1.0, rho=0.95, eps=1e-6, chunk=100)
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))
    for step in range(3, 6):
        _set_grads(reference, step)
        _set_grads(resumed, step)
        ref_opt.step()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(reference, resumed, strict=True))
    back = torch.optim.Adadelta(copy.deepcopy(resumed), lr=1.0, rho=0.95, eps=1e-6)
    back.load_state_dict(opt.state_dict())


def test_parameters_without_gradient_are_left_alone() -> None:
    params = _params(2)
    before = [p.detach().clone() for p in params]
    opt = ChunkedAdadelta(params, chunk=16)
    _set_grads(params, 0)
    params[1].grad = None
    opt.step()
    assert torch.equal(params[1], before[1])
    assert not torch.equal(params[0], before[0])
    assert params[1] not in opt.state


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipping every step, and never (the factor is exactly 1)
def test_clipping_folded_into_the_step_is_clip_grad_norm_bit_for_bit(workers: int, max_norm: float) -> None:
    reference, chunked = _params(3), _params(3)
    ref_opt = torch.optim.Adadelta(reference, lr=1.0, rho=0.95, eps=1e-6)
    opt = ChunkedAdadelta(chunked, lr=1.0, rho=0.95, eps=1e-6, chunk=64, workers=workers)
    for step in range(5):
        _set_grads(reference, step)
        _set_grads(chunked, step)
        torch.nn.utils.clip_grad_norm_(reference, max_norm)
        ref_opt.step()
        opt.step(max_grad_norm=max_norm)
        for a, b in zip(reference, chunked, strict=True):
            assert torch.equal(a.grad, b.grad)  # the gradients are left clipped, as clip_grad_norm_ leaves them
    for a, b in zip(reference, chunked, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(ref_opt.state[a]["acc_delta"], opt.state[b]["acc_delta"])
