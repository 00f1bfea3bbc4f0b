"""``rescore-phrase-table --reverse-model``: p_RNN(f|e) as one more column, on the real fixture sample.

What a Moses user would notice: the column is the reverse model's own probability of the swapped
pair, the forward columns are unchanged, the output is byte-identical whatever the workers, shards or
interruption, a model of the wrong direction is refused before any work, and the moses.ini gets one
more feature.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from rescore_runs import (
    RESCORE_SCRIPT,
    SAMPLE_TABLE,
    SMALL,
    assert_ran,
    assert_same_output,
    lines_of,
    rescore,
    run_command,
    shard_outputs,
    sigkill_after_chunks,
    train_small,
)

from rescorer.cli import rescore_phrase_table_command
from rescorer.model.checkpoint import load_checkpoint
from rescorer.pipeline import rescore as pipeline
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.rescore import RescoreOptions
from rescorer.pipeline.scoring import ScoringOptions
from rescorer.pipeline.train_or_load import Models
from shared_paths import shared_file

LINES = 5166


@pytest.fixture(scope="module")
def sample() -> Path:
    return shared_file(SAMPLE_TABLE)


@pytest.fixture(scope="module")
def models(sample, sample_model, tmp_path_factory) -> tuple[Path, Path]:
    return sample_model, train_small(sample, tmp_path_factory.mktemp("models") / "rev.pt", "reverse")


def rescore_both(inp: Path, out: Path, models: tuple[Path, Path], **kw: object) -> None:
    rescore(inp, out, load_checkpoint(models[0]), load_checkpoint(models[1]), **kw)


def last_columns(path: Path, n: int) -> np.ndarray:
    return np.array([[float(x) for x in line.split(b" ||| ")[2].split()[-n:]] for line in lines_of(path)])


@pytest.fixture(scope="module")
def both(sample, models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("both") / "out.gz"
    rescore_both(sample, out, models, chunk_lines=1000)
    return out


def test_reverse_column_is_the_reverse_models_probability_of_the_swapped_pair(sample, models, both, tmp_path):
    forward_only = tmp_path / "fwd.gz"
    rescore(sample, forward_only, load_checkpoint(models[0]), chunk_lines=1000)
    before, one, two = lines_of(sample), lines_of(forward_only), lines_of(both)
    assert len(before) == len(two) == LINES
    rev = load_checkpoint(models[1])
    model, sv, tv = rev.model, rev.src_vocab, rev.tgt_vocab
    for i, (a, b) in enumerate(zip(one, two, strict=True)):
        fa, fb = a.split(b" ||| "), b.split(b" ||| ")
        # the forward columns and every other field are those of the run without a reverse model
        assert fb[:2] == fa[:2] and fb[3:] == fa[3:] and fb[2].rsplit(b" ", 1)[0] == fa[2], i
    for i in np.random.default_rng(0).choice(LINES, 30, replace=False):
        src, tgt, scores = two[i].decode().split(" ||| ")[:3]
        # the reverse model reads the target and scores the source
        s = torch.tensor([[*sv.encode(tgt.split()), 0]])
        t = torch.tensor([[*tv.encode(src.split()), 0]])
        with torch.no_grad():
            logp = model(s, torch.tensor([s.shape[1]]), t, torch.tensor([t.shape[1]])).item()
        assert math.log(float(scores.split()[-1])) == pytest.approx(max(logp, -100), abs=1e-4)


def test_reverse_column_does_not_depend_on_batching_workers_or_shards(sample, models, both, tmp_path):
    ref = last_columns(both, 3)
    out = tmp_path / "o.gz"
    rescore_both(sample, out, models, token_budget=64, chunk_lines=777)
    assert np.abs(np.log(last_columns(out, 3)) - np.log(ref)).max() < 1e-4
    rescore_both(sample, out, models, chunk_lines=1000, workers=2)
    assert_same_output(out, both)
    whole, parts = shard_outputs(
        lambda out, shard: rescore_both(sample, out, models, chunk_lines=200, token_budget=256, shard=shard), tmp_path)
    assert_same_output(b"".join(part.read_bytes() for part in parts), whole)


def test_scores_parquet_holds_the_reverse_log_probability(sample, models, both, tmp_path):
    import pyarrow.parquet as pq

    parquet = tmp_path / "scores.parquet"
    rescore_both(sample, tmp_path / "o.gz", models, chunk_lines=1000, scores_parquet=str(parquet))
    table = pq.read_table(parquet)
    written = np.log(last_columns(both, 1)[:, 0])
    assert np.abs(np.maximum(table.column("reverse_log_p").to_numpy(), -100) - written).max() < 1e-4


def test_resume_after_sigkill_is_byte_identical_and_keeps_the_reverse_model(sample, models, both, tmp_path):
    """Only the killed run needs a process of its own; the resumes run in this process. The options
    are those of :func:`both`, whose output is the uninterrupted run's."""
    out = tmp_path / "out.gz"
    progress = tmp_path / ".out.gz.progress.json"
    forward = ["--model", str(models[0])]
    options = ["--chunk-lines", "1000", "-j", "0", "--token-budget", "4096", "--device", "cpu", "--quiet"]
    both_models = [*forward, "--reverse-model", str(models[1]), *options]
    sigkill_after_chunks([RESCORE_SCRIPT, str(sample), str(out), *both_models], progress)  # 2 of 6 chunks
    # continuing without the reverse model would splice lines of two layouts: refused
    without = run_command([str(sample), str(out), *forward, *options, "--resume"])
    assert without.exit_code != 0 and without.stderr.startswith("Error:"), without.output
    assert_ran(run_command([str(sample), str(out), *both_models, "--resume"]))
    assert_same_output(out, both)


def test_a_model_of_the_wrong_direction_is_refused_before_any_work(sample, models, tmp_path):
    fwd, rev = (str(m) for m in models)
    out = tmp_path / "o.gz"
    base = [str(sample), str(out), "--quiet", "-j", "0", "--device", "cpu"]
    res = CliRunner().invoke(rescore_phrase_table_command, [*base, "--model", rev])
    assert res.exit_code == 1
    assert res.output == (f"Error: {rev}: a reverse model (it scores p(f|e), from rescorer train --reverse): "
                          "give it to --reverse-model, not --model\n")
    # without --model a forward model would be trained first: the wrong --reverse-model stops that too
    res = CliRunner().invoke(rescore_phrase_table_command, [*base, "--reverse-model", fwd, "--train-steps", "5"])
    assert res.exit_code == 1
    assert res.output == (f"Error: {fwd}: a forward model (it scores p(e|f)): --reverse-model needs one trained "
                          "with rescorer train --reverse\n")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RescoreError, match="a reverse model"):
        rescore_both(sample, out, (models[1], models[1]))


def test_moses_ini_gets_a_feature_and_a_weight_for_the_reverse_column(sample, models, tmp_path):
    ini = shared_file("fixtures/hansard-enfr/filtered/moses.ini")
    out_ini = tmp_path / "moses.ini"
    res = CliRunner().invoke(rescore_phrase_table_command, [
        str(sample), str(tmp_path / "o.gz"), "--model", str(models[0]), "--reverse-model", str(models[1]),
        "--moses-ini", str(ini), "--moses-ini-out", str(out_ini), "--reverse-weight", "0.05", "--quiet", "-j", "0",
        "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "3 more features" in res.output
    text = out_ini.read_text()
    feature = next(line for line in text.splitlines() if line.startswith("PhraseDictionaryMemory"))
    assert "num-features=7" in feature
    weights = next(line for line in text.splitlines() if line.startswith("TranslationModel0="))
    assert weights.split()[1:] == ["0.2"] * 4 + ["0", "0", "0.05"]
    assert all(len(line.split(b" ||| ")[2].split()) == 7 for line in lines_of(tmp_path / "o.gz"))


def test_a_reverse_weight_without_a_reverse_model_is_refused_not_dropped(sample, tmp_path):
    res = CliRunner().invoke(rescore_phrase_table_command, [
        str(sample), str(tmp_path / "o.gz"), "--model", str(sample), "--moses-ini",
        str(shared_file("fixtures/hansard-enfr/filtered/moses.ini")), "--moses-ini-out", str(tmp_path / "moses.ini"),
        "--reverse-weight", "0.05"])
    assert res.exit_code == 1 and res.output.count("\n") == 1
    assert res.output.startswith("Error: --reverse-weight weighs the --reverse-model column, p_RNN(source|target), "
                                 "which this run does not append; see ")
    assert list(tmp_path.iterdir()) == []


def test_a_reverse_model_of_other_languages_is_warned_about(sample, models, tmp_path):
    """The forward model knows the table's words; a reverse model whose shortlists hold none of them
    gets the low-overlap warning too, naming it."""
    from neural.vocab import EOS, UNK, Vocab
    from rescorer.model.checkpoint import Checkpoint
    from rescorer.model.network import RNNEncoderDecoder

    config = replace(SMALL, direction="reverse").config(3, 3)
    foreign = Vocab([EOS, UNK, "wort"])
    reverse = Checkpoint(RNNEncoderDecoder(config).eval(), config, foreign, foreign)
    opts = RescoreOptions(progress=False, device="cpu", workers=0, scoring=ScoringOptions(token_budget=4096))
    with pytest.warns(UserWarning, match=r"0\.0% of source words and 0\.0% of target words in the first chunk are "
                      r"in the reverse model's shortlists"):
        pipeline.rescore(str(sample), str(tmp_path / "o.gz"), Models(load_checkpoint(models[0]), reverse), opts)
