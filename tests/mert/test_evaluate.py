"""Test-set evaluation (``mert evaluate``): post-processing, sacrebleu, bootstrap, decoding."""

from __future__ import annotations

import gzip
import json
import stat
import statistics
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from infrastructure.lines import read_text_lines
from mert.bleu import ReferenceFileError
from mert.cli import main
from mert.evaluate import (
    EvaluationError,
    PostProcessor,
    decode_test_set,
    detruecase,
    evaluate,
    mean_std,
    paired_bootstrap,
    rescore_one_best,
)
from mert.features import ExtraFeatureWeights, write_sidecar
from moses_integration.decoder import DecoderError
from shared_paths import moses_bin_dir, shared_file

FIXTURE = "fixtures/hansard-enfr"
TUNED = "fixtures/hansard-enfr/tuning/test.tuned.1best"
DEFAULT = "fixtures/hansard-enfr/nbest/test.1best"
REF = "fixtures/hansard-enfr/data/test.fr"
TOK_REF = "fixtures/hansard-enfr/data/test.tok.tc.fr"
SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:"
# Measured with this code (sacrebleu 2.6.0, sacremoses): detokenized BLEU of the fixture's
# test outputs. The tokenized values are the README's, from Moses' own evaluator (§8).
TUNED_BLEU, DEFAULT_BLEU = 16.26, 15.41
TUNED_TOK_BLEU, DEFAULT_TOK_BLEU = 17.32, 16.52


def test_detruecase_uppercases_sentence_starts_only() -> None:
    assert detruecase("le chat dort . il rêve ") == "Le chat dort . Il rêve"
    assert detruecase("&quot; oui , dit-il : non ! ( peut-être ) ?") == "&quot; Oui , dit-il : Non ! ( Peut-être ) ?"
    assert detruecase("3,5 % des iPhone") == "3,5 % des iPhone"
    assert detruecase("") == ""


def test_postprocess_detokenizes_and_unescapes_french() -> None:
    lines = ["l&apos; homme a dit &quot; bonjour &quot; ( 3,5 % ) .", "c&apos; est vrai &#124; faux"]
    assert PostProcessor("fr").lines(lines) == ["L'homme a dit \"bonjour\" (3,5 %).", "C'est vrai | faux"]


def test_fixture_outputs_score_as_measured() -> None:
    report = evaluate(
        [shared_file(TUNED)], [shared_file(REF)], lang="fr", tokenized_references=[shared_file(TOK_REF)],
        baseline_hyps=[shared_file(DEFAULT)],
    )
    tuned, default = report.system[0], report.baseline[0]
    assert tuned.signature.startswith(SIGNATURE)
    assert tuned.bleu == pytest.approx(TUNED_BLEU, abs=0.005)
    assert default.bleu == pytest.approx(DEFAULT_BLEU, abs=0.005)
    # BLEU on tokenized text reproduces what Moses' evaluator reported for these very files.
    assert tuned.tokenized_bleu == pytest.approx(TUNED_TOK_BLEU, abs=0.005)
    assert default.tokenized_bleu == pytest.approx(DEFAULT_TOK_BLEU, abs=0.005)
    assert tuned.detokenized[1].startswith("Sportsman Jhonathan critiquaient Florez d'un hélicoptère")
    (boot,) = report.bootstrap
    assert 0 < boot.p_value <= 1 and boot.samples == 1000
    assert boot.delta == pytest.approx(TUNED_BLEU - DEFAULT_BLEU, abs=0.01)
    assert "bs:1000" in boot.signature and "seed:" in boot.signature
    lines = report.lines()
    assert any(line.startswith("signature: " + SIGNATURE) for line in lines)
    assert any(line.startswith("paired bootstrap (1000 samples)") and "p = " in line for line in lines)


def test_bootstrap_of_a_system_against_itself_is_not_significant() -> None:
    hyps = PostProcessor("fr").lines(read_text_lines(shared_file(TUNED))[:60])
    refs = [read_text_lines(shared_file(REF))[:60]]
    result = paired_bootstrap(("a", hyps), ("b", hyps), refs, samples=200)
    # sacrebleu alone would give 1/(n+1) here (every resampled difference is 0, none "above").
    assert result.delta == 0 and result.p_value == 1.0
    other = hyps[:30] + PostProcessor("fr").lines(read_text_lines(shared_file(DEFAULT))[30:60])
    differ = paired_bootstrap(("a", hyps), ("b", other), refs, samples=200)
    assert differ.delta != 0 and 0 < differ.p_value <= 1 and "bs:200" in differ.signature


def test_several_runs_give_mean_and_std(tmp_path: Path) -> None:
    runs = [shared_file(TUNED), shared_file(DEFAULT), shared_file(TUNED)]
    report = evaluate(runs, [shared_file(REF)], lang="fr", bootstrap_samples=100)
    assert [s.name for s in report.system] == ["test.tuned.1best", "test.1best", "test.tuned.1best#2"]
    bleus = [s.bleu for s in report.system]
    assert mean_std(bleus) == (pytest.approx(statistics.fmean(bleus)), pytest.approx(statistics.stdev(bleus)))
    assert mean_std([17.0]) == (17.0, None)
    summary = [line for line in report.lines() if "mean ± std over 3 runs" in line]
    assert summary and f"{statistics.fmean(bleus):.2f} ± {statistics.stdev(bleus):.2f}" in summary[0]


def test_reference_of_another_length_names_the_file(tmp_path: Path) -> None:
    short = tmp_path / "test.short.fr"
    short.write_text("".join(f"{x}\n" for x in read_text_lines(shared_file(REF))[:150]), encoding="utf-8")
    with pytest.raises(ReferenceFileError, match=r"test\.short\.fr:151: reference has 150 lines but the hypotheses "
                       r"\S*test\.tuned\.1best have 200"):
        evaluate([shared_file(TUNED)], [short], lang="fr")
    result = CliRunner().invoke(main, ["evaluate", "--hyp", str(shared_file(TUNED)), "--ref", str(short)])
    assert result.exit_code == 1 and "test.short.fr:151" in result.output


def test_cli_evaluate_hyp_files(tmp_path: Path) -> None:
    out_json = tmp_path / "report.json"
    args = ["evaluate", "--hyp", str(shared_file(TUNED)), "--ref", str(shared_file(REF)), "--tok-ref",
            str(shared_file(TOK_REF)), "--baseline", str(shared_file(DEFAULT)), "--bootstrap-samples", "200",
            "--report", str(out_json)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"signature: {SIGNATURE}" in result.output
    assert f"tokenized BLEU (tok:none, tokenized reference) = {TUNED_TOK_BLEU:.2f}" in result.output
    doc = json.loads(out_json.read_text())
    assert doc["system"][0]["bleu"] == pytest.approx(TUNED_BLEU, abs=0.005)
    assert 0 < doc["bootstrap"][0]["p_value"] <= 1
    usage = CliRunner().invoke(main, ["evaluate", "--ref", str(shared_file(REF))])
    assert usage.exit_code == 1 and usage.output.count("\n") == 1 and "--hyp" in usage.output


def test_cli_evaluate_hyp_files_needs_no_writable_folder(monkeypatch) -> None:
    """Scoring --hyp files writes nothing: it ran where the default --output-dir (eval) cannot be made."""
    monkeypatch.chdir("/proc")  # nothing can be created here, not even by root
    args = ["evaluate", "--hyp", str(shared_file(TUNED)), "--ref", str(shared_file(REF)), "--bootstrap-samples", "10"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"signature: {SIGNATURE}" in result.output


def test_cli_evaluate_refuses_an_unwritable_output_folder_before_decoding(fake_system: dict[str, Path],
                                                                         monkeypatch) -> None:
    monkeypatch.chdir("/proc")
    args = ["evaluate", "--moses-ini", str(fake_system["ini"]), "--src", str(fake_system["src"]),
            "--ref", str(fake_system["src"])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "cannot write eval" in result.output


FAKE_MOSES = r'''#!{python}
"""Fake moses: writes a fixed n-best list (when asked) and its first hypotheses as the 1-best."""
import sys
args = sys.argv[1:]
lines = open({pool!r}, encoding="utf-8").read().splitlines()
n = len(sys.stdin.read().splitlines())
if "-n-best-list" in args:
    open(args[args.index("-n-best-list") + 1], "w", encoding="utf-8").write("".join(x + "\n" for x in lines))
if "-translation-details" in args:
    open(args[args.index("-translation-details") + 1], "w", encoding="utf-8").write("details of %d\n" % n)
seen = set()
for x in lines:
    sid, hyp = x.split(" ||| ")[:2]
    if sid not in seen:
        seen.add(sid)
        print(hyp)
'''


@pytest.fixture
def fake_system(tmp_path: Path) -> dict[str, Path]:
    root = shared_file(FIXTURE)
    n = 4
    lines = gzip.decompress((root / "nbest/dev.nbest.gz").read_bytes()).decode("utf-8").splitlines()
    pool = tmp_path / "pool.nbest"
    pool.write_text("".join(f"{x}\n" for x in lines if int(x.split(" ||| ", 1)[0]) < n), encoding="utf-8")
    src = tmp_path / "src.en"
    src.write_text("".join(f"{x}\n" for x in read_text_lines(root / "data/dev.tok.tc.en")[:n]), encoding="utf-8")
    ini = tmp_path / "sys/moses.ini"
    ini.parent.mkdir()
    ini.write_text((root / "filtered/moses.ini").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "moses"
    fake.write_text(FAKE_MOSES.format(python=sys.executable, pool=str(pool)), encoding="utf-8")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return {"pool": pool, "src": src, "ini": ini, "bin": bin_dir}


def test_decode_without_sidecar_is_the_moses_1best(fake_system: dict[str, Path], tmp_path: Path) -> None:
    ini, src = fake_system["ini"], fake_system["src"]
    out = decode_test_set(ini, src, tmp_path / "o/out.tok", moses_bin_dir=fake_system["bin"])
    firsts = {}
    for line in fake_system["pool"].read_text().splitlines():
        firsts.setdefault(line.split(" ||| ")[0], line.split(" ||| ")[1])
    assert out.read_text().splitlines() == list(firsts.values())
    assert not (tmp_path / "o/out.tok.nbest.gz").exists()
    # keep_nbest: the same 1-best, and the decoder's n-best list kept beside it, every line of it
    kept = decode_test_set(ini, src, tmp_path / "k/out.tok", moses_bin_dir=fake_system["bin"], keep_nbest=True)
    assert kept.read_text() == out.read_text()
    nbest = gzip.decompress((tmp_path / "k/out.tok.nbest.gz").read_bytes()).decode().splitlines()
    pool = fake_system["pool"].read_text().splitlines()
    assert [x.split(" ||| ")[:2] for x in nbest] == [x.split(" ||| ")[:2] for x in pool]
    assert not (tmp_path / "k/out.tok.nbest").exists()


def test_translation_details_of_the_moses_1best_are_kept_and_refused_after_rescoring(
        fake_system: dict[str, Path], tmp_path: Path) -> None:
    ini, src = fake_system["ini"], fake_system["src"]
    for keep in (False, True):
        details = tmp_path / f"{keep}/out.tok.details"
        decode_test_set(ini, src, tmp_path / f"{keep}/out.tok", moses_bin_dir=fake_system["bin"], keep_nbest=keep,
                        details=details)
        assert details.read_text() == "details of 4\n"
    # With n-best features the output is not Moses' 1-best: refused before decoding anything.
    write_sidecar(ini, [ExtraFeatureWeights("WordCount", "WordCount", (1.0,))])
    with pytest.raises(EvaluationError, match=r"moses\.ini: its n-best features \(WordCount\) rerank Moses' 1-best"):
        decode_test_set(ini, src, tmp_path / "x/out.tok", moses_bin_dir=fake_system["bin"],
                        details=tmp_path / "x/out.tok.details")
    assert not (tmp_path / "x").exists()


def test_decode_with_extra_feature_rescores_the_nbest_list(fake_system: dict[str, Path], tmp_path: Path) -> None:
    # A large WordCount weight makes the longest hypothesis of each sentence win the rescoring.
    write_sidecar(fake_system["ini"], [ExtraFeatureWeights("WordCount", "WordCount", (1000.0,))])
    ini, src = fake_system["ini"], fake_system["src"]
    out = decode_test_set(ini, src, tmp_path / "out.tok", moses_bin_dir=fake_system["bin"])
    by_sentence: dict[str, list[str]] = {}
    for line in fake_system["pool"].read_text().splitlines():
        sid, hyp = line.split(" ||| ")[:2]
        by_sentence.setdefault(sid, []).append(hyp.strip())
    got = out.read_text(encoding="utf-8").splitlines()
    assert len(got) == 4
    for hyp, pool in zip(got, by_sentence.values(), strict=True):
        assert len(hyp.split()) == max(len(h.split()) for h in pool)
    # The rescored list is kept, with the feature; a list feature without a weight is an error.
    rescored = tmp_path / "out.tok.nbest.gz"
    assert "WordCount= " in gzip.decompress(rescored.read_bytes()).decode()
    with pytest.raises(EvaluationError, match="no 6 weight.*LexicalReordering0"):
        rescore_one_best(rescored, {"LM0": [1.0]}, 4)


def test_decode_with_the_cslm_feature_picks_its_best_hypothesis(fake_system: dict[str, Path], tmp_path: Path) -> None:
    """The sidecar spec ``CSLM:model.pt`` is built again and rescores the test n-best list."""
    import torch

    from cslm.model import CSLM, CSLMConfig
    from cslm.model_file import save_cslm
    from cslm.scoring import sentence_log_probs
    from moses_integration.tokens import split_tokens
    from neural.vocab import Vocab

    by_sentence: dict[str, list[str]] = {}
    for line in fake_system["pool"].read_text(encoding="utf-8").splitlines():
        sid, hyp = line.split(" ||| ")[:2]
        by_sentence.setdefault(sid, []).append(hyp.strip())
    vocab = Vocab.from_counts(Vocab.count_tokens(h for hyps in by_sentence.values() for h in hyps), 5000)
    torch.manual_seed(0)
    model = CSLM(CSLMConfig(vocab_size=len(vocab), embedding=8, hidden=[16], init_range=0.5)).eval()
    path = save_cslm(tmp_path / "cslm.pt", model, vocab)
    write_sidecar(fake_system["ini"], [ExtraFeatureWeights(f"CSLM:{path}", "CSLM0", (1e6,))])
    out = decode_test_set(fake_system["ini"], fake_system["src"], tmp_path / "out.tok",
                          moses_bin_dir=fake_system["bin"])
    got = out.read_text(encoding="utf-8").splitlines()
    for hyp, pool in zip(got, by_sentence.values(), strict=True):
        scores = sentence_log_probs(model, vocab, [split_tokens(h) for h in pool])
        assert scores[pool.index(hyp)] >= scores.max() - 1e-4


def test_decode_failure_and_missing_moses(fake_system: dict[str, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOSES_BIN_DIR", raising=False)
    with pytest.raises(DecoderError, match="MOSES_BIN_DIR"):
        decode_test_set(fake_system["ini"], fake_system["src"], tmp_path / "out.tok")
    args = ["evaluate", "--moses-ini", str(fake_system["ini"]), "--ref", str(fake_system["src"])]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "need --src" in result.output


def _counting_moses(tmp_path: Path) -> tuple[Path, Path]:
    """A moses that copies its input and counts its calls in a file outside every output folder."""
    bin_dir, calls = tmp_path / "counting-bin", tmp_path / "moses-calls"
    bin_dir.mkdir()
    script = bin_dir / "moses"
    script.write_text(f"#!/bin/sh\necho called >> {calls}\ncat\n", encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bin_dir, calls


@pytest.mark.parametrize("written", ["system.run1.tok", "system.run1.tok.log", "system.run1.tok.detok"])
def test_cli_evaluate_refuses_an_input_it_would_write_over_before_decoding(fake_system: dict[str, Path],
                                                                          tmp_path: Path, written: str) -> None:
    """An input named as a file the run writes in --output-dir (a decode's output or log, a .detok) is
    one line before any decode, and is left as it was."""
    bin_dir, calls = _counting_moses(tmp_path)
    out_dir = tmp_path / "eval"
    out_dir.mkdir()
    ref = out_dir / written
    ref.write_bytes(fake_system["src"].read_bytes())
    args = ["evaluate", "--moses-ini", str(fake_system["ini"]), "--src", str(fake_system["src"]), "--ref", str(ref),
            "--moses-bin-dir", str(bin_dir), "--output-dir", str(out_dir), "--threads", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"(written in --output-dir) is the input --ref {ref}" in result.output
    assert ref.read_bytes() == fake_system["src"].read_bytes() and not calls.exists()
    assert sorted(p.name for p in out_dir.iterdir()) == [written]


def test_cli_evaluate_checks_line_counts_before_decoding(fake_system: dict[str, Path], tmp_path: Path) -> None:
    """A reference, a --hyp or a --baseline of another length than the source is found before the
    decode (which takes half an hour on a real test set), named with its first extra or missing line."""
    bin_dir, calls = _counting_moses(tmp_path)
    src = fake_system["src"]
    short = tmp_path / "short.txt"
    short.write_text("".join(f"{x}\n" for x in read_text_lines(src)[:3]), encoding="utf-8")
    common = ["evaluate", "--moses-ini", str(fake_system["ini"]), "--src", str(src), "--moses-bin-dir", str(bin_dir),
              "--output-dir", str(tmp_path / "eval"), "--threads", "1"]
    for extra, message in ((["--ref", str(short)], f"{short}:4: reference has 3 lines but the source {src} has 4"),
                           (["--ref", str(src), "--baseline", str(short)],
                            f"{short}:4: hypotheses have 3 lines but the source {src} has 4")):
        result = CliRunner().invoke(main, common + extra)
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert message in result.output
    assert not calls.exists() and not (tmp_path / "eval").exists()
    result = CliRunner().invoke(main, common + ["--ref", str(src)])  # the same files, lengths agreeing
    assert result.exit_code == 0 and calls.read_text() == "called\n", result.output


def test_cli_evaluate_resume_keeps_the_decodes_a_stopped_run_finished(fake_system: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """Three runs decode for half an hour each: a run that fails in its second decode keeps the first (and the
    second's log, which its message names), and ``--resume`` decodes only what is left. A decode of another
    ini is refused in one line, never scored as this one's."""
    bin_dir, calls = _counting_moses(tmp_path)
    fail_once = tmp_path / "fail-once"  # the next decode of sys2/moses.ini fails
    (bin_dir / "moses").write_text(f"#!/bin/sh\necho called >> {calls}\ncase \"$*\" in *sys2*) if [ -f {fail_once} ]; "
                                   f"then rm {fail_once}; echo 'broken table' >&2; exit 3; fi;; esac\ncat\n",
                                   encoding="utf-8")
    second = tmp_path / "sys2/moses.ini"
    second.parent.mkdir()
    second.write_text(fake_system["ini"].read_text())
    out_dir = tmp_path / "eval"
    args = ["evaluate", "--moses-ini", str(fake_system["ini"]), "--moses-ini", str(second), "--src",
            str(fake_system["src"]), "--ref", str(fake_system["src"]), "--moses-bin-dir", str(bin_dir),
            "--output-dir", str(out_dir), "--threads", "1", "--resume"]
    fail_once.write_text("")
    failed = CliRunner().invoke(main, args)  # the first is kept; the second decode fails
    assert failed.exit_code == 1 and "moses failed (exit 3)" in failed.output, failed.output
    assert (out_dir / "system.run2.tok.log").read_text() == "broken table\n"
    assert calls.read_text().count("called") == 2
    resumed = CliRunner().invoke(main, args)
    assert resumed.exit_code == 0 and calls.read_text().count("called") == 3, resumed.output
    assert f"kept {out_dir / 'system.run1.tok'}: decoded by an earlier run" in resumed.output
    assert "system system.run2.tok: BLEU = " in resumed.output and "(mean ± std over 2 runs)" in resumed.output
    second.write_text(second.read_text() + "\n")
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1, refused.output  # "kept" run 1, then one line:
    assert refused.output.splitlines()[-1].startswith(f"Error: cannot --resume: {out_dir / 'system.run2.tok.json'} "
                                                      "was made with --moses-ini a file of ")
    again = CliRunner().invoke(main, [a for a in args if a != "--resume"])
    assert again.exit_code == 0 and calls.read_text().count("called") == 5, again.output
    lm = fake_system["ini"].parent / "lm.fr.binary"  # the LM the ini names, retrained in place
    lm.write_bytes(b"an LM\n")
    assert CliRunner().invoke(main, [a for a in args if a != "--resume"]).exit_code == 0
    assert CliRunner().invoke(main, args).exit_code == 0 and calls.read_text().count("called") == 7
    lm.write_bytes(b"a retrained LM\n")
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1 and refused.output.count("\n") == 1, refused.output
    assert refused.output.startswith(f"Error: cannot --resume: {out_dir / 'system.run1.tok.json'} was made with the "
                                     f"model {lm} (6 bytes, mtime "), refused.output
    assert calls.read_text().count("called") == 7


def test_cli_evaluate_an_empty_test_set_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    result = CliRunner().invoke(main, ["evaluate", "--ref", str(empty), "--hyp", str(empty)])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"{empty}: empty: no sentence to score" in result.output


def test_cli_evaluate_warns_in_one_line_of_a_language_sacremoses_has_no_rules_for() -> None:
    """``--lang xx`` (a typo for fr) detokenized ``l' homme`` with the generic rules and said nothing."""
    args = ["evaluate", "--hyp", str(shared_file(TUNED)), "--ref", str(shared_file(REF)), "--bootstrap-samples", "10"]
    for lang, warned in (("xx", True), ("fr", False), ("de", False), ("ja", False)):
        result = CliRunner().invoke(main, [*args, "--lang", lang])
        assert result.exit_code == 0, result.output
        lines = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        assert lines == ([f"warning: --lang {lang}: sacremoses has no rules for it, so its generic rules detokenize "
                          "(a typo? the codes are ISO 639-1: fr, en, de…)"] if warned else []), result.stderr


def test_cli_evaluate_refuses_a_tokenized_reference_for_detokenized_hypotheses() -> None:
    """``--detokenized --tok-ref T`` printed no tokenized BLEU and said nothing of the --tok-ref it left out."""
    result = CliRunner().invoke(main, ["evaluate", "--hyp", str(shared_file(REF)), "--ref", str(shared_file(REF)),
                                       "--tok-ref", str(shared_file(TOK_REF)), "--detokenized"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "--tok-ref scores tokenized hypotheses, and --detokenized ones have none" in result.output


@pytest.mark.slow
@pytest.mark.moses
def test_real_moses_decode_reproduces_the_fixture_and_prints_a_signature(tmp_path: Path) -> None:
    bin_dir = moses_bin_dir()
    root = shared_file(FIXTURE)
    n = 15
    files = {}
    for key, rel in (("src", "data/test.tok.tc.en"), ("ref", "data/test.fr"), ("tok", "data/test.tok.tc.fr")):
        files[key] = tmp_path / Path(rel).name
        files[key].write_text("".join(f"{x}\n" for x in read_text_lines(root / rel)[:n]), encoding="utf-8")
    args = ["evaluate", "--moses-ini", str(root / "filtered/moses.ini"), "--src", str(files["src"]),
            "--ref", str(files["ref"]), "--tok-ref", str(files["tok"]), "--output-dir", str(tmp_path / "eval"),
            "--moses-bin-dir", str(bin_dir), "--threads", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert f"signature: {SIGNATURE}" in result.output
    # Same config, same input: the decoder output is the fixture's default-weight test output.
    decoded = (tmp_path / "eval/system.run1.tok").read_text(encoding="utf-8").splitlines()
    assert decoded == read_text_lines(root / "nbest/test.1best")[:n]
    assert (tmp_path / "eval/system.run1.tok.detok").is_file()


def test_cli_evaluate_resume_refuses_a_decode_rescored_with_a_model_since_retrained(
        fake_system: dict[str, Path], tmp_path: Path) -> None:
    """The extra features' model files are in the decode record: a CSLM retrained in place (same path, same
    spec) makes ``--resume`` refuse the earlier rescored decode, naming the model, not score it as the new one's."""
    import torch

    from cslm.model import CSLM, CSLMConfig
    from cslm.model_file import save_cslm
    from neural.vocab import Vocab

    vocab = Vocab.from_counts(Vocab.count_tokens(["a b c"]), 10)

    def train_cslm(seed: int) -> Path:
        torch.manual_seed(seed)
        return save_cslm(tmp_path / "cslm.pt", CSLM(CSLMConfig(vocab_size=len(vocab), embedding=8, hidden=[16])).eval(),
                         vocab)

    path = train_cslm(0)
    write_sidecar(fake_system["ini"], [ExtraFeatureWeights(f"CSLM:{path}", "CSLM0", (1.0,))])
    out_dir = tmp_path / "eval"
    args = ["evaluate", "--moses-ini", str(fake_system["ini"]), "--src", str(fake_system["src"]), "--ref",
            str(fake_system["src"]), "--moses-bin-dir", str(fake_system["bin"]), "--output-dir", str(out_dir),
            "--threads", "1", "--resume"]
    assert CliRunner().invoke(main, args).exit_code == 0
    kept = CliRunner().invoke(main, args)
    assert kept.exit_code == 0 and "decoded by an earlier run" in kept.output, kept.output
    train_cslm(1)
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 1 and refused.output.count("\n") == 1, refused.output
    assert refused.output.startswith(f"Error: cannot --resume: {out_dir / 'system.run1.tok.json'} was made with the "
                                     f"model {path} ("), refused.output
