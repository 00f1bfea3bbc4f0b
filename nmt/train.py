"""Training the attention NMT model on a tokenised bitext: ``nmt train SRC TGT MODEL``.

What a run does, in order: the bitext is read and checked (:func:`nmt.data.read_bitext`), a held-out
slice is set apart (or ``--valid-src/--valid-tgt`` read), one sentencepiece model per side is trained
on the training text, both sides are encoded, and Adam updates run on length-bucketed batches
(:func:`nmt.data.epoch_batches`) on the training base every model shares (:mod:`neural.training`):
a validation every ``valid_every`` updates
(perplexity per target unit, EOS counted, and BLEU of a greedy decode of the first
``bleu_sentences`` held-out pairs), ``MODEL`` the best model by perplexity, ``MODEL.last`` the latest
state for ``--resume``, stops by time, patience, updates or epochs, Ctrl-C and SIGTERM, a NaN loss.

The model-specific parts are small functions of their own (:func:`update_step`, :func:`validate`,
:func:`learning_rate`); :class:`_NMTTraining` gives the base only what is this model's.
Nothing in a run draws random numbers but the batches, a pure function of (seed, epoch): a resumed
run makes the same updates as one never stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import sacrebleu
import torch
from tqdm import tqdm

from infrastructure.errors import UserError
from infrastructure.files import display_name
from infrastructure.progress import progress_bar
from infrastructure.resume_record import check_same_options, file_identity, options_record
from neural.config import CHECKPOINT_EVERY, DictConfig, check_positive_int
from neural.device import autocast
from neural.training import (
    Training,
    TrainingState,
    TrainResult,
    announce,
    check_resumable,
    check_same_data,
    check_same_recipe,
    resume_source,
    training_device,
    training_files,
)
from nmt.data import EncodedBitext, epoch_batches, read_bitext
from nmt.model import AttentionNMT, NMTConfig, make_batch, pair_log_probs
from nmt.model_file import load_nmt, save_nmt
from nmt.scoring import score_pairs
from nmt.search import greedy_search
from nmt.subwords import Subwords, train_subwords


@dataclass
class NMTTrainConfig(DictConfig):
    """The training recipe; saved in the model file, so a run resumes with it and can be inspected."""

    vocab_size: int = 8000  # sentencepiece units per side, at most
    batch_size: int = 64  # sentence pairs per update
    lr: float = 5e-4  # Adam's
    clip: float = 1.0  # gradient norm limit
    valid_every: int = 1000  # updates between validations
    max_steps: int | None = None
    max_epochs: int | None = None
    max_time: float | None = None  # seconds of training, across --resume
    patience: int | None = 10  # validations without a better perplexity
    seed: int = 1234
    valid_lines: int = 1000  # held out of the bitext when no validation files are given
    bleu_sentences: int = 100  # held-out pairs greedily decoded at each validation
    checkpoint_every: float = CHECKPOINT_EVERY  # seconds between saves of MODEL.last in between validations

    #: What a ``--resume`` may change (neural.training.check_same_recipe): when to stop, how often the run
    #: validates and saves its state (a validation draws no random number: the updates stay the same); the
    #: rest of the recipe is the interrupted run's.
    RESUME_MAY_DIFFER: ClassVar[frozenset[str]] = frozenset({"max_steps", "max_epochs", "max_time", "patience",
                                                             "checkpoint_every", "valid_every", "bleu_sentences"})

    def __post_init__(self) -> None:
        for name in ("vocab_size", "batch_size", "valid_every", "valid_lines"):
            check_positive_int("NMTTrainConfig", name, getattr(self, name))
        check_positive_int("NMTTrainConfig", "bleu_sentences", self.bleu_sentences, minimum=0)
        for name in ("max_steps", "max_epochs", "patience"):
            if getattr(self, name) is not None:
                check_positive_int("NMTTrainConfig", name, getattr(self, name))
        for name in ("lr", "clip"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"NMTTrainConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_time is not None and not float(self.max_time) > 0:
            raise ValueError(f"NMTTrainConfig.max_time must be > 0 seconds, got {self.max_time!r}")
        if not float(self.checkpoint_every) >= 0:
            raise ValueError(f"NMTTrainConfig.checkpoint_every must be >= 0 seconds, got {self.checkpoint_every!r}")


@dataclass
class Validation:
    """One validation: where (update, epoch), held-out perplexity per target unit, greedy BLEU."""

    step: int
    epoch: int
    perplexity: float
    bleu: float | None


@dataclass
class NMTTrainResult(TrainResult):
    steps: int = 0  # updates
    target_tokens: int = 0  # target units (EOS counted) trained on


# --------------------------------------------------------------------------------------------
# The model-specific parts: data, one update, one validation, the schedule


@dataclass
class PreparedData:
    """Both sides' subword models and the encoded training and held-out pairs."""

    src_subwords: Subwords
    tgt_subwords: Subwords
    train: EncodedBitext
    valid: EncodedBitext
    valid_references: list[str]  # the held-out targets as given (tokenised), for BLEU
    fingerprint: str  # what a resumed run must find again


def prepare_data(src: str, tgt: str, cfg: NMTTrainConfig, *, valid_src: str | None = None,
                 valid_tgt: str | None = None, subwords: tuple[Subwords, Subwords] | None = None) -> PreparedData:
    """Read and check the bitext (before anything long), split, train or reuse the subwords, encode."""
    src_lines, tgt_lines = read_bitext(src, tgt)
    if valid_src is not None and valid_tgt is not None:
        valid_pairs = read_bitext(valid_src, valid_tgt)
        train_rows = np.arange(len(src_lines))
    else:
        if len(src_lines) < 2:
            raise UserError(f"{src}: need at least 2 lines to hold one out for validation")
        held = min(cfg.valid_lines, max(1, len(src_lines) // 10))
        order = np.random.default_rng(cfg.seed).permutation(len(src_lines))
        held_rows, train_rows = np.sort(order[:held]), np.sort(order[held:])
        valid_pairs = ([src_lines[i] for i in held_rows], [tgt_lines[i] for i in held_rows])
    train_src = [src_lines[i] for i in train_rows]
    train_tgt = [tgt_lines[i] for i in train_rows]
    if subwords is None:
        subwords = (train_subwords(train_src, cfg.vocab_size, seed=cfg.seed, name=display_name(src)),
                    train_subwords(train_tgt, cfg.vocab_size, seed=cfg.seed, name=display_name(tgt)))
    src_sw, tgt_sw = subwords
    return PreparedData(
        src_sw, tgt_sw, EncodedBitext(src_sw.encode(train_src), tgt_sw.encode(train_tgt)),
        EncodedBitext(src_sw.encode(valid_pairs[0]), tgt_sw.encode(valid_pairs[1])), list(valid_pairs[1]),
        data_fingerprint(data_record(src, tgt, cfg, valid_src=valid_src, valid_tgt=valid_tgt)))


def data_record(src: str, tgt: str, cfg: NMTTrainConfig, *, valid_src: str | None = None,
                valid_tgt: str | None = None) -> dict[str, object]:
    """What the prepared data depends on: the texts by path, size and time (as ``make`` knows a file), the
    subword vocabulary's size, the seed and the held-out lines. Known from the command line alone, so a
    ``--resume`` on other data is refused before the bitext is read; the state keeps it to name what differs."""
    return {"src": file_identity(src), "tgt": file_identity(tgt),
            "valid": [file_identity(valid_src), file_identity(valid_tgt)] if valid_src and valid_tgt else None,
            "vocab_size": cfg.vocab_size, "seed": cfg.seed, "valid_lines": cfg.valid_lines}


def data_fingerprint(record: dict[str, object]) -> str:
    """The digest of a :func:`data_record` that a training state keeps as its ``data``."""
    return hashlib.sha1(json.dumps(record, sort_keys=True).encode()).hexdigest()


def check_same_data_record(where: Path, train_state: dict[str, object], record: dict[str, object],
                           src: str, tgt: str) -> None:
    """Before the bitext is read: a resume is on the data the state was trained on. A state that keeps its
    :func:`data_record` names each file that differs (moved, copied, edited); an older one only says so."""
    recorded = train_state.get("data_record")
    if isinstance(recorded, dict):
        check_same_options(_by_option(recorded), _by_option(record), where,
                           names={"src": "SRC", "tgt": "TGT"}, advice="resume on the same data, or train into "
                           "another MODEL (a copied or touched file counts as other data)")
    check_same_data(where, train_state, data_fingerprint(record), f"{src} and {tgt}")


def _by_option(record: dict[str, object]) -> dict[str, object]:
    """A :func:`data_record` keyed as the command line names its parts (``--valid-src``, ``--valid-tgt``)."""
    valid = record.get("valid") or [None, None]
    return {**{k: v for k, v in record.items() if k != "valid"}, "valid_src": valid[0], "valid_tgt": valid[1]}


def learning_rate(cfg: NMTTrainConfig, step: int) -> float:
    """Adam's step size at update ``step``: constant (Bahdanau et al. train with Adadelta, no schedule)."""
    return cfg.lr


def update_step(model: AttentionNMT, optimizer: torch.optim.Optimizer, data: EncodedBitext, rows: np.ndarray,
                cfg: NMTTrainConfig, step: int, device: torch.device,
                amp_dtype: torch.dtype | None) -> tuple[torch.Tensor, int]:
    """One Adam update on the pairs ``rows``: mean negative log-likelihood per target unit, clipped
    gradients. Returns the summed negative log-likelihood (a tensor on the device, read only when
    needed) and the target units."""
    batch = make_batch([data.sources[i] for i in rows], [data.targets[i] for i in rows], device)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(cfg, step)
    with autocast(device, amp_dtype):
        total = pair_log_probs(model, batch).sum()
    tokens = batch.target_tokens
    optimizer.zero_grad(set_to_none=True)
    (-total / tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    optimizer.step()
    return -total.detach(), tokens


def validate(model: AttentionNMT, data: PreparedData, cfg: NMTTrainConfig,
             amp_dtype: torch.dtype | None) -> tuple[float, float | None]:
    """Held-out perplexity per target unit (EOS counted) and BLEU of a greedy decode of its first
    ``bleu_sentences`` pairs (sacreBLEU on the tokenised text, no further tokenisation)."""
    was_training = model.training
    model.eval()
    valid = data.valid
    log_prob = float(score_pairs(model, valid.sources, valid.targets, amp_dtype=amp_dtype).sum())
    perplexity = math.exp(-log_prob / max(1, valid.target_tokens))
    bleu = None
    if cfg.bleu_sentences:
        sources = valid.sources[: cfg.bleu_sentences]
        found = greedy_search(model, sources)
        hypotheses = data.tgt_subwords.decode([h.ids for h in found])
        bleu = sacrebleu.corpus_bleu(hypotheses, [data.valid_references[: len(sources)]], tokenize="none").score
    model.train(was_training)
    return perplexity, bleu


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class NMTTrainingState(TrainingState):
    """Where a run stands (for ``--resume``): the epoch, the batch of it next, updates and target units so far.

    An epoch's batches are a pure function of (seed, epoch) (:func:`nmt.data.epoch_batches`), so the
    position in it is all a resumed run needs, mid-epoch too.
    """

    epoch: int = 0
    position: int = 0  # batches of the current epoch trained on
    step: int = 0  # updates
    target_tokens: int = 0  # target units (EOS counted) trained on
    best: float = math.inf  # the best validation perplexity (it falls)
    data_record: dict[str, Any] | None = None  # what ``data`` digests (:func:`data_record`), to name what differs

    VALIDATION: ClassVar[type] = Validation


def train_nmt(src: str, tgt: str, model_out: Path, *, model_config: NMTConfig, train_config: NMTTrainConfig,
              valid_src: str | None = None, valid_tgt: str | None = None,
              device: str = "auto", precision: str = "auto", resume: bool = False,
              progress: bool = True) -> NMTTrainResult:
    """What ``nmt train`` does; ``model_config``'s vocabulary sizes are replaced by the subwords'.

    With ``resume`` the run continues from ``MODEL.last`` (or ``MODEL``) with that file's subwords and
    position; its sizes and recipe must be this call's, but for :attr:`NMTTrainConfig.RESUME_MAY_DIFFER`
    (the stops, how often the state is saved). The bitext must be the one it was trained on. The
    subwords live in the model file, so the run fills no ``MODEL.data`` folder.
    """
    model_out = Path(model_out)
    with training_files(model_out, resume):
        run = _NMTTraining.start(src, tgt, model_out, model_config, train_config,
                                 valid_src=valid_src, valid_tgt=valid_tgt, device=device, precision=precision,
                                 resume=resume)
        stopped_by = run.run(progress=progress, checkpoint_every=train_config.checkpoint_every)
        return NMTTrainResult(stopped_by, run.state.elapsed, run.state.history, steps=run.state.step,
                              target_tokens=run.state.target_tokens)


@dataclass
class _NMTTraining(Training):
    """One NMT run on :class:`neural.training.Training`: an Adam update on the next length-bucketed batch,
    a validation every ``valid_every`` updates and at the last one (perplexity, greedy BLEU), stop
    reasons ``max_time``, ``early_stopping``, ``max_steps`` and ``max_epochs``."""

    state: NMTTrainingState
    cfg: NMTTrainConfig
    data: PreparedData
    batches: tuple[int, list[np.ndarray]] | None = None  # (epoch, its batches)

    DIVERGED_HINT: ClassVar[str] = "train again with a smaller --lr"

    @classmethod
    def start(cls, src: str, tgt: str, model_out: Path, model_config: NMTConfig, cfg: NMTTrainConfig, *,
              valid_src: str | None, valid_tgt: str | None, device: str, precision: str,
              resume: bool) -> _NMTTraining:
        """A fresh run, or with ``resume`` the one saved in ``MODEL.last`` (else ``MODEL``)."""
        dev, precision, amp_dtype, why = training_device(device, precision, model_config.hidden)
        resume_from = resume_source(model_out, resume)
        loaded = load_nmt(resume_from, dev) if resume_from is not None else None
        if loaded is not None:
            assert resume_from is not None
            check_resumable(resume_from, loaded.train_state, loaded.optimizer_state)
            check_resumable(resume_from, loaded.train_config, loaded.optimizer_state)  # the recipe is part of it
            check_same_recipe(resume_from, loaded.train_config, cfg, cfg.RESUME_MAY_DIFFER)
            vocabularies = {"src_vocab", "tgt_vocab"}  # the subwords' sizes, set from the data below
            check_same_options(options_record(loaded.model.config, vocabularies),
                               options_record(model_config, vocabularies), resume_from,
                               advice="resume with the same sizes, or train into another MODEL")
            model_config = loaded.model.config
        record = data_record(src, tgt, cfg, valid_src=valid_src, valid_tgt=valid_tgt)
        if loaded is not None:
            assert resume_from is not None and loaded.train_state is not None
            check_same_data_record(resume_from, loaded.train_state, record, src, tgt)
        data = prepare_data(src, tgt, cfg, valid_src=valid_src, valid_tgt=valid_tgt,
                            subwords=(loaded.src_subwords, loaded.tgt_subwords) if loaded else None)
        model_config = dataclasses.replace(model_config, src_vocab=len(data.src_subwords),
                                           tgt_vocab=len(data.tgt_subwords))
        torch.manual_seed(cfg.seed)
        model = AttentionNMT(model_config).to(dev)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        state = NMTTrainingState(data=data.fingerprint)
        if loaded is not None:
            assert loaded.train_state is not None
            model.load_state_dict(loaded.model.state_dict())
            optimizer.load_state_dict(loaded.optimizer_state)
            state = NMTTrainingState.from_dict(loaded.train_state)
        state.data_record = record
        announce(state, dev, precision, "eager", why)
        print(f"{len(data.train)} pairs, {len(data.src_subwords)} and {len(data.tgt_subwords)} subword units",
              file=sys.stderr)
        return cls(model_out, dev, amp_dtype, model, optimizer, state, cfg, data)

    def epoch_batches(self) -> list[np.ndarray]:
        epoch = self.state.epoch
        if self.batches is None or self.batches[0] != epoch:
            self.batches = (epoch, epoch_batches(self.data.train, self.cfg.batch_size, self.cfg.seed, epoch))
        return self.batches[1]

    def write(self, path: Path) -> None:
        save_nmt(path, self.model, self.data.src_subwords, self.data.tgt_subwords,
                 train_config=self.cfg.to_dict(), optimizer_state=self.optimizer.state_dict(),
                 train_state=self.state.to_dict())

    def first_validation(self) -> None:
        """The untrained model's validation, saved: a run stopped before its first scheduled one keeps a model."""
        self.save(self.validate())

    def measure(self) -> tuple[Validation, float]:
        """Held-out perplexity (the metric) and greedy BLEU, said on stderr."""
        state = self.state
        perplexity, bleu = validate(self.model, self.data, self.cfg, self.amp_dtype)
        bleu_text = f", greedy BLEU {bleu:.2f}" if bleu is not None else ""
        tqdm.write(f"update {state.step} (epoch {state.epoch + 1}): valid perplexity {perplexity:.2f}"
                   f"{bleu_text}", file=sys.stderr)
        return Validation(state.step, state.epoch, perplexity, bleu), perplexity

    def improves(self, metric: float) -> bool:
        return metric < self.state.best - 1e-9

    def progress_bar(self, show: bool) -> tqdm:
        return progress_bar(total=self.cfg.max_steps, initial=self.state.step, desc="training", unit=" update",
                            show=show, dynamic_ncols=True, mininterval=1.0)

    def update(self, bar: tqdm) -> None:
        """One update; at an epoch's end, the next epoch."""
        state = self.state
        batches = self.epoch_batches()
        loss, tokens = update_step(self.model, self.optimizer, self.data.train, batches[state.position],
                                   self.cfg, state.step, self.dev, self.amp_dtype)
        state.step += 1
        state.position += 1
        state.target_tokens += tokens
        state.elapsed = self.clock()
        if state.position >= len(batches):
            state.epoch, state.position = state.epoch + 1, 0
        self.watch_loss(loss, at=state.step)
        bar.update(1)
        if state.step % 20 == 0:
            bar.set_postfix(loss=f"{float(loss) / tokens:.3f}", tok_s=f"{state.target_tokens / state.elapsed:.0f}")

    def validation_due(self) -> bool:
        """Every ``valid_every`` updates, at the last update and when time runs out."""
        state, cfg = self.state, self.cfg
        last = (cfg.max_steps is not None and state.step >= cfg.max_steps) or (
            cfg.max_epochs is not None and state.epoch >= cfg.max_epochs)
        return self.out_of_time(cfg.max_time) or last or state.step % cfg.valid_every == 0

    def reason_to_stop(self) -> str | None:
        cfg, state = self.cfg, self.state
        if self.out_of_time(cfg.max_time):
            return "max_time"
        if self.patience_spent(cfg.patience):
            return "early_stopping"
        if cfg.max_steps is not None and state.step >= cfg.max_steps:
            return "max_steps"
        if cfg.max_epochs is not None and state.epoch >= cfg.max_epochs:
            return "max_epochs"
        return None

    def position(self) -> str:
        return f"update {self.state.step} (epoch {self.state.epoch + 1})"
