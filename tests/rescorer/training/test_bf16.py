"""bf16 training on the CPU: the updates track fp32's, each weight is cast to bf16 once
per update, ``auto`` takes bf16 on a CPU only where it measures that it pays, and the model saved is an
ordinary fp32 model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neural import output_layer
from neural.device import CPU_BF16_PAYS_AT, cpu_bf16_speedup, training_precision
from rescorer.model.checkpoint import load_checkpoint
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.training.step import EagerStep, StaticStep
from rescorer.training.train import make_optimizer, train_on_phrase_table
from shared_paths import shared_file
from small_training import BATCH, CONFIG, losses

# The stated tolerance. bf16 keeps 8 bits of mantissa (relative rounding 2^-9 = 0.2%); with fp32
# states, softmax, gradients and optimiser, each of 50 updates' losses stays within 1% of fp32's
# (measured: 0.22% at most), and every parameter moves the way fp32 moves it: the cosine between
# the two runs' total updates is at least 0.9 (measured: 0.95 at least; Adadelta's per-weight
# scaling makes tiny gradients' steps as large as big ones', so rounding shows in direction first).
LOSS_RTOL = 0.01
MIN_UPDATE_COSINE = 0.9


def _batches(count: int, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        src_len, tgt_len = rng.integers(1, 9, BATCH), rng.integers(1, 7, BATCH)
        src = rng.integers(2, CONFIG.src_vocab_size, (BATCH, src_len.max()))
        tgt = rng.integers(2, CONFIG.tgt_vocab_size, (BATCH, tgt_len.max()))
        out.append(tuple(torch.from_numpy(a) for a in (src, src_len, tgt, tgt_len)))
    return out


@pytest.mark.slow
def test_bf16_updates_agree_with_fp32_over_50_updates(one_torch_thread):
    batches = _batches(50)
    exact, exact_model = losses(EagerStep, batches)
    mixed, mixed_model = losses(EagerStep, batches, torch.bfloat16)
    np.testing.assert_allclose(mixed, exact, rtol=LOSS_RTOL)
    assert exact[-1] < 0.95 * exact[0] and mixed[-1] < 0.95 * mixed[0]  # both learned
    assert mixed != exact  # the bf16 run did run in bf16
    torch.manual_seed(3)
    start = RNNEncoderDecoder(CONFIG)
    for (name, a), b, s in zip(exact_model.named_parameters(), mixed_model.parameters(), start.parameters(),
                               strict=True):
        assert b.dtype == torch.float32, name  # the master weights stay fp32
        cosine = torch.nn.functional.cosine_similarity((b - s).detach().flatten(), (a - s).detach().flatten(), dim=0)
        assert float(cosine) >= MIN_UPDATE_COSINE, (name, float(cosine))


class _WeightCasts(TorchDispatchMode):
    """Counts fp32 → bf16 conversions that read a parameter's storage (the weight or a view of it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.names = {p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()}
        self.casts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            source = args[1] if func is torch.ops.aten.copy_.default else source
            target = out if func is torch.ops.aten._to_copy.default else args[0]
            if source.dtype == torch.float32 and target.dtype == torch.bfloat16:
                name = self.names.get(source.untyped_storage().data_ptr())
                if name is not None:
                    self.casts[name] = self.casts.get(name, 0) + 1
        return out


def test_each_weight_is_cast_to_bf16_once_per_update(one_torch_thread):
    """Not once per time step: the recurrences' weights, cast at every step, were 3M values converted
    per decoder step each way at paper sizes. The weights the hand-written Functions read are cast
    by the optimiser, in the pass that updates them (neural.weight_copies), the others by autocast."""
    torch.manual_seed(3)
    model = RNNEncoderDecoder(CONFIG)
    cfg = TrainConfig(batch_size=BATCH)
    step = EagerStep(model, make_optimizer(model, cfg), cfg, torch.device("cpu"), torch.bfloat16)
    batch = _batches(1)[0]
    assert int(batch[1].max()) > 3 and int(batch[3].max()) > 3  # several steps each way
    step(batch)  # from the second update on, the recurrences' and output layer's copies come from the optimiser
    with _WeightCasts(model) as casts:
        step(batch)
    for name in ("enc_rec_gates.weight", "enc_rec_cand.weight", "dec_rec.weight", "dec_context.weight",
                 "out_vocab.weight", "out_rank.weight"):
        assert casts.casts.get(name) == 1, (name, casts.casts)
    assert max(casts.casts.values()) == 1, casts.casts


class _MixedDtypeOps(TorchDispatchMode):
    """Every operation (other than a conversion) whose floating-point tensor operands differ in dtype:
    such an add converts one operand element by element inside the add, slower than the same add in
    one dtype (bf16 + fp32 in the output layer measured 1.5× a widening copy and an fp32 add)."""

    CONVERSIONS = ("aten._to_copy", "aten.copy_", "aten.copy.")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        operands = [a for a in (*args, *(kwargs or {}).values())
                    if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() > 0]
        if len({t.dtype for t in operands}) > 1 and not str(func).startswith(self.CONVERSIONS):
            self.seen.append((str(func), tuple(t.dtype for t in operands)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("make_step", [EagerStep, StaticStep])
def test_a_bf16_update_adds_no_bf16_to_fp32(one_torch_thread, monkeypatch, make_step):
    """bf16 matmul results are widened before an fp32 operand is added to them (the decoder's
    reset-multiplied bias, the output layer's gradient of G_r s summed over vocabulary blocks)."""
    monkeypatch.setattr(output_layer, "CPU_TRAIN_BLOCK_VOCAB", 16)  # several blocks of the 50 words
    torch.manual_seed(3)
    model = RNNEncoderDecoder(CONFIG)
    cfg = TrainConfig(batch_size=BATCH)
    step = make_step(model, make_optimizer(model, cfg), cfg, torch.device("cpu"), torch.bfloat16)
    batch = _batches(1)[0]
    step(batch)
    with _MixedDtypeOps() as mixed:
        step(batch)
    assert mixed.seen == []


def test_named_precisions_are_kept_and_auto_follows_the_measured_bf16_speed_on_a_cpu():
    cpu = torch.device("cpu")
    assert training_precision(cpu, "fp32") == "fp32" and training_precision(cpu, "bf16") == "bf16"
    assert training_precision(cpu, "auto") == "fp32"  # no width: a check made before the model's size is known
    for width in (8, 256):
        pays = cpu_bf16_speedup(width) >= CPU_BF16_PAYS_AT
        assert training_precision(cpu, "auto", width) == ("bf16" if pays else "fp32")


def _train_table(out, precision: str):
    table = str(shared_file("fixtures/hansard-enfr/phrase-table.sample.gz"))
    small = ModelSizes(hidden=48, embedding=24, maxout_units=24, output_rank=24)
    cfg = TrainConfig(max_steps=4, valid_every=4, patience=None, seed=7)
    return train_on_phrase_table(table, out, model_sizes=small, train_config=cfg, shortlist=300, device="cpu",
                                 precision=precision, progress=False)


def test_auto_training_on_a_cpu_takes_what_the_measure_says_and_says_so(tmp_path, capsys):
    """``auto`` on a CPU is bf16 only where this CPU's bf16 matmuls at the model's width pay: the run
    says the ratio and the choice, records it, and computes exactly what naming that precision computes."""
    _train_table(tmp_path / "auto.pt", "auto")
    chosen = training_precision(torch.device("cpu"), "auto", 48)  # the measure is made once per process
    err = capsys.readouterr().err
    speedup = cpu_bf16_speedup(48)
    why = (f"this CPU's bf16 matmuls at width 48 run {speedup:.1f}x its fp32 ones; {CPU_BF16_PAYS_AT:g}x pays"
           if speedup else "this CPU has no native bf16 matmuls")  # AVX2 only: not measured
    assert f"training on cpu in {chosen} (auto: {why}): " in err
    auto = load_checkpoint(tmp_path / "auto.pt")
    assert auto.train_state["precision"] == chosen
    _train_table(tmp_path / "named.pt", chosen)
    named = load_checkpoint(tmp_path / "named.pt").model.state_dict()
    for name, value in auto.model.state_dict().items():
        assert torch.equal(value, named[name]), name


def test_a_model_trained_in_bf16_loads_and_scores_in_fp32_like_any_other(tmp_path, capsys):
    _train_table(tmp_path / "m.pt", "bf16")
    assert "training on cpu in bf16" in capsys.readouterr().err
    ck = load_checkpoint(tmp_path / "m.pt")
    assert ck.train_state["precision"] == "bf16"
    assert all(p.dtype == torch.float32 for p in ck.model.parameters())
    # Scored in fp32, it gives what its weights give in float64 to fp32 rounding: no trace of bf16.
    src = torch.tensor([[5, 7, 0], [9, 0, 0]])
    tgt = torch.tensor([[4, 6, 8, 0], [3, 0, 0, 0]])
    src_len, tgt_len = torch.tensor([3, 2]), torch.tensor([4, 2])
    ck.model.eval()
    with torch.no_grad():
        fp32 = ck.model(src, src_len, tgt, tgt_len)
        exact = ck.model.double()(src, src_len, tgt, tgt_len)
    assert fp32.dtype == torch.float32
    torch.testing.assert_close(fp32.double(), exact, rtol=1e-5, atol=1e-5)
