"""The record a ``--resume`` must match: every option but those listed as free to differ, and one line that
names each option changed since the interrupted run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infrastructure.errors import UserError
from infrastructure.resume_record import ResumeRecordError, check_same_options, options_record


@dataclass
class Inner:
    budget: int | None = None
    share: bool = True


@dataclass
class Options:
    chunk_lines: int = 100
    threads: int = 2
    shard: tuple[int, int] | None = (1, 3)
    table: Path = Path("pt.gz")
    names: list[str] = field(default_factory=lambda: ["a", "b"])
    inner: Inner = field(default_factory=Inner)


def test_every_option_is_recorded_as_json_but_those_that_may_differ() -> None:
    assert options_record(Options(), {"threads"}) == {
        "chunk_lines": 100, "shard": [1, 3], "table": "pt.gz", "names": ["a", "b"], "budget": None, "share": True}
    assert options_record({"beam": 3, "quiet": True, "ini": Path("m.ini")}, {"quiet"}) == {"beam": 3, "ini": "m.ini"}
    assert options_record({"flags": object()}, (), recorded_as={"flags": "digest"}) == {"flags": "digest"}
    # a dataclass of options inside is free or recorded as a whole when named so (its fields may clash then)
    assert options_record({"budget": 1, "inner": Inner()}, {"inner"}) == {"budget": 1}
    assert options_record({"budget": 1, "inner": Inner()}, (), recorded_as={"inner": "x"}) == {"budget": 1,
                                                                                              "inner": "x"}


def test_what_cannot_be_recorded_or_is_no_option_is_a_bug_found_at_once() -> None:
    with pytest.raises(TypeError, match="option flags: a object cannot be recorded"):
        options_record({"flags": object()}, ())
    with pytest.raises(ValueError, match="not options of Options: thread"):  # a renamed option left behind
        options_record(Options(), {"thread"})
    with pytest.raises(ValueError, match="named twice: budget"):
        options_record({"budget": 1, "inner": Inner()}, ())


def test_a_resume_with_other_options_is_one_line_naming_each() -> None:
    then = options_record(Options(chunk_lines=1000), {"threads"})
    check_same_options(then, options_record(Options(chunk_lines=1000, threads=8), {"threads"}), "OUT.progress",
                       advice="x")
    now = options_record(Options(chunk_lines=2000, inner=Inner(budget=64)), {"threads"})
    with pytest.raises(ResumeRecordError) as refused:
        check_same_options(then, now, "OUT.progress", advice="resume with the same options, or remove OUT.partial")
    assert isinstance(refused.value, UserError)
    assert str(refused.value) == ("cannot --resume: OUT.progress was made with --budget none, now 64; with "
                                  "--chunk-lines 1000, now 2000; resume with the same options, or remove OUT.partial")


def test_an_option_recorded_on_one_side_only_counts_and_the_error_is_the_commands() -> None:
    class TuneError(UserError):
        pass

    with pytest.raises(TuneError, match=r"^cannot --resume: W was made with --new-knob none, now 'a b'; "
                                        r"with the source fr.txt, now de.txt; go$"):
        check_same_options({"source": "fr.txt"}, {"source": "de.txt", "new_knob": "a b"}, "W", advice="go",
                           names={"source": "the source"}, error=TuneError)
