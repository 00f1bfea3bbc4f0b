"""The static-shape training step (what CUDA graphs capture) makes the eager step's updates.

The GPU's captured step replays exactly the static step's operations, checked against its eager
run on the GPU itself (neural.cuda_graphs); here, without a GPU, the static step is run
on the CPU against the eager one, and on the meta device, where any read of a tensor's values on
the host (which a capture cannot hold) raises.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from replaying_graphs import LosesTheOptimiserStep, ReplayByRunning
from torch.utils._python_dispatch import TorchDispatchMode

from infrastructure.errors import UserError
from rescorer.cli import main
from rescorer.model import block_sizes
from rescorer.model.checkpoint import load_checkpoint
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.training.step import EagerStep, StaticStep, bucket_width, resolve_train_step
from rescorer.training.train import make_optimizer, train_on_phrase_table
from shared_paths import shared_file
from small_training import BATCH, CONFIG, losses


def _batches(count: int, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """Minibatches of ragged lengths, some with fewer pairs than the batch size (an epoch's end)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        rows = BATCH if i % 6 else int(rng.integers(1, BATCH))
        src_len = rng.integers(1, 9, rows)
        tgt_len = rng.integers(1, 7 if i % 10 else 12, rows)  # now and then a width past 8 (a wider bucket)
        src = rng.integers(2, CONFIG.src_vocab_size, (rows, src_len.max()))
        tgt = rng.integers(2, CONFIG.tgt_vocab_size, (rows, tgt_len.max()))
        out.append(tuple(torch.from_numpy(a) for a in (src, src_len, tgt, tgt_len)))
    return out


def test_static_step_gives_the_eager_losses_over_50_updates(one_torch_thread):
    batches = _batches(50)
    eager, eager_model = losses(EagerStep, batches)
    static, static_model = losses(StaticStep, batches)
    np.testing.assert_allclose(static, eager, rtol=1e-5)
    # Both end at the same model: each parameter moved the same way, to a thousandth of how far it moved.
    torch.manual_seed(3)
    start = RNNEncoderDecoder(CONFIG)
    for (name, a), b, s in zip(eager_model.named_parameters(), static_model.parameters(), start.parameters(),
                               strict=True):
        moved = float((a - s).detach().abs().max())
        assert moved > 0 and float((b - a).detach().abs().max()) <= 1e-3 * moved, name


def test_captured_step_replays_the_eager_updates(one_torch_thread):
    """The captured step's bookkeeping (a warm-up per shape, the check against the eager update, a
    graph's input buffer refilled before each replay), with replays that rerun the update."""
    batches = _batches(50)
    eager, _ = losses(EagerStep, batches)
    graphs = ReplayByRunning()
    eager_updates_on_side_stream = []

    def make_step(*args) -> StaticStep:
        step = StaticStep(*args, graphs=graphs)
        update = step.graphs.update

        def recorded(*inputs):
            if not graphs.replaying:
                eager_updates_on_side_stream.append(graphs.on_side_stream)
            return update(*inputs)

        step.graphs.update = recorded
        return step

    captured, _ = losses(make_step, batches)
    np.testing.assert_allclose(captured, eager, rtol=1e-5)
    # Every update not replayed (warm-ups, the eager references) ran on the capture stream: autograd
    # nodes made on another stream break the capture on a GPU (neural.cuda_graphs).
    assert eager_updates_on_side_stream and all(eager_updates_on_side_stream)
    shapes = Counter((bucket_width(b[0].shape[1]), bucket_width(b[2].shape[1])) for b in batches)
    # A shape's first batch is its warm-up, the second is captured (and replayed to check it), and
    # every later one replayed: each batch after a shape's first is a replay.
    assert graphs.captures == sum(n > 1 for n in shapes.values()) > 1
    assert graphs.replays == 50 - len(shapes)


def test_a_graph_that_differs_from_the_eager_update_is_dropped(one_torch_thread, capsys):
    batches = _batches(20)
    eager, _ = losses(EagerStep, batches)
    kept, _ = losses(lambda *args: StaticStep(*args, graphs=LosesTheOptimiserStep()), batches)
    np.testing.assert_allclose(kept, eager, rtol=1e-5)
    assert "training goes on without CUDA graphs" in capsys.readouterr().err


def test_static_step_pads_to_a_fixed_batch_and_bucket(one_torch_thread):
    torch.manual_seed(0)
    model = RNNEncoderDecoder(CONFIG)
    cfg = TrainConfig(batch_size=BATCH)
    step = StaticStep(model, make_optimizer(model, cfg), cfg, torch.device("cpu"), None)
    src, src_len, tgt, tgt_len = _batches(1)[0]
    src, src_len, tgt, tgt_len = src[:3], src_len[:3], tgt[:3, :10], tgt_len[:3].clamp(max=10)
    packed, (n, t) = step.pack((src, src_len, tgt, tgt_len))
    assert (n, t) == (src.shape[1], 16) and packed.shape == (BATCH, n + t + 2)
    assert torch.equal(packed[:3, :n][:, : src.shape[1]], src) and torch.equal(packed[:3, n + t + 1], tgt_len)
    assert not packed[3:].any()  # empty rows: </s> ids, lengths 0
    assert [bucket_width(w) for w in (1, 8, 9, 16, 17)] == [1, 8, 16, 16, 24]
    with pytest.raises(ValueError, match="1 to 8 pairs"):
        step.pack(tuple(torch.cat([x, x, x]) for x in (src, src_len, tgt, tgt_len)))


def test_static_update_never_reads_a_value_on_the_host():
    """On the meta device a tensor has no values: .item(), .tolist(), boolean indexing and the like
    raise. The update runs there whole, so a CUDA graph can hold it."""
    with torch.device("meta"):
        model = RNNEncoderDecoder(CONFIG)
    cfg = TrainConfig(batch_size=BATCH)
    step = StaticStep(model, make_optimizer(model, cfg), cfg, torch.device("meta"), None)
    packed, key = step.pack(_batches(1)[0])
    loss = step.update(packed.to("meta"), key)
    assert loss.shape == () and loss.device.type == "meta"
    # The eager step, by contrast, reads lengths (it sorts rows and counts them on the host).
    with pytest.raises((NotImplementedError, RuntimeError)):
        EagerStep(model, make_optimizer(model, cfg), cfg, torch.device("meta"), None)(
            tuple(t.to("meta") for t in _batches(1)[0]))


def test_the_step_each_choice_means():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_train_step("auto", cpu, None) == "eager"
    assert resolve_train_step("auto", cuda, torch.bfloat16) == "captured"  # 6.5x eager on an H100 (run 9)
    assert resolve_train_step("auto", cuda, None) == "captured"
    assert resolve_train_step("auto", cuda, torch.float16) == "eager"
    assert resolve_train_step("static", cpu, None) == "static"
    with pytest.raises(UserError, match="needs a CUDA device"):
        resolve_train_step("captured", cpu, None)
    with pytest.raises(UserError, match="fp16"):
        resolve_train_step("static", cuda, torch.float16)


SMALL = ModelSizes(hidden=32, embedding=16, maxout_units=16, output_rank=16)


def _train(out: Path, steps: int, train_step: str, resume: bool = False):
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    cfg = TrainConfig(max_steps=steps, valid_every=10, patience=None, seed=5, batch_size=16, train_step=train_step)
    return train_on_phrase_table(table, out, model_sizes=SMALL, train_config=cfg, shortlist=300, device="cpu",
                                 resume=resume, progress=False)


@pytest.mark.slow
def test_static_training_matches_eager_and_resumes_to_the_same_model(tmp_path, one_torch_thread):
    eager = _train(tmp_path / "eager.pt", 50, "eager")
    static = _train(tmp_path / "static.pt", 50, "static")
    np.testing.assert_allclose([v.log_likelihood for v in static.history],
                               [v.log_likelihood for v in eager.history], rtol=1e-5)
    assert static.history[-1].log_likelihood > static.history[0].log_likelihood + 0.5
    _train(tmp_path / "killed.pt", 20, "static")
    _train(tmp_path / "killed.pt", 50, "static", resume=True)
    straight = load_checkpoint(tmp_path / "static.pt.last")
    resumed = load_checkpoint(tmp_path / "killed.pt.last")
    assert resumed.train_config.train_step == resumed.train_state["train_step"] == "static"
    for name, value in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_train_step_option_is_kept_in_the_model_file_and_checked_before_any_work(tmp_path, one_torch_thread):
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    sizes = ["--hidden", "8", "--embedding", "4", "--maxout-units", "4", "--output-rank", "4", "--shortlist", "50"]
    common = ["--max-steps", "2", "--valid-every", "2", "--device", "cpu", "--threads", "1", "-q", *sizes]
    refused = CliRunner().invoke(main, ["train", table, str(tmp_path / "gpu.pt"), "--train-step", "captured", *common])
    assert refused.exit_code == 1 and "needs a CUDA device" in refused.output
    assert list(tmp_path.iterdir()) == []
    done = CliRunner().invoke(main, ["train", table, str(tmp_path / "m.pt"), "--train-step", "static", *common])
    assert done.exit_code == 0, done.output
    checkpoint = load_checkpoint(tmp_path / "m.pt")
    assert checkpoint.train_config.train_step == checkpoint.train_state["train_step"] == "static"


class _MatmulShapes(TorchDispatchMode):
    """The (operation, operand shapes, dtype) of every matmul run: what a CPU's oneDNN (bf16) builds a
    kernel for the first time it meets it."""

    MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.mm.out,
               torch.ops.aten.addmm.out)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.MATMULS:
            operands = [a for a in args if isinstance(a, torch.Tensor)][-2:]
            self.seen.append((str(func), *(tuple(t.shape) for t in operands), operands[-1].dtype))
        return func(*args, **(kwargs or {}))


def _shapes_per_update(step, batches: list) -> list[set]:
    shapes = []
    with _MatmulShapes() as mode:
        for batch in batches:
            before = len(mode.seen)
            step(batch)
            shapes.append(set(mode.seen[before:]))
    return shapes


@pytest.mark.slow
def test_static_updates_build_no_new_matmul_shape_once_each_bucket_was_seen(one_torch_thread, monkeypatch):
    """Every static update of a bucket runs the same matmul shapes whatever its rows and lengths, so
    that after one update per bucket no update builds a kernel; the eager step on the minibatches' own
    shapes meets new shapes in update after update (the encoder's running rows, the gradients' K, the
    output positions)."""
    batches = _batches(40)
    torch.manual_seed(3)
    model = RNNEncoderDecoder(CONFIG)
    cfg = TrainConfig(batch_size=BATCH)
    static = StaticStep(model, make_optimizer(model, cfg), cfg, torch.device("cpu"), torch.bfloat16)
    by_bucket: dict[tuple[int, int], set] = {}
    for batch, shapes in zip(batches, _shapes_per_update(static, batches), strict=True):
        key = static.pack(batch)[1]
        assert by_bucket.setdefault(key, shapes) == shapes, key  # the bucket alone decides
    _exact_shapes(monkeypatch)
    torch.manual_seed(3)
    model = RNNEncoderDecoder(CONFIG)
    eager = EagerStep(model, make_optimizer(model, cfg), cfg, torch.device("cpu"), torch.bfloat16)
    eager_shapes = set().union(*_shapes_per_update(eager, batches))
    static_shapes = set().union(*by_bucket.values())
    assert len(static_shapes) < len(eager_shapes) / 2, (len(static_shapes), len(eager_shapes))


def _exact_shapes(monkeypatch) -> None:
    """The eager step on the minibatch's own shapes: no row or position rounded up."""
    for name in ("TRAIN_STEP_ROWS", "TRAIN_PACKED_ROWS", "TRAIN_POSITIONS"):
        monkeypatch.setattr(block_sizes, name, 1)


# The stated tolerance of the padded shapes: the padded rows and positions add exactly nothing (their
# state held bit for bit, their scores dropped, zero gradient), so the only difference is the float
# rounding of matmuls with more rows. Measured over these 50 updates: fp32 losses within 1.4e-7 of the
# exact shapes' (relative; the first update's equal), bf16 losses identical.
PADDED_RTOL = {None: 1e-5, torch.bfloat16: 1e-5}


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_padded_eager_updates_give_the_exact_shapes_losses(one_torch_thread, monkeypatch, amp):
    """Every batch of 8 pairs is padded (the encoder's steps to 8 rows, the output layer to all 8·T
    positions); 50 updates give the losses and the model that the minibatches' own shapes give.
    (fp32 keeps the exact shapes in training, where padding only costs: set here to check it.)"""
    monkeypatch.setattr(block_sizes, "TRAIN_FIXED_SHAPES_IN_FP32", True)
    batches = _batches(50)
    padded, padded_model = losses(EagerStep, batches, amp)
    _exact_shapes(monkeypatch)
    exact, exact_model = losses(EagerStep, batches, amp)
    assert padded[0] == pytest.approx(exact[0], rel=1e-6)  # the same weights: the same loss
    np.testing.assert_allclose(padded, exact, rtol=PADDED_RTOL[amp])
    torch.manual_seed(3)
    start = RNNEncoderDecoder(CONFIG)
    for (name, a), b, s in zip(exact_model.named_parameters(), padded_model.parameters(), start.parameters(),
                               strict=True):
        moved = float((a - s).detach().abs().max())
        assert moved > 0 and float((b - a).detach().abs().max()) <= 1e-3 * moved, name


def _full_batches(count: int, rows: int = 64, seed: int = 5) -> list[tuple[torch.Tensor, ...]]:
    """Minibatches of 64 pairs of 1–7 words (plus </s>), as training draws them from a phrase table:
    sources of any length, targets of about one length (a minibatch is cut from pairs sorted by it)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        longest = int(rng.integers(2, 9))
        src_len, tgt_len = rng.integers(1, 9, rows), rng.integers(longest - 1, longest + 1, rows)
        src = rng.integers(2, CONFIG.src_vocab_size, (rows, src_len.max()))
        tgt = rng.integers(2, CONFIG.tgt_vocab_size, (rows, tgt_len.max()))
        out.append(tuple(torch.from_numpy(a) for a in (src, src_len, tgt, tgt_len)))
    return out


def _eager_shapes(batches: list) -> tuple[set, set]:
    """The matmul shapes of a bf16 eager training's first half of ``batches`` and of its second half."""
    torch.manual_seed(3)
    model = RNNEncoderDecoder(CONFIG)
    cfg = TrainConfig(batch_size=64)
    step = EagerStep(model, make_optimizer(model, cfg), cfg, torch.device("cpu"), torch.bfloat16)
    shapes = _shapes_per_update(step, batches)
    return set().union(*shapes[: len(batches) // 2]), set().union(*shapes[len(batches) // 2 :])


def test_eager_updates_meet_no_new_matmul_shape_after_a_warm_up(one_torch_thread, monkeypatch):
    """The eager step's matmul shapes come from a small fixed set: after 40 updates, 40 more meet no
    shape not met before (oneDNN builds a kernel for each new shape it meets in bf16). On the
    minibatches' own shapes (the running rows, the packed steps, the positions) they keep coming."""
    batches = _full_batches(80)
    warm_up, later = _eager_shapes(batches)
    assert later <= warm_up, later - warm_up
    _exact_shapes(monkeypatch)
    exact_warm_up, exact_later = _eager_shapes(batches)
    assert len(exact_later - exact_warm_up) > 20
    assert len(warm_up) < len(exact_warm_up | exact_later) / 2, (len(warm_up), len(exact_warm_up | exact_later))
