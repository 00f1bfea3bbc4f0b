"""``--resume`` for rescoring: what a killed run had finished, and whether it is the same run.

After every chunk the pipeline records how many input lines are done and how many bytes of the
partial output (and of the rejects file) are good. A resumed run cuts the partial files back to
those sizes and continues; the result is byte-identical to an uninterrupted run because chunk
boundaries and gzip members depend only on the input. The record also holds what identifies the
run (input and model files, settings that change the bytes), so a resume with anything else is
refused instead of splicing two different outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

from infrastructure.errors import UserError
from infrastructure.files import write_json
from infrastructure.resume_record import check_same_options, shown

# 3: the options hold the scorer's device type, precision and token budget; 4: chunks cut at
# content-fixed sync points (rescorer.tables.aligned), so a version-3 partial output cannot go on;
# 5: a gzip member starts at every shard point, and the shard state holds the last source key;
# 6: shard points (and so gzip members) follow a grid of lines, not a hash of the sources; 7: models
# by content (content_identity), partial files beside a symlinked output's target; 8: every option but those
# that may differ (infrastructure.resume_record); 9: shards cut at the grid points nearest to equal
# shares (rescorer.pipeline.shards), the shard state holds the shard's lines; 10: grid points are the
# grid's lines themselves, inside a source block too (rescorer.tables.aligned.grid_rows)
PROGRESS_VERSION = 10


class ResumeError(UserError):
    """A progress record that does not belong to this run, or partial files that lost bytes."""


def save_progress(path: Path, record: dict) -> None:
    """Replace the progress record atomically (a kill mid-write keeps the previous one)."""
    write_json(path, record)


def recorded_options(progress_path: Path) -> dict:
    """The options an interrupted run recorded ({} without a readable record of this version)."""
    try:
        saved = json.loads(progress_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return saved.get("options", {}) if saved.get("version") == PROGRESS_VERSION else {}


def load_progress(progress_path: Path, partials: dict[str, Path], identity: dict, fresh: dict,
                  start_over: str | None = None) -> dict:
    """The last durable state of a killed run, after checking it belongs to this run.

    ``partials`` maps the record's byte counters (``output_bytes``, ``rejects_bytes``) to the
    files they count; each must still hold at least that many bytes. The first is the main one:
    without it (or without the record) there is nothing to resume and ``fresh`` comes back.
    ``start_over`` says how to start afresh instead (default: remove the main partial file and the record).
    """
    main_partial = next(iter(partials.values()))
    if not progress_path.exists() or not main_partial.exists():
        return fresh
    saved = json.loads(progress_path.read_text(encoding="utf-8"))
    start_over = start_over or f"remove {main_partial} and {progress_path} to start over"
    if saved.get("version") != identity["version"]:
        raise ResumeError(f"cannot --resume: {progress_path} was written by another version of this program "
                          f"(progress record version {saved.get('version')!r}, this one writes "
                          f"{identity['version']}); {start_over}")
    for key in ("input", "model"):
        if saved.get(key) != identity[key]:
            raise ResumeError(f"cannot --resume: the {key} differs from the interrupted run recorded in "
                              f"{progress_path} ({shown(saved.get(key))} then, {shown(identity[key])} now); "
                              f"{start_over}")
    check_same_options(saved.get("options") or {}, identity["options"], progress_path, error=ResumeError,
                       advice=f"resume with the same options, or {start_over}")
    for counter, partial in partials.items():
        size = partial.stat().st_size if partial.exists() else 0
        if size < saved.get(counter, 0):
            raise ResumeError(f"cannot --resume: {partial} is shorter than its recorded {saved[counter]} bytes")
    return saved
