"""``rescorer report``: one self-contained HTML page with every section, and a real browser's view of it."""

from __future__ import annotations

import gzip
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from analysis_checkpoint import EXAMPLE_TABLE, png_size, write_random_checkpoint
from rescorer.analysis import report as report_module
from rescorer.analysis.report import SECTIONS, ReportOptions, build_report, find_browser, screenshot
from rescorer.cli import main

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
# What the trainer stores per validation (step, mean log-likelihood per pair, perplexity per token).
HISTORY = [{"step": 0, "log_likelihood": -40.0, "perplexity": 3000.0},
           {"step": 100, "log_likelihood": -30.0, "perplexity": 400.0},
           {"step": 200, "log_likelihood": -25.0, "perplexity": 150.0}]
SMALL = ReportOptions(compare_sources=3, min_src_words=2, sample_sources=2, samples=10, beam=2, score_sources=100,
                      map_words=50, map_phrases=50, progress=False)


class StrictChecker(HTMLParser):
    """Every element closed in order, ids unique, images inline: the structure a browser should
    not have to repair."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.ids: list[str] = []
        self.images: list[str] = []
        self.errors: list[str] = []
        self.doctype = False

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl.lower() == "doctype html"

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if "id" in attributes:
            self.ids.append(attributes["id"] or "")
        if tag == "img":
            self.images.append(attributes.get("src") or "")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'} at {self.getpos()}")
        else:
            self.stack.pop()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    model = write_random_checkpoint(EXAMPLE_TABLE, folder / "model.pt", history=HISTORY)
    return build_report(model, EXAMPLE_TABLE, folder / "out", SMALL)


def test_report_is_valid_self_contained_html_with_every_section(report):
    page = report.read_text(encoding="utf-8")
    checker = StrictChecker()
    checker.feed(page)
    checker.close()
    assert checker.doctype and not checker.errors and not checker.stack
    assert len(checker.ids) == len(set(checker.ids))
    assert set(SECTIONS) <= set(checker.ids)
    # Five figures (training, scores, words, phrases; no figure missing), all inlined PNGs.
    assert len(checker.images) == 4 and all(src.startswith("data:image/png;base64,") for src in checker.images)
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing to fetch
    assert "all canadians" in page or "government" in page  # real phrases of the table
    assert "best 150.0 at step 200" not in page  # the curve is an image; its caption:
    assert "3 validations, best perplexity 150.00 at step 200" in page
    assert "366" in page  # the table's line count in the summary
    for name in ("training.png", "scores.png", "words.png", "phrases.png"):
        assert (report.parent / name).stat().st_size > 1000


def test_report_cli_and_bad_table(tmp_path):
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    bad = tmp_path / "bad.txt"
    bad.write_text("a ||| b ||| 0.5 0.5 0.5 0.5\nc ||| d\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["report", str(model), str(bad), str(tmp_path / "out"), "--quiet"])
    assert result.exit_code == 1 and f"{bad}:2" in result.output
    assert not (tmp_path / "out" / "report.html").exists()


def test_report_in_a_real_headless_browser(report, tmp_path):
    browser = find_browser()
    if browser is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium); the screenshot test needs one")
    import matplotlib.image
    shot = screenshot(report, tmp_path / "report.png", width=1000, height=1400, browser=browser)
    assert png_size(shot) == (1000, 1400)
    pixels = matplotlib.image.imread(shot)[..., :3]
    # The page rendered: dark text on the white background, and the colours of a figure.
    assert (pixels.mean(axis=2) < 0.3).mean() > 0.002
    assert (pixels.max(axis=2) - pixels.min(axis=2) > 0.3).mean() > 0.001


def test_an_empty_table_says_so(tmp_path: Path) -> None:
    """It said "0 score columns; the direct probability φ(e|f) is column 3", which points at the columns."""
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    empty = tmp_path / "empty.gz"
    empty.write_bytes(gzip.compress(b""))
    res = CliRunner().invoke(main, ["report", str(model), str(empty), str(tmp_path / "rep"), "-q"])
    assert res.exit_code == 1
    assert res.output == f"Error: {empty}: the table holds no phrase-table lines; there is nothing to report on\n"
    assert not (tmp_path / "rep").exists()


def test_the_command_says_once_where_it_wrote_the_page(tmp_path: Path) -> None:
    """``wrote OUT_DIR/report.html`` once: the command says it, not the library as well."""
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    res = CliRunner().invoke(main, ["report", str(model), str(EXAMPLE_TABLE), str(tmp_path / "rep"), "--sources", "3",
                                    "--min-src-words", "2", "--sample-sources", "1", "-n", "5", "--beam", "2",
                                    "--score-sources", "50", "--map-words", "20", "--map-phrases", "20",
                                    "--device", "cpu"])
    assert res.exit_code == 0, res.output
    wrote = [line for line in res.output.splitlines() if "wrote" in line]
    assert wrote == [f"wrote {tmp_path / 'rep' / 'report.html'}"], res.output
    assert "[report] t-SNE of" in res.output  # the progress messages before it stay


def test_screenshot_without_chromium_stops_before_the_work(tmp_path: Path, monkeypatch) -> None:
    """It built the whole report, then failed; now nothing is read or written."""
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser here
    res = CliRunner().invoke(main, ["report", str(model), str(EXAMPLE_TABLE), str(tmp_path / "rep"),
                                    "--screenshot", str(tmp_path / "shot.png")])
    assert res.exit_code == 1
    assert res.output.startswith("Error: --screenshot needs Chromium or Chrome on PATH (looked for chromium, ")
    assert len(res.output.splitlines()) == 1  # not even the first progress line: no work was done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


@pytest.mark.parametrize(("name", "which"), [("scores.png", "table"), ("report.html", "model")])
def test_an_input_under_a_name_the_report_writes_in_out_dir_is_refused(tmp_path: Path, name: str, which: str) -> None:
    """OUT_DIR/report.html and the figures are replaced by name: an input there under one of those names was
    overwritten. Refused in one line before any work, as every command's output on its input is."""
    out = tmp_path / "rep"
    out.mkdir()
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    inputs = {"model": model, "table": EXAMPLE_TABLE}
    moved = out / name
    moved.write_bytes(Path(inputs[which]).read_bytes())
    inputs[which] = moved
    before = moved.read_bytes()
    res = CliRunner().invoke(main, ["report", str(inputs["model"]), str(inputs["table"]), str(out), "-q"])
    assert res.exit_code == 1
    label = "PHRASE_TABLE" if which == "table" else "MODEL"
    assert res.output == (f"Error: output {moved} (written with OUT_DIR) is the input {label} {moved}; "
                          "write it elsewhere\n")
    assert moved.read_bytes() == before and [p.name for p in out.iterdir()] == [name]


def test_an_interrupted_report_leaves_the_previous_one_whole(report: Path, tmp_path: Path, monkeypatch) -> None:
    """A Ctrl-C once some figures were drawn left the previous page beside the new model's figures; now the
    previous report stays byte for byte, with nothing beside it, and a finished one replaces it whole (a
    model without a training history leaves no training curve of the previous model behind)."""
    out = tmp_path / "out"
    shutil.copytree(report.parent, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "other.pt", seed=6)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(report_module, "map_phrases", interrupted)  # the last figure, after the others are drawn
        with pytest.raises(KeyboardInterrupt):
            build_report(model, EXAMPLE_TABLE, out, SMALL)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    build_report(model, EXAMPLE_TABLE, out, SMALL)
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(after) == ["phrases.png", "report.html", "scores.png", "words.png"]
    assert after["report.html"] != before["report.html"]


def test_a_reverse_model_is_refused_as_rescore_refuses_it(tmp_path: Path) -> None:
    """A p(f|e) model's figures were shown as the p(e|f) model's, exit 0."""
    reverse = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "rev.pt", direction="reverse")
    res = CliRunner().invoke(main, ["report", str(reverse), str(EXAMPLE_TABLE), str(tmp_path / "rep"), "-q"])
    assert res.exit_code == 1
    assert res.output == (f"Error: {reverse}: a reverse model (it scores p(f|e), from rescorer train --reverse): "
                          "MODEL must be a forward model (rescorer train without --reverse)\n")
    assert not (tmp_path / "rep").exists()


def test_a_report_without_samples_says_why(tmp_path: Path) -> None:
    """``--sample-sources 0`` leaves the samples out, and the page says so (it said there was no long source
    phrase to sample from); ``-n 0 --beam 0`` with sources to sample is one line before any work."""
    model = write_random_checkpoint(EXAMPLE_TABLE, tmp_path / "model.pt")
    common = [str(model), str(EXAMPLE_TABLE), str(tmp_path / "rep"), "-q", "--device", "cpu"]
    res = CliRunner().invoke(main, ["report", *common, "-n", "0", "--beam", "0"])
    assert res.exit_code == 1 and res.output.splitlines() == [
        "Error: -n 0 and --beam 0: nothing to show for --sample-sources; give -n or --beam, or --sample-sources 0; "
        "see 'main report --help'"]
    assert not (tmp_path / "rep").exists()
    options = ReportOptions(compare_sources=3, min_src_words=2, sample_sources=0, score_sources=20, map_words=20,
                            map_phrases=20, progress=False)
    page = build_report(model, EXAMPLE_TABLE, tmp_path / "rep", options).read_text()
    samples = page[page.index('<section id="samples">'):].split("</section>")[0]
    assert "<h3>" not in samples and "no samples: --sample-sources 0" in samples
