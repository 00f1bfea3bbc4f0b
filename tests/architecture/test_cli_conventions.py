"""One set of CLI conventions across every command (docs/architecture.md): the common options are
spelled, defaulted and documented the same way wherever they appear, each command takes those that
mean something for it, and every output is checked while the command line is read."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cslm.cli import main as cslm_main
from mert.cli import main as mert_main
from moses_integration.cli_options import DEFAULT_SEED, OutputPath
from rescorer.cli import main as rescorer_main
from rescorer.cli import rescore_phrase_table_command
from table1.cli import main as table1_main

ROOTS = {"rescorer": rescorer_main, "rescore-phrase-table": rescore_phrase_table_command, "cslm": cslm_main,
         "mert": mert_main, "table1": table1_main}


def _commands() -> list[tuple[str, click.Command]]:
    found = []

    def walk(name: str, command: click.Command) -> None:
        if isinstance(command, click.Group):
            for sub_name, sub in command.commands.items():
                walk(f"{name} {sub_name}", sub)
        else:
            found.append((name, command))

    for name, command in ROOTS.items():
        walk(name, command)
    return found


COMMANDS = _commands()


def _option(command: click.Command, name: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option) and p.name == name), None)


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_common_options_mean_the_same_everywhere(name, command):
    threads = _option(command, "threads")
    if threads is not None:  # absent means all CPUs, resolved by limit_threads in the command
        assert threads.opts == ["--threads"] and threads.default is None, name
    device = _option(command, "device")
    if device is not None:
        assert device.opts == ["--device"] and device.default == "auto", name
    quiet = _option(command, "quiet")
    if quiet is not None:
        assert quiet.opts == ["-q", "--quiet"] and quiet.is_flag, name
    seed = _option(command, "seed")
    if seed is not None:
        assert seed.opts == ["--seed"] and seed.default == DEFAULT_SEED, name
    resume = _option(command, "resume")
    if resume is not None:
        assert resume.opts[0] == "--resume" and resume.is_flag, name
    assert _option(command, "jobs") is None, f"{name}: --threads, not --jobs"


def test_short_options_are_not_reused_with_another_meaning():
    meaning: dict[str, set[str]] = {}
    for _, command in COMMANDS:
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-") and not opt.startswith("--"):
                    meaning.setdefault(opt, set()).add(param.name)
    assert all(len(names) == 1 for names in meaning.values()), meaning


def test_old_spellings_still_work(tmp_path):
    """``mert tune --continue`` (now ``--resume``) and ``mert evaluate --json`` (now ``--report``) keep working."""
    tune = dict(COMMANDS)["mert tune"]
    assert "--continue" in _option(tune, "resume").opts
    assert "--json" in _option(dict(COMMANDS)["mert evaluate"], "json_path").opts
    assert "--output-ini" in _option(tune, "output_ini").opts


def test_rescore_is_also_a_rescorer_subcommand():
    result = CliRunner().invoke(rescorer_main, ["rescore", "--help"])
    assert result.exit_code == 0 and "--moses-ini-out" in result.output


# ------------------------------------------------------------------ which common options, and why
#
# The rule: a command takes a common option exactly when it means something for it.
# threads: it computes with torch, or runs worker processes or the decoder; device: it runs a model;
# quiet: it writes progress or a summary on stderr; seed: its result depends on random draws;
# resume: it keeps its progress so that a killed run continues. A new command fails this test until
# its line below says which of them it takes.
ALL = {"threads", "device", "quiet", "seed", "resume"}
COMMON_OPTIONS: dict[str, set[str]] = {
    "rescorer train": ALL,
    "rescorer sample": {"threads", "device", "seed"},  # prints its result only
    "rescorer compare": {"threads", "device", "quiet", "seed"},  # seed: ties among rare sources
    "rescorer plot-scores": set(),  # reads a Parquet file and draws it: no model, no draws
    "rescorer map-words": {"seed"},  # t-SNE of the stored embeddings: no model is run
    "rescorer map-phrases": {"threads", "device", "seed"},
    "rescorer report": {"threads", "device", "quiet", "seed"},
    "rescorer rescore": ALL,  # seed: it trains when given no --model
    # the beam search draws nothing; a search of every source takes hours, kept batch by batch for --resume
    "rescorer propose": {"threads", "device", "quiet", "resume"},
    "rescore-phrase-table": ALL,
    "cslm train": ALL,
    "cslm score": {"threads", "device", "quiet"},
    "cslm nbest": {"threads", "device", "quiet"},
    "cslm export-nplm": set(),  # copies a model's matrices into NPLM's text format
    # numpy in one process (no pool), prints only its result on stdout
    "mert optimize": {"seed"},
    # the n-best features it runs decide their own device (CSLM:model.pt loads where it can)
    "mert tune": {"threads", "quiet", "seed", "resume"},
    # its paired bootstrap is sacreBLEU's, seeded as sacreBLEU seeds it ($SACREBLEU_SEED, 12345, printed in
    # the signature), so that its p-values are the ones sacreBLEU itself reports
    "mert evaluate": {"threads", "quiet"},
    # every step is stamped and a rerun always continues (no --resume); each tuning run has its own fixed
    # seed (table1/settings.py) so that the experiment is the same experiment everywhere
    "table1": {"threads", "device"},
}


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_command_takes_the_common_options_that_mean_something_for_it(name, command):
    assert name in COMMON_OPTIONS, f"{name}: say in COMMON_OPTIONS which common options it takes, and why"
    taken = {option for option in ALL if _option(command, option) is not None}
    assert taken == COMMON_OPTIONS[name], name


# ------------------------------------------------------------------ outputs and failures

# Every output of every command: a place that cannot be written is refused while the command line is
# read, and a failed run leaves nothing it created (moses_integration.files).
OUTPUTS: dict[str, set[str]] = {
    "rescorer train": {"model_out"},
    "rescorer plot-scores": {"out_png"},
    "rescorer map-words": {"out_png"},
    "rescorer map-phrases": {"out_png"},
    "rescorer report": {"out_dir", "screenshot"},
    "rescorer rescore": {"output_table", "save_model", "moses_ini_out", "scores_parquet"},
    "rescore-phrase-table": {"output_table", "save_model", "moses_ini_out", "scores_parquet"},
    "rescorer propose": {"output_table", "moses_ini_out", "list_path"},
    "cslm train": {"model_out"},
    "cslm nbest": {"nbest_out"},
    "cslm export-nplm": {"out"},
    "mert tune": {"work_dir", "output_ini"},
    "mert evaluate": {"output_dir", "json_path"},
    "table1": {"work", "results"},
}
_OUTPUT_NAME = re.compile(r"(^|_)(out|output|save|work|results|screenshot|json_path)(_|$)")


def _looks_like_output(param: click.Parameter) -> bool:
    """A path or name parameter named like an output (``--output-rank`` is a number, not a place)."""
    kind = isinstance(param.type, (click.Path, click.types.StringParamType))
    return kind and not getattr(param.type, "exists", False) and bool(_OUTPUT_NAME.search(param.name or ""))


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_output_is_checked_and_every_command_cleans_up_after_a_failure(name, command):
    outputs = {p.name for p in command.params if isinstance(p.type, OutputPath)}
    assert outputs == OUTPUTS.get(name, set()), name
    assert {p.name for p in command.params if _looks_like_output(p)} <= outputs, name
    assert getattr(command.callback, "one_line_errors", False), f"{name}: its body must run under friendly_errors"


def _invocation(command: click.Command, output: click.Parameter, bad: str, folder: Path) -> list[str]:
    """The shortest command line that reaches ``output`` with ``bad``; every other required value is an
    existing file in ``folder`` (or ``folder`` itself where a folder is wanted)."""

    def value(param: click.Parameter) -> str:
        wants_folder = isinstance(param.type, click.Path) and not param.type.file_okay
        return str(folder if wants_folder else folder / "input.txt")

    args: list[str] = []
    for param in command.params:
        if isinstance(param, click.Argument):
            if param is output:
                args.append(bad)
                continue
            if param.required or command.params.index(param) < command.params.index(output):
                choices = getattr(param.type, "choices", None)
                args.append(str(next(iter(choices))) if choices else value(param))
    for param in command.params:
        if isinstance(param, click.Option) and (param.required or param is output):
            args += [param.opts[0], bad if param is output else value(param)]
    return args


CASES = [(name, command, param) for name, command in COMMANDS for param in command.params
         if isinstance(param.type, OutputPath)]


@pytest.mark.parametrize(("name", "command", "output"), CASES, ids=[f"{n} {p.name}" for n, _, p in CASES])
def test_an_output_that_cannot_be_written_is_one_line_before_any_work(tmp_path: Path, unwritable_folder: Path,
                                                                     name, command, output):
    (tmp_path / "input.txt").write_text("an input\n")
    bad = unwritable_folder / "new" / "out"
    before = sorted(tmp_path.rglob("*"))
    res = CliRunner().invoke(command, _invocation(command, output, str(bad), tmp_path))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: Invalid value for") and str(bad) in lines[0], res.output
    assert sorted(tmp_path.rglob("*")) == before
