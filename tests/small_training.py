"""A tiny RNN and its training steps, shared by the tests that compare two ways of taking the same
updates (eager against static and captured steps; fp32 against bf16)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rescorer.model.config import ModelConfig, TrainConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.training.train import make_optimizer

# Weights far from the paper's N(0, 0.01²), so that every parameter gets gradients that move it in 50 updates.
CONFIG = ModelConfig(src_vocab_size=40, tgt_vocab_size=50, hidden=16, embedding=8, maxout_units=8, output_rank=6,
                     init_std=0.3)
BATCH = 8


def losses(make_step: Callable, batches: list, amp: torch.dtype | None = None) -> tuple[list[float], RNNEncoderDecoder]:
    """The loss of each batch's update from the same seeded model, and the model after them.

    ``make_step(model, optimizer, config, device, amp)`` is a step class or a factory (EagerStep, StaticStep)."""
    torch.manual_seed(3)
    model = RNNEncoderDecoder(CONFIG)
    cfg = TrainConfig(batch_size=BATCH)
    step = make_step(model, make_optimizer(model, cfg), cfg, torch.device("cpu"), amp)
    return [float(step(b)) for b in batches], model
