"""``rescorer report``: one self-contained HTML page to judge a model against a phrase table.

It gathers what the other analysis commands show (Tables 2–3 and Figs. 3–5 of the paper) plus
the model's configuration, its training curve and a summary of the table. The page needs no
server and no network: figures are PNGs inlined as ``data:`` URIs, styles are inline, and
nothing is fetched. The PNGs are also left beside the page.

:func:`screenshot` renders a page with a headless Chromium, for the test that opens the report
in a real browser and for the screenshot in the docs.
"""

from __future__ import annotations

import base64
import html
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infrastructure.errors import UserError
from infrastructure.files import atomic_output, files_replaced_together
from moses_integration.phrase_table import no_lines_error
from neural.device import select_device
from rescorer.analysis import REPORT_FILES
from rescorer.analysis.compare import ComparedSource, compare_blocks, score_blocks
from rescorer.analysis.plots import (
    PIXELS,
    ScorePairs,
    map_phrases,
    map_words,
    plot_scores,
    plot_training_curve,
    table_log_p,
)
from rescorer.analysis.sampling import SampleResult, sample_and_search
from rescorer.model.checkpoint import Checkpoint, load_checkpoint
from rescorer.pipeline.train_or_load import FORWARD_ONLY, check_directions
from rescorer.tables.scan import DIRECT_COLUMN, TableScan, scan_table

SECTIONS = ("model", "training", "table", "frequent", "rare", "samples", "scores", "words", "phrases")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@dataclass
class ReportOptions:
    compare_sources: int = 8  # long sources per Table 2 (frequent and rare)
    min_src_words: int = 4
    sample_sources: int = 4  # sources whose samples are shown (the most frequent long ones)
    samples: int = 50
    beam: int = 5
    score_sources: int = 5000  # random sources (whole blocks) scored for the score scatter
    map_words: int = 1000
    map_phrases: int = 1000
    seed: int = 1234
    device: str = "auto"
    progress: bool = True


def _say(message: str, progress: bool) -> None:
    if progress:
        print(f"[report] {message}", file=sys.stderr, flush=True)


def build_report(
    model_path: str | os.PathLike[str], table_path: str | os.PathLike[str], out_dir: str | os.PathLike[str],
    options: ReportOptions | None = None,
) -> Path:
    """Write ``OUT_DIR/report.html`` (and its figures as PNGs) and return the page's path.

    The files of :data:`REPORT_FILES` replace those of a previous report as one set
    (:func:`files_replaced_together`): a failed or interrupted run leaves the previous page with its own
    figures, not beside those of another model.
    """
    opts = options or ReportOptions()
    with files_replaced_together(out_dir, REPORT_FILES) as staging:
        _write_report(model_path, table_path, staging, opts)
    return Path(out_dir) / "report.html"  # the command says where it wrote it


def _write_report(model_path: str | os.PathLike[str], table_path: str | os.PathLike[str], out: Path,
                  opts: ReportOptions) -> None:
    """The page and its figures, written into ``out``."""
    started = time.monotonic()
    checkpoint = load_checkpoint(model_path, map_location=select_device(opts.device))
    check_directions(checkpoint, None, advice=FORWARD_ONLY)  # a p(f|e) model's figures would be shown as p(e|f)'s
    _say(f"reading {table_path}", opts.progress)
    scan = scan_table(table_path, min_src_words=opts.min_src_words, n_chosen=opts.compare_sources,
                      n_sampled=opts.score_sources, seed=opts.seed, progress=opts.progress)
    if scan.summary.lines == 0:
        raise no_lines_error(table_path, "there is nothing to report on")
    if scan.summary.score_columns <= DIRECT_COLUMN:
        raise UserError(f"{table_path}: {scan.summary.score_columns} score columns; the direct "
                         f"probability φ(e|f) is column {DIRECT_COLUMN + 1}")
    _say(f"top targets of {len(scan.frequent)} frequent and {len(scan.rare)} rare long sources", opts.progress)
    frequent = compare_blocks(checkpoint, scan.frequent)
    rare = compare_blocks(checkpoint, scan.rare)
    _say(f"{opts.samples} samples and beam {opts.beam} for {opts.sample_sources} sources", opts.progress)
    samples = [
        sample_and_search(checkpoint.model, checkpoint.src_vocab, block.source, n=opts.samples, beam=opts.beam,
                          seed=opts.seed)
        for block in (scan.frequent + scan.rare)[: opts.sample_sources]
    ]
    figures: dict[str, tuple[str, str]] = {}  # section -> (png name, one-line description)
    lines = sum(len(block.targets) for block in scan.sampled)
    _say(f"scoring {lines:,} lines of {len(scan.sampled):,} random sources", opts.progress)
    rnn = np.concatenate(score_blocks(checkpoint, scan.sampled)) if scan.sampled else np.zeros(0)
    table = np.concatenate([table_log_p(b.scores[:, DIRECT_COLUMN]) for b in scan.sampled]) if scan.sampled else rnn
    if len(rnn) >= 2:
        figures["scores"] = ("scores.png", plot_scores(ScorePairs(table, rnn), out / "scores.png",
                                                       title=f"{len(scan.sampled):,} random source phrases"))
    history = (checkpoint.train_state or {}).get("history") or []
    if history:
        figures["training"] = ("training.png", plot_training_curve(history, out / "training.png"))
    _say(f"t-SNE of {min(opts.map_words, len(checkpoint.src_vocab) - 2)} word embeddings", opts.progress)
    figures["words"] = ("words.png", map_words(checkpoint, out / "words.png", words=opts.map_words, seed=opts.seed))
    phrases = list(dict.fromkeys(block.source for block in scan.sampled))[: opts.map_phrases]
    if len(phrases) >= 5:
        _say(f"t-SNE of {len(phrases)} phrase summaries", opts.progress)
        figures["phrases"] = ("phrases.png", map_phrases(checkpoint, phrases, out / "phrases.png", seed=opts.seed))
    page = render_html(checkpoint, scan, frequent, rare, samples, figures, out, time.monotonic() - started)
    path = out / "report.html"
    with atomic_output(path) as fh:
        fh.write(page.encode("utf-8"))


# ------------------------------------------------------------------ HTML

_STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 1em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 1.6em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.first td { border-top: 2px solid #999; }
img { max-width: 100%; border: 1px solid #eee; }
p.note { color: #555; font-size: 0.9em; }
nav a { margin-right: 1em; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[int] = (),
           first_rows: Sequence[int] = ()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        cells = "".join(
            f'<td class="num">{_e(v)}</td>' if j in numeric else f"<td>{_e(v)}</td>" for j, v in enumerate(row)
        )
        css = ' class="first"' if i in first_rows else ""
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _image(out: Path, figure: tuple[str, str] | None, alt: str) -> str:
    if figure is None:
        return '<p class="note">not available (see the note above)</p>'
    name, description = figure
    data = base64.b64encode((out / name).read_bytes()).decode("ascii")
    width, height = PIXELS
    return (f'<p class="note">{_e(description)}</p>'
            f'<img alt="{_e(alt)}" width="{width}" height="{height}" src="data:image/png;base64,{data}">')


def _compare_section(rows: Sequence[ComparedSource]) -> str:
    if not rows:
        return '<p class="note">no source phrase of this length with enough targets</p>'
    table_rows, firsts = [], []
    for row in rows:
        firsts.append(len(table_rows))
        for rank in range(max(len(row.by_table), len(row.by_rnn))):
            tm = row.by_table[rank] if rank < len(row.by_table) else ("", None)
            rnn = row.by_rnn[rank] if rank < len(row.by_rnn) else ("", None)
            table_rows.append([
                row.source if rank == 0 else "", f"{row.count:g}" if rank == 0 else "", rank + 1,
                tm[0], "" if tm[1] is None else f"{tm[1]:.3g}", rnn[0], "" if rnn[1] is None else f"{rnn[1]:.2f}",
            ])
    return _table(["source", "count", "#", "translation model", "φ(e|f)", "RNN Encoder–Decoder", "log p"],
                  table_rows, numeric=(1, 2, 4, 6), first_rows=firsts)


def _samples_section(results: Sequence[SampleResult], checkpoint: Checkpoint) -> str:
    parts = []
    for result in results:
        rows = [
            [f"{g.log_p:.2f}", g.samples, g.beam_rank or "",
             " ".join(g.words(checkpoint.tgt_vocab)) + ("" if g.finished else " … (cut)")]
            for g in result.candidates[:15]
        ]
        parts.append(f"<h3>{_e(result.source)}</h3>"
                     + _table(["log p", "samples", "beam rank", "target"], rows, numeric=(0, 1, 2)))
    return "".join(parts) or ('<p class="note">no samples: --sample-sources 0, or no source phrase of '
                              '--min-src-words words or more in the table</p>')


def render_html(
    checkpoint: Checkpoint, scan: TableScan, frequent: Sequence[ComparedSource], rare: Sequence[ComparedSource],
    samples: Sequence[SampleResult], figures: dict[str, tuple[str, str]], out: Path, seconds: float,
) -> str:
    """The page: one ``<section id=...>`` per entry of :data:`SECTIONS`."""
    config = checkpoint.config.to_dict()
    parameters = sum(p.numel() for p in checkpoint.model.parameters())
    model_rows = [[k, v] for k, v in config.items()] + [
        ["parameters", f"{parameters:,}"],
        ["source shortlist (words + [UNK])", checkpoint.src_vocab.shortlist],
        ["target shortlist (words + [UNK])", checkpoint.tgt_vocab.shortlist],
    ]
    if checkpoint.train_config is not None:
        model_rows += [[f"train: {k}", v] for k, v in checkpoint.train_config.to_dict().items()]
    state = checkpoint.train_state or {}
    if "step" in state:
        model_rows.append(["trained updates", state["step"]])
    if "elapsed" in state:
        model_rows.append(["training time (s)", f"{state['elapsed']:.0f}"])
    s = scan.summary
    table_rows = [
        ["file", s.path], ["lines (phrase pairs)", f"{s.lines:,}"], ["distinct source phrases", f"{s.sources:,}"],
        ["targets per source: mean / max", f"{s.mean_targets:.2f} / {s.max_targets}"],
        ["score columns", s.score_columns],
        ["source frequency from", "counts field" if s.has_counts else "number of targets (no counts field)"],
    ]
    words_rows = [[k, f"{s.source_words[k]:,}", f"{s.target_words[k]:,}"]
                  for k in sorted(set(s.source_words) | set(s.target_words))]
    nav = "".join(f'<a href="#{name}">{name}</a>' for name in SECTIONS)
    body = f"""
<h1>RNN Encoder–Decoder report</h1>
<p class="note">model {_e(checkpoint.path)} · table {_e(s.path)} · built in {seconds:.0f} s
by <code>rescorer report</code></p>
<nav>{nav}</nav>
<section id="model"><h2>Model</h2>{_table(["setting", "value"], model_rows)}</section>
<section id="training"><h2>Training curve</h2>
{_image(out, figures.get("training"), "validation perplexity by update step")}</section>
<section id="table"><h2>Phrase table</h2>{_table(["", ""], table_rows)}
{_table(["words", "source phrases", "target phrases (lines)"], words_rows, numeric=(0, 1, 2))}</section>
<section id="frequent"><h2>Top targets of frequent long source phrases (paper Table 2a)</h2>
<p class="note">Each source's targets in the table, ranked by the table's direct probability φ(e|f)
and by the RNN's log p(target | source).</p>{_compare_section(frequent)}</section>
<section id="rare"><h2>Top targets of rare long source phrases (paper Table 2b)</h2>
{_compare_section(rare)}</section>
<section id="samples"><h2>Samples from the RNN Encoder–Decoder (paper Table 3)</h2>
<p class="note">Distinct targets among the samples and the beam search's best, by log p;
generated without the phrase table.</p>{_samples_section(samples, checkpoint)}</section>
<section id="scores"><h2>RNN scores against the translation model (paper Fig. 3)</h2>
{_image(out, figures.get("scores"), "RNN log p against table log p")}</section>
<section id="words"><h2>Word embeddings (paper Fig. 4)</h2>
{_image(out, figures.get("words"), "t-SNE map of source word embeddings")}</section>
<section id="phrases"><h2>Phrase summaries c (paper Fig. 5)</h2>
{_image(out, figures.get("phrases"), "t-SNE map of phrase summaries")}</section>
"""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>RNN Encoder–Decoder report</title><style>{_STYLE}</style></head>"
            f"<body>{body}</body></html>\n")


# ------------------------------------------------------------------ browser


def find_browser() -> str | None:
    """A Chromium or Chrome executable on PATH, or None."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def require_browser() -> str:
    """:func:`find_browser`'s answer, or a :class:`UserError` saying what was looked for: asked before
    a report is built, so that a ``--screenshot`` that cannot be taken stops before the work, not after it."""
    found = find_browser()
    if found is None:
        raise UserError(f"--screenshot needs Chromium or Chrome on PATH (looked for {', '.join(BROWSERS)}); "
                                "install one or leave out --screenshot")
    return found


def screenshot(
    html_path: str | os.PathLike[str], png_path: str | os.PathLike[str], *, width: int = 1200, height: int = 3000,
    browser: str | None = None, timeout: float = 180.0,
) -> Path:
    """Render a local page with headless Chromium into a PNG of ``width`` × ``height`` pixels.

    A fresh profile, no sandbox (containers), no GPU and no background network traffic, so it
    runs the same on a headless build machine. The PNG is written beside its destination and
    renamed into place.
    """
    browser = browser or require_browser()
    dest = Path(png_path)
    uri = Path(html_path).resolve().as_uri()
    with tempfile.TemporaryDirectory(prefix="rescorer-chromium-") as profile:
        shot = Path(profile) / "shot.png"
        command = [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={profile}/user", f"--window-size={width},{height}",
            f"--screenshot={shot}", uri,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0 or not shot.exists():
            tail = (done.stderr or "").strip().splitlines()[-3:]
            raise UserError(f"{browser} failed (exit {done.returncode}): {' | '.join(tail)}")
        with atomic_output(dest) as fh:
            fh.write(shot.read_bytes())
    return dest
