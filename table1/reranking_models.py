"""The reranking experiment's models beyond Table 1's own: the attention NMT model in both directions
and the paper-size phrase RNN read out at several budgets; plus Table 1's reverse RNN and CSLM, reused.

Each is trained as a console command (``nmt train``, ``rescorer train``) like every table1 model, and
stamped on its own under ``reranking/...``; :data:`~table1.workspace.RERANKING_STEP` is stamped last,
when all of them are done. A killed training reruns with ``--resume`` and continues where it stopped:
both trainers keep their clock across ``--resume``, so ``--max-time`` is the total budget.
"""

from __future__ import annotations

import re
import shutil
import zlib
from pathlib import Path

from infrastructure.files import atomic_output, atomic_path, write_json
from infrastructure.lines import iter_raw_lines
from moses_integration.phrase_table import SEPARATOR
from table1.analysis import TableScores, read_table_scores, rnn_correlations
from table1.systems import filtered_table, rnn_train_command, step_cslm, step_rnn_both
from table1.workspace import RERANKING_STEP, Experiment, ExperimentError, run_tool, say

#: The read-outs' sample of the + RNN system's table: the source phrases whose CRC-32 is 0 modulo this, all
#: their targets (about 25,000 pairs at medium): enough for a correlation, scored in minutes by a d=1000 model.
READOUT_SAMPLE_EVERY = 128
#: Where p_RNN lies in the sample as read-outs rescore it: the + RNN table's own (d = the rnn step's) is
#: Moses' four then p_RNN and WP; rescore-phrase-table appends the read-out's p_RNN and WP after them.
SAMPLE_RNN_COLUMN, READOUT_RNN_COLUMN = 4, 6
BEST_PERPLEXITY = re.compile(r"best validation perplexity ([0-9.]+|inf|nan) at step (\d+)")


def nmt_model(exp: Experiment, reverse: bool = False) -> Path:
    """p(e|f) (``nmt-forward.pt``), or p(f|e) with ``reverse`` (trained on the swapped bitext)."""
    return exp.path("reranking", "nmt-reverse.pt" if reverse else "nmt-forward.pt")


def big_rnn_path(exp: Experiment) -> Path:
    """The paper-size RNN's training file; its read-outs are copies beside it (:func:`readout_path`)."""
    return exp.path("reranking", "big-rnn.pt")


def readout_label(hours: float) -> str:
    return f"{hours:g}h"


def readout_path(exp: Experiment, hours: float) -> Path:
    """The copy of the paper-size RNN after ``hours`` of training, e.g. ``big-rnn@6h.pt``."""
    return exp.path("reranking", f"big-rnn@{readout_label(hours)}.pt")


def nmt_train_command(exp: Experiment, reverse: bool = False) -> list[object]:
    """``nmt train`` on the bitext the Moses system trained on (:attr:`Experiment.train_corpus`), source to
    target, or swapped with ``reverse``; held out: ``valid_lines`` pairs of that bitext, nmt's own default
    (the prepared LM-valid slice is target-side only, so it cannot validate a translation model)."""
    n = exp.settings.reranking.nmt
    src, tgt = (exp.tgt, exp.src) if reverse else (exp.src, exp.tgt)
    corpus = exp.train_corpus
    return [exp.console("nmt"), "train", f"{corpus}.{src}", f"{corpus}.{tgt}", nmt_model(exp, reverse),
            "--valid-lines", str(n.valid_lines), "--vocab-size", str(n.vocab_size), "--embedding", str(n.embedding),
            "--hidden", str(n.hidden), "--alignment", str(n.alignment), "--maxout", str(n.maxout),
            "--max-time", str(n.max_time), "--device", exp.device, "--threads", str(exp.jobs), "--resume", "--quiet"]


def readouts(exp: Experiment) -> tuple[list[float], list[float]]:
    """(read-outs to make, read-outs beyond ``big_rnn.max_time`` that are skipped), in hours."""
    r = exp.settings.reranking
    hours = sorted(set(r.big_rnn_readouts))
    limit = r.big_rnn.max_time / 3600
    return [h for h in hours if h <= limit], [h for h in hours if h > limit]


def time_plan(exp: Experiment) -> list[str]:
    """Hours each model still takes from the settings, printed before the long work (as the tuning's plan)."""
    r = exp.settings.reranking
    lines, total = [], 0.0
    for reverse, label in ((False, "NMT p(e|f)"), (True, "NMT p(f|e)")):
        hours = 0.0 if exp.done(nmt_stamp(reverse)) else r.nmt.max_time / 3600
        total += hours
        lines.append(f"time plan: {label}: {hours:.1f} h")
    done, skipped = readouts(exp)
    left = [h for h in done if not exp.done(readout_stamp(h))]
    start = max((h for h in done if exp.done(readout_stamp(h))), default=0.0)
    hours = max(left, default=start) - start
    total += hours
    lines.append(f"time plan: RNN d={r.big_rnn.hidden}: read-outs at {', '.join(map(readout_label, done)) or 'none'}"
                 f"; {hours:.1f} h to go"
                 + (f" (beyond its max_time, skipped: {', '.join(map(readout_label, skipped))})" if skipped else ""))
    lines.append(f"time plan: reranking models: {total:.1f} h in all (Table 1's reverse RNN and CSLM reused)")
    return lines


def nmt_stamp(reverse: bool) -> str:
    return "reranking/nmt-reverse" if reverse else "reranking/nmt-forward"


def readout_stamp(hours: float) -> str:
    return f"reranking/big-rnn@{readout_label(hours)}"


def best_perplexity(log: Path) -> dict[str, float | int]:
    """The last ``best validation perplexity P at step N`` line ``rescorer train`` wrote to ``log``."""
    found = BEST_PERPLEXITY.findall(log.read_text(encoding="utf-8", errors="replace")) if log.exists() else []
    if not found:
        raise ExperimentError(f"{log}: no 'best validation perplexity' line from rescorer train")
    perplexity, step = found[-1]
    return {"valid_perplexity": float(perplexity), "step": int(step)}


def readout_sample(exp: Experiment) -> Path:
    """The + RNN system's table (``rnn/phrase-table.rnn.gz``: Moses' four columns, p_RNN, WP) for one source
    phrase in :data:`READOUT_SAMPLE_EVERY`, all its targets; written once, and the same for every read-out."""
    path = exp.path("reranking", "readout-sample.gz")
    if not path.exists():
        with atomic_output(path) as out:
            for _, raw in iter_raw_lines(exp.path("rnn", "phrase-table.rnn.gz")):
                if zlib.crc32(raw.split(SEPARATOR, 1)[0].strip()) % READOUT_SAMPLE_EVERY == 0:
                    out.write(raw)
    return path


def lex_correlation(scores: TableScores, rnn_column: int) -> dict[str, float | None]:
    """How ln p_RNN (column ``rnn_column``) agrees with ln lex(e|f): Pearson and Spearman over the pairs, and
    Pearson among a source's targets (each source's mean taken out), which is what decides a choice."""
    lex = next(c for c in rnn_correlations(scores, rnn_column) if c.column == "lex(e|f)")
    return {"pearson": lex.pearson, "spearman": lex.spearman, "pearson_same_source": lex.pearson_same_source}


def readout_correlations(exp: Experiment, model: Path, log: Path) -> dict[str, object]:
    """The read-out's ln p_RNN against lex(e|f) on :func:`readout_sample`, beside the rnn step's model's."""
    sample = readout_sample(exp)
    if next(iter_raw_lines(sample), None) is None:  # a table too small for a sample: nothing to correlate
        return {"sample_pairs": 0, "lex_e_f": None, "rnn_step_lex_e_f": None}
    scored = model.with_name(model.stem + ".sample.gz")
    run_tool([exp.console("rescore-phrase-table"), sample, scored, "--model", model,
              "--device", exp.device, "--threads", str(exp.jobs), "--quiet"], log)
    scores = read_table_scores(scored)
    return {"sample_pairs": len(scores.source_ids), "lex_e_f": lex_correlation(scores, READOUT_RNN_COLUMN),
            "rnn_step_lex_e_f": lex_correlation(scores, SAMPLE_RNN_COLUMN)}


def read_out(exp: Experiment, hours: float, log: Path) -> dict[str, object]:
    """Train the paper-size RNN to ``hours`` in all (``--resume``), then copy it aside with its perplexity and
    its agreement with lex(e|f) among a source's targets (:func:`readout_correlations`)."""
    r = exp.settings.reranking.big_rnn
    model = big_rnn_path(exp)
    result = run_tool(rnn_train_command(exp, model, sizes=r, max_time=hours * 3600), log)
    copy = readout_path(exp, hours)
    with atomic_path(copy) as partial:
        shutil.copyfile(model, partial)
    record = {"hours": hours, **best_perplexity(log), "model": copy.name, **readout_correlations(exp, copy, log)}
    write_json(copy.with_suffix(".json"), record)
    return {**result, **record}


def step_reranking_models(exp: Experiment) -> None:
    """Train what the reranking scores its n-best lists with beyond Table 1's models, and make sure
    Table 1's reverse RNN and CSLM are there; stamps :data:`RERANKING_STEP` when all are done."""
    exp.require("prepare", "baseline", "rnn")
    exp.path("reranking").mkdir(parents=True, exist_ok=True)
    for line in time_plan(exp):
        say(line)
    log = exp.log_file("reranking-models")
    # In the order their reranking rows are wanted: the models of hours first (Table 1's steps, stamped:
    # a done one is not even looked at again), then the NMT model's two directions, then the paper-size RNN.
    if not exp.done("rnn-both"):
        step_rnn_both(exp)
    if not exp.done("cslm/export"):
        step_cslm(exp)
    for reverse in (False, True):
        exp.step(nmt_stamp(reverse), lambda rev=reverse: run_tool(nmt_train_command(exp, rev), log))
    done, skipped = readouts(exp)
    for hours in skipped:
        say(f"reranking: RNN read-out at {readout_label(hours)} skipped: beyond big_rnn.max_time "
            f"({exp.settings.reranking.big_rnn.max_time / 3600:g} h)")
    for hours in done:
        exp.step(readout_stamp(hours), lambda h=hours: read_out(exp, h, log))
    exp.step(RERANKING_STEP, lambda: {"readouts": done, "skipped_readouts": skipped})


def reranking_feature_specs(exp: Experiment) -> dict[str, str | None]:
    """Label → ``mert --feature`` spec of each model the reranking scores with; None while not trained."""
    forward, reverse = nmt_model(exp), nmt_model(exp, reverse=True)
    nmt_forward = exp.done(nmt_stamp(False))
    # The phrase RNNs' values are what Moses would read from a table column only where the n-best's
    # pairs are told from the words Moses passed through, which the table the lists were decoded from
    # tells (rescorer.nbest): the baseline's filtered table (the model file records its direction).
    table = f",table={filtered_table(exp)[1]}" if exp.done("baseline") else ""
    specs: dict[str, str | None] = {
        "RNN(f|e)": f"RNN:{exp.reverse_model}{table}" if exp.done("rnn-both/train") else None,
        "CSLM": f"CSLM:{exp.cslm_model}" if exp.done("cslm") else None,
        "NMT p(e|f)": f"NMT:{forward}" if nmt_forward else None,
        "NMT p(e|f)+p(f|e)": f"NMT:{forward},reverse={reverse}" if nmt_forward and exp.done(nmt_stamp(True)) else None,
    }
    hidden = exp.settings.reranking.big_rnn.hidden
    for hours in readouts(exp)[0]:
        specs[f"RNN d={hidden} @{readout_label(hours)}"] = (
            f"RNN:{readout_path(exp, hours)}{table}" if exp.done(readout_stamp(hours)) else None)
    return specs
