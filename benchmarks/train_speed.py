"""Training throughput per model size: pairs/s, updates/s, GFLOP/s and the fraction of the matmul peak.

Usage: python -m benchmarks.train_speed [--sizes paper,small] [--steps 10] [--device auto] [--threads N]
       [--train-step eager,static,captured] [--batch-size 64] [--precision fp32,bf16]
       python -m benchmarks.train_speed --optimizer-only [--sizes paper] [--steps 10] [--threads N]
       [--precision fp32,bf16] [--updates torch,torch-foreach,chunked,fused] [--grad-norm 5]

Times the step callable of ``rescorer.training.step`` (:func:`make_train_step`), the very updates
``rescorer train --train-step MODE`` runs, on minibatches drawn as training draws them (10
minibatches sorted by target length and re-batched), for each mode of ``--train-step`` in turn,
each from the same initial model on the same minibatches: the printed loss difference between
modes is the equality check of a GPU run. Phrase lengths come from the real fixture table
(../shared) when present, else from a synthetic distribution like a Moses table's (1–7 words).
Sizes: ``paper`` (d = 1000, embedding 100, maxout 500, rank 100, 15k shortlists) and ``small``
(SCALE=small's RNN of the Table 1 pipeline). FLOPs per trained pair are 3× the forward matmul
FLOPs of scoring the pair on its own (forward + two backward matmuls, the usual convention);
the static steps' padding is extra work not counted, so the fraction is conservative. Before
timing, the timed minibatches themselves run once untimed (twice when a mode captures: each
bucket's graph is captured on its second batch), so that no timed update meets a new shape. The
matmul peak is measured in the same run, before the sizes (and again at the end, to show drift).
On the CPU a profile of a few steps of the first mode prints its top five entries by self CPU time.

Each mode's line also counts the distinct matmul shapes (operation, operand shapes: what oneDNN builds a
kernel for the first time it meets one, in bf16 on a CPU) of its first pass over the minibatches, and how
many were new in the second half of them. ``--train-step eager-exact`` runs the eager step on the
minibatches' own shapes (the code before the fixed set of ``rescorer.model.block_sizes``, and fp32's
default), ``eager-fixed`` on the fixed set in fp32 too (bf16's default on a CPU).

``--precision`` takes a comma-separated list: each precision then runs every mode on the same
minibatches from the same initial model, interleaved step by step (each minibatch's update in
every precision before the next minibatch, each timed apart), so that the machine's load falls
on all of them alike; each precision's share is taken of its own matmul peak (the bf16 peak for
bf16, measured in the same run by ``machine_peak.matmul_peaks``), and the last lines give each
precision's pairs/s against the first's: ``--precision fp32,bf16`` is the CPU's side-by-side run.

``--optimizer-only`` times the optimiser's step alone on the CPU (gradient-norm clipping at 1 and
Adadelta over every parameter of the size, on random gradients of norm ``--grad-norm``), for each
implementation in ``--updates`` on its own copy of the weights, interleaved step by step:
``torch`` (``torch.optim.Adadelta`` after ``clip_grad_norm_``, one tensor at a time),
``torch-foreach`` (the same in torch's multi-tensor kernels), ``chunked`` (:class:`ChunkedAdadelta`)
and ``fused`` (:class:`FusedAdadelta`'s compiled pass, what training runs). In bf16 each step also
leaves current bf16 copies of the weights the training's matmuls read through
``neural.weight_copies`` (written by the step, or cast again after it, as training would). The
share is of the memory bandwidth measured in the same run (``c = a + b``), counting the bytes an
update cannot avoid; each line also gives the weights' difference from the first implementation.

GPU: ``--device cuda --sizes paper --train-step eager,captured --steps 200`` gives the eager and
captured pairs/s and updates/s of the paper's 64-pair updates side by side.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import os
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks.machine_peak import matmul_peaks, memory_bandwidth, peak_name
from benchmarks.shared_data import shared_dir
from neural.adadelta import ChunkedAdadelta, FusedAdadelta
from neural.config import PRECISIONS
from neural.device import autocast_dtype, matmul_precision, select_device, training_precision
from neural.weight_copies import kept_copy, matmul_weight
from rescorer.model import block_sizes
from rescorer.model.config import ModelConfig, TrainConfig
from rescorer.model.flops import count_flops_per_pair
from rescorer.model.network import RNNEncoderDecoder
from rescorer.training.step import make_train_step, resolve_train_step
from rescorer.training.train import make_optimizer
from table1.settings import SMALL

SIZES = {
    "paper": {"hidden": 1000, "embedding": 100, "maxout_units": 500, "output_rank": 100},
    "small": {"hidden": SMALL.rnn.hidden, "embedding": SMALL.rnn.embedding,
              "maxout_units": SMALL.rnn.maxout_units, "output_rank": SMALL.rnn.output_rank},
}


@functools.cache
def _table_lengths() -> tuple[np.ndarray, np.ndarray] | None:
    """Source and target word counts of the real fixture table's sample, read once."""
    sample = shared_dir() / "fixtures/hansard-enfr/phrase-table.sample.gz"
    if not sample.exists():
        return None
    with gzip.open(sample) as fh:
        pairs = [line.split(b" ||| ")[:2] for line in fh]
    return np.array([len(p[0].split()) for p in pairs]), np.array([len(p[1].split()) for p in pairs])


def phrase_lengths(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) word counts: from the real table when available."""
    table = _table_lengths()
    if table is None:
        return rng.integers(1, 8, n), rng.integers(1, 9, n)
    pick = rng.integers(0, len(table[0]), n)
    return table[0][pick], table[1][pick]


def training_batches(steps: int, config: ModelConfig, cfg: TrainConfig, rng: np.random.Generator) -> list:
    """Minibatches as ``rescorer.training.train.group_batches`` makes them (host tensors, as
    ``PairData.batch`` gives them), with their FLOPs and padding."""
    batches, group = [], cfg.batch_size * cfg.length_group
    while len(batches) < steps:
        s_len, t_len = phrase_lengths(group, rng)
        s_len, t_len = s_len + 1, t_len + 1  # </s>
        order = np.argsort(t_len, kind="stable")
        for lo in range(0, group, cfg.batch_size):
            rows = order[lo : lo + cfg.batch_size]
            sl, tl = s_len[rows], t_len[rows]
            src = torch.from_numpy(rng.integers(2, config.src_vocab_size, (len(rows), sl.max())))
            tgt = torch.from_numpy(rng.integers(2, config.tgt_vocab_size, (len(rows), tl.max())))
            flops = sum(3 * count_flops_per_pair(config, int(a), int(b)) for a, b in zip(sl, tl, strict=True))
            padded = len(rows) * int(tl.max()) - int(tl.sum())
            batches.append(((src, torch.from_numpy(sl), tgt, torch.from_numpy(tl)), flops, padded, int(tl.sum())))
    rng.shuffle(batches)
    return batches[:steps]


def run_size(name: str, args: argparse.Namespace, device: torch.device, precisions: list[str],
             peaks: dict[str, float], cpu_peaks: dict[str, float]) -> dict[str, dict[str, tuple[float, float]]]:
    """Every mode of ``--train-step`` on the same minibatches, from the same initial model, each
    precision's update of a minibatch timed right after the others' (interleaved step by step, so
    that a change in the machine's load falls on every precision alike): pairs per second and per
    CPU-second of each precision and mode."""
    config = ModelConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, **SIZES[name])
    cfg = TrainConfig(batch_size=args.batch_size)
    modes = args.train_step.split(",")
    # Drawn as before --train-step existed (two spare minibatches, the timed ones, the profiled
    # ones), so that figures stay comparable with earlier runs of this benchmark.
    drawn = training_batches(2 + args.steps + args.profile_steps, config, cfg, np.random.default_rng(0))
    batches, profiled = drawn[2 : 2 + args.steps], drawn[2 + args.steps :]
    amps = {p: autocast_dtype(device, training_precision(device, p, config.hidden)) for p in precisions}  # as training
    print(f"\n== {name}: d={config.hidden}, embedding {config.embedding}, maxout {config.maxout_units}, rank "
          f"{config.output_rank}, vocab {args.vocab}, batch {cfg.batch_size}; "
          + ", ".join(f"{p} runs in {training_precision(device, p, config.hidden)}" for p in precisions))
    rates: dict[str, dict[str, tuple[float, float]]] = {p: {} for p in precisions}
    reference: dict[str, list[float]] = {}
    for i, mode in enumerate(modes):
        train_step = mode.removesuffix(EXACT).removesuffix(FIXED)
        steps = {}
        for precision in precisions:
            torch.manual_seed(0)
            model = RNNEncoderDecoder(config).to(device)
            steps[precision] = make_train_step(train_step, model, make_optimizer(model, cfg), cfg, device,
                                               amps[precision])
            if mode.endswith((EXACT, FIXED)):
                steps[precision] = _on_shapes(steps[precision], exact=mode.endswith(EXACT))
        # Warm-up on the timed minibatches themselves: every shape they use has been seen (kernels
        # built, oneDNN primitives made, the optimiser compiled) before the clock starts; twice where
        # a mode captures (each bucket's graph is captured on its second batch). The first pass also
        # records each update's matmul shapes.
        captures = any(resolve_train_step(train_step, device, amps[p]) == "captured" for p in precisions)
        losses: dict[str, list] = {p: [] for p in precisions}
        shapes: dict[str, list[set]] = {p: [] for p in precisions}
        for rep in range(2 if captures else 1):
            for precision in precisions:
                with matmul_precision(precision):
                    if rep == 0:
                        losses[precision], shapes[precision] = matmul_shapes(steps[precision], [b[0] for b in batches])
                    else:
                        losses[precision] += [steps[precision](b[0]) for b in batches]
        elapsed = dict.fromkeys(precisions, 0.0)
        cpu = dict.fromkeys(precisions, 0.0)
        for b in batches:
            for precision in precisions:
                _synchronize(device)
                t0, c0 = time.perf_counter(), time.process_time()
                with matmul_precision(precision):
                    losses[precision].append(steps[precision](b[0]))
                _synchronize(device)
                elapsed[precision] += time.perf_counter() - t0
                cpu[precision] += time.process_time() - c0
        for precision in precisions:
            peak = peak_name(device, precision, config.hidden)
            print(f"[{precision}] ", end="")
            rates[precision][mode] = report(mode, batches, elapsed[precision], cpu[precision], device, peaks[peak],
                                            cpu_peaks[peak], peak)
            print("  " + shapes_line(shapes[precision]))
            values = [float(v) for v in losses[precision]]
            if precision not in reference:
                reference[precision] = values
            else:
                diff = max(abs(a - b) / abs(b) for a, b in zip(values, reference[precision], strict=True))
                print(f"  losses of {len(values)} updates: max relative difference from {modes[0]}: {diff:.2e}")
        if i == 0 and device.type == "cpu" and profiled:
            with matmul_precision(precisions[0]):
                profile(steps[precisions[0]], profiled)
    return rates


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def report(mode: str, timed: list, elapsed: float, cpu: float, device: torch.device, peak: float,
           cpu_peak: float, peak_label: str) -> tuple[float, float]:
    """Print one mode's figures; return its pairs per second and per CPU-second."""
    pairs = sum(b[0][0].shape[0] for b in timed)
    flops = sum(b[1] for b in timed)
    padded, real = sum(b[2] for b in timed), sum(b[3] for b in timed)
    print(f"{mode}: {pairs / elapsed:.1f} pairs/s, {len(timed) / elapsed:.2f} updates/s "
          f"(CPU time {cpu / elapsed:.2f}× wall)")
    print(f"  achieved: {flops / elapsed / 1e9:.1f} GFLOP/s = {100 * flops / elapsed / peak:.1f}% of the "
          f"{peak_label} matmul peak")
    if device.type == "cpu":
        print(f"  per CPU-second: {flops / cpu / 1e9:.1f} GFLOP = {100 * flops / cpu / cpu_peak:.1f}% of the "
              f"{peak_label} matmul peak per CPU-second (the steadier figure on a shared machine)")
    print(f"  padded decoder steps: {100 * padded / (padded + real):.1f}% of decoder steps")
    return pairs / elapsed, pairs / cpu


# A mode named MODE + EXACT runs --train-step MODE on the minibatches' own shapes (no encoder row, packed
# step or output position rounded up to the fixed set of rescorer.model.block_sizes: the code before it,
# and what fp32 runs); MODE + FIXED on the fixed set in fp32 too (what bf16 runs on a CPU).
EXACT, FIXED = "-exact", "-fixed"
MATMULS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm"}


def _on_shapes(step: Callable, exact: bool) -> Callable:
    """``step`` with the training's matmul shapes exact (``exact``) or from the fixed set in any precision."""
    names = ("TRAIN_STEP_ROWS", "TRAIN_PACKED_ROWS", "TRAIN_POSITIONS") if exact else ("TRAIN_FIXED_SHAPES_IN_FP32",)

    def run(batch):
        kept = {name: getattr(block_sizes, name) for name in names}
        try:
            for name in names:
                setattr(block_sizes, name, 1 if exact else True)
            return step(batch)
        finally:
            for name, value in kept.items():
                setattr(block_sizes, name, value)
    return run


def matmul_shapes(step: Callable, batches: list) -> tuple[list[torch.Tensor], list[set[tuple]]]:
    """Each update's loss and the (operation, operand shapes) of every matmul it ran: what oneDNN builds
    a kernel for the first time it meets it (bf16 on a CPU). From torch's profiler, one session for all
    the updates: a dispatch mode would keep the compiled optimiser from running."""
    losses = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for i, batch in enumerate(batches):
            with torch.profiler.record_function(f"update {i}"):
                losses.append(step(batch))
    events = prof.events()
    spans = {e.name: e.time_range for e in events if e.name.startswith("update ")}
    shapes: list[set[tuple]] = []
    for i in range(len(batches)):
        span = spans[f"update {i}"]
        shapes.append({(e.name, *(tuple(shape) for shape in e.input_shapes)) for e in events
                       if e.name in MATMULS and span.start <= e.time_range.start <= span.end})
    return losses, shapes


def shapes_line(per_update: list[set]) -> str:
    """How many distinct matmul shapes the updates met, and how late new ones kept coming."""
    seen: set = set()
    new = []
    for shapes in per_update:
        new.append(len(shapes - seen))
        seen |= shapes
    half = len(per_update) // 2
    last = max((i + 1 for i, n in enumerate(new) if n), default=0)
    return (f"matmul shapes: {len(seen)} distinct in {len(per_update)} updates, {sum(new[half:])} of them new in "
            f"the last {len(per_update) - half}; the last new one in update {last}")


def profile(step, batches: list) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for b in batches:
            step(b[0])
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(f"  profile of {len(batches)} steps, top five by self CPU time:")
    for e in events[:5]:
        print(f"    {e.key:40s} {100 * e.self_cpu_time_total / total:5.1f}%  "
              f"{e.self_cpu_time_total / 1e3 / len(batches):8.1f} ms/step  ({e.count // len(batches)} calls/step)")
    print("  " + recurrence_shares(prof.events()))


MATMULS = {"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::matmul", "aten::baddbmm"}


def recurrence_shares(events) -> str:
    """How much of the profiled CPU time the recurrences' hand-written forward and backward take
    (``rescorer.model.gru``'s autograd functions and what they call), and how much of that is not
    matmuls: the element-wise gate arithmetic, copies and the Python between them, which is all
    that a fused GRU step could take away."""
    total = inside = not_matmul = 0.0
    for e in events:
        total += e.self_cpu_time_total
        parent = e
        while parent is not None and "Recurrence" not in parent.name:
            parent = parent.cpu_parent
        if parent is not None:
            inside += e.self_cpu_time_total
            not_matmul += 0 if e.name in MATMULS else e.self_cpu_time_total
    return (f"recurrences: {100 * inside / max(total, 1):.1f}% of the CPU time, of which not matmuls "
            f"{100 * not_matmul / max(inside, 1):.1f}% ({100 * not_matmul / max(total, 1):.1f}% of the update: "
            "the most a fused GRU step could remove)")


# --optimizer-only: the update's implementations, each a factory of (parameters, clip norm, cfg) -> one step.
# "torch" is torch.optim.Adadelta with clip_grad_norm_ as a training would write them (one tensor at a
# time); "torch-foreach" the same with torch's multi-tensor kernels; "chunked" and "fused" are
# neural.adadelta's (the training's own: FusedAdadelta compiles at COMPILE_MIN_ELEMENTS and up).
def _torch_update(params: list[torch.Tensor], clip: float, cfg: TrainConfig, foreach: bool) -> Callable[[], None]:
    opt = torch.optim.Adadelta(params, lr=1.0, rho=cfg.rho, eps=cfg.eps, foreach=foreach)

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, clip, foreach=foreach)
        opt.step()
    return step


def _own_update(params: list[torch.Tensor], clip: float, cfg: TrainConfig, fused: bool) -> Callable[[], None]:
    opt = (FusedAdadelta(params, lr=1.0, rho=cfg.rho, eps=cfg.eps, compile=True) if fused
           else ChunkedAdadelta(params, lr=1.0, rho=cfg.rho, eps=cfg.eps))
    return lambda: opt.step(max_grad_norm=clip)


UPDATES: dict[str, Callable[[list[torch.Tensor], float, TrainConfig], Callable[[], None]]] = {
    "torch": functools.partial(_torch_update, foreach=False),
    "torch-foreach": functools.partial(_torch_update, foreach=True),
    "chunked": functools.partial(_own_update, fused=False),
    "fused": functools.partial(_own_update, fused=True),
}


def _copied_weights(config: ModelConfig) -> list[int]:
    """Which parameters (by position) bf16 training reads through a kept copy (neural.weight_copies): found by
    one bf16 update of a tiny model of the same layout, since the parameter order does not depend on the sizes."""
    tiny = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, hidden=4, embedding=3, maxout_units=2, output_rank=2)
    torch.manual_seed(0)
    model = RNNEncoderDecoder(tiny)
    step = make_train_step("eager", model, make_optimizer(model, TrainConfig()), TrainConfig(), torch.device("cpu"),
                           torch.bfloat16)
    step((torch.tensor([[2, 3, 1]]), torch.tensor([3]), torch.tensor([[4, 1]]), torch.tensor([2])))
    copied = [i for i, p in enumerate(model.parameters()) if kept_copy(p) is not None]
    assert len(list(model.parameters())) == len(list(RNNEncoderDecoder(config, device="meta").parameters()))
    return copied


def time_updates(name: str, args: argparse.Namespace, precisions: list[str], bandwidth: float,
                 cpu_bandwidth: float) -> None:
    """The optimiser's step alone (clip and Adadelta, and in bf16 the weights' bf16 copies for the next
    update), each implementation of :data:`UPDATES` on its own copy of the size's parameters, all given
    the same gradients and interleaved step by step; its bytes per second as a share of the memory
    bandwidth the same run measured."""
    config = ModelConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, **SIZES[name])
    torch.manual_seed(0)
    start = [p.detach() for p in RNNEncoderDecoder(config).parameters()]
    elements = sum(p.numel() for p in start)
    copied = _copied_weights(config)
    print(f"\n== {name}: the optimiser's step alone, {elements / 1e6:.1f}M parameters in {len(start)} tensors, "
          f"gradients of norm {args.grad_norm:g} clipped at {TrainConfig().clip_norm:g}")
    kinds = args.updates.split(",")
    for precision in precisions:
        copies = copied if training_precision(torch.device("cpu"), precision, config.hidden) == "bf16" else []
        # Bytes an update cannot avoid: the gradient read twice (the norm, then the step), the weight
        # and both running averages read and written once each, and the bf16 copies written.
        least = 32 * elements + 2 * sum(start[i].numel() for i in copies)
        elapsed, cpu, params = _run_updates(kinds, start, copies, args.steps, args.grad_norm)
        for kind in kinds:
            wall, per_cpu = elapsed[kind] / args.steps, cpu[kind] / args.steps
            diff = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                       for a, b in zip(params[kind], params[kinds[0]], strict=True))
            print(f"[{precision}] {kind}: {1e3 * wall:.1f} ms per step ({1e3 * per_cpu:.1f} CPU-ms), "
                  f"{least / wall / 1e9:.2f} GB/s = {100 * least / wall / bandwidth:.1f}% of the memory bandwidth "
                  f"({100 * least / per_cpu / cpu_bandwidth:.1f}% per CPU-second), "
                  f"{elapsed[kinds[0]] / elapsed[kind]:.2f}× {kinds[0]}'s speed; after {args.steps + 1} steps "
                  f"the weights differ from {kinds[0]}'s by {diff:.1e} of a tensor's largest")


def _run_updates(kinds: list[str], start: list[torch.Tensor], copies: list[int], steps: int, grad_norm: float,
                 ) -> tuple[dict[str, float], dict[str, float], dict[str, list[torch.Tensor]]]:
    """Seconds and CPU-seconds of ``steps`` timed steps of each implementation after one untimed (the
    compilation, the state's allocation, the first copies), and the weights each ended with. The bf16
    copies of the parameters at ``copies`` are asked for after each step, as the next update's matmuls
    ask: current where the step wrote them, else cast again."""
    cfg = TrainConfig()
    params = {k: [torch.nn.Parameter(p.clone()) for p in start] for k in kinds}
    weights = {k: [p.detach() for p in params[k]] for k in kinds}  # what the caller compares
    updates = {k: UPDATES[k](params[k], cfg.clip_norm, cfg) for k in kinds}
    elements = sum(p.numel() for p in start)
    for kind in kinds:  # the copies a bf16 training has made by its first step, so the untimed one writes them
        for i in copies:
            matmul_weight(params[kind][i], torch.bfloat16)
    elapsed, cpu = dict.fromkeys(kinds, 0.0), dict.fromkeys(kinds, 0.0)
    for n in range(-1, steps):
        g = torch.Generator().manual_seed(n + 1)
        grads = [torch.randn(p.shape, generator=g) * (grad_norm / elements**0.5) for p in start]
        for kind in kinds:
            for p, grad in zip(params[kind], grads, strict=True):
                p.grad = grad.clone()
            t0, c0 = time.perf_counter(), time.process_time()
            updates[kind]()
            for i in copies:
                matmul_weight(params[kind][i], torch.bfloat16)
            if n >= 0:
                elapsed[kind] += time.perf_counter() - t0
                cpu[kind] += time.process_time() - c0
    return elapsed, cpu, weights


def optimizer_only(args: argparse.Namespace, precisions: list[str]) -> None:
    """``--optimizer-only``: :func:`time_updates` for each size, against the memory bandwidth measured first."""
    bandwidth = memory_bandwidth("cpu")
    cpu_bandwidth = memory_bandwidth("cpu", clock=time.process_time)
    print(f"device: cpu ({torch.get_num_threads()} threads); memory bandwidth measured (c = a + b, fp32): "
          f"{bandwidth / 1e9:.2f} GB/s, {cpu_bandwidth / 1e9:.2f} GB per CPU-second")
    for name in args.sizes.split(","):
        time_updates(name.strip(), args, precisions, bandwidth, cpu_bandwidth)
    print(f"\nmemory bandwidth (measured before/after): {bandwidth / 1e9:.2f} / "
          f"{memory_bandwidth('cpu') / 1e9:.2f} GB/s; shares above use the first")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="paper,small", help="comma-separated: paper, small")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--vocab", type=int, default=15001)
    parser.add_argument("--batch-size", type=int, default=64, help="pairs per update")
    parser.add_argument("--train-step", default="auto", help="comma-separated modes of rescorer train --train-step")
    parser.add_argument("--precision", default="auto",
                        help=f"comma-separated, each of {', '.join(PRECISIONS)}: e.g. fp32,bf16 side by side")
    parser.add_argument("--optimizer-only", action="store_true",
                        help="time the optimiser's step alone (clip and Adadelta) on the CPU, per implementation")
    parser.add_argument("--updates", default=",".join(UPDATES),
                        help=f"with --optimizer-only, comma-separated, each of {', '.join(UPDATES)}")
    parser.add_argument("--grad-norm", type=float, default=5.0,
                        help="with --optimizer-only, the random gradients' norm (the clip is at 1)")
    args = parser.parse_args()
    precisions = args.precision.split(",")
    if any(p not in PRECISIONS for p in precisions):
        parser.error(f"--precision: each of {', '.join(PRECISIONS)}, got {args.precision!r}")
    if any(u not in UPDATES for u in args.updates.split(",")):
        parser.error(f"--updates: each of {', '.join(UPDATES)}, got {args.updates!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.optimizer_only:
        optimizer_only(args, precisions)
        return
    device = select_device(args.device)
    widths = [SIZES[name.strip()]["hidden"] for name in args.sizes.split(",")]
    needed = sorted({peak_name(device, p, width) for p in precisions for width in widths})
    peaks = matmul_peaks(device, needed)
    cpu_peaks = matmul_peaks(device, needed, clock=time.process_time) if device.type == "cpu" else peaks
    print(f"device: {device} ({torch.get_num_threads()} threads); matmul peaks measured: "
          + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items()))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if device.type == "cpu" and load > torch.get_num_threads():
        print(f"note: load average {load:.1f} > {torch.get_num_threads()} threads: the machine is shared, "
              "so absolute figures are low (the fraction of a peak measured in the same run holds better)")
    rates: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    for name in args.sizes.split(","):
        for precision, by_mode in run_size(name.strip(), args, device, precisions, peaks, cpu_peaks).items():
            rates[name.strip(), precision] = by_mode
    peaks_after = matmul_peaks(device, needed)
    print("\nmatmul peaks (measured before/after): " + "; ".join(
        f"{k} {peaks[k] / 1e9:.1f} / {peaks_after[k] / 1e9:.1f} GFLOP/s" for k in peaks)
        + "; fractions above use the first" + ("; per CPU-second: " + ", ".join(
            f"{k} {v / 1e9:.1f} GFLOP" for k, v in cpu_peaks.items()) if device.type == "cpu" else ""))
    if len(precisions) > 1:
        for (name, precision), by_mode in rates.items():
            if precision != precisions[0]:
                base = rates[name, precisions[0]]
                print(f"{name}: {precision} / {precisions[0]} pairs/s: " + ", ".join(
                    f"{mode} {by_mode[mode][0] / base[mode][0]:.2f}× (per CPU-second "
                    f"{by_mode[mode][1] / base[mode][1]:.2f}×)" for mode in by_mode))


if __name__ == "__main__":
    main()
