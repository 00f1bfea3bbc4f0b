"""Training the RNN Encoder–Decoder as in the paper: Adadelta on 64 random unique pairs per update.

Recipe (SPEC §1): maximise the mean log-likelihood of 64 pairs drawn at random (without phrase
frequencies), Adadelta with ρ=0.95 and ε=1e-6, gradient norm clipped at 1, and, as in the original
code, 10 minibatches drawn together, sorted by length and re-batched so that padding is small.

A run can be killed at any time: checkpoints hold the model, the optimiser, both configs, the
vocabularies and the exact data position, and ``--resume`` continues to the same result as an
uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from tqdm import tqdm

from infrastructure.errors import UserError
from infrastructure.files import STDIO_NAME, write_json
from infrastructure.progress import progress_bar
from infrastructure.resume_record import check_same_options, file_identity, options_record
from neural.adadelta import FusedAdadelta
from neural.device import matmul_precision
from neural.training import (
    Training,
    TrainingState,
    TrainResult,
    announce,
    check_resumable,
    check_same_data,
    check_same_recipe,
    data_folder,
    resume_source,
    training_device,
    training_files,
)
from neural.vocab import Vocab
from rescorer.model.checkpoint import load_checkpoint, save_checkpoint
from rescorer.model.config import DEFAULT_SHORTLIST, ModelConfig, ModelSizes, TrainConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.training.data import PairData
from rescorer.training.step import TrainStep, make_train_step, resolve_train_step


@dataclass
class Validation:
    step: int
    log_likelihood: float  # mean log p(Y|X) per pair
    perplexity: float  # per target token, </s> included
    # mean log p(Y|X) − log p(Y|X') per pair, X' another pair's source: how much the model uses the
    # source. Near 0 means it scores targets as a phrase LM would. None in checkpoints written before.
    source_gain: float | None = None
    # Seconds of training (validations included) when it was taken: what a curve against wall time
    # (docs/training-speed.md) reads. None in checkpoints written before.
    elapsed: float | None = None


@dataclass
class RNNTrainResult(TrainResult):
    steps: int = 0  # updates

    BEST_BY = ("log_likelihood", False)  # the mean log-likelihood per pair grows


@torch.no_grad()
def evaluate(
    model: RNNEncoderDecoder, data: PairData, idx: np.ndarray, device: torch.device, batch_size: int = 256
) -> tuple[float, float, float]:
    """Mean log-likelihood per pair, per-token perplexity and the source gain on the given pairs.

    The source gain is the mean of log p(Y|X) − log p(Y|X') where X' is the source of the next pair
    in the batch (batches are sorted by target length, so Y and X' come from pairs of similar target
    length). Perplexity alone cannot tell a translation model from a target-phrase language model;
    a gain near 0 says the decoder ignores the summary c (SPEC §1's N(0, 0.01²) initialisation with
    small models and short budgets does exactly that: see docs/train.md, "Does the model use the source?").
    The cost is one more decoder pass; the encoder runs once.
    """
    was_training = model.training
    model.eval()
    total_lp, total_other, total_tokens = 0.0, 0.0, 0
    order = idx[np.argsort(data.target_lengths(idx), kind="stable")]
    for rows in data.iter_batches(order, batch_size):
        src, src_len, tgt, tgt_len = data.batch(rows, device)
        c = model.encode(src, src_len)
        own = model.score_targets(c, tgt, tgt_len).double()
        other = model.score_targets(c.roll(1, dims=0), tgt, tgt_len).double()
        total_lp += float(own.sum())
        total_other += float(other.sum())
        total_tokens += int(tgt_len.sum())
    model.train(was_training)
    return total_lp / len(idx), math.exp(-total_lp / total_tokens), (total_lp - total_other) / len(idx)


def group_batches(data: PairData, cfg: TrainConfig, epoch: int, group_start: int) -> list[np.ndarray]:
    """The minibatches of one length group, a pure function of (seed, epoch, position).

    Being a pure function is what makes resume exact: the state to save is just three integers.
    """
    perm = data.epoch_order(cfg.seed, epoch)
    group = perm[group_start : group_start + cfg.batch_size * cfg.length_group]
    group = group[np.argsort(data.target_lengths(group), kind="stable")]
    batches = [group[i : i + cfg.batch_size] for i in range(0, len(group), cfg.batch_size)]
    order = np.random.default_rng([cfg.seed, epoch, group_start]).permutation(len(batches))
    return [batches[i] for i in order]


def make_optimizer(model: RNNEncoderDecoder, cfg: TrainConfig) -> FusedAdadelta:
    """Adadelta (SPEC §1: lr 1, ρ, ε from the config) over all parameters."""
    return FusedAdadelta(model.parameters(), lr=1.0, rho=cfg.rho, eps=cfg.eps)


@dataclass
class RNNTrainingState(TrainingState):
    """Where an RNN run stands (for ``--resume``): updates made, and the data position they reached.

    The position is three integers because the minibatches are a pure function of them (:func:`group_batches`).
    """

    step: int = 0  # updates made
    epoch: int = 0
    group_start: int = 0  # the first pair of the current length group in the epoch's order
    batch_in_group: int = 0  # minibatches of that group already trained on
    best: float = -math.inf  # the best validation log-likelihood (it grows)

    FILE_NAMES: ClassVar[Mapping[str, str]] = {"best": "best_ll"}
    VALIDATION: ClassVar[type] = Validation


def _restore(path: Path, data: PairData, model: RNNEncoderDecoder, optimizer: torch.optim.Optimizer,
             fingerprint: object, cfg: TrainConfig) -> RNNTrainingState:
    """Load model and optimiser from checkpoint ``path`` and return its training state, after
    checking that it continues this very run (same data, model configuration and recipe)."""
    ck = load_checkpoint(path, map_location=next(model.parameters()).device)
    check_resumable(path, ck.train_state, ck.optimizer_state)
    assert ck.train_state is not None
    check_same_data(path, ck.train_state, fingerprint, data.source)  # the table: the user's name for the data
    check_same_recipe(path, ck.train_config.to_dict() if ck.train_config else None, cfg, cfg.RESUME_MAY_DIFFER)
    if ck.config != model.config:
        raise UserError(f"{path}: checkpoint config {ck.config} differs from the requested {model.config}")
    model.load_state_dict(ck.model.state_dict())
    optimizer.load_state_dict(ck.optimizer_state)
    return RNNTrainingState.from_dict(ck.train_state)


def train(
    data: PairData,
    model_out: Path,
    *,
    model_config: ModelConfig,
    train_config: TrainConfig,
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    device: str = "auto",
    precision: str = "auto",
    resume: bool = False,
    progress: bool = True,
) -> RNNTrainResult:
    """Train until max_steps, max_time or early stopping, checkpointing at every validation.

    ``model_out`` holds the model with the best validation log-likelihood (the one to score
    with); ``model_out.last`` holds the latest state, which ``resume`` continues from.
    """
    with matmul_precision(precision):
        run = _Training.start(data, Path(model_out), model_config, train_config, src_vocab, tgt_vocab, device,
                              precision, resume)
        stopped_by = run.run(progress=progress, checkpoint_every=train_config.checkpoint_every)
        return RNNTrainResult(stopped_by, run.state.elapsed, run.state.history, steps=run.state.step)


@dataclass
class _Training(Training):
    """One RNN training run on :class:`neural.training.Training`: an Adadelta update on the next minibatch,
    a validation every ``valid_every`` updates and at the last one (log-likelihood, perplexity, source
    gain), stop reasons ``early_stopping``, ``max_time`` and ``max_steps``.
    """

    state: RNNTrainingState
    data: PairData
    model_config: ModelConfig
    cfg: TrainConfig
    src_vocab: Vocab
    tgt_vocab: Vocab
    train_step: TrainStep  # rescorer.training.step: eager, static or captured
    batches_in_group: int = 0  # minibatches of the current length group (set by next_rows)
    pairs_done: int = 0  # pairs trained on since the bar started, and when: the pairs/s it shows
    rate_since: float = 0.0

    DIVERGED_HINT: ClassVar[str] = "train again with a smaller --init-std"

    @classmethod
    def start(cls, data: PairData, model_out: Path, model_config: ModelConfig, cfg: TrainConfig, src_vocab: Vocab,
              tgt_vocab: Vocab, device: str, precision: str, resume: bool) -> _Training:
        """A fresh run, or with ``resume`` the one saved in ``MODEL.last`` (else ``MODEL``)."""
        dev, precision, amp_dtype, why = training_device(device, precision, model_config.hidden)
        torch.manual_seed(cfg.seed)
        step_mode = resolve_train_step(cfg.train_step, dev, amp_dtype)  # a bad choice fails before any work
        model = RNNEncoderDecoder(model_config).to(dev)
        optimizer = make_optimizer(model, cfg)
        state = RNNTrainingState(data=data.fingerprint())
        resume_from = resume_source(model_out, resume)
        if resume_from is not None:
            state = _restore(resume_from, data, model, optimizer, state.data, cfg)
        announce(state, dev, precision, step_mode, why)
        train_step = make_train_step(step_mode, model, optimizer, cfg, dev, amp_dtype)
        return cls(model_out, dev, amp_dtype, model, optimizer, state, data, model_config, cfg, src_vocab, tgt_vocab,
                   train_step)

    def progress_bar(self, show: bool) -> tqdm:
        self.pairs_done, self.rate_since = 0, time.monotonic()
        return progress_bar(total=self.cfg.max_steps, initial=self.state.step, desc="training", unit=" step",
                            show=show, dynamic_ncols=True)

    def update(self, bar: tqdm) -> None:
        """One update, counted on the bar, with the loss and the pairs/s every 10 updates."""
        rows = self.next_rows()
        loss = self.step(rows)
        self.pairs_done += len(rows)
        bar.update(1)
        if self.state.step % 10 == 0:
            rate = self.pairs_done / max(1e-9, time.monotonic() - self.rate_since)
            bar.set_postfix(loss=f"{loss.item():.3f}", pairs_s=f"{rate:.0f}")

    def position(self) -> str:
        return f"step {self.state.step}"

    def write(self, path: Path) -> None:
        save_checkpoint(
            path, model=self.model, config=self.model_config, src_vocab=self.src_vocab, tgt_vocab=self.tgt_vocab,
            train_config=self.cfg, optimizer_state=self.optimizer.state_dict(), train_state=self.state.to_dict(),
        )

    def measure(self) -> tuple[Validation, float]:
        """The validation log-likelihood (said on stderr, with perplexity and source gain)."""
        state = self.state
        ll, ppl, gain = evaluate(self.model, self.data, self.data.valid_idx, self.dev)
        tqdm.write(f"step {state.step}: valid log-likelihood {ll:.4f}, perplexity {ppl:.2f}, "
                   f"source gain {gain:.3f} nats/pair", file=sys.stderr)
        return Validation(state.step, ll, ppl, gain, state.elapsed), ll

    def improves(self, metric: float) -> bool:
        return metric > self.state.best + 1e-6

    def reason_to_stop(self) -> str | None:
        """Why training ends now (patience first, then time, then steps), or None to go on."""
        if self.patience_spent(self.cfg.patience):
            return "early_stopping"
        if self.out_of_time(self.cfg.max_time):
            return "max_time"
        if self.cfg.max_steps is not None and self.state.step >= self.cfg.max_steps:
            return "max_steps"
        return None

    def next_rows(self) -> np.ndarray:
        """The rows of the next minibatch, in the length-grouped order; a new epoch when one ends."""
        state = self.state
        while not (batches := group_batches(self.data, self.cfg, state.epoch, state.group_start)):
            state.epoch, state.group_start, state.batch_in_group = state.epoch + 1, 0, 0
        self.batches_in_group = len(batches)
        return batches[state.batch_in_group]

    def step(self, rows: np.ndarray) -> torch.Tensor:
        """One update on ``rows`` (from :meth:`next_rows`); moves the epoch position and the clock on."""
        state, cfg = self.state, self.cfg
        loss = self.train_step(self.data.batch(rows))
        state.step += 1
        state.batch_in_group += 1
        if state.batch_in_group >= self.batches_in_group:
            state.group_start += cfg.batch_size * cfg.length_group
            state.batch_in_group = 0
        state.elapsed = self.clock()
        self.watch_loss(loss, state.step)
        return loss

    def validation_due(self) -> bool:
        """Every ``valid_every`` steps, and at the last step (time or steps used up)."""
        cfg, state = self.cfg, self.state
        at_end = cfg.max_steps is not None and state.step >= cfg.max_steps
        return state.step % cfg.valid_every == 0 or self.out_of_time(cfg.max_time) or at_end


def prepare_data(
    table: str,
    workdir: Path,
    *,
    shortlist: int,
    src_corpus: str | None = None,
    tgt_corpus: str | None = None,
    vocabs: tuple[Vocab, Vocab] | None = None,
    reverse: bool = False,
    progress: bool = True,
) -> tuple[Path, Vocab, Vocab]:
    """Unique pairs of ``table`` as an id file in ``workdir``, reusing one left by an earlier run.

    ``vocabs`` (from a checkpoint being resumed) wins over building new shortlists, so a resumed
    run always encodes with the vocabularies its model was trained on. With ``reverse`` the model's
    source is the table's target and the other way round: pairs, shortlists and the corpora they
    are counted in are swapped (``src_corpus`` stays the text of the table's source language), so
    a reverse model's shortlists are the forward model's, exchanged. The returned vocabularies are
    the model's (source first).

    A resumed run reuses the id file when :func:`pairs_record` says it was encoded from the same table,
    the same way and with these vocabularies: extracting a real table's unique pairs takes minutes, on
    every resume of a training that runs for days. Otherwise the pairs are extracted again, and the
    training's data fingerprint decides whether they are the data it was trained on.
    """
    from rescorer.training.data import build_vocabularies, encode_pairs, extract_unique_pairs

    workdir.mkdir(parents=True, exist_ok=True)
    ids_path = workdir / "pairs.ids.arrow"
    pairs_path = workdir / "pairs.text.arrow"
    record_path = workdir / PAIRS_RECORD
    if vocabs is not None and ids_path.exists() and _read_record(record_path) == pairs_record(table, reverse, vocabs):
        if progress:
            print(f"reusing {ids_path}: {table}'s pairs, encoded by an earlier run", file=sys.stderr)
        return ids_path, *vocabs
    record_path.unlink(missing_ok=True)  # written again once the ids are
    try:  # the text pairs only serve to make the ids: never left behind, however this ends
        corpus = extract_unique_pairs(table, pairs_path, progress=progress)
        if vocabs is None:
            table_src, table_tgt = build_vocabularies(corpus, shortlist, src_corpus, tgt_corpus)
            vocabs = (table_tgt, table_src) if reverse else (table_src, table_tgt)
        src_vocab, tgt_vocab = vocabs
        encode_pairs(pairs_path, ids_path, src_vocab, tgt_vocab, swap=reverse)
    finally:
        pairs_path.unlink(missing_ok=True)
    record = pairs_record(table, reverse, (src_vocab, tgt_vocab))
    if record is not None:
        write_json(record_path, record)
    return ids_path, src_vocab, tgt_vocab


#: The record of what ``MODEL.data/pairs.ids.arrow`` was encoded from (:func:`pairs_record`).
PAIRS_RECORD = "pairs.json"


def pairs_record(table: str, reverse: bool, vocabs: tuple[Vocab, Vocab]) -> dict[str, object] | None:
    """What an id file of :func:`prepare_data` depends on: the table by path, size and time (as the CSLM's
    and the NMT model's prepared data), the direction, and the vocabularies' words by digest; None for a
    table read from stdin, which cannot be told again."""
    if table == STDIO_NAME:
        return None
    words = json.dumps([vocab.words for vocab in vocabs], ensure_ascii=False).encode("utf-8")
    return {"table": file_identity(table), "reverse": reverse, "vocabularies": hashlib.sha1(words).hexdigest()}


def _read_record(path: Path) -> object:
    """A JSON record, or None where it is missing or unreadable (then the ids are made again)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def train_on_phrase_table(
    table: str,
    model_out: Path,
    *,
    model_sizes: ModelSizes,
    train_config: TrainConfig,
    src_corpus: str | None = None,
    tgt_corpus: str | None = None,
    shortlist: int = DEFAULT_SHORTLIST,
    device: str = "auto",
    precision: str = "auto",
    resume: bool = False,
    progress: bool = True,
) -> RNNTrainResult:
    """What ``rescorer train`` does: unique pairs → shortlists → model file.

    The model's config is built once the shortlists are: ``model_sizes`` over their vocabularies (a
    small table may have fewer than 15,000 distinct words); a resumed run keeps its checkpoint's.
    ``model_sizes.direction`` says which way: ``reverse`` trains p(f|e) on the same pairs, sources
    and targets swapped (:func:`prepare_data`).
    The run holds ``model_out`` (:func:`neural.training.training_files`): a second training into it
    stops before touching the model, its ``.last`` state or its ``.data`` folder.
    """
    model_out = Path(model_out)
    dev, _, amp_dtype, _ = training_device(device, precision)
    resolve_train_step(train_config.train_step, dev, amp_dtype)  # a bad choice fails before any work
    with training_files(model_out, resume):
        vocabs = None
        model_config: ModelConfig | None = None  # built once the shortlists exist (or the checkpoint's)
        resume_from = resume_source(model_out, resume)
        if resume_from is not None:
            ck = load_checkpoint(resume_from)
            if ck.config.direction != model_sizes.direction:
                hint = "with --reverse" if ck.config.direction == "reverse" else "without --reverse"
                raise UserError(f"{resume_from}: that run trains a {ck.config.direction} model; resume it {hint}")
            trained_sizes = ModelSizes(**{f.name: getattr(ck.config, f.name) for f in fields(ModelSizes)})
            check_same_options(options_record(trained_sizes, ()), options_record(model_sizes, ()), resume_from,
                               advice="resume with the same sizes, or train into another MODEL")
            vocabs, model_config = (ck.src_vocab, ck.tgt_vocab), ck.config  # the recipe: checked by train()
        workdir = data_folder(model_out)
        made_workdir = not workdir.exists()
        try:
            ids_path, src_vocab, tgt_vocab = prepare_data(
                table, workdir, shortlist=shortlist, src_corpus=src_corpus, tgt_corpus=tgt_corpus,
                vocabs=vocabs, reverse=model_sizes.direction == "reverse", progress=progress,
            )
            data = PairData(ids_path, seed=train_config.seed, source=table)
        except (UserError, ValueError, OSError):
            if made_workdir:  # nothing of it is worth keeping: an empty or unreadable table
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        if model_config is None:
            model_config = model_sizes.config(len(src_vocab), len(tgt_vocab))
        return train(
            data, model_out, model_config=model_config, train_config=train_config, src_vocab=src_vocab,
            tgt_vocab=tgt_vocab, device=device, precision=precision, resume=resume, progress=progress,
        )
