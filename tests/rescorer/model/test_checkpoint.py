"""Checkpoints and configs: exact round trips, atomic writes, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from neural.model_files import ModelFileError
from neural.vocab import EOS, UNK, Vocab
from rescorer.model import checkpoint as checkpoint_module
from rescorer.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rescorer.model.config import DEFAULT_TRAIN_TIME, ModelConfig, ModelSizes, TrainConfig
from rescorer.model.network import RNNEncoderDecoder

CONFIG = ModelConfig(src_vocab_size=6, tgt_vocab_size=5, hidden=8, embedding=4, maxout_units=3, output_rank=2)
SRC_VOCAB = Vocab([EOS, UNK, "the", "house", "&amp;", "é"])
TGT_VOCAB = Vocab([EOS, UNK, "la", "maison", "&#124;"])
SRC = torch.tensor([[2, 3, 0, 0], [4, 5, 1, 0]])
SRC_LEN = torch.tensor([3, 4])
TGT = torch.tensor([[2, 3, 0], [4, 0, 0]])
TGT_LEN = torch.tensor([3, 2])


@pytest.fixture
def trained() -> tuple[RNNEncoderDecoder, torch.optim.Optimizer]:
    """A model one Adadelta step away from init, so the optimiser state is not empty."""
    torch.manual_seed(0)
    model = RNNEncoderDecoder(CONFIG)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0, rho=0.95, eps=1e-6)
    (-model(SRC, SRC_LEN, TGT, TGT_LEN).mean()).backward()
    optimizer.step()
    return model, optimizer


def _save(path: Path, model: RNNEncoderDecoder, **extra: object) -> Path:
    return save_checkpoint(path, model=model, config=CONFIG, src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB, **extra)


def test_round_trip_gives_identical_scores_vocab_and_config(
    tmp_path: Path, trained: tuple[RNNEncoderDecoder, torch.optim.Optimizer]
) -> None:
    model, optimizer = trained
    train_config = TrainConfig(max_steps=100, max_time=60.0, patience=None)
    train_state = {"step": 1, "best_ll": float("-inf"), "history": [{"step": 1, "ll": -3.5}],
                   "rng": torch.get_rng_state()}
    path = _save(tmp_path / "model.pt", model, train_config=train_config,
                 optimizer_state=optimizer.state_dict(), train_state=train_state)
    loaded = load_checkpoint(path)
    assert loaded.path == path and loaded.version == checkpoint_module.FORMAT_VERSION
    assert not loaded.model.training
    assert loaded.config == CONFIG and loaded.train_config == train_config
    assert loaded.src_vocab == SRC_VOCAB and loaded.tgt_vocab == TGT_VOCAB
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded.model(SRC, SRC_LEN, TGT, TGT_LEN), model(SRC, SRC_LEN, TGT, TGT_LEN))
    for (name, a), b in zip(model.state_dict().items(), loaded.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.train_state is not None
    assert loaded.train_state["history"] == train_state["history"]
    assert torch.equal(loaded.train_state["rng"], train_state["rng"])
    # the optimiser resumes exactly: one more step from either copy gives the same weights
    assert loaded.optimizer_state is not None
    resumed = torch.optim.Adadelta(loaded.model.parameters())
    resumed.load_state_dict(loaded.optimizer_state)
    loaded.model.train()
    model.train()
    for m, opt in ((model, optimizer), (loaded.model, resumed)):
        opt.zero_grad()
        (-m(SRC, SRC_LEN, TGT, TGT_LEN).mean()).backward()
        opt.step()
    for a, b in zip(model.parameters(), loaded.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_file_is_self_describing_and_safe_to_load(
    tmp_path: Path, trained: tuple[RNNEncoderDecoder, torch.optim.Optimizer]
) -> None:
    model, _ = trained
    path = _save(tmp_path / "model.pt", model)
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "moses-rnn-rescorer-checkpoint"
    assert raw["model_config"] == CONFIG.to_dict()
    assert raw["src_vocab"]["words"] == SRC_VOCAB.words
    assert raw["train_config"] is None and raw["optimizer_state"] is None


def test_atomic_write_leaves_only_the_checkpoint(
    tmp_path: Path, trained: tuple[RNNEncoderDecoder, torch.optim.Optimizer]
) -> None:
    model, _ = trained
    _save(tmp_path / "model.pt", model)
    _save(tmp_path / "model.pt", model)  # overwriting goes through a temp file as well
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_failed_write_keeps_the_previous_checkpoint(
    tmp_path: Path, trained: tuple[RNNEncoderDecoder, torch.optim.Optimizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = trained
    path = _save(tmp_path / "model.pt", model)
    before = path.read_bytes()

    def dying_save(obj: object, stream: object) -> None:
        stream.write(b"partial")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint_module.torch, "save", dying_save)
    with pytest.raises(OSError, match="disk full"):
        _save(path, model)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_unstorable_train_state_fails_at_save_time(
    tmp_path: Path, trained: tuple[RNNEncoderDecoder, torch.optim.Optimizer]
) -> None:
    model, _ = trained
    with pytest.raises(ModelFileError, match=r"train_state\['rng'\] is a object"):
        _save(tmp_path / "model.pt", model, train_state={"rng": object()})
    assert not any(tmp_path.iterdir())


def test_mismatched_config_or_vocab_is_refused(
    tmp_path: Path, trained: tuple[RNNEncoderDecoder, torch.optim.Optimizer]
) -> None:
    model, _ = trained
    with pytest.raises(CheckpointError, match="was built with"):
        save_checkpoint(tmp_path / "m.pt", model=model, config=ModelConfig(6, 5), src_vocab=SRC_VOCAB,
                        tgt_vocab=TGT_VOCAB)
    with pytest.raises(CheckpointError, match="vocabulary sizes"):
        save_checkpoint(tmp_path / "m.pt", model=model, config=CONFIG, src_vocab=TGT_VOCAB, tgt_vocab=TGT_VOCAB)


def test_garbage_and_foreign_files_give_a_clear_error(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a checkpoint\n" * 10)
    with pytest.raises(CheckpointError, match=r"garbage\.pt: not a rescorer checkpoint"):
        load_checkpoint(garbage)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    with pytest.raises(CheckpointError, match=r"foreign\.pt: not a rescorer checkpoint"):
        load_checkpoint(foreign)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_newer_format_version_is_refused(
    tmp_path: Path, trained: tuple[RNNEncoderDecoder, torch.optim.Optimizer]
) -> None:
    model, _ = trained
    path = _save(tmp_path / "model.pt", model)
    raw = torch.load(path, weights_only=True)
    raw["version"] = checkpoint_module.FORMAT_VERSION + 1
    torch.save(raw, path)
    with pytest.raises(CheckpointError, match="version 2 is not supported"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------- configs


def test_model_config_defaults_are_the_papers_and_round_trip() -> None:
    config = ModelConfig(src_vocab_size=15001, tgt_vocab_size=15001)
    assert (config.hidden, config.embedding, config.maxout_units, config.output_rank) == (1000, 100, 500, 100)
    assert config.init_std == 0.01
    assert ModelConfig.from_dict(config.to_dict()) == config


def test_direction_is_saved_and_a_file_without_it_is_a_forward_model(tmp_path: Path) -> None:
    """A reverse model says so when loaded; model files written before the field are p(e|f) models."""
    from dataclasses import replace

    reverse = replace(CONFIG, direction="reverse")
    path = save_checkpoint(tmp_path / "rev.pt", model=RNNEncoderDecoder(reverse), config=reverse,
                           src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB)
    assert load_checkpoint(path).config.direction == "reverse"
    payload = torch.load(path, weights_only=True)
    del payload["model_config"]["direction"]  # as every model file written before the option
    torch.save(payload, tmp_path / "old.pt")
    assert load_checkpoint(tmp_path / "old.pt").config.direction == "forward"
    with pytest.raises(ValueError, match="direction must be one of forward, reverse"):
        replace(CONFIG, direction="backward")


def test_train_config_defaults_are_the_papers_and_round_trip() -> None:
    config = TrainConfig()
    assert (config.batch_size, config.rho, config.eps, config.clip_norm, config.length_group) == (
        64, 0.95, 1e-6, 1.0, 10,
    )
    assert TrainConfig.from_dict(config.to_dict()) == config
    custom = TrainConfig(max_steps=5, max_time=1.5, patience=None, clip_norm=None)
    assert TrainConfig.from_dict(custom.to_dict()) == custom


def test_a_model_config_holds_real_vocabulary_sizes_and_sizes_alone_are_checked_early() -> None:
    """No placeholder vocabulary: a vocabulary has at least </s> and [UNK]. What a user chooses (ModelSizes)
    is checked when given, before any shortlist exists, and becomes a config once they do."""
    for size in (0, 1):
        with pytest.raises(ValueError, match="src_vocab_size must be an integer >= 2"):
            ModelConfig(src_vocab_size=size, tgt_vocab_size=5)
    with pytest.raises(ValueError, match="ModelSizes.hidden must be an integer >= 1"):
        ModelSizes(hidden=0)
    with pytest.raises(ValueError, match="ModelSizes.init_std must be finite"):
        ModelSizes(init_std=float("nan"))
    sizes = ModelSizes(hidden=8, embedding=4, maxout_units=3, output_rank=2)
    assert sizes.config(6, 5) == CONFIG
    assert ModelSizes().config(15001, 15001) == ModelConfig(src_vocab_size=15001, tgt_vocab_size=15001)


def test_one_default_per_setting_the_configs_and_the_command_line_agree() -> None:
    """``rescorer train``'s defaults are the configs' (``--valid-every`` was 500 there and 1000 in TrainConfig)."""
    from rescorer.cli import train_command

    defaults = {p.name: p.default for p in train_command.params}
    train, sizes = TrainConfig(), ModelSizes()
    assert (defaults["valid_every"], defaults["patience"], defaults["batch_size"], defaults["seed"]) == (
        train.valid_every, train.patience, train.batch_size, train.seed)
    assert [defaults[name] for name in ("hidden", "embedding", "maxout_units", "output_rank", "init_std")] == [
        sizes.hidden, sizes.embedding, sizes.maxout_units, sizes.output_rank, sizes.init_std]


@pytest.mark.parametrize(("steps", "seconds", "valid_every", "max_time"), [
    (100, None, 50, None),  # a quarter would be 25: never more often than every 50 updates
    (1000, None, 250, None),  # a quarter of the budget
    (10_000, None, 500, None),  # never less often than rescorer train's default
    (None, 60.0, 125, 60.0),  # a time budget: every 125 updates
    (None, None, 125, DEFAULT_TRAIN_TIME),  # no budget given: 1800 s
])
def test_the_budgeted_training_of_rescore_validates_about_four_times(steps, seconds, valid_every, max_time) -> None:
    config = TrainConfig.for_budget(max_steps=steps, max_time=seconds, seed=7, train_step="eager")
    assert (config.valid_every, config.max_steps, config.max_time) == (valid_every, steps, max_time)
    assert config.patience is None and config.seed == 7 and config.train_step == "eager"


def test_from_dict_rejects_unknown_and_missing_keys() -> None:
    with pytest.raises(ValueError, match="unknown ModelConfig key.*hiden"):
        ModelConfig.from_dict({**CONFIG.to_dict(), "hiden": 5})
    with pytest.raises(ValueError, match="missing ModelConfig key.*tgt_vocab_size"):
        ModelConfig.from_dict({"src_vocab_size": 3})
    with pytest.raises(ValueError, match="unknown TrainConfig key"):
        TrainConfig.from_dict({"lr": 1.0})
    with pytest.raises(ValueError, match="hidden"):
        ModelConfig(src_vocab_size=3, tgt_vocab_size=3, hidden=0)
    with pytest.raises(ValueError, match="rho"):
        TrainConfig(rho=1.5)


@pytest.mark.slow
def test_loading_a_model_file_initialises_nothing_and_loads_no_compiler(tmp_path: Path) -> None:
    """A command's start-up is import + load: building the layers on the meta device must neither
    run the random init nor import torch._dynamo (2.5 s of a 2.7 s start-up when it did), for the
    RNN checkpoint and the CSLM file alike."""
    import subprocess
    import sys

    from cslm.model import CSLM, CSLMConfig
    from cslm.model_file import save_cslm

    config = ModelConfig(src_vocab_size=5, tgt_vocab_size=5, hidden=8, embedding=4, maxout_units=4, output_rank=3)
    vocab = Vocab([EOS, UNK, "a", "b", "c"])
    save_checkpoint(tmp_path / "rnn.pt", model=RNNEncoderDecoder(config), config=config, src_vocab=vocab,
                    tgt_vocab=vocab)
    cslm_config = CSLMConfig(vocab_size=5, embedding=4, hidden=[8])
    save_cslm(tmp_path / "cslm.pt", model=CSLM(cslm_config), vocab=vocab)
    script = (
        "import sys, torch\n"
        "from rescorer.model.checkpoint import load_checkpoint\n"
        "from cslm.model_file import load_cslm\n"
        "torch.manual_seed(7); before = torch.rand(1)\n"
        "torch.manual_seed(7); load_checkpoint(sys.argv[1]); load_cslm(sys.argv[2])\n"
        "assert torch.equal(torch.rand(1), before), 'the load drew random numbers (an init ran)'\n"
        "assert 'torch._dynamo' not in sys.modules, 'the load imported torch._dynamo'\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "rnn.pt"), str(tmp_path / "cslm.pt")], check=True)
