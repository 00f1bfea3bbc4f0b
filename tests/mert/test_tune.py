"""The tuning loop (``mert tune``): with the fake decoder of :mod:`fake_moses` (the real loop around a
tiny fixed search space), and with the real Moses when available."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fake_moses import FIXTURE, SENTENCES, TOP_K, fake_dev, quiet, tune_options
from held_output import held_by_another_process
from mert.cli import main
from mert.features import read_sidecar
from mert.tune import (
    LOG_FILE,
    STATE_FILE,
    STOP_CONVERGED,
    STOP_MAX,
    STOP_NO_NEW,
    TuneError,
    TuneOptions,
    tune,
)
from moses_integration.decoder import DecoderError
from moses_integration.moses_ini import MosesIni
from moses_integration.nbest import load_nbest_arrays, read_nbest
from shared_paths import moses_bin_dir, shared_file


@pytest.fixture
def dev(tmp_path: Path) -> dict[str, Path]:
    """A small dev set (source, reference, hypothesis pool) and a fake moses bin dir."""
    return fake_dev(tmp_path)


def _weight_shape(ini: Path) -> dict[str, int]:
    return {name: len(values) for name, values in MosesIni.read(ini).weights().items()}


def test_loop_keeps_every_iteration_and_writes_a_tuned_ini(dev: dict[str, Path], tmp_path: Path) -> None:
    work = tmp_path / "work"
    messages: list[str] = []
    result = tune(tune_options(dev, work, max_iterations=6, output_ini=tmp_path / "out/tuned.ini"), log=messages.append)
    n = len(result.iterations)
    assert n >= 2 and result.stop_reason in {STOP_CONVERGED, STOP_NO_NEW, STOP_MAX}
    for i in range(1, n + 1):
        for suffix in ("moses.ini", "out", "nbest.gz"):
            assert (work / f"run{i}.{suffix}").is_file()
        # each kept list is a complete, valid Moses n-best list of the dev set
        assert load_nbest_arrays(work / f"run{i}.nbest.gz", expected_sentences=SENTENCES).features.shape[1] == 14
    assert not list(work.glob("run*.nbest")) and not list(work.glob(".*tmp"))
    rows = (work / LOG_FILE).read_text().splitlines()
    assert rows[0].startswith("iteration\tdecode_seconds") and len(rows) == n + 1
    merged = [r.merged_hypotheses for r in result.iterations]
    assert merged == sorted(merged) and merged[0] == SENTENCES * TOP_K
    assert sum(r.new_hypotheses for r in result.iterations) == merged[-1]
    first = result.iterations[0]
    assert first.optimised_bleu is not None and first.optimised_bleu > first.dev_bleu_1best
    # Progress: one line per iteration with the numbers a user watches.
    assert sum(m.startswith("iteration ") for m in messages) == n
    assert "dev BLEU of the 1-best" in messages[0] and "optimised BLEU" in messages[0]
    # The tuned config: same features and weight counts, the final weights, absolute model paths.
    for ini in (work / "moses.ini", tmp_path / "out/tuned.ini"):
        assert _weight_shape(ini) == _weight_shape(dev["ini"])
        tuned = MosesIni.read(ini)
        assert tuned.weights() == result.weights
        assert all(os.path.isabs(f.path) for f in tuned.feature_lines() if f.path)
        assert not Path(f"{ini}.extra-features").exists()
    assert result.weights["UnknownWordPenalty0"] == [1.0]  # untuneable: kept as it was
    tuneable = np.concatenate([v for k, v in result.weights.items() if k != "UnknownWordPenalty0"])
    if result.iterations[-1].optimised_bleu is not None:
        assert np.abs(tuneable).sum() == pytest.approx(1.0)  # L1-normalised, as Moses' mert
    state = json.loads((work / STATE_FILE).read_text())
    assert state["completed_iterations"] == n and state["stop_reason"] == result.stop_reason


def test_the_first_decode_uses_the_start_weights_l1_normalised(dev: dict[str, Path], tmp_path: Path) -> None:
    """As mert-moses.pl: tuneable weights over their L1 norm, UnknownWordPenalty0 as it was."""
    start = MosesIni.read(dev["ini"]).weights()
    norm = sum(abs(v) for name, values in start.items() if name != "UnknownWordPenalty0" for v in values)
    assert norm > 1.5, "the fixture's start weights must be far from normalised for this test"
    tune(tune_options(dev, tmp_path / "w1", max_iterations=1), log=quiet)
    first = MosesIni.read(tmp_path / "w1/run1.moses.ini").weights()
    assert first.keys() == start.keys() and first["UnknownWordPenalty0"] == start["UnknownWordPenalty0"]
    for name, values in start.items():
        if name != "UnknownWordPenalty0":
            assert first[name] == pytest.approx([v / norm for v in values], abs=1e-6), name
    # A feature held at a non-zero value keeps its meaning: nothing is rescaled (Moses' rule).
    tune(tune_options(dev, tmp_path / "w2", max_iterations=1, fixed=["LM0"]), log=quiet)
    assert MosesIni.read(tmp_path / "w2/run1.moses.ini").weights() == start
    with pytest.raises(TuneError, match="--fixed NoSuch: no such feature"):
        tune(tune_options(dev, tmp_path / "w3", fixed=["NoSuch"]), log=quiet)
    assert not (tmp_path / "w3/run1.out").exists()


def test_same_list_twice_stops_with_no_new_hypotheses(
    dev: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MOSES_STATIC", "1")
    result = tune(tune_options(dev, tmp_path / "work", max_iterations=5), log=quiet)
    assert result.stop_reason == STOP_NO_NEW
    assert [r.new_hypotheses for r in result.iterations] == [SENTENCES * TOP_K, 0]
    second = result.iterations[1]
    assert second.optimised_bleu is None and second.weights == result.iterations[0].weights
    assert MosesIni.read(tmp_path / "work/moses.ini").weights() == result.iterations[0].weights


def test_continue_after_a_crash_gives_the_uninterrupted_result(dev: dict[str, Path], tmp_path: Path) -> None:
    full = tune(tune_options(dev, tmp_path / "full", max_iterations=4, min_weight_change=0.0), log=quiet)
    assert len(full.iterations) >= 3, "the fake must keep producing new hypotheses for this test"
    work = tmp_path / "crashed"
    tune(tune_options(dev, work, max_iterations=2, min_weight_change=0.0), log=quiet)
    # A crash in iteration 3 leaves partial files and no state update; they must be redone.
    (work / "run3.nbest.gz").write_bytes(b"partial garbage")
    (work / "run3.moses.ini").write_text("[weight]\n")
    with pytest.raises(TuneError, match="pass --resume to continue it"):
        tune(tune_options(dev, work, max_iterations=4, min_weight_change=0.0), log=quiet)
    with pytest.raises(TuneError, match=r"cannot --resume: .*tuning-state.json was made with --ref \[.*; resume with "
                                        r"the same options, or choose another --work-dir$"):
        tune(tune_options(dev, work, max_iterations=4, references=[dev["src"]], resume=True), log=quiet)
    messages: list[str] = []
    resumed = tune(tune_options(dev, work, max_iterations=4, min_weight_change=0.0, resume=True), log=messages.append)
    assert messages[0].startswith("resuming") and "after iteration 2" in messages[0]
    assert resumed.weights == full.weights  # exactly: seeds per iteration, weights stored exactly
    assert [r.optimised_bleu for r in resumed.iterations] == [r.optimised_bleu for r in full.iterations]
    assert MosesIni.read(work / "moses.ini").weights() == MosesIni.read(tmp_path / "full/moses.ini").weights()
    def log_rows(folder: Path) -> list[list[str]]:  # all but the timings
        rows = [line.split("\t") for line in (folder / LOG_FILE).read_text().splitlines()]
        return [r[:1] + r[2:7] + r[8:] for r in rows]

    assert log_rows(work) == log_rows(tmp_path / "full")
    # Continuing a finished run only rewrites the outputs.
    again = tune(tune_options(dev, work, max_iterations=4, min_weight_change=0.0, resume=True), log=quiet)
    assert again.weights == full.weights and len(again.iterations) == len(full.iterations)


def test_a_resume_with_another_option_that_changes_the_weights_is_refused_naming_it(dev: dict[str, Path],
                                                                                   tmp_path: Path) -> None:
    """Every option is in the state but those that may differ (threads, when to stop, where to write): a resume
    with another --seed, --restarts or --fixed once went on and mixed two tunings' iterations."""
    work = tmp_path / "work"
    tune(tune_options(dev, work, max_iterations=1), log=quiet)
    state = work / STATE_FILE
    for changed, named in [({"seed": 7}, "--seed 0, now 7"), ({"restarts": 6}, "--restarts 5, now 6"),
                           ({"decoder_flags": ["-distortion-limit", "6"]}, "--decoder-flags [], now ['-distortion-")]:
        with pytest.raises(TuneError, match=rf"^cannot --resume: {state} was made with {re.escape(named)}"):
            tune(tune_options(dev, work, max_iterations=2, resume=True, **changed), log=quiet)
    resumed = tune(tune_options(dev, work, max_iterations=2, threads=2, min_weight_change=0.0, resume=True),
                   log=quiet)
    assert len(resumed.iterations) == 2
    # A state written before every option was recorded holds a "fingerprint" of five: those are compared.
    doc = json.loads(state.read_text())
    old = doc.pop("options")
    doc["fingerprint"] = {"ini": old["ini"], "source": old["source"], "references": old["references"],
                          "features": old["feature_specs"], "nbest_size": old["nbest_size"], "seed": 0}
    state.write_text(json.dumps(doc))
    with pytest.raises(TuneError, match=r"was made with --nbest-size 100, now 50; resume with the same options"):
        tune(tune_options(dev, work, max_iterations=2, nbest_size=50, resume=True), log=quiet)
    assert len(tune(tune_options(dev, work, max_iterations=2, seed=7, resume=True), log=quiet).iterations) == 2


def test_a_resume_after_the_source_or_a_model_changed_in_place_is_refused_naming_it(dev: dict[str, Path],
                                                                                    tmp_path: Path) -> None:
    """The state recorded the files by path alone: a --src edited in place (its lines reordered) or a language
    model retrained in place was resumed in silence, and MERT merged lists decoded from two systems."""
    system = tmp_path / "system"
    system.mkdir()
    (system / "lm.fr.binary").write_bytes(b"the first LM")
    ini = system / "moses.ini"
    ini.write_text(dev["ini"].read_text(encoding="utf-8"), encoding="utf-8")
    source = tmp_path / "dev.en"
    source.write_bytes(dev["src"].read_bytes())
    work = tmp_path / "work"
    tune(tune_options(dev, work, ini=ini, source=source, max_iterations=1), log=quiet)
    assert len(tune(tune_options(dev, work, ini=ini, source=source, max_iterations=2, resume=True),
                    log=quiet).iterations) == 2
    lines = source.read_text(encoding="utf-8").splitlines()
    source.write_text("".join(f"{line}\n" for line in reversed(lines)), encoding="utf-8")
    with pytest.raises(TuneError, match=r"^cannot --resume: .*tuning-state.json was made with --src "):
        tune(tune_options(dev, work, ini=ini, source=source, max_iterations=3, resume=True), log=quiet)
    source.write_bytes(dev["src"].read_bytes())
    os.utime(source, ns=(0, json.loads((work / STATE_FILE).read_text())["inputs"]["--src"]["mtime_ns"]))
    (system / "lm.fr.binary").write_bytes(b"the new LM!!")  # the same size: retrained in place
    with pytest.raises(TuneError, match=r"was made with the model .*lm\.fr\.binary \(12 bytes, mtime \d+\), now "):
        tune(tune_options(dev, work, ini=ini, source=source, max_iterations=3, resume=True), log=quiet)


def test_extra_feature_is_tuned_and_its_weight_goes_to_the_sidecar(dev: dict[str, Path], tmp_path: Path) -> None:
    work = tmp_path / "work"
    # An ini written elsewhere whose relative model paths refer to the system folder (what
    # rescore-phrase-table --moses-ini-out gives): --decoder-cwd names that folder.
    copy = tmp_path / "elsewhere/moses.ini"
    copy.parent.mkdir()
    copy.write_text(dev["ini"].read_text())
    opts = tune_options(dev, work, ini=copy, decoder_cwd=dev["ini"].parent, max_iterations=3,
                    feature_specs=["LengthRatio:1.1"])
    result = tune(opts, log=quiet)
    lm = MosesIni.read(work / "run1.moses.ini").find_feature("LM0")
    assert lm is not None and lm.path == str(dev["ini"].parent.resolve() / "lm.fr.binary")
    entries = list(read_nbest(work / "run1.nbest.gz"))
    assert all(e.features[-1][0] == "LengthRatio" for e in entries)
    assert len(result.weights["LengthRatio"]) == 1
    extras = read_sidecar(work / "moses.ini")
    assert [(e.spec, e.name, e.weights) for e in extras] == [
        ("LengthRatio:1.1", "LengthRatio", tuple(result.weights["LengthRatio"]))
    ]
    tuned = MosesIni.read(work / "moses.ini").weights()
    assert "LengthRatio" not in tuned and _weight_shape(work / "moses.ini") == _weight_shape(dev["ini"])
    # Moses never sees the extra feature: the per-iteration configs have no weight for it.
    assert "LengthRatio" not in (work / "run2.moses.ini").read_text()


def test_bad_options_are_clear_errors(dev: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TuneError, match="already used"):
        tune(tune_options(dev, tmp_path / "w1", feature_specs=["mert.features:WordCount:LM0"]), log=quiet)
    with pytest.raises(ValueError, match="reference file ends after 11 lines"):
        short = tmp_path / "short.fr"
        short.write_text("".join(dev["ref"].read_text().splitlines(keepends=True)[:-1]))
        tune(tune_options(dev, tmp_path / "w2", references=[short]), log=quiet)
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)
    with pytest.raises(DecoderError, match="MOSES_BIN_DIR"):
        tune(tune_options(dev, tmp_path / "w3", moses_bin_dir=None), log=quiet)
    monkeypatch.setenv("FAKE_MOSES_FAIL", "1")
    with pytest.raises(DecoderError, match=r"(?s)moses failed \(exit 1\).*Size of scoreVector"):
        tune(tune_options(dev, tmp_path / "w4"), log=quiet)


@pytest.mark.parametrize("name", ["tuning-state.json", "tuning.tsv", "run1.nbest.gz", "run2.weights", "run12.out"])
def test_a_tuned_ini_written_over_a_file_the_tuning_keeps_is_refused_before_decoding(dev: dict[str, Path],
                                                                                    tmp_path: Path, name: str) -> None:
    """``--moses-ini-out WORK/run1.nbest.gz`` replaced that iteration's list with the tuned ini at the end (and
    WORK/tuning-state.json the state): the next --resume failed on it, its decodes lost."""
    work = tmp_path / "work"
    with pytest.raises(TuneError, match=rf"^--moses-ini-out .*{re.escape(name)} is a file the tuning keeps in "):
        tune(tune_options(dev, work, output_ini=tmp_path / "." / "work" / name), log=quiet)
    assert not (work / "run1.out").exists()


def test_cli_tune_prints_the_weights(dev: dict[str, Path], tmp_path: Path) -> None:
    args = ["tune", "--moses-ini", str(dev["ini"]), "--src", str(dev["src"]), "--ref", str(dev["ref"]),
            "--work-dir", str(tmp_path / "work"), "--moses-bin-dir", str(dev["bin"]), "--max-iterations", "2",
            "--restarts", "3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "LM0= " in result.output and "iteration(s), stopped:" in result.output
    again = CliRunner().invoke(main, args)  # the work dir is taken: refuse, point to --resume
    assert again.exit_code == 1 and "--resume" in again.output


@pytest.mark.slow
@pytest.mark.moses
def test_real_moses_tuning_improves_dev_bleu(tmp_path: Path) -> None:
    """3 iterations of real tuning on the first 30 dev sentences of the fixture (a few minutes)."""
    bin_dir = moses_bin_dir()
    root = shared_file(FIXTURE)
    n = 30
    paths = {}
    for key, name in (("src", "dev.tok.tc.en"), ("ref", "dev.tok.tc.fr")):
        paths[key] = tmp_path / name
        lines = (root / "data" / name).read_text(encoding="utf-8").splitlines()[:n]
        paths[key].write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    work = tmp_path / "work"
    result = tune(
        TuneOptions(
            ini=root / "filtered/moses.ini", source=paths["src"], references=[paths["ref"]], work_dir=work,
            moses_bin_dir=bin_dir, threads=2, max_iterations=3,
        )
    )
    assert len(result.iterations) >= 2
    first = result.iterations[0]
    assert first.hypotheses > 20 * n  # a real 100-best list
    assert result.best_optimised_bleu is not None and result.best_optimised_bleu > first.dev_bleu_1best
    assert _weight_shape(work / "moses.ini") == _weight_shape(root / "filtered/moses.ini")
    # The tuned config (absolute model paths) decodes from anywhere.
    from moses_integration.decoder import decode

    (tmp_path / "elsewhere").mkdir()
    out = decode(bin_dir, work / "moses.ini", paths["src"], tmp_path / "out.txt", threads=2, cwd=tmp_path / "elsewhere")
    assert len(out.output.read_text(encoding="utf-8").splitlines()) == n


def test_cslm_feature_is_tuned_on_the_fake_decoder(dev: dict[str, Path], tmp_path: Path) -> None:
    """``--feature CSLM:model.pt``: every hypothesis gets CSLM0, MERT weighs it, the sidecar keeps it."""
    import torch

    from cslm.model import CSLM, CSLMConfig
    from cslm.model_file import save_cslm
    from cslm.scoring import sentence_log_probs
    from moses_integration.tokens import split_tokens
    from neural.vocab import Vocab

    vocab = Vocab.from_counts(Vocab.count_tokens(dev["ref"].read_text(encoding="utf-8").splitlines()), 200)
    torch.manual_seed(0)
    model = CSLM(CSLMConfig(vocab_size=len(vocab), embedding=8, hidden=[16], init_range=0.3)).eval()
    path = save_cslm(tmp_path / "cslm.pt", model, vocab)
    work = tmp_path / "work"
    result = tune(tune_options(dev, work, max_iterations=2, feature_specs=[f"CSLM:{path}"]), log=quiet)
    entries = list(read_nbest(work / "run1.nbest.gz"))
    assert all(e.features[-1][0] == "CSLM0" for e in entries)
    expected = sentence_log_probs(model, vocab, [split_tokens(e.hypothesis) for e in entries])
    np.testing.assert_allclose([e.features[-1][1][0] for e in entries], expected, rtol=1e-5, atol=1e-4)
    assert len(result.weights["CSLM0"]) == 1
    extras = read_sidecar(work / "moses.ini")
    assert [(e.spec, e.name) for e in extras] == [(f"CSLM:{path}", "CSLM0")]
    assert "CSLM0" not in MosesIni.read(work / "moses.ini").weights()


def test_a_second_tune_on_a_held_work_dir_stops_before_decoding(dev: dict[str, Path], tmp_path: Path) -> None:
    """``mert tune --continue`` while the first run still tunes there: refused, nothing decoded."""
    work = tmp_path / "work"
    work.mkdir()
    args = ["tune", "--moses-ini", str(dev["ini"]), "--src", str(dev["src"]), "--ref", str(dev["ref"]),
            "--work-dir", str(work), "--moses-bin-dir", str(dev["bin"]), "--continue"]
    with held_by_another_process(work) as holder:
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and f"Error: {work} is in use by pid {holder.pid} " in result.output
    assert list(work.iterdir()) == []
