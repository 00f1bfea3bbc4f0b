"""Running the rescoring pipeline in tests: one call taking the options the tests vary, its output's
lines, and the sharded run whose parts must concatenate to the whole."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

from rescorer.model.checkpoint import Checkpoint
from rescorer.pipeline.rescore import RescoreOptions, RescoreSummary, rescore_phrase_table
from rescorer.pipeline.scoring import ScoringOptions


def rescore(inp: Path, out: Path, forward: Checkpoint, reverse: Checkpoint | None = None,
            **kw: object) -> RescoreSummary:
    """``rescore-phrase-table`` on CPU without progress; ``token_budget`` and ``workers`` as given,
    any other :class:`RescoreOptions` field through ``kw``; the run's summary."""
    scoring = ScoringOptions(token_budget=kw.pop("token_budget", 4096))
    opts = RescoreOptions(progress=False, device="cpu", workers=kw.pop("workers", 0), scoring=scoring, **kw)
    return rescore_phrase_table(str(inp), str(out), forward, opts, reverse)


def lines_of(path: Path) -> list[bytes]:
    with gzip.open(path) as fh:
        return fh.read().splitlines()


def shard_outputs(run: Callable[[Path, tuple[int, int] | None], object], folder: Path,
                  shards: int = 3) -> tuple[Path, list[Path]]:
    """The whole run's output and its ``shards`` parts' (``run(out, shard)`` writes one), in order."""
    whole = folder / "whole.gz"
    run(whole, None)
    parts = [folder / f"out.{k}.gz" for k in range(1, shards + 1)]
    for k, part in enumerate(parts, start=1):
        run(part, (k, shards))
    return whole, parts
