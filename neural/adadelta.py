"""Adadelta (SPEC §1: ρ = 0.95, ε = 1e-6) with torch's arithmetic, run in cache-sized chunks on CPU.

``torch.optim.Adadelta`` runs its eleven element-wise operations one after the other over whole
tensors, and two of them allocate fresh tensors of the parameter's size at every step. At paper
sizes (17M parameters, 68 MB per state) that is ~25 passes over main memory and page faults on
every fresh buffer: 16% of a training step on 2 cores. Here the same operations, in the same
order on each element (so the results are bit-identical, which a test checks), run on chunks of
:data:`CHUNK` elements whose six streams stay in a core's cache, with two scratch buffers per
worker reused across all chunks and parameters: each element of the gradient, the parameter and
the two running averages crosses main memory once per step, gradient clipping included.

The state (``step``, ``square_avg``, ``acc_delta``) is torch's own, so checkpoints written with
``torch.optim.Adadelta`` resume here and the other way round. Off the CPU (or for sparse,
complex or non-contiguous tensors) the step is torch's own foreach implementation: a GPU does
each pass at memory bandwidth in one kernel launch per group of tensors.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor
from torch.optim.adadelta import adadelta as torch_adadelta

from neural.weight_copies import kept_copy, mark_current

# Elements per chunk: 256 KB per stream, so that a worker's six streams (1.5 MB) stay in its core's
# 2 MB L2. Measured on this machine's 2 cores at paper sizes, clipping included, sharing them with
# other work (load ~3): 68 ms per step with two workers against 87 ms for 1 MB chunks whose
# operations each ran on both threads after a separate clip_grad_norm_ (131072: 68 ms; 32768:
# 74 ms, Python overhead); torch.optim.Adadelta with clip_grad_norm_ took 73 + 9 ms when quiet.
CHUNK = 65_536


class ChunkedAdadelta(torch.optim.Adadelta):
    """``torch.optim.Adadelta`` (no weight decay, minimising) with the chunked CPU step of the module doc.

    ``step(max_grad_norm=…)`` also clips the gradients first, exactly as
    ``torch.nn.utils.clip_grad_norm_`` does, but scales each CPU chunk while it is in cache instead
    of in a pass of its own over every gradient (and not at all when the norm is within bounds,
    where the clip's factor is exactly 1). With ``workers`` > 1 the chunks are shared among that
    many threads, each running its operations single-threaded: no fork and join per operation,
    which on a shared machine costs a scheduler wait whenever another process holds a core.
    """

    def __init__(self, params: Iterable[Tensor], *, lr: float = 1.0, rho: float = 0.95, eps: float = 1e-6,
                 chunk: int = CHUNK, workers: int | None = None) -> None:
        super().__init__(params, lr=lr, rho=rho, eps=eps, foreach=None)
        self.chunk = int(chunk)
        self.workers = workers  # None: torch's thread count at each step
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._scratch: dict[tuple[torch.dtype, torch.device, int], tuple[Tensor, Tensor]] = {}

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None, *,  # type: ignore[override]
             max_grad_norm: float | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = [self._collect(group) for group in self.param_groups]
        scale = None
        if max_grad_norm is not None:
            scale = self._clip(groups, max_grad_norm)
        chunked_work = []
        for group, (params, grads, square_avgs, acc_deltas, steps, chunked) in zip(self.param_groups, groups,
                                                                                 strict=True):
            for i in chunked:
                steps[i] += 1
                chunked_work.append((params[i], grads[i], square_avgs[i], acc_deltas[i], group, kept_copy(params[i])))
            rest = sorted(set(range(len(params))) - set(chunked))
            if rest:
                pick = [params[i] for i in rest], [grads[i] for i in rest], [square_avgs[i] for i in rest]
                torch_adadelta(
                    *pick, [acc_deltas[i] for i in rest], [steps[i] for i in rest],
                    lr=group["lr"], rho=group["rho"], eps=group["eps"], weight_decay=group["weight_decay"],
                    foreach=group["foreach"], maximize=group["maximize"], differentiable=group["differentiable"],
                    capturable=group["capturable"], has_complex=any(torch.is_complex(params[i]) for i in rest),
                )
        if chunked_work:
            self._run_chunks(chunked_work, scale)
            for work in chunked_work:
                if work[5] is not None:
                    mark_current(work[0])
        return loss

    def _collect(self, group: dict) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor], list[Tensor],
                                             list[int]]:
        """torch's lists for ``group`` (state created lazily) and which of its parameters go in chunks."""
        params: list[Tensor] = []
        grads: list[Tensor] = []
        square_avgs: list[Tensor] = []
        acc_deltas: list[Tensor] = []
        steps: list[Tensor] = []
        self._init_group(group, params, grads, square_avgs, acc_deltas, steps)
        chunked = [
            i for i, (p, g) in enumerate(zip(params, grads, strict=True))
            if p.device.type == "cpu" and not torch.is_complex(p) and p.is_contiguous() and g.is_contiguous()
            and group["weight_decay"] == 0 and not group["maximize"] and not group["differentiable"]
        ]
        return params, grads, square_avgs, acc_deltas, steps, chunked

    def _clip(self, groups: list, max_grad_norm: float) -> Tensor | None:
        """clip_grad_norm_'s factor; applied here to the gradients not updated in chunks, returned
        for the chunks (None where it is exactly 1, which changes nothing)."""
        grads = [g for group in groups for g in group[1]]
        if not grads:
            return None
        total_norm = torch.nn.utils.get_total_norm(grads, 2.0, False, None)
        factor = torch.clamp(float(max_grad_norm) / (total_norm + 1e-6), max=1.0)  # clip_grad_norm_'s
        rest = [g for (_, grads_, _, _, _, chunked) in groups for i, g in enumerate(grads_) if i not in set(chunked)]
        for device in {g.device for g in rest}:  # as clip_grad_norm_ scales them, one group per device
            torch._foreach_mul_([g for g in rest if g.device == device], factor.to(device))
        if len(rest) == len(grads):
            return None
        factor = factor.cpu()
        return None if float(factor) == 1.0 else factor

    def _run_chunks(self, work: list, scale: Tensor | None) -> None:
        """The chunked update of every (param, grad, square_avg, acc_delta, group, copy) in ``work``."""
        items = [(w, lo, min(lo + self.chunk, w[0].numel())) for w in work for lo in range(0, w[0].numel(), self.chunk)]
        workers = min(self.workers or torch.get_num_threads(), len(items))
        if workers <= 1:
            self._update_chunks(items, scale, self._buffers(work[0][0], 0))
            return
        if self._pool is None or self._pool[0] != workers:
            self._pool = (workers, ThreadPoolExecutor(workers, thread_name_prefix="adadelta"))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # each worker's operations single-threaded, side by side
        try:
            futures = [self._pool[1].submit(self._update_chunks, items[k::workers], scale,
                                            self._buffers(work[0][0], k)) for k in range(workers)]
            for future in futures:
                future.result()
        finally:
            torch.set_num_threads(threads)

    def _buffers(self, like: Tensor, worker: int) -> tuple[Tensor, Tensor]:
        key = (like.dtype, like.device, worker)
        if key not in self._scratch:
            self._scratch[key] = (like.new_empty(self.chunk), like.new_empty(self.chunk))
        return self._scratch[key]

    @torch.no_grad()  # grad mode is per thread: the workers need their own
    def _update_chunks(self, items: list, scale: Tensor | None, buffers: tuple[Tensor, Tensor]) -> None:
        """torch's single-tensor Adadelta, operation for operation, one chunk at a time."""
        std_buf, delta_buf = buffers
        for (param, grad, square_avg, acc_delta, group, copy), lo, hi in items:
            lr, rho, eps = group["lr"], group["rho"], group["eps"]
            g_c, sq_c, acc_c = grad.view(-1)[lo:hi], square_avg.view(-1)[lo:hi], acc_delta.view(-1)[lo:hi]
            std, delta = std_buf[: hi - lo], delta_buf[: hi - lo]
            if scale is not None:
                g_c.mul_(scale)  # the clip, as clip_grad_norm_ scales each gradient
            sq_c.mul_(rho).addcmul_(g_c, g_c, value=1 - rho)
            torch.add(sq_c, eps, out=std).sqrt_()
            torch.add(acc_c, eps, out=delta).sqrt_()
            delta.div_(std).mul_(g_c)
            acc_c.mul_(rho).addcmul_(delta, delta, value=1 - rho)
            param.view(-1)[lo:hi].add_(delta, alpha=-lr)
            if copy is not None:  # the matmuls' copy of the weight (neural.weight_copies), from the chunk in cache
                copy.view(-1)[lo:hi].copy_(param.view(-1)[lo:hi])



# Parameters (elements) from which FusedAdadelta compiles its update: below, the chunked step's
# few milliseconds never repay a compilation (about 10 s with a warm inductor cache, 90 s cold
# on a loaded 2-core machine).
COMPILE_MIN_ELEMENTS = 1_000_000


def _fused_update(param: Tensor, grad: Tensor, square_avg: Tensor, acc_delta: Tensor, copy: Tensor | None,
                  scale: Tensor, rho: float, eps: float, lr: float) -> None:
    """torch's Adadelta on one tensor after the clip's ``scale``: each element read once, the state,
    the weight and its copy written once (module doc of :class:`FusedAdadelta`)."""
    g = grad * scale
    square = square_avg * rho + (1 - rho) * (g * g)
    delta = (acc_delta + eps).sqrt() / (square + eps).sqrt() * g
    acc_delta.copy_(acc_delta * rho + (1 - rho) * (delta * delta))
    square_avg.copy_(square)
    updated = param - lr * delta
    param.copy_(updated)
    if copy is not None:
        copy.copy_(updated)


def _fused_updates(params: list[Tensor], grads: list[Tensor], square_avgs: list[Tensor], acc_deltas: list[Tensor],
                   copies: list[Tensor | None], scale: Tensor, rho: float, eps: float, lr: float) -> None:
    """:func:`_fused_update` of every tensor of the lists: compiled, one call for all parameters."""
    for param, grad, square_avg, acc_delta, copy in zip(params, grads, square_avgs, acc_deltas, copies, strict=True):
        _fused_update(param, grad, square_avg, acc_delta, copy, scale, rho, eps, lr)


class FusedAdadelta(ChunkedAdadelta):
    """:class:`ChunkedAdadelta` whose CPU update is one compiled pass over every parameter (torch.compile).

    The chunked step runs twelve element-wise operations per chunk from Python; compiled, the
    clip's scaling, the two running averages, the step and the bf16 copy of the weight
    (:mod:`neural.weight_copies`) are one loop over each tensor, and all the tensors' loops are
    one compiled call (one guard check and one entry into the generated code per step, where a
    call per parameter paid them 22 times). Measured on a 2-core AMD EPYC (AVX2), one thread,
    18.3M paper-size parameters, clip included, under load: 49 CPU-ms per step against 113–151
    for the chunked step (docs/training-speed.md). The arithmetic is torch's, in its order, but
    the compiler may contract a multiply and an add into one rounding: the results agree with
    ``torch.optim.Adadelta`` and ``clip_grad_norm_`` to a few float32 ulps per step (tested), not
    bit for bit. Unlike ``clip_grad_norm_`` the compiled pass leaves the gradients unscaled.

    The compiled call is specialised to the list of tensors (how many, which have a bf16 copy),
    not to their sizes; it is compiled again only if that list changes (a parameter that got no
    gradient in a step, a copy made later).

    ``compile``: None compiles where the parameters hold at least :data:`COMPILE_MIN_ELEMENTS`
    elements. Where compiling fails (no C++ compiler), a warning says so and the chunked step runs.
    """

    def __init__(self, params: Iterable[Tensor], *, lr: float = 1.0, rho: float = 0.95, eps: float = 1e-6,
                 chunk: int = CHUNK, workers: int | None = None, compile: bool | None = None) -> None:
        super().__init__(params, lr=lr, rho=rho, eps=eps, chunk=chunk, workers=workers)
        if compile is None:
            elements = sum(p.numel() for group in self.param_groups for p in group["params"])
            compile = elements >= COMPILE_MIN_ELEMENTS
        self._compile = compile
        self._kernel: Callable | None = None
        self._tried: set[tuple] = set()  # the kinds of call whose compilation was tried

    def _run_chunks(self, work: list, scale: Tensor | None) -> None:
        if not self._compile:
            super()._run_chunks(work, scale)
            return
        factor = torch.ones((), dtype=work[0][0].dtype) if scale is None else scale.to(work[0][0].dtype)
        by_settings: dict[tuple[float, float, float], list] = {}  # one call per set of hyper-parameters
        for item in work:
            group = item[4]
            by_settings.setdefault((group["rho"], group["eps"], group["lr"]), []).append(item)
        calls = []
        for (rho, eps, lr), items in by_settings.items():
            # Flat views: the compiled call depends on how many tensors there are, not on their shapes.
            lists = [[t.view(-1) for t in column] for column in list(zip(*items, strict=True))[:4]]
            copies = [None if item[5] is None else item[5].view(-1) for item in items]
            calls.append((*lists, copies, rho, eps, lr))
        kernel = self._compiled(calls)
        if kernel is None:
            super()._run_chunks(work, scale)
            return
        for params, grads, square_avgs, acc_deltas, copies, rho, eps, lr in calls:
            kernel(params, grads, square_avgs, acc_deltas, copies, factor, rho, eps, lr)

    def _compiled(self, calls: list[tuple]) -> Callable | None:
        """The compiled update, tried first on small tensors shaped as each call of this step (as many,
        the same dtypes, equal sizes where theirs are equal, a bf16 copy where they have one), so that
        a failing compilation touches no parameter and the trial is the compilation the step then
        uses; None if it fails."""
        if self._kernel is None:
            self._kernel = torch.compile(_fused_updates, dynamic=True, fullgraph=True)
        for params, grads, square_avgs, acc_deltas, copies, rho, eps, lr in calls:
            kind = (tuple(p.numel() for p in params), tuple(c is None for c in copies), rho, eps, lr)
            if kind in self._tried:
                continue
            self._tried.add(kind)
            # Trial sizes from 2 (0 and 1 would be specialised), equal where the real sizes are.
            sizes = {n: 2 + i for i, n in enumerate(dict.fromkeys(kind[0]))}
            trial = [[torch.ones(sizes[p.numel()], dtype=t.dtype) for p, t in zip(params, column, strict=True)]
                     for column in (params, grads, square_avgs, acc_deltas)]
            for p in trial[0]:
                p.requires_grad_(True)  # as every parameter the step updates: else the trial's guard differs
            trial_copies = [None if c is None else torch.empty(sizes[p.numel()], dtype=c.dtype)
                            for p, c in zip(params, copies, strict=True)]
            try:
                with torch.no_grad():
                    self._kernel(*trial, trial_copies, torch.ones((), dtype=params[0].dtype), rho, eps, lr)
            except Exception as exc:
                warnings.warn(f"Adadelta runs uncompiled: torch.compile failed ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})", stacklevel=2)
                self._compile = False
                return None
        return self._kernel
