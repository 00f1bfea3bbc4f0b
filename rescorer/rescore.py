"""``rescore-phrase-table``: stream a Moses table, append the RNN and unknown-word columns.

The run is a pipeline of three overlapping stages, so that no stage waits on another:

* a reader thread decompresses, splits and validates chunks and maps words to ids (pyarrow);
* the main thread scores each chunk with the model (torch releases the GIL);
* worker processes format the lines and compress each chunk into its own gzip member.

Memory is bounded by a few chunks whatever the table size. Output goes to a hidden partial file
next to the destination and is renamed only when complete. After every chunk a small progress
file records how many input lines are done and how many output bytes are good, so ``--resume``
truncates the partial file to that size and continues; the result is byte-identical to an
uninterrupted run because chunk boundaries and gzip members depend only on the input.
"""

from __future__ import annotations

import concurrent.futures as futures
import gzip
import json
import multiprocessing
import os
import queue
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from moses_integration.phrase_table import PhraseTableError, input_position, open_input
from rescorer.checkpoint import Checkpoint
from rescorer.device import autocast_dtype, select_device
from rescorer.output_chunks import format_chunk
from rescorer.scoring import PairScorer, ScoringOptions
from rescorer.table_chunks import (
    LineChunk,
    ParsedChunk,
    TokenIds,
    iter_line_chunks,
    parse_chunk,
    phrases_to_ids,
)

PROGRESS_VERSION = 1
WP_SIDES = ("target", "source", "both")
LOW_OVERLAP_PERCENT = 50.0


class RescoreError(RuntimeError):
    """A run that cannot start or continue; the message says what to do."""


@dataclass
class RescoreOptions:
    chunk_lines: int = 100_000
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    wp_side: str = "target"
    skip_bad_lines: bool = False
    shard: tuple[int, int] | None = None  # (K, N), K in 1..N
    resume: bool = False
    scores_parquet: str | None = None
    compresslevel: int = 6
    progress: bool = True
    device: str = "auto"
    precision: str = "auto"
    scoring: ScoringOptions = field(default_factory=ScoringOptions)

    def identity(self) -> dict:
        """Settings that change the output bytes; a resume must use the same ones."""
        return {
            "chunk_lines": self.chunk_lines, "wp_side": self.wp_side, "skip_bad_lines": self.skip_bad_lines,
            "shard": list(self.shard) if self.shard else None, "compresslevel": self.compresslevel,
            "scores_parquet": self.scores_parquet,
        }


@dataclass
class RescoreSummary:
    lines: int = 0  # lines written
    scored: int = 0  # lines that got the two columns
    distinct_sources: int = 0
    bad_lines: int = 0
    sum_log_prob: float = 0.0
    target_tokens: int = 0
    target_unknown: int = 0
    seconds: float = 0.0

    @property
    def mean_log_prob(self) -> float:
        return self.sum_log_prob / self.scored if self.scored else float("nan")

    @property
    def unknown_share(self) -> float:
        return self.target_unknown / self.target_tokens if self.target_tokens else 0.0

    def report(self) -> str:
        rate = self.scored / self.seconds if self.seconds > 0 else 0.0
        return (
            f"rescored {self.lines} lines ({self.scored} scored, {self.bad_lines} bad lines copied through), "
            f"{self.distinct_sources} distinct sources; mean log p {self.mean_log_prob:.4f}; "
            f"target words outside the shortlist {100 * self.unknown_share:.2f}%; "
            f"{self.seconds:.1f} s ({rate:.0f} pairs/s)"
        )


def parse_shard(text: str) -> tuple[int, int]:
    """``K/N`` with 1 ≤ K ≤ N, as a SLURM array index would give it."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise RescoreError(f"--shard must look like K/N (e.g. 3/8), got {text!r}") from exc
    if not 1 <= k <= n:
        raise RescoreError(f"--shard {text}: K must be between 1 and N")
    return k, n


def count_lines(path: str) -> int:
    """Total lines (one decompression pass), needed to cut shards of equal size."""
    total, last = 0, b"\n"
    with open_input(path) as fh:
        try:
            while block := fh.read(8 << 20):
                total += block.count(b"\n")
                last = block[-1:]
        except (EOFError, OSError) as exc:
            raise PhraseTableError(path, total + 1, f"input is truncated or corrupt ({exc})") from exc
    return total + (last != b"\n")


def _sources_of(lines: list[bytes]) -> list[bytes]:
    return [line.split(b" ||| ", 1)[0] for line in lines]


class _ShardFilter:
    """Keeps the lines of shard K/N: contiguous, cut where the source phrase changes.

    Shard k nominally starts at line floor((k-1)·T/N)+1; the real start moves forward to the first
    line whose source differs from its predecessor's. Every shard applies the same rule to both
    of its ends, so the shards partition the table and concatenate to the whole.
    """

    def __init__(self, shard: tuple[int, int], total_lines: int, state: dict | None = None) -> None:
        k, n = shard
        self.start_line = (k - 1) * total_lines // n + 1
        self.end_line = k * total_lines // n + 1  # nominal start of the next shard
        self.last_shard = k == n
        state = state or {}
        self.started = state.get("started", k == 1)
        self.finished = state.get("finished", False)
        self.prev_source = state.get("prev_source")

    def state(self) -> dict:
        return {"started": self.started, "finished": self.finished, "prev_source": self.prev_source}

    def rows(self, chunk: LineChunk) -> np.ndarray:
        keep = np.zeros(len(chunk.lines), dtype=bool)
        sources = _sources_of(chunk.lines)
        prev = self.prev_source.encode() if isinstance(self.prev_source, str) else self.prev_source
        for i, src in enumerate(sources):
            line_no = chunk.first_line_no + i
            boundary = prev is None or src != prev
            if not self.started and line_no >= self.start_line and boundary:
                self.started = True
            if self.started and not self.last_shard and line_no >= self.end_line and boundary:
                self.finished = True
            keep[i] = self.started and not self.finished
            prev = src
        self.prev_source = prev.decode("utf-8", "replace") if prev is not None else None
        return np.flatnonzero(keep)


@dataclass
class _Prepared:
    chunk: LineChunk
    rows: np.ndarray  # rows of the chunk that belong to this run (shard)
    parsed: ParsedChunk | None
    sources: TokenIds | None = None
    source_of_row: np.ndarray | None = None
    targets: TokenIds | None = None
    new_sources: int = 0
    shard_state: dict | None = None
    last_source: str | None = None  # carried across chunks to count distinct sources


def rescore_phrase_table(
    input_path: str,
    output_path: str,
    checkpoint: Checkpoint,
    options: RescoreOptions | None = None,
) -> RescoreSummary:
    """Stream ``input_path`` to ``output_path`` with two more score columns. See module doc."""
    opts = options or RescoreOptions()
    if opts.wp_side not in WP_SIDES:
        raise RescoreError(f"--wp-side must be one of {', '.join(WP_SIDES)}")
    _check_paths(input_path, output_path, opts)
    started = time.monotonic()
    device = select_device(opts.device)
    scorer = PairScorer(checkpoint.model, device, autocast_dtype(device, opts.precision), opts.scoring)
    src_words = pa.array(checkpoint.src_vocab.words, pa.string())
    tgt_words = pa.array(checkpoint.tgt_vocab.words, pa.string())
    total_lines = count_lines(input_path) if opts.shard else None

    to_stdout = output_path == "-"
    out_dir = Path(output_path).resolve().parent if not to_stdout else Path.cwd()
    name = Path(output_path).name
    partial = out_dir / f".{name}.partial"
    progress_path = out_dir / f".{name}.progress.json"
    parts_dir = Path(opts.scores_parquet + ".parts") if opts.scores_parquet else None
    compress = None if not output_path.endswith(".gz") else opts.compresslevel

    identity = {
        "version": PROGRESS_VERSION, "input": _file_identity(input_path),
        "model": _file_identity(getattr(checkpoint, "path", None)), "options": opts.identity(),
    }
    done = {"lines_done": 0, "output_bytes": 0, "chunks_done": 0, "summary": asdict(RescoreSummary()),
            "shard_state": None, "prev_source": None}
    if opts.resume and not to_stdout:
        done = _load_progress(progress_path, partial, identity, done)
    summary = RescoreSummary(**done["summary"])
    summary.seconds = 0.0
    if parts_dir:
        parts_dir.mkdir(parents=True, exist_ok=True)
        for part in parts_dir.glob("part-*.parquet"):
            if int(part.stem.split("-")[1]) >= done["chunks_done"]:
                part.unlink()

    out = sys.stdout.buffer if to_stdout else open(partial, "r+b" if opts.resume and partial.exists() else "wb")  # noqa: SIM115
    if not to_stdout:
        out.truncate(done["output_bytes"])
        out.seek(done["output_bytes"])
    fh = open_input(input_path)
    in_size = None if input_path == "-" else os.path.getsize(input_path)
    shard_filter = _ShardFilter(opts.shard, total_lines, done["shard_state"]) if opts.shard else None
    bar = tqdm(total=in_size, unit="B", unit_scale=True, desc="rescoring", disable=not opts.progress,
               file=sys.stderr, dynamic_ncols=True)
    prepared_q: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    reader = threading.Thread(
        target=_read_stage,
        args=(fh, input_path, opts, done, shard_filter, src_words, tgt_words, prepared_q, stop),
        daemon=True,
    )
    reader.start()
    pool = (
        futures.ProcessPoolExecutor(opts.workers, mp_context=multiprocessing.get_context("spawn"))
        if opts.workers > 1 else None
    )
    in_flight: list[tuple[futures.Future | bytes, dict]] = []
    chunks_done = done["chunks_done"]
    output_bytes = done["output_bytes"]
    warned = False
    try:
        while True:
            item = prepared_q.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                break
            prep: _Prepared = item
            log_p, n_unk, scored_rows = _score_prepared(prep, scorer, opts.wp_side, summary)
            if not warned and prep.targets is not None and len(prep.targets.ids):
                warned = True
                _warn_low_overlap(prep)
            lines = [prep.chunk.lines[i] for i in prep.rows]
            summary.lines += len(lines)
            summary.distinct_sources += prep.new_sources
            if parts_dir and prep.parsed is not None:
                _write_parquet_part(parts_dir / f"part-{chunks_done:08d}.parquet", prep, log_p, n_unk)
            args = (lines, log_p, n_unk, scored_rows, compress)
            job = pool.submit(format_chunk, *args) if pool else format_chunk(*args)
            chunks_done += 1
            marker = {
                "lines_done": prep.chunk.last_line_no, "chunks_done": chunks_done,
                "summary": asdict(summary), "shard_state": prep.shard_state, "prev_source": prep.last_source,
            }
            in_flight.append((job, marker))
            position = input_position(fh)
            if position is not None:
                bar.update(position - bar.n)
            bar.set_postfix(lines=f"{summary.lines:,}", pairs_s=f"{summary.scored / (time.monotonic() - started):.0f}")
            while in_flight and (len(in_flight) > 2 * max(1, opts.workers) or _ready(in_flight[0][0])):
                output_bytes = _write_head(in_flight, out, output_bytes, to_stdout, progress_path, identity)
        while in_flight:
            output_bytes = _write_head(in_flight, out, output_bytes, to_stdout, progress_path, identity)
        if output_bytes == 0 and compress is not None:
            out.write(gzip.compress(b"", mtime=0))  # an empty table is still a valid gzip file
    except BaseException:
        stop.set()
        if not to_stdout:
            out.close()
            sys.stderr.write(
                f"rescore-phrase-table: stopped; {output_bytes} good bytes kept in {partial} "
                f"(run again with --resume to continue)\n"
            )
        raise
    finally:
        bar.close()
        if pool:
            pool.shutdown(cancel_futures=True)
        fh.close()
    summary.seconds = time.monotonic() - started
    if not to_stdout:
        out.flush()
        os.fsync(out.fileno())
        out.close()
        if opts.scores_parquet:
            _merge_parquet(parts_dir, Path(opts.scores_parquet))
        os.replace(partial, output_path)
        progress_path.unlink(missing_ok=True)
    else:
        out.flush()
    return summary


def _ready(job: futures.Future | bytes) -> bool:
    return not isinstance(job, futures.Future) or job.done()


def _write_head(in_flight: list, out: BinaryIO, output_bytes: int, to_stdout: bool, progress_path: Path,
                identity: dict) -> int:
    """Write the oldest finished chunk, then record it as durable in the progress file."""
    job, marker = in_flight.pop(0)
    data = job.result() if isinstance(job, futures.Future) else job
    out.write(data)
    output_bytes += len(data)
    if not to_stdout:
        out.flush()
        os.fsync(out.fileno())
        _atomic_json(progress_path, {**identity, **marker, "output_bytes": output_bytes})
    return output_bytes


def _read_stage(fh, path, opts, done, shard_filter, src_words, tgt_words, out_q, stop) -> None:
    """Reader thread: chunks → validated phrases → ids. Errors travel to the main thread."""
    try:
        prev_source = done.get("prev_source")
        for chunk in iter_line_chunks(fh, path, opts.chunk_lines):
            if stop.is_set():
                return
            if chunk.last_line_no <= done["lines_done"]:
                continue
            rows = shard_filter.rows(chunk) if shard_filter else np.arange(len(chunk.lines))
            shard_state = shard_filter.state() if shard_filter else None
            if not len(rows):
                out_q.put(_Prepared(chunk, rows, None, shard_state=shard_state, last_source=prev_source))
                if shard_filter and shard_filter.finished:
                    break
                continue
            sub = LineChunk(chunk.first_line_no + int(rows[0]), [chunk.lines[i] for i in rows], chunk.end_offset)
            if len(rows) and rows[-1] - rows[0] + 1 != len(rows):
                raise RuntimeError("shard rows must be contiguous")
            parsed = parse_chunk(sub, path, skip_bad_lines=opts.skip_bad_lines, want_scores=bool(opts.scores_parquet))
            prep = _Prepared(chunk, rows, parsed, shard_state=shard_state)
            if len(parsed.source):
                encoded = pc.dictionary_encode(parsed.source)
                prep.sources = phrases_to_ids(encoded.dictionary, src_words)
                prep.source_of_row = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
                prep.targets = phrases_to_ids(parsed.target, tgt_words)
                n = len(parsed.source)
                prev = pa.concat_arrays([pa.array([prev_source], pa.string()), parsed.source.slice(0, n - 1)])
                prep.new_sources = int(pc.sum(pc.fill_null(pc.not_equal(parsed.source, prev), True)).as_py())
                prev_source = parsed.source[len(parsed.source) - 1].as_py()
            prep.last_source = prev_source
            out_q.put(prep)
            if shard_filter and shard_filter.finished:
                break
        out_q.put(None)
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which re-raises
        out_q.put(exc)


def _score_prepared(prep: _Prepared, scorer: PairScorer, wp_side: str, summary: RescoreSummary):
    """Scores of the scored rows, with their positions in the run's line list."""
    parsed = prep.parsed
    if parsed is None or prep.targets is None:
        empty = np.zeros(0)
        if parsed is not None:
            summary.bad_lines += len(parsed.bad_rows)
        return empty, empty.astype(np.int64), empty.astype(np.int64)
    log_p = scorer.score(prep.sources, prep.source_of_row, prep.targets)
    src_unk = prep.sources.n_unk[prep.source_of_row]
    tgt_unk = prep.targets.n_unk
    n_unk = {"target": tgt_unk, "source": src_unk, "both": src_unk + tgt_unk}[wp_side].astype(np.int64)
    summary.scored += len(log_p)
    summary.bad_lines += len(parsed.bad_rows)
    summary.sum_log_prob += float(log_p.sum())
    summary.target_tokens += int(len(prep.targets.ids))
    summary.target_unknown += int(tgt_unk.sum())
    # parsed.good_rows index the shard sub-chunk, which starts at the run's first row of the chunk.
    return log_p, n_unk, parsed.good_rows


def _warn_low_overlap(prep: _Prepared) -> None:
    src_known = 100.0 * (1 - prep.sources.n_unk.sum() / max(1, len(prep.sources.ids)))
    tgt_known = 100.0 * (1 - prep.targets.n_unk.sum() / max(1, len(prep.targets.ids)))
    if min(src_known, tgt_known) < LOW_OVERLAP_PERCENT:
        warnings.warn(
            f"only {src_known:.1f}% of source words and {tgt_known:.1f}% of target words in the first chunk "
            f"are in the model's shortlists; is this model trained for this table's languages and tokenisation?",
            stacklevel=2,
        )


def _write_parquet_part(path: Path, prep: _Prepared, log_p: np.ndarray, n_unk: np.ndarray) -> None:
    parsed = prep.parsed
    scores = parsed.scores if parsed.scores is not None else np.zeros((len(log_p), 0))
    width = scores.shape[1]
    flat = pa.array(scores.reshape(-1), pa.float64())
    table = pa.table({
        "source": parsed.source, "target": parsed.target, "log_p": pa.array(log_p, pa.float64()),
        "n_unk": pa.array(n_unk, pa.int32()),
        "table_scores": pa.FixedSizeListArray.from_arrays(flat, width) if width else pa.nulls(len(log_p)),
    })
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def _merge_parquet(parts_dir: Path, dest: Path) -> None:
    parts = sorted(parts_dir.glob("part-*.parquet"))
    tmp = dest.with_name(f".{dest.name}.tmp")
    writer = None
    try:
        for part in parts:
            table = pq.read_table(part)
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            writer.write_table(table)
    finally:
        if writer:
            writer.close()
    if writer is None:
        pq.write_table(pa.table({"source": pa.array([], pa.string())}), tmp)
    os.replace(tmp, dest)
    for part in parts:
        part.unlink()
    parts_dir.rmdir()


def _file_identity(path: str | os.PathLike | None) -> dict | None:
    if path is None or str(path) == "-":
        return None
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _atomic_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _load_progress(progress_path: Path, partial: Path, identity: dict, fresh: dict) -> dict:
    """The last durable state of a killed run, after checking it belongs to this run."""
    if not progress_path.exists() or not partial.exists():
        return fresh
    saved = json.loads(progress_path.read_text())
    for key in ("version", "input", "model", "options"):
        if saved.get(key) != identity[key]:
            raise RescoreError(
                f"cannot --resume: the {key} differs from the interrupted run recorded in {progress_path}; "
                f"remove {partial} and {progress_path} to start over"
            )
    if partial.stat().st_size < saved["output_bytes"]:
        raise RescoreError(f"cannot --resume: {partial} is shorter than its recorded {saved['output_bytes']} bytes")
    return saved


def _check_paths(input_path: str, output_path: str, opts: RescoreOptions) -> None:
    if input_path == "-" and (opts.resume or opts.shard):
        raise RescoreError("--resume and --shard need a file as input, not stdin")
    if output_path == "-":
        if opts.resume:
            raise RescoreError("--resume needs a file as output, not stdout")
        return
    if input_path != "-" and Path(input_path).resolve() == Path(output_path).resolve():
        raise RescoreError(f"refusing to overwrite the input {input_path}; choose another output path")
    if not Path(output_path).resolve().parent.is_dir():
        raise RescoreError(f"output folder {Path(output_path).parent} does not exist")


TEXT_TABLE_TYPES = ("PhraseDictionaryMemory", "PhraseDictionaryMultiModel")


def write_moses_ini(ini_in: str, ini_out: str, table_path: str, weights: tuple[float, ...]) -> None:
    """A moses.ini whose phrase table is ``table_path``, with ``len(weights)`` more features.

    Paths are written absolute (the other models' relative paths resolved against the input ini's
    folder) because Moses resolves relative paths against its working directory, which is rarely
    the folder of the new ini. A binarised table (compact, on-disk) cannot
    read the text output; the error says which command rebuilds it with the right score count.
    """
    from moses_integration.moses_ini import MosesIni, MosesIniError

    ini = MosesIni.read(ini_in)
    tables = ini.phrase_tables()
    if len(tables) == 1 and tables[0].type not in TEXT_TABLE_TYPES and not table_path.endswith(".minphr"):
        old = tables[0]
        raise MosesIniError(
            ini_in, old.line_no,
            f"{old.name} is a {old.type}, which cannot load the text table {table_path}; binarise it first, e.g. "
            f"processPhraseTableMin -in {table_path} -out table -nscores {(old.num_features or 0) + len(weights)}, "
            f"or change the feature to PhraseDictionaryMemory",
        )
    new_path = table_path if table_path == "-" else str(Path(table_path).resolve())
    # Relocatable systems keep relative model paths, valid when Moses runs in the ini's folder;
    # the new ini lives elsewhere, so its other models are pinned to where they are now.
    ini.absolutize_paths(Path(ini_in).resolve().parent)
    ini.add_phrase_table_scores(new_path, weights)
    ini.write(ini_out)
