"""Figures of what the model learned: score scatter (the paper's Fig. 3), word and phrase maps
(Figs. 4–5) and the training curve. Headless: matplotlib's object API (``Figure``, drawn by
Agg), never pyplot, so no display, no GUI backend and no global figure state are involved.

Every figure is ``FIGSIZE`` inches at ``DPI``, saved without cropping, so its pixel size is
known in advance (:data:`PIXELS`) and a report can lay it out.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from infrastructure.errors import UserError
from infrastructure.files import atomic_output, display_name
from moses_integration.phrase_table import LOG_FLOOR, SEPARATOR, iter_lines
from moses_integration.tokens import split_tokens
from rescorer.analysis.sampling import encode_phrases
from rescorer.model.checkpoint import Checkpoint
from rescorer.pipeline.scoring import PairScorer
from rescorer.tables.scan import DIRECT_COLUMN

FIGSIZE = (8.0, 6.0)
DPI = 100
PIXELS = (int(FIGSIZE[0] * DPI), int(FIGSIZE[1] * DPI))  # (width, height) of every PNG written here
SCATTER_LIMIT = 200_000  # more points than this are drawn as a 2-D histogram
MAX_LABELS = 150


def _figure():
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    return fig, fig.subplots()


def _save(fig: Figure, out_png: str | os.PathLike[str]) -> None:
    """Write the figure atomically: a killed run leaves no half-written PNG."""
    with atomic_output(out_png) as fh:
        fig.savefig(fh, format="png", dpi=DPI)


@dataclass
class ScorePairs:
    """Table log p (Moses' floor at −100 applied) and RNN log p of the same phrase pairs."""

    table_log_p: np.ndarray
    rnn_log_p: np.ndarray

    @property
    def pearson(self) -> float:
        if len(self.rnn_log_p) < 2:
            return float("nan")
        return float(np.corrcoef(self.table_log_p, self.rnn_log_p)[0, 1])


def table_log_p(probabilities: np.ndarray) -> np.ndarray:
    """ln p as Moses reads a score column: max(ln p, −100), so p = 0 becomes −100."""
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(probabilities), LOG_FLOOR)


def _open_scores_parquet(path: str | os.PathLike[str]) -> pq.ParquetFile:
    """Open ``path`` as a ``--scores-parquet`` file, checking the column types the figure reads before any
    batch is read, so a text file, a truncated file or a foreign Parquet is one line naming the file,
    not an Arrow traceback from deep in the read."""
    name = display_name(path)
    try:
        file = pq.ParquetFile(path)
        schema = file.schema_arrow
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{name}: not a Parquet file of rescore --scores-parquet ({exc})") from None
    names = set(schema.names)
    if not {"log_p", "table_scores"} <= names:
        raise UserError(f"{name}: no log_p/table_scores columns; is it a --scores-parquet file?")
    log_p = schema.field("log_p").type
    if not (pa.types.is_floating(log_p) or pa.types.is_integer(log_p)):
        raise UserError(f"{name}: not a Parquet file of rescore --scores-parquet (log_p is {log_p}, not numbers)")
    scores = schema.field("table_scores").type
    if not pa.types.is_null(scores) and not (
        pa.types.is_fixed_size_list(scores)
        and (pa.types.is_floating(scores.value_type) or pa.types.is_integer(scores.value_type))
    ):
        raise UserError(
            f"{name}: not a Parquet file of rescore --scores-parquet "
            f"(table_scores is {scores}, not a fixed-size list of numbers)"
        )
    return file


def read_scores_parquet(path: str | os.PathLike[str], column: int = DIRECT_COLUMN) -> ScorePairs:
    """RNN and table log p from ``rescore-phrase-table --scores-parquet``, read batch by batch
    (only the two numbers per row are kept, as float32)."""
    file = _open_scores_parquet(path)
    rnn, table = [], []
    try:
        for batch in file.iter_batches(columns=["log_p", "table_scores"], batch_size=1 << 20):
            scores = batch.column("table_scores")
            if scores.null_count == len(scores):
                raise UserError(f"{display_name(path)}: the table scores were not stored")
            width = scores.type.list_size
            if column >= width:
                raise UserError(
                    f"{display_name(path)}: the table has {width} score columns; there is no column {column + 1}"
                )
            values = scores.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)[:, column]
            table.append(table_log_p(values).astype(np.float32))
            rnn.append(batch.column("log_p").to_numpy(zero_copy_only=False).astype(np.float32))
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"{display_name(path)}: not a Parquet file of rescore --scores-parquet ({exc})") from None
    if not rnn:
        raise UserError(f"{display_name(path)}: no rows")
    return ScorePairs(np.concatenate(table), np.concatenate(rnn))


def plot_scores(pairs: ScorePairs, out_png: str | os.PathLike[str], *, title: str = "") -> str:
    """Fig. 3: RNN log p(Y|X) against the table's log φ(e|f); a 2-D histogram beyond
    :data:`SCATTER_LIMIT` points. Returns a one-line description.

    A pair with a score that is not finite (NaN, ±inf: a damaged table or a diverged model) has no place
    on the axes and would make Pearson's r NaN: it is left out, and the description counts it, so that it
    is seen and not drawn as if it were not there.
    """
    finite = np.isfinite(pairs.table_log_p) & np.isfinite(pairs.rnn_log_p)
    left_out = int(len(finite) - finite.sum())
    if left_out == len(finite):
        raise UserError(f"none of the {left_out:,} phrase pairs has finite scores: nothing to plot")
    if left_out:
        pairs = ScorePairs(pairs.table_log_p[finite], pairs.rnn_log_p[finite])
    n = len(pairs.rnn_log_p)
    fig, ax = _figure()
    if n > SCATTER_LIMIT:
        counts, xedges, yedges, image = ax.hist2d(pairs.table_log_p, pairs.rnn_log_p, bins=200, cmin=1,
                                                  norm=LogNorm(), cmap="viridis")
        fig.colorbar(image, ax=ax, label="phrase pairs per cell")
        kind = "2-D histogram"
    else:
        ax.scatter(pairs.table_log_p, pairs.rnn_log_p, s=3, alpha=0.3, linewidths=0)
        kind = "scatter"
    ax.set_xlabel("translation model: log φ(e|f)  (table column 3)")
    ax.set_ylabel("RNN Encoder–Decoder: log p(target | source)")
    description = f"{n:,} phrase pairs, Pearson r = {pairs.pearson:.3f}"
    ax.set_title((title + "\n" if title else "") + description, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    _save(fig, out_png)
    not_drawn = f"; {left_out:,} with a score that is not finite (NaN or infinite) left out" if left_out else ""
    return f"{kind} of {description}{not_drawn}"


#: The fewest points a t-SNE map is drawn of (its perplexity is a third of them).
MIN_MAP_POINTS = 5


def _tsne(vectors: np.ndarray, seed: int) -> np.ndarray:
    """2-D t-SNE (scikit-learn), perplexity capped for small inputs; PCA init for stable maps."""
    from sklearn.manifold import TSNE

    n = len(vectors)
    if n < MIN_MAP_POINTS:
        raise UserError(f"a map needs at least {MIN_MAP_POINTS} points, got {n}")
    perplexity = min(30.0, (n - 1) / 3)
    tsne = TSNE(n_components=2, perplexity=perplexity, init="pca", learning_rate="auto", random_state=seed)
    return tsne.fit_transform(vectors.astype(np.float64))


def _readable_labels(points: np.ndarray, max_labels: int, columns: int, rows: int) -> list[int]:
    """Indices to label: at most one per cell of a columns × rows raster, earlier (more frequent)
    points first. Cells are wider than tall because labels are: a label then rarely runs into
    its neighbour's. ``max_labels`` 0 labels none (``--labels 0``: the points alone)."""
    if max_labels <= 0:
        return []
    low, high = points.min(0), points.max(0)
    scaled = (points - low) / np.maximum(high - low, 1e-12)
    cells = np.floor(scaled * (np.array([columns, rows]) - 1e-9)).astype(int)
    taken: set[tuple[int, int]] = set()
    chosen = []
    for i, cell in enumerate(map(tuple, cells)):
        if cell not in taken:
            taken.add(cell)
            chosen.append(i)
            if len(chosen) >= max_labels:
                break
    return chosen


def _plot_map(points: np.ndarray, labels: Sequence[str], out_png, title: str, max_labels: int,
              columns: int) -> int:
    """Scatter of the 2-D points, labels cut to fit a cell of the label raster."""
    fig, ax = _figure()
    ax.scatter(points[:, 0], points[:, 1], s=4, alpha=0.4, linewidths=0, color="tab:blue")
    shown = _readable_labels(points, max_labels, columns=columns, rows=40)
    width = max(6, PIXELS[0] // columns // 5)  # about 5 pixels per character at 6 points
    for i in shown:
        text = labels[i] if len(labels[i]) <= width else labels[i][: width - 1] + "…"
        ax.annotate(text, points[i], fontsize=6, alpha=0.85)
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    _save(fig, out_png)
    return len(shown)


def map_words(checkpoint: Checkpoint, out_png, *, words: int = 1000, seed: int = 1234,
              max_labels: int = MAX_LABELS) -> str:
    """Fig. 4: t-SNE of the source word embeddings e(x) of the ``words`` most frequent words."""
    vocab = checkpoint.src_vocab.words[2:]  # shortlist order = frequency order; skip </s>, [UNK]
    n = min(words, len(vocab))
    vectors = checkpoint.model.src_embed.weight.detach().float().cpu().numpy()[2 : 2 + n]
    points = _tsne(vectors, seed)
    shown = _plot_map(points, vocab[:n], out_png,
                      f"source word embeddings, {n} most frequent words (t-SNE)", max_labels, columns=14)
    return f"{n} words, {shown} labelled"


def phrase_summaries(checkpoint: Checkpoint, phrases: Sequence[str]) -> np.ndarray:
    """The summary vectors c [n, d] of source phrases, by the scorer's encoder."""
    scorer = PairScorer(checkpoint.model, next(checkpoint.model.parameters()).device)
    with torch.inference_mode():
        return scorer.encode_sources(encode_phrases(phrases, checkpoint.src_vocab)).cpu().numpy()


def map_phrases(checkpoint: Checkpoint, phrases: Sequence[str], out_png, *, seed: int = 1234,
                max_labels: int = MAX_LABELS) -> str:
    """Fig. 5: t-SNE of the phrase summaries c."""
    points = _tsne(phrase_summaries(checkpoint, phrases), seed)
    shown = _plot_map(points, list(phrases), out_png,
                      f"source phrase summaries c, {len(phrases)} phrases (t-SNE)", max_labels, columns=7)
    return f"{len(phrases)} phrases, {shown} labelled"


def read_phrases(path: str | os.PathLike[str], *, max_phrases: int = 1000, min_words: int = 1,
                 seed: int = 1234) -> list[str]:
    """Distinct phrases from a text file (one per line) or a Moses table (its source phrases).

    A line holding `` ||| `` makes it a table. More than ``max_phrases`` are reduced to a seeded
    uniform sample (reservoir sampling: one pass, any file size), kept in file order.
    """
    rng = random.Random(seed)
    seen: set[str] = set()
    kept: list[tuple[int, str]] = []
    index = 0
    for line_no, raw in iter_lines(path):
        field = raw.split(SEPARATOR, 1)[0]
        try:
            text = field.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{display_name(path)}:{line_no}: not valid UTF-8 ({exc.reason})") from exc
        tokens = split_tokens(text)
        phrase = " ".join(tokens)
        if len(tokens) < min_words or phrase in seen:
            continue
        seen.add(phrase)
        if len(kept) < max_phrases:
            kept.append((index, phrase))
        else:
            slot = rng.randrange(index + 1)
            if slot < max_phrases:
                kept[slot] = (index, phrase)
        index += 1
    kept.sort()
    return [phrase for _, phrase in kept]


def plot_training_curve(history: Sequence[dict], out_png) -> str:
    """Validation perplexity per target token against update steps, from the checkpoint."""
    if not history:
        raise UserError("the checkpoint holds no validation history")
    steps = [v["step"] for v in history]
    ppl = [v["perplexity"] for v in history]
    fig, ax = _figure()
    ax.plot(steps, ppl, marker="o", markersize=3)
    ax.set_xlabel("update step (64 pairs each)")
    ax.set_ylabel("validation perplexity per target token")
    ax.set_yscale("log")
    best = int(np.argmin(ppl))
    ax.set_title(f"best {ppl[best]:.1f} at step {steps[best]}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    _save(fig, out_png)
    return f"{len(history)} validations, best perplexity {ppl[best]:.2f} at step {steps[best]}"
