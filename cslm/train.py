"""Training the CSLM: random n-gram minibatches from a memory-mapped corpus, early stopping.

The corpus (tokenised target text, possibly millions of lines) is streamed twice: once to count
words for the shortlist and the line lengths, once to write the token ids into ``.npy`` files
that are memory-mapped during training (:class:`NgramCorpus`). An n-gram is just a token
position: its history is gathered from the id stream when the minibatch is drawn, so no list of
n-grams ever exists.

Optimiser. Schwenk's CSLM toolkit trains with plain SGD, a learning rate decayed as
lr₀/(1 + n·decay) over the n examples seen, and weight decay. Adam is the default here because it
reached a clearly lower validation perplexity in the same wall time on the fixture's French LM
text (docs/cslm.md; ``--optimizer sgd`` gives the toolkit's recipe for comparison): with a
15,001-way softmax most output rows receive rare, small gradients, which Adam's per-parameter
scaling handles without tuning a decay schedule.

Epochs. By default an epoch is one pass over all training n-grams. ``--epoch-size N`` makes
each epoch a fresh random sample of N n-grams, as the CSLM toolkit's resampling does: with a
large corpus and a time budget, validation (and the patience rule) then happens at a useful
rate. The model file holds the best model by validation perplexity; ``MODEL.last`` holds the
latest state, from which ``--resume`` continues (also mid-epoch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm import tqdm

from cslm.model import CSLM, CSLMConfig
from cslm.model_file import CSLMFile, load_cslm, save_cslm
from cslm.scoring import gather_histories, sentence_positions, token_scores
from cslm.step import CSLMStep, make_cslm_step, resolve_cslm_step
from infrastructure.errors import UserError
from infrastructure.files import atomic_output, atomic_path, display_name, read_twice, write_json
from infrastructure.progress import progress_bar
from infrastructure.resume_record import check_same_options, file_identity, options_record
from moses_integration.tokens import split_tokens
from neural.config import CHECKPOINT_EVERY, TRAIN_STEPS, DictConfig, check_positive_int
from neural.device import select_device
from neural.training import (
    Training,
    TrainingState,
    TrainResult,
    announce,
    check_resumable,
    check_same_data,
    check_same_recipe,
    data_folder,
    last_checkpoint_path,
    resume_source,
    training_device,
    training_files,
)
from neural.vocab import Vocab, read_corpus_lines

DATA_VERSION = 1


@dataclass
class CSLMTrainConfig(DictConfig):
    """The training recipe; saved in the model file so a run can be resumed and inspected."""

    batch_size: int = 128
    optimizer: str = "adam"
    lr: float | None = None  # None: 1e-3 for Adam, 0.02 for SGD
    lr_decay: float = 5e-8  # SGD only: lr = lr0 / (1 + examples_seen * lr_decay)
    weight_decay: float = 0.0
    epoch_size: int | None = None  # n-grams per epoch; None = all training n-grams
    max_epochs: int | None = None
    max_time: float | None = None
    patience: int | None = 10
    seed: int = 1234
    checkpoint_every: float = CHECKPOINT_EVERY  # seconds between mid-epoch saves of MODEL.last
    self_normalize: float = 0.0  # alpha of the alpha * (log Z)^2 penalty (Devlin et al. 2014); 0 = off
    train_step: str = "auto"  # how an update runs (cslm.step); the same updates to ~1e-6 whichever

    #: What a ``--resume`` may change (neural.training.check_same_recipe): when to stop, how often the state
    #: is saved, how an update runs; the rest of the recipe is the interrupted run's.
    RESUME_MAY_DIFFER: ClassVar[frozenset[str]] = frozenset({"max_epochs", "max_time", "patience",
                                                             "checkpoint_every", "train_step"})

    def __post_init__(self) -> None:
        check_positive_int("CSLMTrainConfig", "batch_size", self.batch_size)
        if self.train_step not in TRAIN_STEPS:
            raise ValueError(f"CSLMTrainConfig.train_step must be one of {', '.join(TRAIN_STEPS)}, "
                             f"got {self.train_step!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"CSLMTrainConfig.optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        for name in ("epoch_size", "max_epochs", "patience"):
            if getattr(self, name) is not None:
                check_positive_int("CSLMTrainConfig", name, getattr(self, name))
        if self.lr is not None and not float(self.lr) > 0:
            raise ValueError(f"CSLMTrainConfig.lr must be > 0, got {self.lr!r}")
        if not (isinstance(self.self_normalize, (int, float)) and float(self.self_normalize) >= 0):
            raise ValueError(f"CSLMTrainConfig.self_normalize must be >= 0, got {self.self_normalize!r}")
        if self.max_time is not None and not float(self.max_time) > 0:
            raise ValueError(f"CSLMTrainConfig.max_time must be > 0 seconds, got {self.max_time!r}")

    @property
    def learning_rate(self) -> float:
        return float(self.lr) if self.lr is not None else (1e-3 if self.optimizer == "adam" else 0.02)



# --------------------------------------------------------------------------------------------
# The memory-mapped corpus


@dataclass
class CorpusCounts:
    """Pass 1 over a corpus: word counts and each line's token count."""

    counts: Counter
    lengths: np.ndarray  # tokens per line, without </s>


def count_corpus(path: str, progress: bool = True) -> CorpusCounts:
    counts: Counter = Counter()
    lengths: list[int] = []
    bar = progress_bar(desc=f"counting {Path(path).name}", unit=" lines", show=progress)
    for line in read_corpus_lines(path):
        tokens = split_tokens(line.rstrip("\r\n"))
        counts.update(tokens)
        lengths.append(len(tokens))
        bar.update(1)
    bar.close()
    return CorpusCounts(counts, np.asarray(lengths, dtype=np.int64))


def _write_split(path: str, lines: np.ndarray, lengths: np.ndarray, vocab: Vocab, out: Path, context: int,
                 progress: bool) -> None:
    """Pass 2: the ids of the chosen lines (each closed by ``</s>``) into ``out/tokens.npy``, ``positions.npy``."""
    out.mkdir(parents=True, exist_ok=True)
    chosen = np.zeros(len(lengths), dtype=bool)
    chosen[lines] = True
    total = int((lengths[chosen] + 1).sum())
    with atomic_path(out / "tokens.npy") as tmp:  # Ctrl-C while encoding leaves no half-written ids
        tokens = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(total,))
        at = 0
        bar = progress_bar(desc=f"encoding {out.name}", total=len(lengths), unit=" lines", show=progress)
        try:  # closed on Ctrl-C too, so that the line saying so starts a line of its own
            for line_no, line in enumerate(read_corpus_lines(path)):
                bar.update(1)
                if line_no >= len(chosen) or not chosen[line_no]:
                    continue
                ids = vocab.encode(split_tokens(line.rstrip("\r\n")), add_eos=True)
                tokens[at : at + len(ids)] = ids
                at += len(ids)
        finally:
            bar.close()
        if at != total:
            raise UserError(f"{path}: changed while it was being read ({at} tokens, expected {total})")
        tokens.flush()
        del tokens
        positions = sentence_positions(lengths[chosen] + 1, context).astype(np.uint8)
        with atomic_output(out / "positions.npy") as fh:
            np.save(fh, positions)


class NgramSplit:
    """One split (train or valid) of a prepared corpus: memory-mapped ids and positions."""

    def __init__(self, folder: Path, config: CSLMConfig) -> None:
        self.tokens = np.load(folder / "tokens.npy", mmap_mode="r")
        self.positions = np.load(folder / "positions.npy", mmap_mode="r")
        self.config = config
        if len(self.tokens) != len(self.positions):
            raise UserError(f"{folder}: tokens.npy and positions.npy differ in length; delete the folder")

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Histories ``[B, order−1]`` and targets ``[B]`` of the n-grams ending at token positions ``idx``."""
        idx = np.sort(np.asarray(idx, dtype=np.int64))  # sequential reads from the memory map
        hist = gather_histories(self.tokens, self.positions, idx, self.config.context, self.config.bos_id)
        return torch.from_numpy(hist), torch.from_numpy(np.asarray(self.tokens[idx], dtype=np.int64))


def data_record(corpus: str, valid: str | None, *, shortlist: int, order: int, seed: int) -> dict[str, Any]:
    """What the prepared data of a run depends on: the texts (by path, size and time, as ``make`` knows a
    file), the shortlist, n and the seed of the held-out lines. Known from the command line alone, so a
    ``--resume`` on other data is refused before the corpus is read, naming what differs."""
    return {"version": DATA_VERSION, "corpus": file_identity(corpus), "valid": file_identity(valid) if valid else None,
            "shortlist": shortlist, "order": order, "seed": seed}


def data_fingerprint(record: dict[str, Any]) -> str:
    """The digest of a :func:`data_record` that a training state keeps as its ``data``."""
    return hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()


def prepare_corpus(
    corpus: str,
    folder: Path,
    *,
    shortlist: int,
    order: int,
    valid: str | None = None,
    vocab: Vocab | None = None,
    seed: int = 1234,
    progress: bool = True,
) -> tuple[Vocab, NgramSplit, NgramSplit, str]:
    """Shortlist and memory-mapped train/valid id files in ``folder`` (reused when still current).

    Without ``valid`` a random 0.1% of the corpus lines (at least 500, at most a tenth) is held
    out. ``vocab`` (from a model being resumed) wins over building a new shortlist. Returns the
    vocabulary, both splits and a fingerprint that a resumed run compares.
    """
    folder.mkdir(parents=True, exist_ok=True)
    meta = data_record(corpus, valid, shortlist=shortlist, order=order, seed=seed)
    meta_path = folder / "meta.json"
    vocab_path = folder / "vocab.json"
    current = meta_path.exists() and json.loads(meta_path.read_text(encoding="utf-8")) == meta
    if current:
        stored = Vocab(json.loads(vocab_path.read_text(encoding="utf-8")))
        current = vocab is None or stored == vocab
    if not current:
        meta_path.unlink(missing_ok=True)
        counted = count_corpus(corpus, progress)
        n = len(counted.lengths)
        if n == 0:
            raise UserError(f"{corpus}: the corpus is empty")
        if vocab is None:
            vocab = Vocab.from_counts(counted.counts, shortlist)
        if valid:
            valid_counts = count_corpus(valid, progress)
            if len(valid_counts.lengths) == 0:  # its perplexity would be 1.00 at every epoch: no stopping, no best
                raise UserError(f"{valid}: the validation text is empty")
            train_lines = np.arange(n)
        else:
            n_valid = min(max(500, round(n * 0.001)), max(1, n // 10))
            if n < 2:
                raise UserError(f"{corpus}: need at least 2 lines to hold out validation text")
            order_ = np.random.default_rng(seed).permutation(n)
            train_lines = np.sort(order_[n_valid:])
            valid_counts = CorpusCounts(Counter(), counted.lengths)
            valid_lines = np.sort(order_[:n_valid])
        context = order - 1
        _write_split(corpus, train_lines, counted.lengths, vocab, folder / "train", context, progress)
        if valid:
            _write_split(valid, np.arange(len(valid_counts.lengths)), valid_counts.lengths, vocab, folder / "valid",
                         context, progress)
        else:
            _write_split(corpus, valid_lines, counted.lengths, vocab, folder / "valid", context, progress)
        write_json(vocab_path, vocab.words)
        write_json(meta_path, meta)  # last: its presence says the folder is complete
    assert vocab is not None or current
    vocab = vocab or Vocab(json.loads(vocab_path.read_text(encoding="utf-8")))
    config = CSLMConfig(vocab_size=len(vocab), order=order)
    return vocab, NgramSplit(folder / "train", config), NgramSplit(folder / "valid", config), data_fingerprint(meta)


# --------------------------------------------------------------------------------------------
# Training


@dataclass
class Validation:
    """One validation: perplexity, and the log normaliser's mean and spread over the held-out tokens.

    log Z decides whether the raw scores Moses' ``NeuralLM`` adds are log-probabilities: with a
    self-normalised model its mean and spread are near 0. Files from before self-normalisation
    have no log Z figures (None).
    """

    epoch: int
    examples: int
    perplexity: float
    log_z_mean: float | None = None
    log_z_std: float | None = None


@dataclass
class CSLMTrainResult(TrainResult):
    epochs: int = 0
    examples: int = 0  # n-grams trained on


@torch.no_grad()
def validation_stats(
    model: CSLM, split: NgramSplit, batch: int = 8192, amp_dtype: torch.dtype | None = None
) -> tuple[float, float, float]:
    """Per-token perplexity of a split (``</s>`` and ``[UNK]`` included) and the mean and std of log Z."""
    was_training = model.training
    model.eval()
    total, z_sum, z_sq = 0.0, 0.0, 0.0
    for start in range(0, len(split), batch):
        hist, tgt = split.batch(np.arange(start, min(start + batch, len(split))))
        scores = token_scores(model, hist, tgt, amp_dtype=amp_dtype)
        assert scores.log_z is not None
        total += float(scores.log_probs().double().sum())
        log_z = scores.log_z.double()
        z_sum += float(log_z.sum())
        z_sq += float((log_z * log_z).sum())
    model.train(was_training)
    n = max(1, len(split))
    mean = z_sum / n
    return math.exp(-total / n), mean, math.sqrt(max(0.0, z_sq / n - mean * mean))


def _epoch_order(n: int, cfg: CSLMTrainConfig, epoch: int) -> np.ndarray:
    """The training n-grams of one epoch, a pure function of (seed, epoch): resuming needs only the position."""
    perm = np.random.default_rng([cfg.seed, epoch]).permutation(n)
    return perm[: cfg.epoch_size] if cfg.epoch_size is not None else perm


def _make_optimizer(model: CSLM, cfg: CSLMTrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)


@dataclass
class CSLMTrainingState(TrainingState):
    """Where a CSLM run stands (for ``--resume``): the epoch, the n-grams into it, and all n-grams trained on.

    An epoch's order is a pure function of the seed and the epoch (:func:`_epoch_order`), so the
    position in it is all a resumed run needs, mid-epoch too.
    """

    epoch: int = 0
    position: int = 0  # n-grams of the current epoch trained on
    examples: int = 0  # n-grams trained on in all
    best: float = math.inf  # the best validation perplexity (it falls)

    FILE_NAMES: ClassVar[Mapping[str, str]] = {"bad_validations": "bad_epochs"}
    VALIDATION: ClassVar[type] = Validation


def train_cslm(
    corpus: str,
    model_out: Path,
    *,
    model_config: CSLMConfig,
    train_config: CSLMTrainConfig,
    shortlist: int = 15000,
    valid: str | None = None,
    device: str = "auto",
    precision: str = "auto",
    resume: bool = False,
    progress: bool = True,
) -> CSLMTrainResult:
    """What ``cslm train`` does: prepare the corpus, train, keep the best model in ``model_out``.

    ``model_config.vocab_size`` is replaced by the size of the shortlist actually built. With
    ``resume`` the run continues from ``MODEL.last`` (or ``MODEL``), with that file's config,
    vocabulary and position; the corpus must be the one it was trained on. The run holds
    ``model_out`` (:func:`neural.training.training_files`): a second training into it stops before
    touching its files.
    """
    resolve_cslm_step(train_config.train_step, select_device(device), train_config.optimizer)  # before any work
    _check_read_twice(corpus, valid)
    with training_files(Path(model_out), resume):
        run = _CSLMTraining.start(corpus, Path(model_out), model_config, train_config, shortlist=shortlist,
                                  valid=valid, device=device, precision=precision, resume=resume, progress=progress)
        stopped_by = run.run(progress=progress, checkpoint_every=train_config.checkpoint_every)
        state = run.state
        return CSLMTrainResult(stopped_by, state.elapsed, state.history, epochs=state.epoch, examples=state.examples)


def _check_read_twice(corpus: str, valid: str | None) -> None:
    """The corpus and the validation text are read twice (counted, then encoded): a pipe (``<(zcat x.gz)``)
    gives its lines once, and the second pass found none, which was reported, after the counting of a
    whole corpus, as a file that "changed while it was being read"."""
    for label, path in (("CORPUS", corpus), ("--valid", valid)):
        if path is not None and not read_twice(path):
            raise UserError(f"{display_name(path)}: {label} is read twice (counted, then encoded), which a pipe "
                            "cannot be; give the file itself (plain or .gz)")


@dataclass
class _IntervalSums:
    """Sums over the n-grams trained on since the last save, for its heartbeat line. The sums stay
    tensors on the device, so that training never waits for a GPU to report them."""

    cross_entropy: torch.Tensor | float = 0.0
    log_z_squared: torch.Tensor | float = 0.0
    ngrams: int = 0


def _check_resumable_here(loaded: CSLMFile, model_out: Path, model_config: CSLMConfig, cfg: CSLMTrainConfig,
                          record: dict[str, Any], corpus: str) -> None:
    """Before the corpus is read: the state can resume, with this call's recipe, sizes and data. Each
    that differs is named in one line; sizes given now were silently replaced by the file's."""
    where = loaded.path or model_out
    check_resumable(where, loaded.train_state, loaded.optimizer_state)
    check_same_recipe(where, loaded.train_config, cfg, cfg.RESUME_MAY_DIFFER)
    sizes = {"vocab_size"}  # set by the data, checked with it
    check_same_options(options_record(loaded.model.config, sizes), options_record(model_config, sizes), where,
                       advice="resume with the same sizes, or train into another MODEL")
    assert loaded.train_state is not None
    try:  # the prepared data's record, if it is still the one the state was trained on, names what differs
        recorded = json.loads((data_folder(model_out) / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, dict) and data_fingerprint(recorded) == loaded.train_state.get("data"):
        check_same_options(recorded, record, where, names={"corpus": "CORPUS", "valid": "--valid"},
                           advice="resume on the same data, or train into another MODEL")
    check_same_data(where, loaded.train_state, data_fingerprint(record), corpus)


@dataclass
class _CSLMTraining(Training):
    """One CSLM training run on :class:`neural.training.Training`: an update on the next n-grams of the
    epoch, a validation (perplexity, log Z) at the end of each epoch and when time runs out, a save of
    ``MODEL.last`` every ``checkpoint_every`` seconds in between, stop reasons ``max_time``,
    ``early_stopping`` and ``max_epochs``.
    """

    state: CSLMTrainingState
    cfg: CSLMTrainConfig
    train_step: CSLMStep  # cslm.step: eager, static or captured
    vocab: Vocab
    train_split: NgramSplit
    valid_split: NgramSplit
    since_save: _IntervalSums = field(default_factory=_IntervalSums)
    out_of_time_now: bool = False  # max_time ran out at the last update
    trained: bool = False  # an update (or an epoch's end) happened in this process
    order: tuple[int, np.ndarray] | None = None  # (epoch, its n-gram order): drawn once per epoch

    DIVERGED_HINT: ClassVar[str] = "train again with a smaller --lr"

    @classmethod
    def start(cls, corpus: str, model_out: Path, model_config: CSLMConfig, cfg: CSLMTrainConfig, *, shortlist: int,
              valid: str | None, device: str, precision: str, resume: bool, progress: bool) -> _CSLMTraining:
        """A fresh run on ``corpus``, or with ``resume`` the one saved in ``MODEL.last`` (else ``MODEL``)."""
        width = max(model_config.hidden, default=model_config.embedding)
        dev, precision, amp_dtype, why = training_device(device, precision, width)
        resume_from = resume_source(model_out, resume)
        loaded = load_cslm(resume_from, dev) if resume_from is not None else None
        record = data_record(corpus, valid, shortlist=shortlist, order=model_config.order, seed=cfg.seed)
        if loaded is not None:
            _check_resumable_here(loaded, model_out, model_config, cfg, record, corpus)
            model_config = loaded.model.config
        vocab, train_split, valid_split, fingerprint = prepare_corpus(
            corpus, data_folder(model_out), shortlist=shortlist, order=model_config.order, valid=valid,
            vocab=loaded.vocab if loaded else None, seed=cfg.seed, progress=progress,
        )
        model_config = dataclasses.replace(model_config, vocab_size=len(vocab))
        torch.manual_seed(cfg.seed)
        model = CSLM(model_config).to(dev)
        optimizer = _make_optimizer(model, cfg)
        state = CSLMTrainingState(data=fingerprint)
        if loaded is not None:
            assert loaded.train_state is not None and loaded.optimizer_state is not None
            model.load_state_dict(loaded.model.state_dict())
            optimizer.load_state_dict(loaded.optimizer_state)
            state = CSLMTrainingState.from_dict(loaded.train_state)
        announce(state, dev, precision, resolve_cslm_step(cfg.train_step, dev, cfg.optimizer), why)
        train_step = make_cslm_step(state.train_step, model, optimizer, self_normalize=cfg.self_normalize,
                                    batch_size=cfg.batch_size, optimizer_name=cfg.optimizer, device=dev,
                                    amp_dtype=amp_dtype)
        return cls(model_out, dev, amp_dtype, model, optimizer, state, cfg, train_step, vocab, train_split,
                   valid_split)

    @property
    def epoch_len(self) -> int:
        n, size = len(self.train_split), self.cfg.epoch_size
        return n if size is None else min(size, n)

    def write(self, path: Path) -> None:
        save_cslm(path, self.model, self.vocab, train_config=self.cfg.to_dict(),
                  optimizer_state=self.optimizer.state_dict(), train_state=self.state.to_dict())

    def save(self, improved: bool) -> None:
        """As every training's save; the sums of the next heartbeat start again."""
        super().save(improved)
        self.since_save = _IntervalSums()

    def measure(self) -> tuple[Validation, float]:
        """The validation perplexity (said on stderr, with log Z's mean and spread)."""
        state = self.state
        ppl, z_mean, z_std = validation_stats(self.model, self.valid_split, amp_dtype=self.amp_dtype)
        partial = f" (stopped {state.position} n-grams into epoch {state.epoch + 1})" if state.position else ""
        tqdm.write(f"epoch {state.epoch}: valid perplexity {ppl:.2f}, log Z mean {z_mean:.3f} std {z_std:.3f}"
                   f"{partial}", file=sys.stderr)
        return Validation(state.epoch, state.examples, ppl, z_mean, z_std), ppl

    def improves(self, metric: float) -> bool:
        return metric < self.state.best - 1e-9

    def first_validation(self) -> None:
        """Recorded and saved: the model file exists from the start of a CSLM run."""
        self.save(self.validate())

    def progress_bar(self, show: bool) -> tqdm:
        return progress_bar(total=self.epoch_len, initial=self.state.position,
                            desc=f"epoch {self.state.epoch + 1}", unit=" ngram", unit_scale=True, show=show,
                            dynamic_ncols=True, mininterval=1.0)

    def epoch_order(self) -> np.ndarray:
        """The training n-grams of the current epoch, in their order (:func:`_epoch_order`, kept for the epoch)."""
        epoch = self.state.epoch
        if self.order is None or self.order[0] != epoch:
            self.order = (epoch, _epoch_order(len(self.train_split), self.cfg, epoch))
        return self.order[1]

    def update(self, bar: tqdm) -> None:
        """One update of the epoch (a bar of its own, from its first update on), saving now and then;
        at the epoch's end, the next epoch. A run out of time stays where it stopped in its epoch."""
        cfg, state = self.cfg, self.state
        order = self.epoch_order()
        self.trained = True
        if state.position < len(order):
            if state.position == 0 and bar.n:  # the epoch before was validated: a new bar for this one
                bar.reset(total=self.epoch_len)
                bar.set_description(f"epoch {state.epoch + 1}")
            rows = order[state.position : state.position + cfg.batch_size]
            loss = self.step(rows)
            bar.update(len(rows))
            if state.position % (cfg.batch_size * 50) < cfg.batch_size:
                bar.set_postfix(loss=f"{loss.item():.3f}", ngram_s=f"{bar.format_dict['rate'] or 0:.0f}")
            if self.out_of_time(cfg.max_time):
                self.out_of_time_now = True
                bar.close()  # the lines that say where it stopped come after the bar, not under it
                return
        if state.position >= len(order):
            state.epoch += 1
            state.position = 0

    def checkpoint_line(self) -> str:
        """Where in its epoch the run stands, and how it trained since the last save."""
        state = self.state
        return (f"saved {last_checkpoint_path(self.model_out)}: epoch {state.epoch + 1}, "
                f"{state.position:,} of {self.epoch_len:,} n-grams, {state.examples:,} in "
                f"{state.elapsed:.0f} s ({state.examples / max(state.elapsed, 1e-9):.0f} "
                f"n-grams/s), {self.training_figures()}")

    def validation_due(self) -> bool:
        """At the end of each epoch, and when time runs out."""
        return self.out_of_time_now or self.state.position == 0

    def reason_to_stop(self) -> str | None:
        """Time first, then patience (only after an epoch trained here), then the epochs."""
        cfg, state = self.cfg, self.state
        if self.out_of_time_now:
            return "max_time"
        if self.trained and self.patience_spent(cfg.patience):
            return "early_stopping"
        if cfg.max_epochs is not None and state.epoch >= cfg.max_epochs:
            return "max_epochs"
        return None

    def position(self) -> str:
        return f"{self.state.examples} n-grams (epoch {self.state.epoch + 1})"

    def where(self, at: int) -> str:
        return f"the update that reached {at:,} n-grams"

    def training_figures(self) -> str:
        """The training perplexity and mean (log Z)² over the n-grams since the last save.

        One minibatch's loss swings by tenths of a nat from batch to batch, too much to read a trend
        from a line every ten minutes; the mean over the whole interval can be set beside the
        validation perplexity.
        """
        sums = self.since_save  # never empty here: a heartbeat follows a training step
        text = f"training perplexity {math.exp(float(sums.cross_entropy) / sums.ngrams):.2f}"
        if self.cfg.self_normalize:
            text += f", mean (log Z)² {float(sums.log_z_squared) / sums.ngrams:.3f}"
        return text + " since the last save"

    def step(self, rows: np.ndarray) -> torch.Tensor:
        """One update on the n-grams ``rows``; moves the epoch position and the clock on."""
        cfg, state = self.cfg, self.state
        hist, tgt = self.train_split.batch(rows)
        if cfg.optimizer == "sgd":
            for group in self.optimizer.param_groups:
                group["lr"] = cfg.learning_rate / (1.0 + state.examples * cfg.lr_decay)
        loss, cross_entropy, log_z_squared = self.train_step(hist, tgt)
        sums, n = self.since_save, len(rows)
        sums.cross_entropy = sums.cross_entropy + cross_entropy * n
        if cfg.self_normalize:
            sums.log_z_squared = sums.log_z_squared + log_z_squared * n
        sums.ngrams += n
        state.position += len(rows)
        state.examples += len(rows)
        state.elapsed = self.clock()
        self.watch_loss(loss, state.examples)
        return loss
