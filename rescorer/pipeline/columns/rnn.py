"""The RNN's column, p(e|f): its text, and the warning for a model of other languages."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyarrow as pa

from moses_integration.phrase_table import LOG_FLOOR, format_log_probability
from rescorer.pipeline.scoring_plan import ScoringPlan

LOW_OVERLAP_PERCENT = 50.0


def probability_column(log_probs: np.ndarray) -> pa.Array:
    """exp(log p) floored at exp(-100) per line, as Moses reads it back (the same text as
    :func:`format_log_probability`: same ``math.exp``, same ``.6g``)."""
    bad = np.isnan(log_probs) | (log_probs == math.inf)
    if bad.any():
        format_log_probability(float(log_probs[np.flatnonzero(bad)[0]]))  # raises, naming the value
    exp = math.exp
    return pa.array([f"{exp(x):.6g}" for x in np.maximum(log_probs, LOG_FLOOR).tolist()], pa.string())


def warn_low_overlap(plan: ScoringPlan, which: str = "") -> None:
    """Warn when the first chunk's words are mostly outside a model's shortlists (``which``: "reverse "
    for the reverse model, whose sources are the table's targets: the message names the table's sides)."""
    src_known = 100.0 * (1 - plan.sources.n_unk.sum() / max(1, len(plan.sources.ids)))
    tgt_known = 100.0 * (1 - plan.targets.n_unk.sum() / max(1, len(plan.targets.ids)))
    if which:
        src_known, tgt_known = tgt_known, src_known
    if min(src_known, tgt_known) < LOW_OVERLAP_PERCENT:
        warnings.warn(
            f"only {src_known:.1f}% of source words and {tgt_known:.1f}% of target words in the first chunk "
            f"are in the {which}model's shortlists; is this model trained for this table's languages and "
            "tokenisation?",
            stacklevel=2,
        )
