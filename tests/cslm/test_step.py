"""The CSLM's static-shape and captured training steps make the eager step's updates (cslm.step)."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from replaying_graphs import ReplayByRunning

from cslm.model import CSLM, CSLMConfig
from cslm.model_file import load_cslm
from cslm.step import make_cslm_step, resolve_cslm_step
from cslm.train import CSLMTrainConfig, train_cslm
from infrastructure.errors import UserError
from shared_paths import shared_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CONFIG = CSLMConfig(vocab_size=30, order=4, embedding=6, hidden=[12, 10], init_range=0.3)
BATCH = 16


def _batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n-gram minibatches with a skewed target distribution to learn; every 7th one short (an epoch's end)."""
    rng = np.random.default_rng(1)
    out = []
    for i in range(count):
        rows = BATCH if i % 7 else int(rng.integers(1, BATCH))
        hist = rng.integers(0, CONFIG.vocab_size + 1, (rows, CONFIG.context))  # <s> is vocab_size
        tgt = np.minimum(rng.geometric(0.3, rows), CONFIG.vocab_size - 1)
        out.append((torch.from_numpy(hist), torch.from_numpy(tgt)))
    return out


def _run(mode: str, batches: list, graphs=None) -> tuple[list[list[float]], CSLM]:
    torch.manual_seed(0)
    model = CSLM(CONFIG)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    step = make_cslm_step(mode, model, optimizer, self_normalize=0.1, batch_size=BATCH, optimizer_name="adam",
                          device=torch.device("cpu"), amp_dtype=None, graphs=graphs)
    return [step(h, t).tolist() for h, t in batches], model


def test_static_and_captured_steps_give_the_eager_losses_over_50_updates():
    batches = _batches(50)
    eager, eager_model = _run("eager", batches)
    static, static_model = _run("static", batches)
    graphs = ReplayByRunning()
    captured, captured_model = _run("captured", batches, graphs)
    assert graphs.captures == 1 and graphs.replays == 49  # one shape: warm-up, capture (+ its check), replays
    np.testing.assert_allclose(static, eager, rtol=1e-5)  # loss, cross-entropy and (log Z)², update by update
    np.testing.assert_allclose(captured, eager, rtol=1e-5)
    assert eager[-1][1] < eager[0][1] - 0.3  # it learns the skewed targets
    torch.manual_seed(0)
    start = CSLM(CONFIG)
    for (name, a), b, c, s in zip(eager_model.named_parameters(), static_model.parameters(),
                                  captured_model.parameters(), start.parameters(), strict=True):
        moved = float((a - s).detach().abs().max())
        assert moved > 0, name
        assert float((b - a).detach().abs().max()) <= 1e-3 * moved, name
        assert float((c - a).detach().abs().max()) <= 1e-3 * moved, name


def test_static_update_never_reads_a_value_on_the_host():
    with torch.device("meta"):
        model = CSLM(CONFIG)
    step = make_cslm_step("static", model, torch.optim.Adam(model.parameters()), self_normalize=0.1, batch_size=BATCH,
                          optimizer_name="adam", device=torch.device("meta"), amp_dtype=None)
    hist, tgt = _batches(1)[0]
    packed = torch.cat([hist, tgt.unsqueeze(1)], dim=1)
    assert step.update(packed.to("meta"), "ngrams").shape == (3,)


def test_the_step_each_choice_means():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_cslm_step("auto", cpu, "adam") == "eager"
    assert resolve_cslm_step("auto", cuda, "adam") == "captured"
    assert resolve_cslm_step("auto", cuda, "sgd") == "eager"
    with pytest.raises(UserError, match="needs --optimizer adam"):
        resolve_cslm_step("captured", cuda, "sgd")
    with pytest.raises(UserError, match="needs a CUDA device"):
        resolve_cslm_step("captured", cpu, "adam")


def test_static_training_matches_eager_and_resumes_to_the_same_model(tmp_path: Path):
    corpus = tmp_path / "fr.txt"
    with gzip.open(shared_file("data/hansard/hansard.fr.gz"), "rt", encoding="utf-8") as fh:
        corpus.write_text("".join(itertools.islice(fh, 20000, 20800)), encoding="utf-8")
    cfg = CSLMConfig(vocab_size=2, order=4, embedding=16, hidden=[32])

    def run(out: Path, epochs: int, train_step: str, resume: bool = False):
        # 1,000 n-grams an epoch in minibatches of 64: each epoch ends with a short one (40).
        return train_cslm(str(corpus), out, model_config=cfg, shortlist=500, progress=False, resume=resume,
                          train_config=CSLMTrainConfig(max_epochs=epochs, batch_size=64, epoch_size=1000,
                                                       self_normalize=0.1, train_step=train_step))

    eager = run(tmp_path / "eager.pt", 2, "eager")
    static = run(tmp_path / "static.pt", 2, "static")
    np.testing.assert_allclose([v.perplexity for v in static.history], [v.perplexity for v in eager.history],
                               rtol=1e-5)
    assert static.history[-1].perplexity < 0.95 * static.history[0].perplexity  # 32 updates: it learns
    run(tmp_path / "split.pt", 1, "static")
    run(tmp_path / "split.pt", 2, "static", resume=True)
    a = load_cslm(tmp_path / "static.pt.last")
    b = load_cslm(tmp_path / "split.pt.last")
    assert b.train_config["train_step"] == b.train_state["train_step"] == "static"
    assert all(torch.equal(value, b.model.state_dict()[k]) for k, value in a.model.state_dict().items())
