"""``rescorer rerank-weights``: every (λ, μ)'s figures on dev text, and the weights its rule chooses."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from proposal_system import example_system, write_reverse_model
from rescorer.cli import main
from rescorer.proposals.weights import LENGTH_BAND, GridPoint, choose_point


@pytest.fixture(scope="module")
def system(tmp_path_factory) -> Path:
    """The example table, its word tables, a forward model, a reverse one trained briefly (its scores
    must differ between targets for λ to matter), and dev text: 10 sentences, each a table source and
    two more words, with references."""
    folder = tmp_path_factory.mktemp("weights")
    example_system(folder)
    write_reverse_model(folder / "phrase-table.gz", folder / "reverse.pt")
    lines = gzip.decompress((folder / "phrase-table.gz").read_bytes()).decode().splitlines()
    pairs = [line.split(" ||| ")[:2] for line in lines[::40]]
    (folder / "dev.en").write_text("".join(f"{s} the budget\n" for s, _ in pairs))
    (folder / "dev.fr").write_text("".join(f"{t} le budget\n" for _, t in pairs))
    return folder


def _cli(system: Path, *extra: str, reverse: str = "reverse.pt", reference: str = "dev.fr",
         table: str = "phrase-table.gz"):
    return CliRunner().invoke(main, [
        "rerank-weights", str(system / table), "--model", str(system / "model.pt"), "--reverse-model",
        str(system / reverse), "--text", str(system / "dev.en"), "--reference", str(system / reference),
        "--per-source", "1", "--device", "cpu", "--threads", "1", *extra])


def test_the_rule_takes_the_most_in_the_reference_within_the_length_band_and_says_so() -> None:
    """Within 20% of the table's same-length ratio the most in the reference wins, even against a
    point outside the band that finds more; ties go to the smaller weights; with none inside, the
    most in the reference over all, and the line says that none was within."""
    points = [GridPoint(0.0, 0.0, 0.66, 0.119), GridPoint(0.5, 0.0, 0.82, 0.065),
              GridPoint(1.0, 0.0, 0.89, 0.043), GridPoint(0.25, 1.0, 1.0, 0.065), GridPoint(1.5, 2.0, 1.21, 0.9)]
    best, line = choose_point(points)
    assert (best.reverse, best.length) == (0.5, 0.0)  # 0.065 ties with λ 0.25, μ 1: smaller weights
    assert line.startswith("chosen: λ 0.5, μ 0 (within 20% of the length ratio") and "6.5% of missing" in line
    assert LENGTH_BAND == 0.2
    best, line = choose_point([GridPoint(0.0, 0.0, 0.5, 0.1), GridPoint(1.0, 0.0, 0.7, 0.05)])
    assert (best.reverse, best.length, best.within) == (0.0, 0.0, False)
    assert "(none within 20%" in line


def test_it_prints_every_point_and_chooses_by_the_rule_from_the_figures_it_printed(system) -> None:
    """Each (λ, μ) of the grid gets a line; the choice is the rule applied to those printed figures
    (the band from the printed percentage, the share from the printed counts); the plain beam and
    the search's speeds are measured too; ``--measure`` prints the same figures and chooses nothing."""
    result = _cli(system, "--reverse-grid", "0,0.5,1.5", "--length-grid", "0,2", "--plain-beam", "4",
                  "--sentences", "50")
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    assert out[0].startswith("dev.en: 10 sentences; ") and " sources to fill (" in out[0]  # --sentences 50 of 10 lines
    assert re.match(r"plain beam 4 \(no reverse model\): [\d.]+ sources/s; \d+ proposals", out[1]), out[1]
    assert re.match(r"collecting beam 40: [\d.]+ sources/s, \d+ candidates per source; reverse model: ", out[2])
    printed = {}
    for line in out:
        found = re.match(r"  λ (\S+), μ (\S+): \d+ proposals, .*, (\d+)%\); missing: (\d+) of (\d+) in", line)
        if found:
            lam, mu, pct, hit, of = found.groups()
            printed[float(lam), float(mu)] = (int(pct), int(hit) / int(of))
    assert sorted(printed) == [(0.0, 0.0), (0.0, 2.0), (0.5, 0.0), (0.5, 2.0), (1.5, 0.0), (1.5, 2.0)]
    assert len(set(printed.values())) > 1  # the reverse model's weight changes which targets are proposed
    within = {k: v for k, v in printed.items() if 80 <= v[0] <= 120} or printed
    lam, mu = max(within, key=lambda k: (within[k][1], -k[0] - k[1]))
    assert out[-1].startswith(f"chosen: λ {lam:g}, μ {mu:g} (")

    measured = _cli(system, "--reverse-grid", "0,0.5,1.5", "--length-grid", "0,2", "--measure")
    assert measured.exit_code == 0, measured.output
    assert not any(line.startswith("chosen:") for line in measured.output.splitlines())
    assert [line for line in measured.output.splitlines() if line.startswith("  λ")] == \
        [line for line in out if line.startswith("  λ")]


def test_bad_input_is_one_line_before_the_search(system, tmp_path) -> None:
    """A reference a line short, a forward model as the reverse one, a missing word table: one line
    each, naming the file (and the line), exit 1, nothing searched."""
    (system / "short.fr").write_text("".join((system / "dev.fr").read_text().splitlines(keepends=True)[:-1]))
    result = _cli(system, reference="short.fr")
    said = r"short\.fr:10: the reference has 9 lines but the text \S*dev\.en has 10$"
    assert result.exit_code == 1 and re.search(said, result.output.strip()), result.output
    result = _cli(system, reverse="model.pt")
    assert result.exit_code == 1 and "model.pt: a forward model (it scores p(e|f))" in result.output
    result = _cli(system, "--lex-e2f", str(tmp_path / "none.e2f"))
    assert result.exit_code == 1 and "none.e2f" in result.output and "sources to fill" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_a_table_with_no_lines_is_one_line_naming_it(system) -> None:
    """It was a ZeroDivisionError traceback from the table's target words per source word."""
    (system / "empty.gz").write_bytes(gzip.compress(b""))
    result = _cli(system, "--lex-e2f", str(system / "lex.e2f"), "--lex-f2e", str(system / "lex.f2e"),
                  table="empty.gz")
    assert result.exit_code == 1
    assert result.output == (f"Error: {system / 'empty.gz'}: the table holds no phrase-table lines; there are no "
                             "pairs to measure proposals against\n")


def test_nothing_to_measure_is_one_line_not_a_choice(system) -> None:
    """An empty text and reference, or a text with no source to fill, printed "0 proposals" at every point
    and then "chosen: λ 0, μ 0", exit 0."""
    (system / "empty.en").write_text("")
    (system / "empty.fr").write_text("")
    result = CliRunner().invoke(main, [
        "rerank-weights", str(system / "phrase-table.gz"), "--model", str(system / "model.pt"), "--reverse-model",
        str(system / "reverse.pt"), "--text", str(system / "empty.en"), "--reference", str(system / "empty.fr"),
        "--per-source", "1", "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 1
    assert result.output == (f"Error: {system / 'empty.en'}: the text holds no lines; there are no sentences to "
                             "measure the proposals on\n")
    (system / "unknown.en").write_text("zzqx\n")
    (system / "unknown.fr").write_text("zzqx\n")
    result = CliRunner().invoke(main, [
        "rerank-weights", str(system / "phrase-table.gz"), "--model", str(system / "model.pt"), "--reverse-model",
        str(system / "reverse.pt"), "--text", str(system / "unknown.en"), "--reference", str(system / "unknown.fr"),
        "--per-source", "1", "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {system / 'unknown.en'}: no n-gram of the text is a source propose "
                                    "--for-text would fill (missing or thin in ")
    assert len(result.output.splitlines()) == 1 and "chosen" not in result.output


@pytest.mark.parametrize("option, width", [("--beam", "1"), ("--plain-beam", "3")])
def test_more_per_source_than_a_beam_keeps_is_refused_as_propose_refuses_it(system, option, width) -> None:
    """``--beam 1`` with the default ``--per-source 5`` ran and chose weights from proposals it could not make."""
    result = CliRunner().invoke(main, [
        "rerank-weights", str(system / "phrase-table.gz"), "--model", str(system / "model.pt"), "--reverse-model",
        str(system / "reverse.pt"), "--text", str(system / "dev.en"), "--reference", str(system / "dev.fr"),
        option, width, "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 1
    assert result.output == f"Error: --per-source 5 is more than the beam keeps ({option} {width})\n"
