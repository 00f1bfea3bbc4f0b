"""``rescore-phrase-table``'s value rules, stated once (``rescorer.pipeline.option_rules``): a bad value
given to the library entry point, :func:`rescore`, is refused in the one line the command line prints
for it, before the models are loaded or the table read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from neural.vocab import EOS, UNK, Vocab
from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import Checkpoint, save_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.scoring import ScoringOptions
from rescorer.pipeline.train_or_load import Models

WORDS = ["la", "maison", "the", "house"]


@pytest.fixture(scope="module")
def checkpoint() -> Checkpoint:
    vocab = Vocab([EOS, UNK, *WORDS])
    config = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), hidden=8, embedding=4,
                         maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    return Checkpoint(RNNEncoderDecoder(config).eval(), config, vocab, vocab)


@pytest.fixture
def table(tmp_path: Path) -> Path:
    path = tmp_path / "pt.txt"
    path.write_text("la maison ||| the house ||| 0.5 0.5 0.5 0.5\nla ||| the ||| 0.5 0.5 0.5 0.5\n")
    return path


@pytest.fixture
def no_work(monkeypatch) -> None:
    def started(*_a, **_k):
        raise AssertionError("work started before the bad value was refused")

    monkeypatch.setattr("rescorer.pipeline.train_or_load.Models.load", started)
    monkeypatch.setattr("rescorer.pipeline.reader.iter_line_chunks", started)


def library_refusal(table: Path, checkpoint: Checkpoint, **options) -> str:
    """The one line :func:`rescore` refuses ``options`` with; nothing may be written beside the table."""
    before = sorted(table.parent.iterdir())
    options.setdefault("workers", 0)
    with pytest.raises(RescoreError) as refused:
        rescore(str(table), str(table.parent / "out.gz"), Models(checkpoint),
                RescoreOptions(progress=False, device="cpu", **options))
    assert sorted(table.parent.iterdir()) == before
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("options, args", [
    ({"chunk_lines": 0}, ["--chunk-lines", "0"]),
    ({"chunk_lines": 10_000_001}, ["--chunk-lines", "10000001"]),
    ({"workers": -1}, ["-j", "-1"]),
    ({"compress_level": 10}, ["--compress-level", "10"]),
    ({"scoring": ScoringOptions(token_budget=0)}, ["--token-budget", "0"]),
    ({"scoring": ScoringOptions(token_budget=1 << 25)}, ["--token-budget", str(1 << 25)]),
])
def test_the_library_refuses_a_bad_value_in_the_line_the_command_prints(table, checkpoint, no_work, tmp_path,
                                                                        options, args) -> None:
    message = library_refusal(table, checkpoint, **options)
    model = tmp_path / "model" / "tiny.pt"
    model.parent.mkdir()
    save_checkpoint(model, model=checkpoint.model, config=checkpoint.config, src_vocab=checkpoint.src_vocab,
                    tgt_vocab=checkpoint.tgt_vocab)
    res = CliRunner().invoke(rescore_phrase_table_command, [
        str(table), str(tmp_path / "out.gz"), "--model", str(model), "-q", "-j", "0", "--device", "cpu", *args])
    assert res.exit_code == 1 and res.output == f"Error: {message}\n", (res.output, message)
    assert args[0] in message


@pytest.mark.parametrize("options, words", [
    ({"chunk_lines": True}, "'--chunk-lines': True is not a whole number."),
    ({"chunk_lines": 2.5}, "'--chunk-lines': 2.5 is not a whole number."),
    ({"workers": "4"}, "'-j' / '--workers': '4' is not a whole number."),
    ({"workers": 2000}, "'-j' / '--workers': 2000 is not in the range 0<=x<=1024."),
    ({"compress_level": -1}, "'--compress-level': -1 is not in the range 0<=x<=9."),
])
def test_the_library_refuses_what_the_command_line_cannot_spell(table, checkpoint, no_work, options,
                                                               words) -> None:
    assert library_refusal(table, checkpoint, **options).endswith(words)


def test_a_side_the_unknown_word_column_lacks_is_refused_as_the_command_line_does(table, checkpoint, no_work,
                                                                                  tmp_path) -> None:
    message = library_refusal(table, checkpoint, wp_side="left")
    assert message == "Invalid value for '--wp-side': 'left' is not one of 'target', 'source', 'both'."
    res = CliRunner().invoke(rescore_phrase_table_command, [str(table), str(tmp_path / "out.gz"), "--wp-side", "left"])
    assert res.exit_code != 0 and res.output.startswith(f"Error: {message[:-1]}"), res.output


def test_propose_refuses_while_parsing_a_budget_its_rescoring_would_refuse_after_the_search(table, checkpoint,
                                                                                          tmp_path) -> None:
    """``rescorer propose`` ends with the rescoring pipeline: its ``-j`` and ``--token-budget`` follow the
    same rules, so a value that pipeline refuses is refused before the search, not after it."""
    from rescorer.cli import main

    model = tmp_path / "tiny.pt"
    save_checkpoint(model, model=checkpoint.model, config=checkpoint.config, src_vocab=checkpoint.src_vocab,
                    tgt_vocab=checkpoint.tgt_vocab)
    before = sorted(tmp_path.iterdir())
    res = CliRunner().invoke(main, ["propose", str(table), str(tmp_path / "out.gz"), "--model", str(model),
                                    "--token-budget", str(1 << 25)])
    assert res.exit_code == 1
    assert res.output == f"Error: Invalid value for '--token-budget': {1 << 25} is not in the range 1<=x<={1 << 24}.\n"
    assert sorted(tmp_path.iterdir()) == before
