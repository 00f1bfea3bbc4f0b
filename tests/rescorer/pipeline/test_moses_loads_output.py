"""The rescored table and the edited moses.ini load and decode in the real Moses decoder.

A mismatch between num-features, the table's columns and the weights is the most common way a
Moses run fails, and Moses reads a negative score as NaN without complaint (SPEC §6), so only the
real decoder is a convincing check. Skipped unless MOSES_BIN_DIR is set.
"""

from __future__ import annotations

import gzip

import pytest

from moses_integration.decoder import decode
from moses_integration.nbest import read_nbest
from rescorer.model.checkpoint import load_checkpoint
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.pipeline.moses_config import write_moses_ini
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.train_or_load import Models
from rescorer.training.train import train_on_phrase_table
from shared_paths import moses_bin_dir
from small_system import small_system

pytestmark = [pytest.mark.slow, pytest.mark.moses]


@pytest.mark.parametrize("with_bad_line", [False, True])
def test_moses_decodes_with_the_rescored_table(tmp_path, with_bad_line):
    bindir = moses_bin_dir()
    system = small_system(tmp_path)
    table, sentences = system.table, system.sentences

    model = tmp_path / "model.pt"
    config = ModelSizes(hidden=32, embedding=16, maxout_units=16, output_rank=16)
    train_on_phrase_table(str(table), model, model_sizes=config,
                          train_config=TrainConfig(max_steps=10, valid_every=10, patience=None),
                          device="cpu", progress=False)
    if with_bad_line:  # one non-numeric score: with --skip-bad-lines Moses must still load the output
        lines = gzip.decompress(table.read_bytes()).splitlines()
        fields = lines[len(lines) // 2].split(b" ||| ")
        fields[2] = b"x" + fields[2]  # first score "x0.5..." is not a number
        lines.insert(len(lines) // 2, b" ||| ".join(fields))
        table.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    out = tmp_path / "phrase-table.rnn.gz"
    options = RescoreOptions(progress=False, device="cpu", workers=0, skip_bad_lines=with_bad_line)
    summary = rescore(str(table), str(out), Models(load_checkpoint(model)), options)
    assert summary.rejected == int(with_bad_line)
    write_moses_ini(str(tmp_path / "moses.ini"), str(tmp_path / "moses.rnn.ini"), str(out), (0.2, 0.2))

    source = tmp_path / "dev.en"
    source.write_text("\n".join(sentences) + "\n")
    result = decode(bindir, tmp_path / "moses.rnn.ini", source, tmp_path / "dev.out",
                    nbest_path=tmp_path / "dev.nbest", nbest_size=5, cwd=tmp_path)
    assert len(result.output.read_text().splitlines()) == 2
    entries = list(read_nbest(tmp_path / "dev.nbest"))
    tm = [dict(e.features)["TranslationModel0"] for e in entries]
    assert all(len(v) == 6 for v in tm)
    # Moses reads our columns back as log p_RNN (< 0, ≥ −100 per phrase) and −n_unk (≤ 0).
    assert all(v[4] < 0 and v[5] <= 0 for v in tm)
