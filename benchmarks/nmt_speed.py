"""Training speed of the attention NMT model (nmt) beside a plain torch peer, on the same batches, in one run.

The peer is what one would write with torch's own layers at the same sizes: an ``nn.GRU`` bidirectional
encoder over packed sequences, an ``nn.GRUCell`` decoder, the same attention MLP, maxout and softmax.
Both train with Adam on the same random batches of ``--batch`` pairs of about ``--length`` units; the
figure is target units (EOS counted) per second of updates, after one untimed warm-up update each,
and on the CPU also per CPU-second of this process (the steadier figure on a shared machine, where the
wall clock counts time the other jobs held the cores); the two models take turns, one update each, so
that a change in the machine's load touches both. Our model's matmul FLOPs per update (forward and
backward, counted by torch's ``FlopCounterMode`` on the same batches) give its share of the matmul peak
of its precision, measured in the same run (``benchmarks/machine_peak.py``); ``auto`` is resolved as
``nmt train`` resolves it for a model of this width.
``--device cuda`` runs both on a GPU (the clock read after the device's queue has drained);
``benchmarks/gpu_suite.sh`` does.

    python -m benchmarks.nmt_speed --dim 256 --vocab 8000 --steps 10 --threads 1
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.machine_peak import matmul_peaks, peak_name
from neural.device import autocast, autocast_dtype, training_precision
from nmt.model import AttentionNMT, NMTConfig, PairBatch, make_batch, pair_log_probs
from nmt.scoring import score_grouped
from nmt.search import beam_search


class TorchPeer(nn.Module):
    """The same network from torch's layers (``nn.GRU``'s reset gate applies after its recurrent map)."""

    def __init__(self, config: NMTConfig) -> None:
        super().__init__()
        R, H, N, L = config.embedding, config.hidden, config.alignment, config.maxout
        self.L = L
        self.src_embedding = nn.Embedding(config.src_vocab, R)
        self.tgt_embedding = nn.Embedding(config.tgt_vocab, R)
        self.encoder = nn.GRU(R, H, batch_first=True, bidirectional=True)
        self.init_state = nn.Linear(H, H)
        self.attention_state = nn.Linear(H, N, bias=False)
        self.attention_annotation = nn.Linear(2 * H, N)
        self.attention_v = nn.Linear(N, 1, bias=False)
        self.decoder = nn.GRUCell(R + 2 * H, H)
        self.readout = nn.Linear(R + 3 * H, 2 * L)
        self.output = nn.Linear(L, config.tgt_vocab)

    def forward(self, batch: PairBatch) -> torch.Tensor:
        lengths = batch.src_mask.sum(1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(self.src_embedding(batch.src), lengths, batch_first=True,
                                                   enforce_sorted=False)
        annotations, _ = self.encoder(packed)
        annotations, _ = nn.utils.rnn.pad_packed_sequence(annotations, batch_first=True,
                                                          total_length=batch.src.shape[1])
        H = self.decoder.hidden_size
        s = torch.tanh(self.init_state(annotations[:, 0, H:]))
        keys = self.attention_annotation(annotations)
        emb = self.tgt_embedding(batch.tgt_in)
        outputs = []
        for i in range(batch.tgt_in.shape[1]):
            scores = self.attention_v(torch.tanh(keys + self.attention_state(s).unsqueeze(1))).squeeze(-1)
            alpha = torch.softmax(scores.float().masked_fill(~batch.src_mask, float("-inf")), -1).to(annotations.dtype)
            context = torch.bmm(alpha.unsqueeze(1), annotations).squeeze(1)
            s = self.decoder(torch.cat([emb[:, i], context], -1), s)
            t = self.readout(torch.cat([emb[:, i], s, context], -1))
            outputs.append(t.view(-1, self.L, 2).amax(-1))
        logits = self.output(torch.stack(outputs, 1)).float()
        picked = logits.gather(-1, batch.tgt_out.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        return picked.masked_fill(~batch.tgt_mask, 0.0).sum(1)


def batches(config: NMTConfig, count: int, size: int, length: int, seed: int,
            device: torch.device | str = "cpu") -> list[PairBatch]:
    rng = random.Random(seed)

    def ids(vocab: int) -> list[int]:
        return [rng.randrange(4, vocab) for _ in range(max(1, length + rng.randint(-length // 4, length // 4)))]

    return [make_batch([ids(config.src_vocab) for _ in range(size)], [ids(config.tgt_vocab) for _ in range(size)],
                       device) for _ in range(count)]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a clock read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TimedTraining:
    """Adam updates of one model, each timed on its own, so that two models can take turns."""

    def __init__(self, model: nn.Module, loss_of, amp: torch.dtype | None) -> None:
        self.model, self.loss_of, self.amp = model, loss_of, amp
        self.optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
        self.device = next(model.parameters()).device
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def update(self, batch: PairBatch, *, timed: bool = True) -> None:
        synchronize(self.device)
        started, cpu_started = time.perf_counter(), time.process_time()
        with autocast(self.device, self.amp):
            loss = -self.loss_of(self.model, batch).sum() / batch.target_tokens
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        synchronize(self.device)
        if timed:
            self.seconds += time.perf_counter() - started
            self.cpu_seconds += time.process_time() - cpu_started

    def flops(self, batch: PairBatch) -> int:
        """The matmul FLOPs of one update's forward and backward on ``batch`` (the gradients it leaves
        are cleared by the next update, and no weight moves)."""
        # The in-place addmm_ (the output layer's backward accumulates with it) is not in torch's table.
        with FlopCounterMode(display=False, custom_mapping={torch.ops.aten.addmm_: _addmm_flops}) as counter:
            with autocast(self.device, self.amp):
                loss = -self.loss_of(self.model, batch).sum() / batch.target_tokens
            loss.backward()
        self.optimizer.zero_grad()
        return counter.get_total_flops()


def _addmm_flops(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
    """FLOPs of ``self.addmm_(a, b)``, as torch counts ``addmm``: the product's."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


def units_per_second(ours: TimedTraining, peer: TimedTraining, data: list[PairBatch]) -> tuple[float, ...]:
    """Target units per second, then per CPU-second, of each over ``data`` (ours, peer, ours, peer), the
    first batch an untimed warm-up: the two take turns, one update each, so that the machine's load,
    which moves, touches both alike."""
    for n, batch in enumerate(data):
        for training in (ours, peer) if n % 2 else (peer, ours):
            training.update(batch, timed=n > 0)
    units = sum(batch.target_tokens for batch in data[1:])
    return units / ours.seconds, units / peer.seconds, units / ours.cpu_seconds, units / peer.cpu_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=256, help="R = H = N = L")
    parser.add_argument("--vocab", type=int, default=8000, help="units per side")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=25, help="mean units per sentence")
    parser.add_argument("--steps", type=int, default=10, help="timed updates per model and precision")
    parser.add_argument("--precision", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--sources", type=int, default=10,
                        help="sentences of the n-best and beam figures (0: training figures only)")
    parser.add_argument("--hypotheses", type=int, default=100, help="n-best hypotheses per source")
    parser.add_argument("--beam", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = NMTConfig(src_vocab=args.vocab, tgt_vocab=args.vocab, embedding=args.dim, hidden=args.dim,
                       alignment=args.dim, maxout=args.dim)
    device = torch.device(args.device)
    data = batches(config, args.steps + 1, args.batch, args.length, seed=1, device=device)
    print(f"d={args.dim}, {args.vocab} units per side, {args.batch} pairs of about {args.length} units per update, "
          f"{args.steps} timed updates, device {device}, {args.threads} CPU thread(s)")
    precisions = args.precision.split(",")
    names = {p: peak_name(device, p, args.dim) for p in precisions}
    peaks = matmul_peaks(device, sorted(set(names.values())))
    cpu_peaks = matmul_peaks(device, sorted(set(names.values())), clock=time.process_time) \
        if device.type == "cpu" else peaks
    print("matmul peaks measured: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items()))
    for precision in precisions:
        amp = autocast_dtype(device, training_precision(device, precision, args.dim))  # as nmt train
        torch.manual_seed(0)
        ours_training = TimedTraining(AttentionNMT(config).to(device), pair_log_probs, amp)
        torch.manual_seed(0)
        peer_training = TimedTraining(TorchPeer(config).to(device), lambda m, b: m(b), amp)
        ours, peer, ours_cpu, peer_cpu = units_per_second(ours_training, peer_training, data)
        print(f"{precision}: nmt {ours:,.0f} target units/s, torch peer (nn.GRU) {peer:,.0f}: {ours / peer:.2f}x"
              + (f"; per CPU-second {ours_cpu:,.0f} and {peer_cpu:,.0f}: {ours_cpu / peer_cpu:.2f}x"
                 if device.type == "cpu" else ""))
        flops = sum(ours_training.flops(batch) for batch in data[1:])
        units = sum(batch.target_tokens for batch in data[1:])
        share = flops / (units / ours) / peaks[names[precision]]
        print(f"  nmt: {flops / len(data[1:]) / 1e9:.2f} GFLOP per update = {100 * share:.1f}% of the "
              f"{names[precision]} matmul peak"
              + (f" ({100 * flops / (units / ours_cpu) / cpu_peaks[names[precision]]:.1f}% per CPU-second)"
                 if device.type == "cpu" else ""))
    if args.sources:
        search_speeds(config, args, device)


def nbest_like(stem: list[int], count: int, vocab: int, rng: random.Random) -> list[list[int]]:
    """``count`` hypotheses as a decoder's n-best list has them: each is the stem with one unit replaced
    at a random position, so they share the stem's prefix up to their edit (a Moses 100-best list of
    newstest shares about as much: 2.4 words per distinct prefix)."""
    out = []
    for _ in range(count):
        at = rng.randrange(len(stem))
        out.append([*stem[:at], rng.randrange(4, vocab), *stem[at + 1 :]])
    return out


@torch.no_grad()
def search_speeds(config: NMTConfig, args: argparse.Namespace, device: torch.device) -> None:
    """n-best scoring (each source encoded once, its hypotheses' shared prefixes decoded once), of
    hypotheses sharing prefixes as an n-best list's do and of hypotheses with nothing in common, and
    batched beam search; fp32, random weights: the searches run to their length limit, 2 × the
    source's units + 10."""
    torch.manual_seed(0)
    model = AttentionNMT(config).to(device).eval()
    rng = random.Random(2)
    sources = [[rng.randrange(4, config.src_vocab) for _ in range(args.length)] for _ in range(args.sources)]
    groups = [g for g in range(args.sources) for _ in range(args.hypotheses)]
    shared = [h for _ in sources for h in nbest_like([rng.randrange(4, config.tgt_vocab) for _ in range(args.length)],
                                                      args.hypotheses, config.tgt_vocab, rng)]
    distinct = [[rng.randrange(4, config.tgt_vocab) for _ in range(args.length + rng.randint(-3, 3))]
                for _ in groups]
    rates = []
    for hypotheses in (shared, distinct):
        synchronize(device)
        started = time.perf_counter()
        score_grouped(model, sources, groups, hypotheses)
        synchronize(device)
        rates.append(len(hypotheses) / (time.perf_counter() - started))
    prefixes = len({(g, tuple(h[:i])) for g, h in zip(groups, shared, strict=True) for i in range(len(h) + 1)})
    started = time.perf_counter()
    beam_search(model, sources, args.beam)
    synchronize(device)
    searched = len(sources) / (time.perf_counter() - started)
    print(f"n-best scoring: {rates[0]:,.1f} hypotheses/s sharing prefixes as an n-best list "
          f"({sum(len(h) + 1 for h in shared) / prefixes:.1f} units per decoder step), {rates[1]:,.1f} with nothing "
          f"in common ({args.hypotheses} per source); beam search (beam {args.beam}, batched): {searched:,.2f} "
          "sentences/s")

if __name__ == "__main__":
    main()
