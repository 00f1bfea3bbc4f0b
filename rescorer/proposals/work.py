"""The work folder of ``rescorer propose``: why a killed run loses at most one batch of search.

Proposing for every source of a real table takes hours on a CPU, so a run keeps what it has done in
a hidden folder beside its output, ``.OUTPUT.propose/``, and ``--resume`` goes on from there:

* ``proposals.tsv``: the listing (kind, source, target, log p; reranked, log p(f|e) and the p(e|f)
  column's ln too), appended one batch of sources at a time and flushed to disk (fsync) before
  ``progress.json`` says so;
* ``progress.json``: replaced atomically after each batch with what is durable (sources searched,
  the listing's bytes, the counts of the report) and what identifies the run: the table, the model,
  the text, the word tables and every option that decides the output's bytes. A resume with other
  ones is refused in one line naming what changed, instead of splicing two runs;
* ``merged.gz`` and ``flagged.npy``: the table with the proposed lines merged in and their line
  numbers, each written atomically once the search is over (phase ``merged``);
* ``table[.gz]`` with its ``.partial`` and progress record: ``rescore-phrase-table``'s own run
  (:mod:`rescorer.pipeline.partial_output`), always resumed from its own record.

A resumed run cuts the listing back to its recorded bytes and skips the sources already searched:
sources come in the same order (the table's sort order) and in the same batches (the recorded
``rows_per_step`` and device decide them), so the result is byte for byte an uninterrupted run's.
The folder goes when the output is complete; a failed or killed run keeps it, unless nothing in it
is durable yet. Without ``--resume`` a folder holding progress is an error, as for training: hours
of search are never thrown away silently.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO

from rescorer.pipeline.errors import RescoreError
from rescorer.pipeline.resume import ResumeError, load_progress, save_progress

# The record's format; a record of another version is refused as another run. 2: models by content.
PROGRESS_VERSION = 2
PHASES = ("search", "searched", "merged")  # searching; listing complete; merged table written


class ProposeWork:
    """The paths of a run's work folder beside ``output`` (module doc)."""

    def __init__(self, output: str) -> None:
        out = Path(output).resolve()
        self.output = output
        self.folder = out.parent / f".{out.name}.propose"
        self.progress = self.folder / "progress.json"
        self.listing = self.folder / "proposals.tsv"
        self.merged = self.folder / "merged.gz"
        self.flagged = self.folder / "flagged.npy"
        self.table = self.folder / ("table.gz" if output.endswith(".gz") else "table")

    def start(self, identity: dict, resume: bool) -> dict:
        """The state to go on from: a fresh one, or with ``resume`` the recorded one, checked against ``identity``.

        A folder without a progress record holds nothing durable (a run killed before its first
        batch was recorded) and is cleared. One with a record needs ``resume``.
        """
        fresh = {"phase": "search", "sources_done": 0, "listing_bytes": 0, "kinds": {}, "search_seconds": 0.0,
                 "skipped": None}
        if not self.progress.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
            return fresh
        if not resume:
            raise RescoreError(f"{self.folder} holds an interrupted run of {self.output} ({self._done_so_far()}): "
                               f"pass --resume to continue it, or remove that folder to start over")
        if not self.listing.exists():
            self.listing.touch()  # a record without its listing is refused below as a listing too short
        try:
            state = load_progress(self.progress, {"listing_bytes": self.listing}, identity, fresh,
                                  start_over=f"remove {self.folder} to start over")
        except ResumeError as exc:
            raise RescoreError(str(exc)) from exc
        if state.get("phase") not in PHASES:
            raise RescoreError(f"cannot --resume: {self.progress} records no phase of this version; "
                               f"remove {self.folder} to start over")
        os.truncate(self.listing, state["listing_bytes"])  # what a killed batch wrote past the record goes
        return state

    def _done_so_far(self) -> str:
        try:
            saved = json.loads(self.progress.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "its progress record is unreadable"
        return f"{saved.get('sources_done', 0)} sources searched, phase {saved.get('phase')}"

    def record(self, identity: dict, state: dict) -> None:
        """Replace the progress record (atomically: a kill keeps the previous one)."""
        save_progress(self.progress, {**identity, **state})

    def open_listing(self, size: int) -> BinaryIO:
        """The listing, opened to append at ``size`` (its durable bytes); the folder is made if missing."""
        self.folder.mkdir(exist_ok=True)
        stream = open(self.listing, "r+b" if self.listing.exists() else "wb")  # noqa: SIM115 - the caller closes it
        stream.truncate(size)
        stream.seek(size)
        return stream

    def commit_batch(self, listing: BinaryIO, data: bytes, identity: dict, state: dict, counts: dict) -> None:
        """Make a searched batch durable: its listing lines on disk first, then the record that counts them.

        ``state["sources_done"]`` already counts the batch; ``counts`` are the report's counts so far.
        """
        listing.write(data)
        listing.flush()
        os.fsync(listing.fileno())
        state["listing_bytes"] += len(data)
        state["kinds"] = {kind: asdict(k) for kind, k in counts.items()}
        self.record(identity, state)

    def discard_if_empty(self) -> None:
        """After a failure: remove the folder when no record says anything in it is durable."""
        if not self.progress.exists():
            shutil.rmtree(self.folder, ignore_errors=True)

    def remove(self) -> None:
        """The output is complete: nothing here is needed any more."""
        shutil.rmtree(self.folder)
