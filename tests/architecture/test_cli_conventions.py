"""One set of CLI conventions across every command (docs/architecture.md): the common options are
spelled, defaulted and documented the same way wherever they appear, each command takes those that
mean something for it, and every output is checked while the command line is read."""

from __future__ import annotations

import ast
import importlib
import os
import re
import traceback
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from cslm.cli import main as cslm_main
from infrastructure.cli_options import (
    DEFAULT_SEED,
    Command,
    DeviceName,
    FiniteFloat,
    Group,
    IntRange,
    NumberList,
    OneLinePath,
    OutputPath,
    friendly_errors,
    is_input,
    parameter_label,
    use_threads,
)
from infrastructure.errors import UserError
from mert.cli import main as mert_main
from nmt.cli import main as nmt_main
from rescorer.cli import main as rescorer_main
from rescorer.cli import rescore_phrase_table_command
from table1.cli import main as table1_main

ROOTS = {"rescorer": rescorer_main, "rescore-phrase-table": rescore_phrase_table_command, "cslm": cslm_main,
         "nmt": nmt_main, "mert": mert_main, "table1": table1_main}


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
    if threads is not None:  # absent means all CPUs; the option applies it (use_threads), not the command body
        assert threads.opts == ["--threads"] and threads.default is None and threads.callback is use_threads, name
    device = _option(command, "device")
    if device is not None:
        assert device.opts == ["--device"] and device.default == "auto", name
        assert isinstance(device.type, DeviceName), f"{name}: --device is checked by DeviceName"
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


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:-1", "mps", "meta", "CPU"])
def test_a_device_torch_cannot_take_is_one_line_while_the_command_line_is_read(bad):
    """``--device gpu`` was torch's RuntimeError, and ``--device meta`` its NotImplementedError after the
    data was prepared; every command with ``--device`` now says what it takes, before any work."""
    with_device = [name for name, command in COMMANDS if _option(command, "device") is not None]
    assert len(with_device) >= 10
    for name in with_device:
        res = _invoke_as_typed(name, "--device", bad)
        assert res.exit_code == 1 and res.output == (f"Error: Invalid value for '--device': {bad!r} is not one of "
                                                     "auto, cpu, cuda or cuda:N.\n"), (name, res.output)


def test_an_output_that_cannot_be_stdout_refuses_the_dash():
    """``nmt train SRC TGT -`` wrote a model into a file named ``-`` (and ``-.last``): ``-`` is stdout
    everywhere, so an output that cannot go there says so in one line."""
    refused = []
    for name, command in COMMANDS:
        for param in command.params:
            if isinstance(param.type, OutputPath) and not param.type.allow_dash:
                with pytest.raises(click.ClickException, match="'-' means standard output, which this"):
                    param.type.convert("-", param, None)
                refused.append((name, param.name))
    assert ("nmt train", "model_out") in refused and ("mert evaluate", "json_path") in refused


def test_an_input_that_cannot_be_stdin_says_so_for_the_dash(tmp_path, monkeypatch):
    """``cslm train - m.pt`` said "File '-' does not exist", as if a file named ``-`` were wanted; such a
    file is still read where there is one."""
    monkeypatch.chdir(tmp_path)
    refused = []
    for name, command in COMMANDS:
        for param in command.params:
            if isinstance(param.type, OneLinePath) and param.type.exists and not param.type.allow_dash:
                with pytest.raises(click.ClickException, match="'-' means standard input, which this input cannot"):
                    param.type.convert("-", param, None)
                refused.append((name, param.name))
    assert {("cslm train", "corpus"), ("mert optimize", "nbest"), ("mert evaluate", "hyps")} <= set(refused)
    (tmp_path / "-").write_text("a file named -\n")
    param = dict((p.name, p) for p in dict(COMMANDS)["cslm train"].params)["corpus"]
    assert os.fspath(param.type.convert("-", param, None)) == "-"


def test_a_learning_rate_past_what_float32_holds_is_one_line():
    """``--lr 1e39`` was torch's "cannot be converted to type float without overflow" after the data was
    prepared, and left MODEL and MODEL.last behind."""
    with_lr = [(name, _option(command, "lr")) for name, command in COMMANDS if _option(command, "lr") is not None]
    assert {name for name, _ in with_lr} >= {"cslm train", "nmt train"}
    for name, option in with_lr:
        with pytest.raises(click.ClickException, match="1e\\+39 is not in the range 0<x<=3.40"):
            option.type.convert("1e39", option, None)
        assert option.type.convert("0.5", option, None) == 0.5, name


def test_short_options_are_not_reused_with_another_meaning():
    meaning: dict[str, set[str]] = {}
    for _, command in COMMANDS:
        for param in command.params:
            for opt in getattr(param, "opts", []):
                if opt.startswith("-") and not opt.startswith("--"):
                    meaning.setdefault(opt, set()).add(param.name)
    assert all(len(names) == 1 for names in meaning.values()), meaning


def test_an_option_has_one_shape_in_every_command():
    """``--json`` means "print JSON instead of text" wherever it is (``mert evaluate`` writes its JSON file with
    ``--report PATH``), and a list of names is a repeated option (``table1 --config``, ``mert evaluate --ref``),
    not one string of them."""
    json_options = [(name, p) for name, command in COMMANDS for p in command.params if "--json" in p.opts]
    assert json_options and all(isinstance(p, click.Option) and p.is_flag for _, p in json_options), \
        [name for name, p in json_options if not getattr(p, "is_flag", False)]
    assert _option(dict(COMMANDS)["table1"], "configs").multiple


def test_old_spellings_still_work(tmp_path):
    """``mert tune --continue`` (now ``--resume``) keeps working."""
    tune = dict(COMMANDS)["mert tune"]
    assert "--continue" in _option(tune, "resume").opts
    assert "--output-ini" in _option(tune, "output_ini").opts


def test_rescore_is_also_a_rescorer_subcommand():
    result = CliRunner().invoke(rescorer_main, ["rescore", "--help"])
    assert result.exit_code == 0 and "--moses-ini-out" in result.output


def _invoke_as_typed(name: str, *args: str) -> Result:
    """``name`` (``rescorer train``) with ``args``, run from its console script's name, as a user types it."""
    root, *sub = name.split()
    return CliRunner().invoke(ROOTS[root], [*sub, *args], prog_name=root)


def test_every_command_is_of_the_common_classes():
    """The classes that make a usage mistake one line: a command made with plain ``click.command`` would not."""
    assert all(isinstance(root, (Group, Command)) for root in ROOTS.values())
    assert [name for name, command in COMMANDS if not isinstance(command, Command)] == []


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_a_usage_mistake_is_one_line_and_exit_1_like_a_bad_value(name, command):
    """README: a bad value is one line and exit 1. So are an unknown option and a missing argument, not
    click's usage screen (three lines, exit 2): one line that names the command's --help."""
    res = _invoke_as_typed(name, "--no-such-option")
    assert (res.exit_code, res.output) == (1, f"Error: No such option '--no-such-option'; see '{name} --help'\n")
    required = [p for p in command.params if p.required]
    if required:
        res = _invoke_as_typed(name)
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        assert res.output.startswith("Error: Missing ") and res.output.endswith(f"; see '{name} --help'\n")


def test_options_that_go_together_given_apart_are_one_line(tmp_path: Path):
    """``--moses-ini`` without ``--moses-ini-out``, a pair that only the command's body can check."""
    (tmp_path / "pt").write_text("a ||| b ||| 0.5\n")
    (tmp_path / "moses.ini").write_text("[feature]\n")
    res = _invoke_as_typed("rescore-phrase-table", str(tmp_path / "pt"), str(tmp_path / "out.gz"),
                           "--moses-ini", str(tmp_path / "moses.ini"))
    assert (res.exit_code, res.output) == (1, "Error: --moses-ini and --moses-ini-out go together; "
                                              "see 'rescore-phrase-table --help'\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["moses.ini", "pt"]


def test_a_group_without_a_subcommand_still_shows_its_help():
    res = _invoke_as_typed("rescorer")
    assert "Commands:" in res.output and "Error" not in res.output


def test_every_option_says_what_it_does():
    """``--help`` says what each option does, not only its default (``compare --min-src-words``,
    ``report --beam``, ``cslm train --optimizer``, …)."""
    silent = [f"{name} {p.opts[0]}" for name, command in COMMANDS for p in command.params
              if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert silent == []


def test_every_subcommand_is_described_by_a_sentence():
    """A group's ``--help`` lists its subcommands, each with a sentence (not a lowercase fragment)."""
    for root in ROOTS.values():
        for name, sub in getattr(root, "commands", {}).items():
            described = sub.get_short_help_str(limit=1000)
            assert described[:1] == described[:1].upper() and described.endswith("."), (name, described)


def test_an_option_of_a_set_form_shows_the_form():
    """``--shard K/N``, not ``--shard TEXT``."""
    shown = _invoke_as_typed("rescore-phrase-table", "--help").output
    assert re.search(r"--shard K/N\s", shown), shown


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
    # prints its figures only, on stdout; a dev set's search takes minutes, not hours
    "rescorer rerank-weights": {"threads", "device"},
    "rescore-phrase-table": ALL,
    "cslm train": ALL,
    "cslm score": {"threads", "device", "quiet"},
    "cslm nbest": {"threads", "device", "quiet"},
    "cslm export-nplm": set(),  # copies a model's matrices into NPLM's text format
    "nmt train": ALL,
    "nmt translate": {"threads", "device", "quiet"},  # the beam search draws nothing
    "nmt score": {"threads", "device"},  # prints its result only, on stdout
    "nmt nbest": {"threads", "device", "quiet"},
    # threads: start points optimised at once (the same result); prints only its result on stdout
    "mert optimize": {"threads", "seed"},
    # the n-best features it runs decide their own device (CSLM:model.pt loads where it can)
    "mert tune": {"threads", "quiet", "seed", "resume"},
    # its paired bootstrap is sacreBLEU's, seeded as sacreBLEU seeds it ($SACREBLEU_SEED, 12345, printed in
    # the signature), so that its p-values are the ones sacreBLEU itself reports
    "mert evaluate": {"threads", "quiet", "resume"},  # resume: a stopped run keeps the decodes it finished
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
# read, and a failed run leaves nothing it created (infrastructure.files).
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
    "nmt train": {"model_out"},
    "nmt translate": {"out"},
    "nmt nbest": {"nbest_out"},
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


# ------------------------------------------------------------------ no output is one of the inputs
#
# Every output of every command is compared with every input of the same command (and with its other
# outputs) by file identity before any work: an output that is the input --model, even through a hard
# link or a symlink, would destroy it.


def _inputs(command: click.Command) -> list[click.Parameter]:
    return [p for p in command.params if is_input(p)]


def _command_line(command: click.Command, given: dict[str, str], folder: Path) -> list[str]:
    """A command line with ``given`` (parameter name -> value); every other required value (and every
    argument before a given one) is ``folder/input.txt``, ``folder`` where a folder is wanted, the first
    choice, or a path of its own for an output."""

    def filler(param: click.Parameter) -> str:
        choices = getattr(param.type, "choices", None)
        if choices:
            return str(next(iter(choices)))
        if isinstance(param.type, OutputPath):
            return str(folder / f"{param.name}.out")
        wants_folder = isinstance(param.type, click.Path) and not param.type.file_okay
        return str(folder if wants_folder else folder / "input.txt")

    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    last_given = max((k for k, p in enumerate(arguments) if p.name in given), default=-1)
    args = [given.get(p.name, filler(p)) for k, p in enumerate(arguments)
            if p.name in given or p.required or k < last_given]
    for param in command.params:
        if isinstance(param, click.Option) and (param.name in given or param.required):
            args += [param.opts[0], given.get(param.name, filler(param))]
    return args


def _takes(param: click.Parameter, folder: bool) -> bool:
    path = param.type
    return isinstance(path, click.Path) and (path.dir_okay if folder else path.file_okay)


IDENTITY_CASES = [(name, command, output, source) for name, command in COMMANDS
                  for output in command.params if isinstance(output.type, OutputPath)
                  for source in _inputs(command) if _takes(source, output.type.folder)]


@pytest.mark.parametrize(("name", "command", "output", "source"), IDENTITY_CASES,
                         ids=[f"{n} {o.name} {i.name}" for n, _, o, i in IDENTITY_CASES])
def test_an_output_that_is_an_input_is_refused_in_one_line_naming_both(tmp_path: Path, monkeypatch, name, command,
                                                                       output, source):
    """The output is a hard link to the input (a symlink for a folder): refused, and the input is intact."""
    monkeypatch.chdir(tmp_path)  # outputs with a relative default (mert tune's work/) stay in here
    (tmp_path / "input.txt").write_text("an input\n")
    kept = tmp_path / "kept"
    if output.type.folder:
        kept.mkdir()
        (kept / "inside.txt").write_text("a file the user had\n")
        (tmp_path / "link").symlink_to(kept, target_is_directory=True)
    else:
        kept.write_text("what the user had\n")
        os.link(kept, tmp_path / "link")
    before = sorted((p.relative_to(tmp_path), p.is_file() and p.read_bytes()) for p in tmp_path.rglob("*"))
    given = {source.name: str(kept), output.name: str(tmp_path / "link")}
    res = CliRunner().invoke(command, _command_line(command, given, tmp_path))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert lines == [f"Error: output {tmp_path / 'link'} ({parameter_label(output)}) is the input "
                     f"{parameter_label(source)} {kept}; write it elsewhere"], res.output
    assert sorted((p.relative_to(tmp_path), p.is_file() and p.read_bytes()) for p in tmp_path.rglob("*")) == before


PAIRS_OF_OUTPUTS = [(name, command, first, second) for name, command in COMMANDS
                    for k, first in enumerate(command.params) if isinstance(first.type, OutputPath)
                    for second in command.params[k + 1:]
                    if isinstance(second.type, OutputPath) and first.type.folder == second.type.folder]


@pytest.mark.parametrize(("name", "command", "first", "second"), PAIRS_OF_OUTPUTS,
                         ids=[f"{n} {a.name} {b.name}" for n, _, a, b in PAIRS_OF_OUTPUTS])
def test_two_outputs_on_one_path_are_refused(tmp_path: Path, monkeypatch, name, command, first, second):
    """``rescore-phrase-table t.gz out.gz --save-model out.gz`` would leave the table where the model was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.txt").write_text("an input\n")
    same = tmp_path / "sub" / ".." / "same"  # not there yet, and spelled two ways
    given = {first.name: str(tmp_path / "same"), second.name: str(same)}
    res = CliRunner().invoke(command, _command_line(command, given, tmp_path))
    assert res.exit_code == 1, (res.output, res.exception)
    assert res.output.strip().splitlines() == [
        f"Error: output {same} ({parameter_label(second)}) is also the output {parameter_label(first)} "
        f"{tmp_path / 'same'}; give each output its own path"], res.output
    assert not (tmp_path / "same").exists()


def test_the_cases_that_destroyed_data_are_refused(tmp_path: Path, monkeypatch):
    """Command lines whose output is an input or another output: each is one line, every file kept."""
    monkeypatch.chdir(tmp_path)
    Path("t.txt").write_text("a ||| b ||| 0.5 0.5 0.5 0.5\n")
    Path("m.pt").write_bytes(b"a model")
    Path("moses.ini").write_text("[feature]\n")
    rescore = rescore_phrase_table_command
    runs = {
        "--model m.pt": (rescore, ["t.txt", "m.pt", "--model", "m.pt"],
                         "output m.pt (OUTPUT_TABLE) is the input --model m.pt"),
        "--save-model": (rescore, ["t.txt", "out.gz", "--save-model", "out.gz"],
                         "output out.gz (--save-model) is also the output OUTPUT_TABLE out.gz"),
        "--moses-ini-out": (rescore, ["t.txt", "out.gz", "--model", "m.pt", "--moses-ini", "moses.ini",
                                      "--moses-ini-out", "moses.ini"],
                            "output moses.ini (--moses-ini-out) is the input --moses-ini moses.ini"),
        "train t t": (rescorer_main, ["train", "t.txt", "t.txt", "--max-steps", "1"],
                      "output t.txt (MODEL_OUT) is the input PHRASE_TABLE t.txt"),
    }
    for case, (command, args, message) in runs.items():
        res = CliRunner().invoke(command, args)
        assert res.exit_code == 1 and res.output.startswith(f"Error: {message}; "), (case, res.output)
    assert Path("m.pt").read_bytes() == b"a model" and Path("moses.ini").read_text() == "[feature]\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "moses.ini", "t.txt"]


def test_files_a_command_writes_beside_or_inside_an_output_are_not_inputs_either(tmp_path: Path, monkeypatch):
    """``mert tune`` writes WORK_DIR/moses.ini at its end, the trainings MODEL.last: an input there
    would be overwritten although no output names it."""
    from mert.cli import main as mert

    monkeypatch.chdir(tmp_path)
    Path("work").mkdir()
    Path("work/moses.ini").write_text("[feature]\n")
    Path("dev.en").write_text("a\n")
    Path("dev.fr").write_text("b\n")
    Path("m.pt.last").write_text("a ||| b ||| 0.5 0.5 0.5 0.5\n")
    runs = [
        (mert, ["tune", "--moses-ini", "work/moses.ini", "--src", "dev.en", "--ref", "dev.fr", "--work-dir", "work"],
         "output work/moses.ini (written with --work-dir) is the input --moses-ini work/moses.ini"),
        (rescorer_main, ["train", "m.pt.last", "m.pt", "--max-steps", "1"],
         "output m.pt.last (written with MODEL_OUT) is the input PHRASE_TABLE m.pt.last"),
    ]
    for command, args, message in runs:
        res = CliRunner().invoke(command, args)
        assert res.exit_code == 1 and res.output.startswith(f"Error: {message}; "), res.output
    assert Path("work/moses.ini").read_text() == "[feature]\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.en", "dev.fr", "m.pt.last", "work"]


# ------------------------------------------------------------------ numbers and input files, checked as typed

NUMBER_TYPES = (click.types.IntParamType, click.types.FloatParamType)
NUMERIC = [(name, command, param) for name, command in COMMANDS for param in command.params
           if isinstance(param.type, NUMBER_TYPES)]


@pytest.mark.parametrize(("name", "command", "option"), NUMERIC, ids=[f"{n} {p.name}" for n, _, p in NUMERIC])
def test_every_number_is_checked_by_the_one_validating_type_and_help_shows_its_range(name, command, option):
    assert isinstance(option.type, (IntRange, FiniteFloat)), f"{name} {option.name}"
    help_text = command.get_help(click.Context(command, info_name=name))
    shown = option.type._describe_range()
    assert shown and shown in " ".join(help_text.split()), f"{name} {option.name}: --help does not show {shown!r}"


def _out_of_range(kind: click.ParamType) -> str:
    if isinstance(kind, IntRange):
        return str(kind.min - 1) if kind.min is not None else str(kind.max + 1)
    return "nan" if kind.min is None else str(kind.min - 1)


@pytest.mark.parametrize(("name", "command", "option"), NUMERIC, ids=[f"{n} {p.name}" for n, _, p in NUMERIC])
def test_a_number_out_of_range_is_one_line_naming_the_option(tmp_path: Path, monkeypatch, name, command, option):
    """``mert optimize --restarts -1`` was numpy's "negative dimensions are not allowed"; ``rescorer train
    --max-steps -5`` named ``TrainConfig.max_steps``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.txt").write_text("an input\n")
    bad = _out_of_range(option.type)
    res = CliRunner().invoke(command, _command_line(command, {option.name: bad}, tmp_path))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: Invalid value for '{option.opts[0]}'") \
        and bad in lines[0], res.output


def test_every_input_is_read_by_the_one_path_type():
    assert all(isinstance(p.type, OneLinePath) for _, command in COMMANDS for p in _inputs(command))


# Inputs that must exist (the others, such as propose's --lex-e2f or mert tune's --moses-bin-dir, have a
# default place that the library looks in and names when it is missing).
INPUTS = [(name, command, param) for name, command in COMMANDS for param in _inputs(command) if param.type.exists]


@pytest.mark.parametrize(("name", "command", "source"), INPUTS, ids=[f"{n} {p.name}" for n, _, p in INPUTS])
def test_a_missing_input_is_one_line_with_the_same_status_everywhere(tmp_path: Path, monkeypatch, name, command,
                                                                    source):
    """A missing --model exited 2 with a usage screen, a missing table 1; rescorer train, report and cslm score
    said ``[Errno 2] …``. Every input is now checked as it is read, the same way."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.txt").write_text("an input\n")
    missing = tmp_path / "no-such-file"
    res = CliRunner().invoke(command, _command_line(command, {source.name: str(missing)}, tmp_path))
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), (res.output, res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: Invalid value for") and str(missing) in lines[0] \
        and "does not exist" in lines[0], res.output


def test_a_missing_file_found_by_a_command_is_one_line():
    """An :class:`OSError` that a command meets is ``FILE: reason``, not Python's ``[Errno 2] …: 'FILE'``."""

    @click.command()
    @friendly_errors()
    def opens() -> None:
        open("no-such-file")  # noqa: SIM115

    res = CliRunner().invoke(opens, [])
    assert res.exit_code == 1 and res.output == "Error: no-such-file: No such file or directory\n"


def test_a_bug_raising_value_error_shows_its_traceback_not_one_line():
    """``friendly_errors`` turned any ``ValueError`` into ``Error: …``, so a bug looked like bad input and lost
    its traceback. Only a :class:`UserError` (and a named file's ``OSError``) is the user's to fix now."""

    @click.command()
    @friendly_errors()
    def buggy() -> None:
        int("not a number")  # a bug in the project, not the user's input

    res = CliRunner().invoke(buggy, [])
    assert res.exit_code == 1 and isinstance(res.exception, ValueError), (res.output, res.exception)
    assert "Error:" not in res.output
    assert "int(\"not a number\")" in "".join(traceback.format_exception(res.exception))

    @click.command()
    @friendly_errors()
    def users_mistake() -> None:
        raise UserError("corpus.txt: the corpus is empty")

    res = CliRunner().invoke(users_mistake, [])
    assert res.exit_code == 1 and res.output == "Error: corpus.txt: the corpus is empty\n"


def test_every_error_class_of_the_project_is_a_user_error():
    """One base for what a user must fix: an error class outside it would be a traceback at the command line."""
    root = Path(__file__).resolve().parents[2]
    found = []
    for package in ("infrastructure", "moses_integration", "mert", "cslm", "rescorer", "table1"):
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                    found.append(getattr(importlib.import_module(module), node.name))
    assert len(found) >= 24
    assert [cls.__qualname__ for cls in found if not issubclass(cls, UserError)] == []


def test_every_argument_that_names_a_file_is_typed_as_one():
    """An untyped file argument escapes both checks above (``rescorer train t.gz t.gz`` overwrote its table)."""
    untyped = {(name, p.name) for name, command in COMMANDS for p in command.params
               if isinstance(p, click.Argument) and p.type is click.STRING}
    assert untyped == set()  # rescorer sample's SOURCE, a phrase, is a PhraseText


LISTS = {("cslm train", "hidden"): ["0,5", "a", "16,,8"], ("mert optimize", "ranges"): ["1,0", "1", "0,nan"],
         ("rescorer rerank-weights", "reverse_grid"): ["0,,1", "inf", "a"],
         ("rescorer rerank-weights", "length_grid"): ["0,nan", ""]}


def test_lists_of_numbers_are_checked_as_typed_in_one_line(tmp_path: Path, monkeypatch):
    """``cslm train --hidden 0`` and ``mert optimize --ranges 1,0`` were usage screens with exit 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.txt").write_text("an input\n")
    found = {(name, p.name) for name, command in COMMANDS for p in command.params if isinstance(p.type, NumberList)}
    assert found == set(LISTS)
    for (name, option), values in LISTS.items():
        command = dict(COMMANDS)[name]
        for bad in values:
            res = CliRunner().invoke(command, _command_line(command, {option: bad}, tmp_path))
            assert res.exit_code == 1, (name, bad, res.output)
            lines = res.output.strip().splitlines()
            flag = "--" + option.replace("_", "-")
            assert len(lines) == 1 and lines[0].startswith(f"Error: Invalid value for '{flag}'"), res.output
