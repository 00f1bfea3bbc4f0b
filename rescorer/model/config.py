"""Model and training hyper-parameters as plain, serialisable dataclasses.

Both configs are stored inside checkpoints as plain dicts (so that a checkpoint loads with
``torch.load(weights_only=True)`` and stays readable without this code), which is why each has a
``to_dict``/``from_dict`` pair. ``from_dict`` is strict: an unknown key almost always means a
checkpoint written by a different version or a typo in a hand-written config, and silently
ignoring it would build a different model from the one that was trained.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from neural.config import CHECKPOINT_EVERY, TRAIN_STEPS, DictConfig, check_positive_int

# What a model scores: "forward" p(e|f), the table's target given its source (the paper's model), or
# "reverse" p(f|e), trained on the same pairs with sources and targets swapped (`rescorer train --reverse`).
DIRECTIONS = ("forward", "reverse")


def _check_sizes(owner: str, config: ModelSizes | ModelConfig) -> None:
    """The checks of the sizes a user chooses (``--hidden`` …), shared by :class:`ModelSizes` and
    :class:`ModelConfig`: a bad size otherwise fails deep inside torch."""
    for name in ("hidden", "embedding", "maxout_units", "output_rank"):
        check_positive_int(owner, name, getattr(config, name))
    if config.direction not in DIRECTIONS:
        raise ValueError(f"{owner}.direction must be one of {', '.join(DIRECTIONS)}, got {config.direction!r}")
    init_std = config.init_std
    if isinstance(init_std, bool) or not isinstance(init_std, (int, float)):
        raise ValueError(f"{owner}.init_std must be a number, got {init_std!r}")
    if not (math.isfinite(init_std) and init_std > 0):
        raise ValueError(f"{owner}.init_std must be finite and > 0, got {init_std!r}")


#: Words per language kept in the vocabulary ([UNK] included): the paper's shortlist.
DEFAULT_SHORTLIST = 15000
#: The largest shortlist: more words than any phrase table's side holds in practice (the output layer is
#: shortlist × output rank).
MAX_SHORTLIST = 1_000_000
#: The largest std of the initial weights: 100 times the paper's 0.01, past which no training starts
#: sanely (``--init-std 10`` failed in a traceback, ``1e308`` trained a model of NaNs).
MAX_INIT_STD = 1.0


@dataclass(frozen=True)
class ModelSizes:
    """What a user chooses of a :class:`ModelConfig` (``--hidden``, ``--embedding``, …): every field
    but the vocabulary sizes, which only the shortlists built from the data give.

    The defaults, the paper's experiment, are defined here once; :class:`ModelConfig` and the command
    line take them from here. A training builds its :class:`ModelConfig` with :meth:`config` once the
    shortlists exist, so no config ever holds a made-up vocabulary size.
    """

    hidden: int = 1000
    embedding: int = 100
    maxout_units: int = 500
    output_rank: int = 100
    init_std: float = 0.01
    direction: str = "forward"

    def __post_init__(self) -> None:
        _check_sizes("ModelSizes", self)

    def config(self, src_vocab_size: int, tgt_vocab_size: int) -> ModelConfig:
        """The model of these sizes over vocabularies of ``src_vocab_size`` and ``tgt_vocab_size`` ids."""
        return ModelConfig(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                           **dataclasses.asdict(self))


@dataclass
class ModelConfig(DictConfig):
    """Sizes of the RNN Encoder–Decoder (SPEC §1); the defaults are the paper's experiment (:class:`ModelSizes`).

    ``src_vocab_size``/``tgt_vocab_size`` count *ids*, i.e. the shortlist words plus ``[UNK]``
    plus ``</s>``: the paper's 15,000-word shortlist (14,999 words + ``[UNK]``) gives 15,001.
    ``embedding`` is the rank of the factorised input matrices (Sec. 4.1.1 uses 100; Appendix A
    says 500). ``maxout_units`` is the size of s⟨t⟩ after maxout, so the deep-output layer s'
    has ``2 * maxout_units`` units. ``output_rank`` is the rank of G = G_l G_r.

    ``direction`` (one of :data:`DIRECTIONS`) says which way the model reads the phrase table: a
    ``reverse`` model's source vocabulary is the table's target side and it scores p(f|e). It is
    stored with the model so that a model cannot be given where the other direction is wanted;
    model files written before the field existed are ``forward``, as they were all trained so.
    """

    src_vocab_size: int
    tgt_vocab_size: int
    hidden: int = ModelSizes.hidden
    embedding: int = ModelSizes.embedding
    maxout_units: int = ModelSizes.maxout_units
    output_rank: int = ModelSizes.output_rank
    init_std: float = ModelSizes.init_std
    direction: str = ModelSizes.direction

    def __post_init__(self) -> None:
        # A real vocabulary has at least the two reserved ids (</s>=0, [UNK]=1).
        check_positive_int("ModelConfig", "src_vocab_size", self.src_vocab_size, minimum=2)
        check_positive_int("ModelConfig", "tgt_vocab_size", self.tgt_vocab_size, minimum=2)
        _check_sizes("ModelConfig", self)
        self.init_std = float(self.init_std)


#: ``rescore-phrase-table``'s training budget in seconds, given no ``--model``, ``--train-time`` or ``--train-steps``.
DEFAULT_TRAIN_TIME = 1800.0


@dataclass
class TrainConfig(DictConfig):
    """The training recipe of SPEC §1 (Sec. 3.1/4.1.1) plus the stopping rules of our trainer.

    ``rho``/``eps`` are Adadelta's; ``clip_norm`` is the gradient-norm clip of the original code
    (``None`` disables it); ``length_group`` is how many minibatches are drawn together, sorted
    by length and re-batched (the original code's trick to cut padding). ``valid_every`` is in
    update steps. Training stops at the first of ``max_steps`` updates, ``max_time`` seconds of
    wall time, or ``patience`` validations in a row without improvement; ``None`` disables that
    rule. ``train_step`` says how an update runs (one of :data:`TRAIN_STEPS`; the same updates
    to 1e-5, see :mod:`rescorer.training.step`), so a resumed run may choose another.

    Each default is the command line's (``rescorer train`` reads them from here);
    :meth:`for_budget` is the recipe of a training that ``rescore-phrase-table`` runs on a budget.
    """

    batch_size: int = 64
    rho: float = 0.95
    eps: float = 1e-6
    clip_norm: float | None = 1.0
    length_group: int = 10
    seed: int = 1234
    valid_every: int = 500
    max_steps: int | None = None
    max_time: float | None = None
    patience: int | None = 10
    train_step: str = "auto"
    checkpoint_every: float = CHECKPOINT_EVERY  # seconds between saves of MODEL.last in between validations

    #: What a ``--resume`` may change (neural.training.check_same_recipe): when to stop, how often the run
    #: validates and saves its state, how an update runs: none of them changes an update (a validation draws
    #: no random number). The rest of the recipe is the interrupted run's. ``rescore-phrase-table``'s budget
    #: sets ``valid_every`` (:meth:`for_budget`), so a resume with another ``--train-steps`` changes it too.
    RESUME_MAY_DIFFER: ClassVar[frozenset[str]] = frozenset({"max_steps", "max_time", "patience", "train_step",
                                                             "checkpoint_every", "valid_every"})

    def __post_init__(self) -> None:
        check_positive_int("TrainConfig", "batch_size", self.batch_size)
        if self.train_step not in TRAIN_STEPS:
            raise ValueError(f"TrainConfig.train_step must be one of {', '.join(TRAIN_STEPS)}, got {self.train_step!r}")
        check_positive_int("TrainConfig", "length_group", self.length_group)
        check_positive_int("TrainConfig", "valid_every", self.valid_every)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"TrainConfig.seed must be an integer, got {self.seed!r}")
        if not (0.0 <= float(self.rho) < 1.0):
            raise ValueError(f"TrainConfig.rho must be in [0, 1), got {self.rho!r}")
        if not float(self.eps) > 0.0:
            raise ValueError(f"TrainConfig.eps must be > 0, got {self.eps!r}")
        self.rho = float(self.rho)
        self.eps = float(self.eps)
        if self.clip_norm is not None:
            if not float(self.clip_norm) > 0.0:
                raise ValueError(f"TrainConfig.clip_norm must be > 0 or None, got {self.clip_norm!r}")
            self.clip_norm = float(self.clip_norm)
        if self.max_steps is not None:
            check_positive_int("TrainConfig", "max_steps", self.max_steps)
        if self.patience is not None:
            check_positive_int("TrainConfig", "patience", self.patience)
        if not float(self.checkpoint_every) >= 0.0:
            raise ValueError(f"TrainConfig.checkpoint_every must be >= 0 seconds, got {self.checkpoint_every!r}")
        if self.max_time is not None:
            if not float(self.max_time) > 0.0:
                raise ValueError(f"TrainConfig.max_time must be > 0 seconds or None, got {self.max_time!r}")
            self.max_time = float(self.max_time)

    @classmethod
    def for_budget(cls, *, max_steps: int | None, max_time: float | None, seed: int = 1234,
                   train_step: str = "auto") -> TrainConfig:
        """The training of ``rescore-phrase-table`` without ``--model``: it runs to its budget, never stops early.

        The budget is ``max_steps`` updates or ``max_time`` seconds, :data:`DEFAULT_TRAIN_TIME` when
        neither is given. With no patience, validation only picks the best model, so it follows the
        budget: every quarter of ``max_steps`` (every 125 updates on a time budget), but never more
        often than every 50 updates nor less often than every 500 (the default of ``rescorer train``),
        so that a short budget still keeps the best of about four models.
        """
        if max_steps is None and max_time is None:
            max_time = DEFAULT_TRAIN_TIME
        valid_every = max(50, min(cls.valid_every, (max_steps or cls.valid_every) // 4))
        return cls(max_steps=max_steps, max_time=max_time, patience=None, seed=seed, valid_every=valid_every,
                   train_step=train_step)
