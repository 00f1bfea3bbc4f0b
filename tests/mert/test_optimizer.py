"""MERT optimisation on the real n-best list, merging of n-best lists, and input errors."""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from mert.bleu import ReferenceFileError
from mert.cli import main
from mert.line_search import MertData
from mert.nbest_set import (
    WeightsError,
    fixed_mask,
    format_weights,
    load_tuning_set,
    merge_nbest_lists,
    read_init_opt,
    read_weights,
)
from mert.optimizer import optimize_runs
from moses_integration.nbest import NBestError
from shared_paths import shared_file

NBEST = "fixtures/hansard-enfr/nbest/dev.nbest.gz"
REF = "fixtures/hansard-enfr/data/dev.tok.tc.fr"
INIT = "fixtures/hansard-enfr/nbest/init.opt"
MOSES_BLEU = 26.62  # README §7: Moses' mert, 20 restarts, on this very list


@lru_cache(maxsize=1)
def tuning_set() -> tuple[object, MertData]:
    return load_tuning_set([shared_file(NBEST)], [shared_file(REF)])


def _fixture_lines() -> list[str]:
    return gzip.decompress(shared_file(NBEST).read_bytes()).decode("utf-8").splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Optimisation


@pytest.mark.slow
def test_reaches_moses_bleu_with_20_restarts() -> None:
    _, data = tuning_set()
    start, low, high = read_init_opt(shared_file(INIT), 14)
    result = optimize_runs(data, start, restarts=20, ranges=(low, high), seed=1000)
    weights, bleu = result.weights, result.bleu
    assert bleu >= MOSES_BLEU - 0.05
    assert data.score(weights) == pytest.approx(bleu, abs=1e-9)  # normalising keeps the 1-bests
    assert np.abs(weights).sum() == pytest.approx(1.0)


def test_single_run_from_the_decoder_weights_already_matches_moses() -> None:
    _, data = tuning_set()
    start, _, _ = read_init_opt(shared_file(INIT), 14)
    result = optimize_runs(data, start, restarts=0)
    assert result.runs[0].start_bleu == pytest.approx(24.0541, abs=5e-5)  # README: default weights
    assert result.bleu >= MOSES_BLEU - 0.05
    assert result.runs[0].iterations >= 2


def test_restarts_are_seeded_ranged_and_the_best_run_wins() -> None:
    data = _small_data()
    low, high = np.full(4, -0.5), np.array([0.5, 1.0, 2.0, 0.5])
    a = optimize_runs(data, np.ones(4), restarts=6, ranges=(low, high), seed=4)
    b = optimize_runs(data, np.ones(4), restarts=6, ranges=(low, high), seed=4)
    assert [r.bleu for r in a.runs] == [r.bleu for r in b.runs]
    np.testing.assert_array_equal(a.weights, b.weights)
    randoms = np.array([r.start for r in a.runs if r.random_start])
    assert len(randoms) == 6 and np.all(randoms >= low) and np.all(randoms <= high)
    assert a.bleu == max(r.bleu for r in a.runs)
    assert all(r.bleu >= r.start_bleu for r in a.runs)  # coordinate ascent never loses
    c = optimize_runs(data, np.ones(4), restarts=6, ranges=(low, high), seed=5)
    assert [r.start.tolist() for r in c.runs[1:]] != [r.start.tolist() for r in a.runs[1:]]


def test_fixed_features_do_not_move_and_weights_are_not_normalised() -> None:
    data = _small_data()
    start = np.array([0.3, -2.0, 0.7, 1.5])
    result = optimize_runs(data, start, restarts=3, fixed=[False, True, False, True], seed=0)
    for run in result.runs:
        assert run.weights[1] == -2.0 and run.weights[3] == 1.5
    assert result.weights[1] == -2.0 and result.weights[3] == 1.5


def test_features_held_at_zero_count_as_absent_and_the_rest_is_normalised() -> None:
    """A column held at 0 is a feature the system does not use: the result equals the optimisation
    without that column, L1-normalised as Moses' mert normalises a system without it."""
    data = _small_data()
    start = np.array([0.3, 0.0, 0.7, 1.5])
    held = optimize_runs(data, start, restarts=3, fixed=[False, True, False, False], seed=0)
    assert held.weights[1] == 0.0
    assert np.abs(held.weights).sum() == pytest.approx(1.0)
    unnormalised = optimize_runs(data, start, restarts=3, fixed=[False, True, False, False], seed=0,
                                 normalize=False)
    assert held.bleu == unnormalised.bleu
    np.testing.assert_allclose(held.weights, unnormalised.weights / np.abs(unnormalised.weights).sum())


def test_several_start_points_and_lockstep_give_the_same_runs() -> None:
    data = _small_data()
    starts = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, -1.0]])
    one = optimize_runs(data, starts, restarts=3, seed=2, points_per_call=1)
    many = optimize_runs(data, starts, restarts=3, seed=2, points_per_call=8)
    assert len(one.runs) == 5 and not one.runs[1].random_start and one.runs[2].random_start
    np.testing.assert_allclose([r.bleu for r in one.runs], [r.bleu for r in many.runs], atol=1e-9)


@pytest.mark.slow
def test_threads_give_the_same_result_to_the_bit() -> None:
    """The start points shared out among threads (``mert tune --threads``, ``mert optimize --threads``):
    every run, and so the winner, exactly as on one thread, on the real fixture list with a held
    column (the data's caches are first built by the threads' caller, not by the threads)."""
    _, data = tuning_set()
    start, low, high = read_init_opt(shared_file(INIT), 14)
    fixed = np.zeros(14, dtype=bool)
    fixed[3] = True
    one = optimize_runs(data, start, restarts=4, ranges=(low, high), seed=7, fixed=fixed)
    _, fresh = load_tuning_set([shared_file(NBEST)], [shared_file(REF)])  # caches not built yet
    for threads in (2, 3, 8):
        many = optimize_runs(fresh, start, restarts=4, ranges=(low, high), seed=7, fixed=fixed, threads=threads)
        np.testing.assert_array_equal(many.weights, one.weights)
        assert [(r.bleu, r.iterations) for r in many.runs] == [(r.bleu, r.iterations) for r in one.runs]
        np.testing.assert_array_equal(np.array([r.weights for r in many.runs]),
                                      np.array([r.weights for r in one.runs]))


def _small_data() -> MertData:
    """A fast synthetic tuning problem (the line-search tests' generator)."""
    rng = np.random.default_rng(1)
    sizes = rng.integers(5, 30, 40)
    total = int(sizes.sum())
    feats = rng.normal(size=(total, 4))
    feats[:, 1] = rng.integers(-5, 5, total)
    hyp_len = rng.integers(5, 25, total)
    stats = np.zeros((total, 10), dtype=np.int64)
    prev = hyp_len
    for n in range(4):
        t = hyp_len - n
        m = np.minimum(rng.integers(1, t + 1), prev)
        stats[:, 2 * n], stats[:, 2 * n + 1], prev = m, t, m
    stats[:, 8], stats[:, 9] = hyp_len, rng.integers(5, 25, total)
    return MertData(feats, stats, np.concatenate([[0], np.cumsum(sizes)]))


# --------------------------------------------------------------------------------------------
# Merging n-best lists


@pytest.mark.slow
def test_merging_drops_repeated_hypotheses(tmp_path: Path) -> None:
    lines = _fixture_lines()
    once = merge_nbest_lists([shared_file(NBEST)])
    twice = merge_nbest_lists([shared_file(NBEST), shared_file(NBEST)])
    assert len(twice.hypotheses) == len(once.hypotheses) == 19313
    assert twice.duplicates_removed == 19313
    # A second list with one new hypothesis for sentence 1 (new words) and one with the same
    # words but other feature values: both are new; the exact repeats are not.
    extra = [lines[0], lines[150], lines[150].replace("LM0= -", "LM0= -1"), lines[250]]
    extra[1] = extra[1].replace(" ||| ", " ||| neu ", 1)
    second = _write(tmp_path / "iter2.nbest", extra + [ln for ln in lines if not ln.startswith(("0 ", "1 ", "2 "))])
    merged = merge_nbest_lists([shared_file(NBEST), second])
    assert len(merged.hypotheses) == 19313 + 2
    assert merged.sources == [str(shared_file(NBEST)), str(second)]
    offsets = merged.offsets
    assert offsets[2] - offsets[1] == (once.offsets[2] - once.offsets[1]) + 2
    sentence_1 = merged.hypotheses[offsets[1] : offsets[2]]
    assert sentence_1[-2].startswith("neu ")  # new hypotheses follow the first list's, in order
    assert np.all(np.diff(merged.sent_ids) >= 0)


def test_merged_list_optimises_like_the_single_list() -> None:
    _, data = tuning_set()
    nbest, merged = load_tuning_set([shared_file(NBEST)] * 2, [shared_file(REF)])
    start, _, _ = read_init_opt(shared_file(INIT), 14)
    assert merged.score(start) == data.score(start)
    np.testing.assert_array_equal(merged.stats, data.stats)


# --------------------------------------------------------------------------------------------
# Errors name the file and line


def test_nbest_with_a_missing_sentence(tmp_path: Path) -> None:
    lines = [ln for ln in _fixture_lines() if not ln.startswith("5 ||| ")]
    path = _write(tmp_path / "gap.nbest", lines)
    first_6 = next(i for i, ln in enumerate(lines, start=1) if ln.startswith("6 ||| "))
    with pytest.raises(NBestError, match=rf"gap.nbest:{first_6}: sentence id 6 follows id 4: sentence id 5 is missing"):
        load_tuning_set([path], [shared_file(REF)])


def test_nbest_lists_with_different_features(tmp_path: Path) -> None:
    lines = _fixture_lines()
    lines[40] = lines[40].replace("Distortion0=", "Distortion1=")
    path = _write(tmp_path / "renamed.nbest", lines)
    with pytest.raises(NBestError, match=r"renamed.nbest:41: features \[.*Distortion1=1.*\] differ from the first"):
        load_tuning_set([path], [shared_file(REF)])
    other = _write(tmp_path / "other.nbest", [ln.replace("Distortion0=", "Distortion1=") for ln in _fixture_lines()])
    with pytest.raises(NBestError, match=r"other.nbest:1: features .*Distortion1.* differ from those of .*dev.nbest"):
        merge_nbest_lists([shared_file(NBEST), other])


def test_nbest_lists_covering_different_sentences(tmp_path: Path) -> None:
    short = _write(tmp_path / "short.nbest", [ln for ln in _fixture_lines() if int(ln.split(" ", 1)[0]) < 150])
    with pytest.raises(NBestError, match=r"short.nbest:\d+: the list ends at sentence id 149; expected 200"):
        merge_nbest_lists([shared_file(NBEST), short])


def test_reference_with_a_different_line_count(tmp_path: Path) -> None:
    ref_lines = shared_file(REF).read_text(encoding="utf-8").splitlines()
    ref = _write(tmp_path / "ref.fr", ref_lines[:-1])
    with pytest.raises(ReferenceFileError, match=r"ref.fr:200: reference file ends after 199 lines but the n-best"):
        load_tuning_set([shared_file(NBEST)], [ref])
    longer = _write(tmp_path / "ref2.fr", [*ref_lines, "extra line"])
    with pytest.raises(ReferenceFileError, match=r"ref2.fr:201: reference file has 201 lines"):
        load_tuning_set([shared_file(NBEST)], [shared_file(REF), longer])


# --------------------------------------------------------------------------------------------
# Weight files and the command line


def test_weight_files_by_name_and_init_opt(tmp_path: Path) -> None:
    nbest, _ = tuning_set()
    names = nbest.feature_names  # type: ignore[attr-defined]
    from_show = read_weights(shared_file("fixtures/hansard-enfr/nbest/show-weights.txt"), names)
    start, low, high = read_init_opt(shared_file(INIT), 14)
    np.testing.assert_array_equal(from_show, start)
    from_ini = read_weights(shared_file("fixtures/hansard-enfr/filtered/moses.ini"), names)
    np.testing.assert_array_equal(from_ini, start)
    assert low is not None and high is not None and low.sum() == 0 and high.sum() == 14
    lines = format_weights(start, names)
    assert lines[0] == "LexicalReordering0= 0.3 0.3 0.3 0.3 0.3 0.3" and lines[3] == "WordPenalty0= -1"
    assert fixed_mask(names, ["LM0", "TranslationModel0_2"]).nonzero()[0].tolist() == [7, 12]
    bad = _write(tmp_path / "w.ini", [ln for ln in lines if not ln.startswith("LM0")])
    with pytest.raises(WeightsError, match=r"w.ini:\d+: no weights for n-best feature LM0"):
        read_weights(bad, names)
    twice = _write(tmp_path / "twice.txt", [*lines, "LM0= 0.9"])  # the last one was taken in silence
    with pytest.raises(WeightsError, match=r"/twice.txt:7: weights for LM0 already given on line 3$"):
        read_weights(twice, names)
    short = _write(tmp_path / "init.opt", ["0.1 0.2"])
    with pytest.raises(WeightsError, match=r"init.opt:1: expected 14 values, found 2"):
        read_init_opt(short, 14)


@pytest.mark.parametrize(("lines", "message"), [
    (["0.1 nan"], r"init.opt:1: 'nan' is not a finite number"),
    (["0.1 0.2", "0 -inf", "1 1"], r"init.opt:2: '-inf' is not a finite number"),
    (["0.1 0.2", "0 1", "1 0"], r"init.opt:3: value 2: the random-restart maximum 0 is below the minimum 1 of line 2"),
    (["0.1 0.2", "-1e308 0", "1e308 1"], r"init.opt:3: value 1: the random-restart range -1e\+308 to 1e\+308 is "
                                         r"wider than a float holds"),
])
def test_init_opt_values_that_no_restart_can_use_name_their_line(tmp_path: Path, lines: list[str],
                                                                 message: str) -> None:
    """A start weight or a range that is not finite, or a range upside down: the file's line, not a
    ValueError or OverflowError from the random restarts."""
    with pytest.raises(WeightsError, match=message):
        read_init_opt(_write(tmp_path / "init.opt", lines), 2)


def test_cli_start_weights_and_ranges_that_are_not_finite_are_one_line(tmp_path: Path) -> None:
    nbest = _write(tmp_path / "small.nbest", ["0 ||| a b ||| LM0= 0 TM0= 1 ||| 0", "0 ||| a c ||| LM0= 1 TM0= 2 ||| 0"])
    ref = _write(tmp_path / "ref", ["a b"])
    for extra, message in ((["--init", "LM0= nan TM0= 1"], "--init 'LM0= nan TM0= 1':1: 'nan' is not a finite number"),
                           (["--init", "LM0= 1e999 TM0= 1"], "'1e999' is not a finite number"),
                           (["--ranges", "-1e308,1e308"], "the numbers are further apart than a float holds")):
        result = CliRunner().invoke(main, ["optimize", str(nbest), "--ref", str(ref), "--restarts", "2", *extra])
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert message in result.output


@pytest.mark.parametrize(("command", "option", "limit"), [
    ("optimize", "--restarts", "10000"), ("optimize", "--random-directions", "10000"), ("tune", "--restarts", "10000"),
    ("evaluate", "--bootstrap-samples", "10000"),
])
def test_counts_that_size_an_array_have_a_maximum(tmp_path: Path, command: str, option: str, limit: str) -> None:
    """``--restarts 100000000000`` was numpy's traceback 'Unable to allocate 10.2 TiB' (and
    ``--bootstrap-samples 100000000`` ate 16 GB for 20 lines): one line as the command line is read."""
    text = _write(tmp_path / "text", ["a b"])
    files = {"optimize": [str(text), "--ref", str(text)],
             "tune": ["--moses-ini", str(text), "--src", str(text), "--ref", str(text)],
             "evaluate": ["--hyp", str(text), "--ref", str(text)]}[command]
    result = CliRunner().invoke(main, [command, *files, option, "100000000000"])
    assert result.exit_code != 0 and result.output.count("\n") == 1, result.output
    assert f"'{option}': 100000000000 is not in the range" in result.output and limit in result.output


def test_cli_optimize_prints_moses_weights_and_bleu(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["optimize", str(shared_file(NBEST)), "--ref", str(shared_file(REF)), "--init-opt", str(shared_file(INIT))]
    result = runner.invoke(main, [*args, "--restarts", "0"])
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    assert [ln.split("=")[0] for ln in out[:6]] == [
        "LexicalReordering0",
        "Distortion0",
        "LM0",
        "WordPenalty0",
        "PhrasePenalty0",
        "TranslationModel0",
    ]
    assert len(out[0].split()) == 7
    assert out[6].startswith("# BLEU ") and float(out[6].split()[2]) >= MOSES_BLEU - 0.05
    weights_file = _write(tmp_path / "weights.txt", out)  # the output reads back as --init
    again = runner.invoke(main, ["optimize", str(shared_file(NBEST)), "--ref", str(shared_file(REF)),
                                 "--init", str(weights_file), "--restarts", "0"])
    assert again.exit_code == 0, again.output
    show = str(shared_file("fixtures/hansard-enfr/nbest/show-weights.txt"))
    fixed = runner.invoke(main, ["optimize", str(shared_file(NBEST)), "--ref", str(shared_file(REF)),
                                 "--init", show, "--init", str(weights_file), "--fixed", "LM0",
                                 "--restarts", "1", "--seed", "3"])
    assert fixed.exit_code == 0, fixed.output
    assert "LM0= 0.5\n" in fixed.output and "best of 3 runs" in fixed.output
    threaded = runner.invoke(main, ["optimize", str(shared_file(NBEST)), "--ref", str(shared_file(REF)),
                                    "--init", show, "--init", str(weights_file), "--fixed", "LM0",
                                    "--restarts", "1", "--seed", "3", "--threads", "2"])
    assert threaded.output.splitlines()[:6] == fixed.output.splitlines()[:6]  # the same weights
    bad_ref = _write(tmp_path / "bad.ref", ["only one line"])
    failed = runner.invoke(main, ["optimize", str(shared_file(NBEST)), "--ref", str(bad_ref)])
    assert failed.exit_code == 1
    assert "bad.ref:2: reference file ends after 1 lines" in failed.output


def test_init_takes_the_weights_themselves_as_its_help_says(tmp_path: Path) -> None:
    """``--init '0.1 0.2'`` said ``[Errno 2] No such file or directory: '0.1 0.2'``: numbers (or ``Name= v``)
    on the command line are start weights, as the same text in a file is."""
    nbest = _write(tmp_path / "small.nbest", [
        "0 ||| le chat ||| LM0= -2.0 TM0= -1.0 -0.5 ||| 0", "0 ||| chat le ||| LM0= -4.0 TM0= -0.5 -0.2 ||| 0",
        "1 ||| un chien noir ||| LM0= -3.0 TM0= -1.5 -0.7 ||| 0", "1 ||| chien un ||| LM0= -5.0 TM0= -0.2 -0.1 ||| 0",
    ])
    ref = _write(tmp_path / "ref", ["le chat", "un chien noir"])
    runner = CliRunner()

    def weights(init: str) -> list[str]:
        res = runner.invoke(main, ["optimize", str(nbest), "--ref", str(ref), "--init", init, "--restarts", "0"])
        assert res.exit_code == 0, res.output
        return [line for line in res.output.splitlines() if not line.startswith("#")]

    from_file = weights(str(_write(tmp_path / "start.txt", ["0.3 0.2 0.1"])))
    assert weights("0.3 0.2 0.1") == from_file == weights("LM0= 0.3 TM0= 0.2 0.1")
    wrong = runner.invoke(main, ["optimize", str(nbest), "--ref", str(ref), "--init", "0.1 0.2"])
    assert wrong.exit_code == 1 and wrong.output == "Error: --init '0.1 0.2':1: expected 3 weights, found 2\n"
    missing = runner.invoke(main, ["optimize", str(nbest), "--ref", str(ref), "--init", "weights.txt"])
    assert missing.exit_code == 1 and "'--init': File 'weights.txt' does not exist" in missing.output
    for typo, message in (("LM0= 0.3 TM0= 0.2 O.1", "could not convert string to float: 'O.1'"),
                          ("0.3 0.2 x", "could not convert string to float: 'x'")):  # was: File '…' does not exist
        res = runner.invoke(main, ["optimize", str(nbest), "--ref", str(ref), "--init", typo])
        assert res.exit_code == 1 and res.output.startswith(f"Error: --init '{typo}':"), res.output
        assert ": not a number" in res.output and res.output.count("\n") == 1
        assert message in res.output


def test_a_stop_ends_the_optimising_threads_at_once(monkeypatch) -> None:
    """SIGTERM to `mert optimize --threads 2` (as a scheduler sends it) while its threads search:
    the one line and 143, and no thread starts a line search after it; they all went on to the
    end before (22.9 s with 300 restarts)."""
    import signal
    import threading

    from mert import optimizer

    real, stopped, after = optimizer.line_search_points, threading.Event(), []

    def line_search_then_stop(*args, **kwargs):
        if stopped.is_set():
            after.append(threading.current_thread().name)
        elif threading.current_thread() is not threading.main_thread():
            stopped.set()  # the first search of a thread: the scheduler's SIGTERM comes now
            signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(optimizer, "line_search_points", line_search_then_stop)
    result = CliRunner().invoke(main, ["optimize", str(shared_file(NBEST)), "--ref", str(shared_file(REF)),
                                       "--init-opt", str(shared_file(INIT)), "--restarts", "40", "--threads", "2"])
    assert result.exit_code == 143 and result.output.endswith(" optimize: stopped by SIGTERM\n"), result.output
    assert len(after) <= 2, f"{len(after)} line searches after the stop"  # at most one per thread, begun as it came
