"""Text preparation: Moses' tokeniser and truecaser (sacremoses), clean-corpus-n.perl's rules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from infrastructure.errors import UserError
from infrastructure.lines import text_lines
from shared_paths import shared_file
from table1.text_prep import (
    CleanRules,
    clean_corpus_files,
    clean_pairs,
    tokenize_lines,
    train_truecaser,
    truecase_lines,
    write_text_lines,
)


def test_clean_pairs_applies_each_rule_of_clean_corpus_n():
    pairs = [
        ("a  b\tc ", " x y"),  # whitespace runs collapse, ends trimmed: kept as "a b c" / "x y"
        ("", "x"),  # empty side: dropped
        ("a " * 81, "x"),  # 81 words > max 80: dropped
        ("a " * 10, "x"),  # ratio 10 > 9: dropped
        ("a " * 9, "x"),  # ratio exactly 9: kept
        ("a|b c", "x | y"),  # '|' removed (first line not factored), then spaces normalised
        ("w" * 1001, "x"),  # word longer than 1000 characters: dropped
    ]
    kept = list(clean_pairs(pairs))
    assert kept == [(1, "a b c", "x y"), (5, " ".join(["a"] * 9), "x"), (6, "ab c", "x y")]


def test_clean_pairs_min_words_and_custom_max():
    pairs = [("a", "x"), ("a b c", "x y z")]
    assert [n for n, _, _ in clean_pairs(pairs, CleanRules(min_words=2, max_words=3))] == [2]


def test_clean_corpus_files_reports_counts_and_a_short_file(tmp_path):
    write_text_lines(tmp_path / "c.en", ["a b", "", "c"])
    write_text_lines(tmp_path / "c.fr", ["x", "y", "z w"])
    read, kept = clean_corpus_files(tmp_path / "c.en", tmp_path / "c.fr", tmp_path / "o.en", tmp_path / "o.fr")
    assert (read, kept) == (3, 2)
    assert (tmp_path / "o.en").read_text() == "a b\nc\n"
    assert (tmp_path / "o.fr").read_text() == "x\nz w\n"
    write_text_lines(tmp_path / "short.fr", ["x"])
    with pytest.raises(UserError, match=r"short\.fr:2: file ends before"):
        clean_corpus_files(tmp_path / "c.en", tmp_path / "short.fr", tmp_path / "p.en", tmp_path / "p.fr")


@pytest.mark.parametrize("jobs", [1, 2])
def test_tokenize_escapes_as_moses_tokenizer_perl(jobs, tmp_path):
    # tokenizer.perl -l fr (default escaping) output for these lines.
    lines = ["L'homme a dit: \"oui\" & <non>.", "C'est 3,5 %."] * 3
    out = list(tokenize_lines(lines, "fr", jobs=jobs, temp_folder=tmp_path))
    assert out[0] == "L&apos; homme a dit : &quot; oui &quot; &amp; &lt; non &gt; ."
    assert out[1] == "C&apos; est 3,5 % ."
    assert out[2:] == out[:2] * 2


def test_truecaser_learns_the_usual_case_of_each_word(tmp_path):
    corpus = tmp_path / "tok.en"
    write_text_lines(corpus, ["The house of Commons met .", "we saw the house .", "Paris is big .", "in Paris ."])
    train_truecaser(corpus, tmp_path / "model.en")
    out = list(truecase_lines(["The house is in Paris .", "Paris ."], tmp_path / "model.en"))
    # sentence-initial words take their usual case; other words keep theirs
    assert out == ["the house is in Paris .", "Paris ."]


def test_prepared_text_matches_the_fixture_made_with_moses_perl_scripts(tmp_path):
    """tokenizer.perl made the fixture's dev set; sacremoses gives the same tokens (case aside)."""
    raw = shared_file("fixtures/hansard-enfr/data/dev.en")
    tok_tc = shared_file("fixtures/hansard-enfr/data/dev.tok.tc.en")
    ours = list(tokenize_lines(text_lines(raw, last=100), "en"))
    theirs = list(text_lines(tok_tc, last=100))
    assert [o.lower() for o in ours] == [t.lower() for t in theirs]


def test_processes_read_the_input_a_window_ahead_not_all_of_it(monkeypatch, tmp_path):
    """A full-scale LM text does not fit in memory: a slow reader of the output holds the input back."""
    import time

    from table1 import text_prep

    monkeypatch.setattr(text_prep, "BATCH_LINES", 2)
    pulled = 0

    def lines():
        nonlocal pulled
        for i in range(400):
            pulled += 1
            yield f"line {i} ."

    out = tokenize_lines(lines(), "en", jobs=2, temp_folder=tmp_path)
    assert next(out) == "line 0 ."
    time.sleep(1.0)  # the workers would have taken everything by now
    assert pulled <= text_prep.WINDOW_BATCHES * 2 * 2
    assert [next(out) for _ in range(3)] == ["line 1 .", "line 2 .", "line 3 ."]
    assert list(out)[-1] == "line 399 ." and pulled == 400


#: A fresh process, as ``table1`` is (joblib's worker pool and its temporary folder are per process): a
#: ``Parallel`` with joblib's defaults first (its pool is reused by the next), then the prep on 2
#: processes; it prints the joblib folders of its own (their names carry its pid) in ``/dev/shm`` and the
#: system temp folder before, while the workers run (what a kill would leave) and after.
_PREP_IN_A_FRESH_PROCESS = """
import glob, json, os, sys, tempfile
from joblib import Parallel, delayed
from table1.text_prep import tokenize_lines, truecase_lines
assert Parallel(n_jobs=2)(delayed(abs)(i) for i in (-1, -2)) == [1, 2]
def folders():
    return sorted(f for place in ("/dev/shm", tempfile.gettempdir())
                  for f in glob.glob(os.path.join(place, f"joblib_memmapping_folder_{os.getpid()}_*")))
work, model = sys.argv[1:]
before = folders()
out = tokenize_lines((f"Line {i}." for i in range(5000)), "en", jobs=2, temp_folder=os.path.join(work, "tmp"))
first = next(out)
during = folders()
last = list(out)[-1]
cased = list(truecase_lines(["The house ."] * 5000, model, jobs=2, temp_folder=os.path.join(work, "tmp")))
print(json.dumps({"before": before, "during": during, "after": folders(), "lines": [first, last, cased[0]]}))
"""


@pytest.mark.slow
def test_processes_leave_nothing_in_dev_shm_or_the_temp_dir(tmp_path):
    """A killed ``table1`` leaves what joblib made outside the work folder: it must make nothing there,
    and nothing left in the work folder either."""
    corpus = tmp_path / "tok.en"
    write_text_lines(corpus, ["we saw the house .", "The house is big ."])
    train_truecaser(corpus, tmp_path / "model.en")
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run([sys.executable, "-c", _PREP_IN_A_FRESH_PROCESS, work, tmp_path / "model.en"],
                         capture_output=True, text=True, check=True)
    seen = json.loads(run.stdout)
    assert seen["lines"] == ["Line 0 .", "Line 4999 .", "the house ."]
    assert seen["during"] == seen["before"]
    assert seen["after"] == seen["before"]
    assert list(work.iterdir()) == []

def test_processes_need_a_temp_folder_of_the_caller():
    with pytest.raises(ValueError, match="temp_folder"):
        list(tokenize_lines(["a ."], "en", jobs=2))
