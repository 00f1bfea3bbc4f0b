"""``rescore-phrase-table --cslm``: the CSLM as Moses' in-decoder NeuralLM feature in the written moses.ini.

End to end through the real command on the built-in sample (``examples/``) with a tiny model, so
each case runs in seconds. What matters to a Moses user: the order Moses is given is the model
file's own (Moses refuses another only after loading everything), the path works from any
directory, and a broken model file or a clashing name stops the run before any training or
scoring, leaving nothing behind.
"""

from __future__ import annotations

import gzip
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from moses_integration.moses_ini import MosesIni
from moses_integration.nplm import NPLMConfig, NPLMModel, write_nplm
from neural.vocab import Vocab
from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import save_checkpoint
from rescorer.model.config import ModelConfig
from rescorer.model.network import RNNEncoderDecoder
from rescorer.pipeline.moses_config import check_moses_ini, write_moses_ini
from shared_paths import REPO_ROOT

TABLE = REPO_ROOT / "examples" / "phrase-table.en-fr.gz"
INI = REPO_ROOT / "examples" / "moses.ini"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    """A tiny RNN Encoder–Decoder over the sample table's words (no foreign-vocabulary warning)."""
    src, tgt = Counter(), Counter()
    for line in gzip.decompress(TABLE.read_bytes()).decode("utf-8").splitlines():
        fields = line.split(" ||| ")
        src.update(fields[0].split())
        tgt.update(fields[1].split())
    src_vocab, tgt_vocab = Vocab.from_counts(src, shortlist=200), Vocab.from_counts(tgt, shortlist=200)
    config = ModelConfig(src_vocab_size=len(src_vocab.words), tgt_vocab_size=len(tgt_vocab.words), hidden=8,
                         embedding=4, maxout_units=4, output_rank=4)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "tiny.pt"
    save_checkpoint(path, model=RNNEncoderDecoder(config).eval(), config=config, src_vocab=src_vocab,
                    tgt_vocab=tgt_vocab)
    return path


def tiny_nplm(path: Path, ngram_size: int = 3) -> Path:
    """A valid NPLM model file: 6 words, embedding 2, 3 hidden units, output embedding 2."""
    vocab = ["<unk>", "<s>", "</s>", "<null>", "la", "maison"]
    config = NPLMConfig(ngram_size=ngram_size, input_vocab_size=6, output_vocab_size=6, input_embedding_dimension=2,
                        num_hidden=3, output_embedding_dimension=2)
    rng = np.random.default_rng(0)
    matrices = {name: rng.normal(size=shape).astype(np.float32) for name, shape in config.shapes().items()}
    write_nplm(path, NPLMModel(config, vocab, matrices))
    return path


def cli(*args: str):
    return CliRunner().invoke(rescore_phrase_table_command, [*args, "-q", "-j", "0", "--device", "cpu"])


def feature_and_weight(ini_path: Path, name: str) -> tuple[str, str]:
    lines = ini_path.read_text(encoding="utf-8").splitlines()
    feature = next(line for line in lines if f" name={name} " in line)
    weight = next(line for line in lines if line.startswith(f"{name}="))
    return feature, weight


def test_written_ini_gets_the_neural_lm_with_the_files_order_and_an_absolute_path(
        tmp_path: Path, model_file: Path, monkeypatch) -> None:
    tiny_nplm(tmp_path / "cslm.nplm", ngram_size=4)
    monkeypatch.chdir(tmp_path)  # --cslm given relative: Moses runs elsewhere, so it must be written absolute
    res = cli(str(TABLE), "out.gz", "--model", str(model_file), "--moses-ini", str(INI), "--moses-ini-out",
              "new.ini", "--cslm", "cslm.nplm", "--cslm-weight", "0.25")
    assert res.exit_code == 0, res.output
    assert "NeuralLM CSLM0 (order 4)" in res.output
    feature, weight = feature_and_weight(tmp_path / "new.ini", "CSLM0")
    assert feature == f"NeuralLM factor=0 name=CSLM0 order=4 path={tmp_path / 'cslm.nplm'}"
    assert weight == "CSLM0= 0.25"
    ini = MosesIni.read(tmp_path / "new.ini")
    # the phrase-table edit is unchanged, and the NeuralLM is the last feature
    assert ini.phrase_tables()[0].num_features == 6 and ini.phrase_tables()[0].path == str(tmp_path / "out.gz")
    assert ini.feature_lines()[-1].name == "CSLM0"
    # everything else of the original ini is kept: exactly two more lines
    assert len(ini.text().splitlines()) == len(INI.read_text(encoding="utf-8").splitlines()) + 2


def test_name_and_default_weight(tmp_path: Path, model_file: Path) -> None:
    nplm = tiny_nplm(tmp_path / "cslm.nplm")
    res = cli(str(TABLE), str(tmp_path / "out.gz"), "--model", str(model_file), "--moses-ini", str(INI),
              "--moses-ini-out", str(tmp_path / "new.ini"), "--cslm", str(nplm), "--cslm-name", "NPLM1")
    assert res.exit_code == 0, res.output
    feature, weight = feature_and_weight(tmp_path / "new.ini", "NPLM1")
    assert feature == f"NeuralLM factor=0 name=NPLM1 order=3 path={nplm}"
    assert weight == "NPLM1= 0"  # 0: the untuned system decodes exactly as the original one


@pytest.mark.parametrize(
    "content, message",
    [
        ("hello\n", r"cslm.nplm:1: expected a section header"),
        (None, r"cslm.nplm: no \\end line: the file is incomplete"),  # a truncated export
    ],
)
def test_broken_model_file_fails_before_training_and_leaves_nothing(tmp_path: Path, content: str | None,
                                                                   message: str) -> None:
    nplm = tmp_path / "cslm.nplm"
    if content is None:
        tiny_nplm(nplm)
        nplm.write_text("".join(nplm.read_text().splitlines(keepends=True)[:20]))
    else:
        nplm.write_text(content)
    res = cli(str(TABLE), str(tmp_path / "out.gz"), "--moses-ini", str(INI), "--moses-ini-out",
              str(tmp_path / "new.ini"), "--cslm", str(nplm), "--train-steps", "5")
    assert res.exit_code == 1
    assert len(res.output.strip().splitlines()) == 1 and res.output.startswith("Error: ")
    assert re.search(message, res.output), res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cslm.nplm"]  # no model, no table, no ini


def test_missing_model_file_is_one_line_as_a_missing_table_is(tmp_path: Path, model_file: Path) -> None:
    res = cli(str(TABLE), str(tmp_path / "out.gz"), "--model", str(model_file), "--moses-ini", str(INI),
              "--moses-ini-out", str(tmp_path / "new.ini"), "--cslm", str(tmp_path / "none.nplm"))
    assert res.exit_code == 1 and "none.nplm" in res.output and "does not exist" in res.output
    assert len(res.output.strip().splitlines()) == 1  # no usage screen
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "name, message",
    [
        ("Distortion0", "feature name 'Distortion0' is already used by this Distortion"),
        ("TranslationModel0", "is already used by this PhraseDictionaryMemory"),
        ("CSLM_0", "contains '_', which Moses' extractor reads as a sparse feature"),
    ],
)
def test_unusable_name_is_refused_before_scoring(tmp_path: Path, model_file: Path, name: str, message: str) -> None:
    nplm = tiny_nplm(tmp_path / "cslm.nplm")
    res = cli(str(TABLE), str(tmp_path / "out.gz"), "--model", str(model_file), "--moses-ini", str(INI),
              "--moses-ini-out", str(tmp_path / "new.ini"), "--cslm", str(nplm), "--cslm-name", name)
    assert res.exit_code == 1 and message in res.output, res.output
    assert str(INI) in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cslm.nplm"]


def test_cslm_needs_an_ini_to_edit(tmp_path: Path, model_file: Path) -> None:
    nplm = tiny_nplm(tmp_path / "cslm.nplm")
    res = cli(str(TABLE), str(tmp_path / "out.gz"), "--model", str(model_file), "--cslm", str(nplm))
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "--cslm adds a feature to the written moses.ini" in res.output
    assert not (tmp_path / "out.gz").exists()


def test_library_check_and_write_agree(tmp_path: Path) -> None:
    """The check is a dry run of the edit: what it accepts, the write makes; what it refuses, it names."""
    nplm = tiny_nplm(tmp_path / "cslm.nplm", ngram_size=5)
    out_table = tmp_path / "out.gz"
    assert check_moses_ini(str(INI), str(TABLE), str(out_table), cslm=str(nplm), cslm_weight=0.5) == 4
    with pytest.raises(ValueError, match="not finite"):
        check_moses_ini(str(INI), str(TABLE), str(out_table), cslm=str(nplm), cslm_weight=float("inf"))
    added = write_moses_ini(str(INI), str(tmp_path / "new.ini"), str(out_table), (0.0, 0.0), cslm=str(nplm),
                            cslm_weight=0.5)
    assert added is not None and added.args["order"] == "5" and added.path == str(nplm.resolve())
    assert MosesIni.read(tmp_path / "new.ini").weights()["CSLM0"] == [0.5]
    assert write_moses_ini(str(INI), str(tmp_path / "plain.ini"), str(out_table), (0.0, 0.0)) is None
    assert "NeuralLM" not in (tmp_path / "plain.ini").read_text()
