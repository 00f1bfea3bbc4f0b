"""ChunkedAdadelta is torch.optim.Adadelta bit for bit, FusedAdadelta within a stated tolerance; both write the
matmuls' bf16 weight copies."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from neural.adadelta import COMPILE_MIN_ELEMENTS, ChunkedAdadelta, FusedAdadelta
from neural.weight_copies import matmul_weight


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


# The stated tolerance of the compiled update: torch's arithmetic in torch's order, but the compiler may
# fuse a multiply and an add into one rounding, so each step may differ from torch's by a few float32 ulps.
FUSED_RTOL, FUSED_ATOL = 1e-5, 1e-7


@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_compiled_update_is_torch_adadelta_and_clip_grad_norm_within_tolerance(max_norm: float) -> None:
    reference, fused = _params(4), _params(4)
    ref_opt = torch.optim.Adadelta(reference, lr=1.0, rho=0.95, eps=1e-6, foreach=False)
    opt = FusedAdadelta(fused, lr=1.0, rho=0.95, eps=1e-6, compile=True)
    start = [p.detach().clone() for p in reference]
    for step in range(6):
        _set_grads(reference, step)
        _set_grads(fused, step)
        torch.nn.utils.clip_grad_norm_(reference, max_norm, foreach=False)
        ref_opt.step()
        opt.step(max_grad_norm=max_norm)
    assert opt._kernel is not None  # the compiled pass ran, not the chunked fallback
    for a, b, s in zip(reference, fused, start, strict=True):
        assert not torch.equal(a, s)  # the weights did move
        torch.testing.assert_close(b, a, rtol=FUSED_RTOL, atol=FUSED_ATOL)
        torch.testing.assert_close(b - s, a - s, rtol=1e-4, atol=FUSED_ATOL)  # and the updates themselves agree
        for key in ("square_avg", "acc_delta"):
            torch.testing.assert_close(opt.state[b][key], ref_opt.state[a][key], rtol=FUSED_RTOL, atol=1e-12)
        assert float(opt.state[b]["step"]) == 6


@pytest.mark.parametrize("compiled", [False, True])
def test_the_matmuls_bf16_copies_are_written_with_the_weights(compiled: bool) -> None:
    """After each step the copy a training Function reads is the cast of the updated fp32 weight,
    and it is read without casting the weight again."""
    params = _params(5)
    opt = FusedAdadelta(params, chunk=64, compile=compiled)
    copies = [matmul_weight(p, torch.bfloat16) for p in params]
    for step in range(3):
        _set_grads(params, step)
        opt.step(max_grad_norm=0.5)
        for p, kept in zip(params, copies, strict=True):
            assert torch.equal(kept, p.detach().to(torch.bfloat16))
            assert matmul_weight(p, torch.bfloat16) is kept  # current: no new cast
    assert matmul_weight(params[0], torch.float32) is params[0]  # fp32 training: the weight itself


def test_a_weight_changed_elsewhere_is_cast_again() -> None:
    """A copy the optimiser did not refresh (a checkpoint loaded into the model, another optimiser)
    is never read: the version counter tells."""
    params = _params(6)
    kept = matmul_weight(params[0], torch.bfloat16)
    with torch.no_grad():
        params[0].add_(1.0)
    fresh = matmul_weight(params[0], torch.bfloat16)
    assert fresh is not kept and torch.equal(fresh, params[0].detach().to(torch.bfloat16))
    _set_grads(params, 0)
    torch.optim.Adadelta(params).step()  # writes no copy
    assert torch.equal(matmul_weight(params[0], torch.bfloat16), params[0].detach().to(torch.bfloat16))


def test_training_compiles_the_update_at_the_sizes_that_repay_it() -> None:
    from rescorer.model.config import TrainConfig
    from rescorer.training.train import make_optimizer

    tiny = torch.nn.Linear(10, 10)
    assert not FusedAdadelta(tiny.parameters())._compile
    big = torch.nn.Linear(1000, COMPILE_MIN_ELEMENTS // 1000)
    assert FusedAdadelta(big.parameters())._compile
    assert isinstance(make_optimizer(torch.nn.Linear(2, 2), TrainConfig()), FusedAdadelta)


def test_the_update_is_one_compiled_call_over_all_parameters_compiled_once() -> None:
    """One call of the compiled code per step, whatever the number of parameters (a call per
    parameter paid its guards and wrapper each time), and one compilation, the trial's, which the
    steps then use (each compilation takes seconds; one made for the trial alone doubled the first
    step's wait). A step over another list of tensors (a parameter without a gradient) compiles once more."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    params = _params(7)
    opt = FusedAdadelta(params, compile=True)
    matmul_weight(params[0], torch.bfloat16)  # one weight with a copy, the others without
    _set_grads(params, 0)
    opt.step(max_grad_norm=0.5)
    kernel, calls = opt._kernel, []
    assert kernel is not None
    opt._kernel = lambda *args: calls.append(len(args[0])) or kernel(*args)
    for step in range(1, 3):
        _set_grads(params, step)
        opt.step(max_grad_norm=0.5)
    assert calls == [len(params)] * 2
    assert counters["stats"]["unique_graphs"] == 1
    params[1].grad = None
    opt.step(max_grad_norm=0.5)
    assert calls[-1] == len(params) - 1 and counters["stats"]["unique_graphs"] == 2


STORED_RNN = Path(__file__).resolve().parents[1] / "data" / "old_checkpoints" / "rnn" / "m.pt.last"


def test_a_stored_training_state_resumes_in_the_compiled_update() -> None:
    """A training state written by earlier code (torch's Adadelta state, tests/data/old_checkpoints)
    continues in the compiled update as in torch's own Adadelta and clip, within the stated tolerance,
    and what it saves loads back into torch's."""
    from rescorer.model.checkpoint import load_checkpoint

    stored = load_checkpoint(STORED_RNN)
    assert stored.optimizer_state is not None and stored.optimizer_state["state"]
    steps_before = float(stored.optimizer_state["state"][0]["step"])
    reference, fused = (list(copy.deepcopy(stored.model).parameters()) for _ in range(2))
    ref_opt = torch.optim.Adadelta(reference, lr=1.0, rho=0.95, eps=1e-6, foreach=False)
    opt = FusedAdadelta(fused, lr=1.0, rho=0.95, eps=1e-6, compile=True)
    ref_opt.load_state_dict(copy.deepcopy(stored.optimizer_state))
    opt.load_state_dict(copy.deepcopy(stored.optimizer_state))
    for step in range(3):
        _set_grads(reference, step)
        _set_grads(fused, step)
        torch.nn.utils.clip_grad_norm_(reference, 1.0, foreach=False)
        ref_opt.step()
        opt.step(max_grad_norm=1.0)
    assert opt._kernel is not None
    for a, b in zip(reference, fused, strict=True):
        torch.testing.assert_close(b, a, rtol=FUSED_RTOL, atol=FUSED_ATOL)
        for key in ("square_avg", "acc_delta"):
            torch.testing.assert_close(opt.state[b][key], ref_opt.state[a][key], rtol=FUSED_RTOL, atol=1e-12)
        assert float(opt.state[b]["step"]) == steps_before + 3
    saved = opt.state_dict()
    assert list(saved["param_groups"][0]) == list(stored.optimizer_state["param_groups"][0])
    torch.optim.Adadelta(copy.deepcopy(fused)).load_state_dict(saved)
