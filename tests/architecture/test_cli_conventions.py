"""One set of CLI conventions across every command (docs/architecture.md): the common options are
spelled, defaulted and documented the same way wherever they appear."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from cslm.cli import main as cslm_main
from mert.cli import main as mert_main
from moses_integration.cli_options import DEFAULT_SEED
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
