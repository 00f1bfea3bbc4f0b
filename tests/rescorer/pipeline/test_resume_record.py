"""The progress record a --resume is checked against: every option that changes the output bytes is in it,
unless listed as one that may differ; an earlier version of the record is refused in one line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from rescore_runs import assert_same_output
from tiny_rescore import (
    interrupted_run,
    run,
    table_lines,
    write_table,
)

from moses_integration.phrase_table import PhraseTableError
from rescorer.model.checkpoint import load_checkpoint
from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.resume import PROGRESS_VERSION
from rescorer.pipeline.scoring import ScoringOptions
from rescorer.pipeline.train_or_load import Models


@pytest.mark.parametrize("changed", [{"precision": "bf16"}, {"scoring": ScoringOptions(token_budget=64)}])
def test_resume_refuses_another_precision_or_token_budget(tmp_path: Path, model_file: Path, changed) -> None:
    """They decide the scores' last bits (bf16 far more): a resume must compute as the run it continues."""
    table, ck = interrupted_run(tmp_path, model_file)
    record = json.loads((tmp_path / ".out.gz.progress.json").read_text())
    assert {k: record["options"][k] for k in ("device", "precision")} == {"device": "cpu", "precision": "fp32"}
    named = "--precision fp32, now bf16" if "precision" in changed else "--token-budget 512, now 64"
    with pytest.raises(RescoreError, match=f"cannot --resume: .*progress.json was made with {named}; resume with "
                                           f"the same options, or remove .*partial and .*progress.json to start over"):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True, **changed)


def test_a_progress_record_of_an_earlier_version_is_refused_in_one_line(tmp_path: Path, model_file: Path) -> None:
    """Version 7 recorded fewer options: it cannot tell whether the run was made as this one would be."""
    table, ck = interrupted_run(tmp_path, model_file)
    progress = tmp_path / ".out.gz.progress.json"
    record = json.loads(progress.read_text())
    record["version"] = 7
    progress.write_text(json.dumps(record))
    with pytest.raises(RescoreError, match=rf"^cannot --resume: {progress} was written by another version of this "
                                           rf"program \(progress record version 7, this one writes "
                                           rf"{PROGRESS_VERSION}\); remove "):
        run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True)


@dataclass
class WithANewOption(RescoreOptions):
    """The options with one more, as a new feature adds one: listed nowhere else."""

    new_knob: int = 0


def test_a_new_option_is_in_the_resume_record_unless_listed_as_one_that_may_differ(tmp_path: Path, model_file: Path,
                                                                                   monkeypatch) -> None:
    """An option that changes the bytes once had to be added to the record by hand; forgotten, a ``--resume``
    spliced outputs made with two settings. Now every option is recorded unless it is said to be free."""
    lines = table_lines(300)
    lines[250] = b"a ||| b ||| 0.5 oops 0.5 0.5"
    table, out, ck = write_table(tmp_path / "pt.txt", lines), tmp_path / "out.gz", load_checkpoint(model_file)

    def options(**kw) -> WithANewOption:
        return WithANewOption(progress=False, device="cpu", workers=0, chunk_lines=100,
                              scoring=ScoringOptions(token_budget=512), **kw)

    with pytest.raises(PhraseTableError):
        rescore(str(table), str(out), Models(ck), options(new_knob=1))
    assert json.loads((tmp_path / ".out.gz.progress.json").read_text())["options"]["new_knob"] == 1
    with pytest.raises(RescoreError, match="out.gz.progress.json was made with --new-knob 1, now 2; resume with"):
        rescore(str(table), str(out), Models(ck), options(new_knob=2, resume=True, skip_bad_lines=True))
    summary = rescore(str(table), str(out), Models(ck), options(new_knob=1, resume=True, skip_bad_lines=True))
    assert summary.resumed_lines > 0 and summary.lines == 299  # went on from the recorded chunks
    monkeypatch.setattr(WithANewOption, "MAY_DIFFER", RescoreOptions.MAY_DIFFER | {"new_knob"})
    assert "new_knob" not in options().identity()
    assert options(new_knob=1).identity() == options(new_knob=2).identity() == options().identity()


def test_resume_keeps_the_recorded_automatic_token_budget(tmp_path: Path, model_file: Path, monkeypatch) -> None:
    """On a GPU the automatic budget follows free memory; a resumed run takes the interrupted run's."""
    table, ck = interrupted_run(tmp_path, model_file, scoring=ScoringOptions())
    budgets = []
    monkeypatch.setattr("rescorer.pipeline.scoring.auto_token_budget", lambda device, config: budgets.append(1) or 123)
    run(table, tmp_path / "out.gz", ck, chunk_lines=100, skip_bad_lines=True, resume=True, scoring=ScoringOptions())
    assert budgets == []  # the recorded budget was used, not a new automatic one
    monkeypatch.undo()
    run(table, tmp_path / "straight.gz", ck, chunk_lines=100, skip_bad_lines=True, scoring=ScoringOptions())
    assert_same_output(tmp_path / "out.gz", tmp_path / "straight.gz")
