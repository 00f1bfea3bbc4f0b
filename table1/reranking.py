"""The reranking experiment: Baseline's tuned runs rerank their own n-best lists with each network as a feature.

What a user deciding which network to add needs, at a cost this machine can pay (docs/table1.md,
"Reranking"): Baseline's three tuned systems exist, so each decodes dev and test once more into
``nbest_size``-best distinct lists with Moses' segmentation (for the phrase-level scores), and every
model scores the first ``rerank_size`` hypotheses of each list once. Then, for every feature set
(:func:`feature_sets`), run k's weights are tuned on run k's fixed dev lists by MERT
(:func:`mert.rerank.tune_on_lists`, the tuned Baseline weights as start point, the new columns at 0) and
run k's test lists are reranked with them. Each set is compared with "Baseline reranked", the same lists
tuned the same way with no new column, since tuning on fixed lists moves BLEU by itself.

Every piece is stamped on its own under ``reranking/``: a list (``reranking/lists/runK/SPLIT``), its
oracle BLEU by list size (``reranking/oracle/runK/SPLIT``), a model's scores of a list
(``reranking/scores/LABEL/runK/SPLIT``, resumed block by block inside), a set's tuning
(``reranking/mert/SET/runK``). A model trained later (``table1 reranking-models``) adds its sets on the
next run; the report (:mod:`table1.reranking_report`) is rebuilt every time from what is there.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infrastructure.files import atomic_path, copy_compressed, display_name
from mert.bleu import read_references
from mert.features import NBestFeature, load_feature, read_source_sentences, score_entries
from mert.nbest_set import fixed_mask
from mert.rerank import best_rows, bleu_statistics, oracle_bleu, tune_on_lists, with_columns
from mert.tune import weights_vector
from moses_integration.decoder import decode
from moses_integration.nbest import (
    SEGMENTATION_FLAG,
    NBestArrays,
    NBestEntry,
    column_names,
    load_nbest_arrays,
    read_nbest,
)
from table1.collect import run_weights
from table1.reranking_models import nmt_model, nmt_stamp, reranking_feature_specs
from table1.settings import CONFIGURATIONS_BY_KEY, RunPlan
from table1.tuning import tuning_iterations
from table1.workspace import Experiment, ExperimentError, run_tool, say, single_phrase_table

#: The phrase RNN's column as it ran in + RNN: already in Baseline's lists, which decode the six-column
#: table with it at weight 0; a set with it tunes that column instead of holding it at 0.
LIST_FEATURE = "p_RNN"
BASELINE_RERANKED = "Baseline reranked"
SPLITS = ("dev", "test")
#: Sentences a model scores between two saved parts: what a killed scoring of a long list loses at most.
BLOCK_SENTENCES = 100
#: The NMT model's own translation of test (beam search), for its standalone BLEU beside the reranking.
NMT_TRANSLATE_STAMP = "reranking/nmt-translate"


@dataclass(frozen=True)
class FeatureSet:
    """A row of the reranking report: the features added to Baseline's lists, by label."""

    label: str
    features: tuple[str, ...]

    @property
    def slug(self) -> str:
        return slug(self.label)


def slug(label: str) -> str:
    """A label as a file and stamp name: ``NMT p(e|f)`` → ``nmt-p-e-f``."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


def feature_sets(labels: Sequence[str]) -> list[FeatureSet]:
    """Baseline reranked; each feature alone; the phrase RNN both ways; and all together.

    ``labels`` are :data:`LIST_FEATURE` and the labels of
    :func:`table1.reranking_models.reranking_feature_specs`, in order. "All" takes the NMT model in both
    directions rather than one, and the paper-size RNN's last read-out only (its read-outs are one model
    at several ages).
    """
    sets = [FeatureSet(BASELINE_RERANKED, ())] + [FeatureSet(f"+ {label}", (label,)) for label in labels]
    if LIST_FEATURE in labels and "RNN(f|e)" in labels:
        sets.append(FeatureSet(f"+ {LIST_FEATURE} + RNN(f|e)", (LIST_FEATURE, "RNN(f|e)")))
    readouts = [label for label in labels if label.startswith("RNN d=")]
    together = [label for label in labels if label != "NMT p(e|f)" and label not in readouts[:-1]]
    if "NMT p(e|f)+p(f|e)" not in labels and "NMT p(e|f)" in labels:
        together.append("NMT p(e|f)")
    if len(together) > 2:
        sets.append(FeatureSet("+ all", tuple(together)))
    return sets


# --------------------------------------------------------------------------------------------
# Where things are


def list_path(exp: Experiment, run: int, split: str) -> Path:
    return exp.path("reranking", "lists", f"run{run}.{split}.nbest.gz")


def scores_path(exp: Experiment, label: str, run: int, split: str) -> Path:
    return exp.path("reranking", "scores", slug(label), f"run{run}.{split}.npy")


def output_path(exp: Experiment, fset: FeatureSet, run: int, split: str) -> Path:
    """A set's reranked 1-best of run ``run``'s list (tokenised, as Moses writes it)."""
    return exp.path("reranking", "outputs", fset.slug, f"run{run}.{split}.tok")


def nmt_test_output(exp: Experiment) -> Path:
    return exp.path("reranking", "nmt-forward.test.tok")


def list_stamp(run: int, split: str) -> str:
    return f"reranking/lists/run{run}/{split}"


def oracle_stamp(run: int, split: str) -> str:
    return f"reranking/oracle/run{run}/{split}"


def scores_stamp(label: str, run: int, split: str) -> str:
    return f"reranking/scores/{slug(label)}/run{run}/{split}"


def mert_stamp(fset: FeatureSet, run: int) -> str:
    return f"reranking/mert/{fset.slug}/run{run}"


def baseline_plan(run: int) -> RunPlan:
    return RunPlan(CONFIGURATIONS_BY_KEY["baseline"], run)


# --------------------------------------------------------------------------------------------
# Lists


def decode_list(exp: Experiment, run: int, split: str) -> dict[str, object]:
    """Run ``run``'s tuned Baseline on ``split`` into its distinct n-best list, kept gzipped."""
    ini = exp.tune_dir(baseline_plan(run)) / "moses.ini"
    final = list_path(exp, run, split)
    final.parent.mkdir(parents=True, exist_ok=True)
    plain = final.with_suffix("")  # runK.SPLIT.nbest, the decoder's own file until it is compressed
    result = decode(exp.moses().bin_dir, ini, exp.prepared(split, exp.src), final.with_name(f"run{run}.{split}.1best"),
                    nbest_path=plain, nbest_size=exp.settings.reranking.nbest_size, distinct=True, threads=exp.jobs,
                    extra_args=[SEGMENTATION_FLAG])
    copy_compressed(plain, final)
    plain.unlink()
    return {"ini": str(ini), "list": str(final), "decode_seconds": round(result.seconds, 1)}


def oracle_curve(exp: Experiment, run: int, split: str) -> dict[str, object]:
    """The oracle BLEU (tokenised; :func:`mert.rerank.oracle_bleu`) of the list's first k hypotheses, for
    k from 1 to ``nbest_size``: how much any reranking could gain, and how much a deeper list adds."""
    r = exp.settings.reranking
    arrays = load_nbest_arrays(list_path(exp, run, split))
    stats = bleu_statistics(arrays, read_references([exp.prepared(split, exp.tgt)]))
    sizes = sorted({s for s in (1, 10, 50, 100, 200, 500, r.rerank_size, r.nbest_size) if s <= r.nbest_size})
    curve = [[size, round(oracle_bleu(stats, arrays.offsets, size), 2)] for size in sizes]  # a list: stamps sort keys
    counts = np.diff(arrays.offsets)
    return {"oracle_bleu": curve, "hypotheses": len(arrays.hypotheses),
            "mean_list_size": round(float(counts.mean()), 1)}


# --------------------------------------------------------------------------------------------
# A model's scores of a list


#: What a model's score of a hypothesis depends on: its sentence, words and phrase segmentation. The same
#: hypothesis recurs in other runs' lists of the same sentences (their weights differ, their system not).
HypothesisKey = tuple[int, str, object]
Known = dict[HypothesisKey, np.ndarray]


def hypothesis_key(entry: NBestEntry) -> HypothesisKey:
    return entry.sent_id, entry.hypothesis, entry.segmentation


def known_scores(nbest: Path, values: Path, size: int, known: Known) -> None:
    """Add a scored list's values to ``known``, by hypothesis."""
    scores = np.load(values)
    for entry, row in zip(read_nbest(nbest, per_sentence=size), scores, strict=True):
        known.setdefault(hypothesis_key(entry), row)


def score_list(feature: NBestFeature, nbest: Path, sources: list[str], size: int, out: Path,
               known: Known | None = None) -> dict[str, object]:
    """``feature``'s values of each sentence's first ``size`` hypotheses of ``nbest``, saved as ``out``
    (``[H, num_values]``, rows in list order). Saved in parts of :data:`BLOCK_SENTENCES` sentences
    beside it, so that a killed scoring resumes at its last part; the parts go once ``out`` is whole.
    Hypotheses in ``known`` (other runs' lists of the same sentences) take their values from there: a
    model's score depends on the hypothesis' sentence, words and segmentation only."""
    parts = out.with_name(out.name + ".parts")
    parts.mkdir(parents=True, exist_ok=True)
    name, known = display_name(nbest), {} if known is None else known
    reused = 0

    def save(block: list[NBestEntry]) -> None:
        nonlocal reused
        part = parts / f"{block[0].sent_id // BLOCK_SENTENCES:06d}.npy"
        if part.exists():
            return
        new = [e for e in block if hypothesis_key(e) not in known]
        if new:
            for entry, row in zip(new, score_entries([feature], sources, new, path=name)[0], strict=True):
                known[hypothesis_key(entry)] = row
        reused += len(block) - len(new)
        with atomic_path(part) as partial, open(partial, "wb") as fh:
            np.save(fh, np.stack([known[hypothesis_key(e)] for e in block]))

    block: list[NBestEntry] = []
    for entry in read_nbest(nbest, expected_sentences=len(sources), per_sentence=size):
        if block and entry.sent_id // BLOCK_SENTENCES != block[-1].sent_id // BLOCK_SENTENCES:
            save(block)
            block = []
        block.append(entry)
    if block:
        save(block)
    files = sorted(parts.glob("[0-9]*.npy"))
    values = np.concatenate([np.load(f) for f in files])
    with atomic_path(out) as partial, open(partial, "wb") as fh:
        np.save(fh, values)
    shutil.rmtree(parts)
    return {"name": feature.name, "values": feature.num_values, "hypotheses": int(values.shape[0]),
            "reused": reused}


def score_lists(exp: Experiment, label: str, spec: str, runs: int) -> None:
    """One model's scores of every run's dev and test list (the model loaded once, only if one is missing);
    a hypothesis an earlier run's list of the same split holds is not scored again."""
    todo = [(k, split) for k in range(1, runs + 1) for split in SPLITS if not exp.done(scores_stamp(label, k, split))]
    if not todo:
        return
    feature, size = load_feature(spec), exp.settings.reranking.rerank_size
    for split in SPLITS:
        known: Known = {}
        for k in range(1, runs + 1):
            if exp.done(scores_stamp(label, k, split)):
                known_scores(list_path(exp, k, split), scores_path(exp, label, k, split), size, known)
        sources = read_source_sentences(exp.prepared(split, exp.src))
        for k in (k for k, s in todo if s == split):
            out = scores_path(exp, label, k, split)
            out.parent.mkdir(parents=True, exist_ok=True)
            exp.step(scores_stamp(label, k, split), lambda k=k, out=out, split=split, known=known, src=sources: {
                "spec": spec, **score_list(feature, list_path(exp, k, split), src, size, out, known)})


# --------------------------------------------------------------------------------------------
# Tuning on the lists


@dataclass
class RunLists:
    """Run k's dev and test lists (each sentence's first ``rerank_size`` hypotheses), dev's BLEU statistics."""

    run: int
    dev: NBestArrays
    test: NBestArrays
    dev_stats: np.ndarray


def load_run_lists(exp: Experiment, run: int) -> RunLists:
    size = exp.settings.reranking.rerank_size
    dev, test = (load_nbest_arrays(list_path(exp, run, split), per_sentence=size) for split in SPLITS)
    return RunLists(run, dev, test, bleu_statistics(dev, read_references([exp.prepared("dev", exp.tgt)])))


def with_scores(exp: Experiment, arrays: NBestArrays, fset: FeatureSet, run: int, split: str) -> NBestArrays:
    """``arrays`` with the set's models' scores appended (the list's own p_RNN column is there already)."""
    extra = []
    for label in fset.features:
        if label == LIST_FEATURE:
            continue
        stamp = exp.read_stamp(scores_stamp(label, run, split))
        extra.append((str(stamp["name"]), np.load(scores_path(exp, label, run, split))))
    return with_columns(arrays, extra)


def fixed_columns(exp: Experiment, fset: FeatureSet) -> list[str]:
    """The table's columns held at 0: the RNN's and the unknown-word column, or only the latter with p_RNN."""
    table_feature, _, num_scores = single_phrase_table(exp.rnn_ini)
    config = CONFIGURATIONS_BY_KEY["rnn" if LIST_FEATURE in fset.features else "baseline"]
    return config.fixed_columns(table_feature, num_scores)


def tune_set(exp: Experiment, lists: RunLists, fset: FeatureSet) -> dict[str, object]:
    """Tune the set's weights on run k's dev lists, from run k's tuned Baseline weights (new columns at 0);
    write the reranked dev and test 1-best."""
    ini = exp.tune_dir(baseline_plan(lists.run)) / "moses.ini"
    dev = with_scores(exp, lists.dev, fset, lists.run, "dev")
    added = dev.feature_names[len(lists.dev.feature_names):]
    start = weights_vector({**run_weights(ini), **{name: [0.0] * count for name, count in added}},
                           dev.feature_names, where=str(ini))
    r = exp.settings.reranking
    tuned = tune_on_lists(dev, lists.dev_stats, start, fixed=fixed_mask(dev.feature_names, fixed_columns(exp, fset)),
                          restarts=r.restarts, seed=baseline_plan(lists.run).seed, threads=exp.jobs)
    test = with_scores(exp, lists.test, fset, lists.run, "test")
    depth = {}
    for split, arrays in (("dev", dev), ("test", test)):
        out = output_path(exp, fset, lists.run, split)
        out.parent.mkdir(parents=True, exist_ok=True)
        rows = best_rows(arrays.features @ tuned.weights, arrays.offsets)
        with atomic_path(out) as partial:
            partial.write_text("".join(f"{arrays.hypotheses[i]}\n" for i in rows), encoding="utf-8")
        depth[split] = choice_depth(rows - arrays.offsets[:-1], r.rerank_size)
    held = set(fixed_columns(exp, fset))
    baseline_tunes = set(column_names(lists.dev.feature_names)) - set(fixed_columns(exp, FeatureSet("", ())))
    new = [c for c in column_names(dev.feature_names) if c not in held and c not in baseline_tunes]
    return {"weights": tuned.named(), "new_columns": new, "dev_bleu": round(tuned.dev_bleu, 4),
            "start_dev_bleu": round(tuned.start_bleu, 4), "choice_depth": depth}


def choice_depth(positions: np.ndarray, rerank_size: int) -> dict[str, int]:
    """How many sentences took their reranked 1-best from each stretch of the list (0-based ``positions``):
    ``{"1": n, "2-10": n, "11-50": n, "51-100": n}`` for a reranked prefix of 100. A set that often
    chooses from the last stretch would have found more in a deeper list; one that never leaves the top
    ten would not."""
    bounds = sorted({b for b in (1, 10, 50) if b < rerank_size} | {rerank_size})
    counts, low = {}, 0
    for high in bounds:
        stretch = str(high) if high == low + 1 else f"{low + 1}-{high}"
        counts[stretch] = int(((positions >= low) & (positions < high)).sum())
        low = high
    return counts


# --------------------------------------------------------------------------------------------
# The step


def available_sets(exp: Experiment) -> tuple[list[FeatureSet], list[str]]:
    """(The sets whose models are all trained, the labels of models not trained yet) with their specs."""
    specs = reranking_feature_specs(exp)
    ready = [LIST_FEATURE, *(label for label, spec in specs.items() if spec)]
    return feature_sets(ready), [label for label, spec in specs.items() if not spec]


def sentence_counts(exp: Experiment) -> dict[str, int]:
    """Sentences of dev and test, read once for the whole plan."""
    return {split: len(read_source_sentences(exp.prepared(split, exp.src))) for split in SPLITS}


def decode_rate(exp: Experiment, runs: int, sentences: dict[str, int]) -> tuple[float, str] | None:
    """Seconds per sentence of a list's decode: measured on the lists done, else the tuning's 100-best
    decodes of dev (a lower bound: a deeper list takes longer)."""
    done = [(exp.read_stamp(list_stamp(k, s)), s) for k in range(1, runs + 1) for s in SPLITS
            if exp.done(list_stamp(k, s))]
    done = [(d, s) for d, s in done if "decode_seconds" in d]
    if done:
        return sum(float(d["decode_seconds"]) for d, _ in done) / sum(sentences[s] for _, s in done), "measured"
    decodes = [float(it["decode_seconds"]) for it in tuning_iterations(exp, {"baseline"}) if "decode_seconds" in it]
    if decodes:
        return sum(decodes) / len(decodes) / sentences["dev"], "at least: the tuning's 100-best decodes"
    return None


def scoring_rate(exp: Experiment, label: str, runs: int) -> float | None:
    """Seconds per hypothesis a model took on the lists it has scored (those it scored, not reused)."""
    stamps = [exp.read_stamp(scores_stamp(label, k, s)) for k in range(1, runs + 1) for s in SPLITS
              if exp.done(scores_stamp(label, k, s))]
    scored = sum(int(d.get("hypotheses", 0)) - int(d.get("reused", 0)) for d in stamps)
    return sum(float(d["seconds"]) for d in stamps) / scored if scored > 0 else None


def plan_lines(exp: Experiment, runs: int, sets: list[FeatureSet], missing: list[str]) -> list[str]:
    """What is still to do, in hours where a rate has been measured (the reranking's time plan)."""
    r = exp.settings.reranking
    todo = [(k, s) for k in range(1, runs + 1) for s in SPLITS if not exp.done(list_stamp(k, s))]
    sentences = sentence_counts(exp)
    rate = decode_rate(exp, runs, sentences) if todo else None
    hours = "" if rate is None else f": {sum(sentences[s] for _, s in todo) * rate[0] / 3600:.1f} h ({rate[1]})"
    lines = [f"reranking: {len(todo)} of {2 * runs} lists to decode ({r.nbest_size}-best distinct, the first "
             f"{r.rerank_size} scored){hours}"]
    labels = dict.fromkeys(f for fset in sets for f in fset.features if f != LIST_FEATURE)
    for label in labels:
        left = [(k, s) for k in range(1, runs + 1) for s in SPLITS if not exp.done(scores_stamp(label, k, s))]
        if left:
            per = scoring_rate(exp, label, runs)
            size = sum(sentences[s] for _, s in left) * r.rerank_size
            lines.append(f"reranking: {label}: {len(left)} lists to score, at most {size:,} hypotheses"
                         + (f", {size * per / 3600:.1f} h at its measured rate (less: hypotheses other runs' lists "
                            "hold are not scored again)" if per else "; its rate is measured on the first"))
    tunings = sum(not exp.done(mert_stamp(f, k)) for f in sets for k in range(1, runs + 1))
    lines.append(f"reranking: {tunings} tunings on fixed lists to run ({len(sets)} sets x {runs} runs; minutes each)")
    if missing:
        lines.append(f"reranking: not trained yet, so not in this report: {', '.join(missing)} "
                     "(table1 reranking-models trains them)")
    return lines


def step_reranking(exp: Experiment, runs: int) -> list[FeatureSet]:
    """Decode, score and tune what is not stamped yet; returns the sets whose runs are all tuned."""
    exp.require("baseline", "rnn", *(f"tune/{baseline_plan(k).name}" for k in range(1, runs + 1)))
    sets, missing = available_sets(exp)
    for line in plan_lines(exp, runs, sets, missing):
        say(line)
    for k in range(1, runs + 1):
        for split in SPLITS:
            exp.step(list_stamp(k, split), lambda k=k, split=split: decode_list(exp, k, split))
            exp.step(oracle_stamp(k, split), lambda k=k, split=split: oracle_curve(exp, k, split))
    if exp.done(nmt_stamp(False)):  # what the NMT model reaches alone: its beam search's test BLEU
        exp.step(NMT_TRANSLATE_STAMP, lambda: run_tool(
            [exp.console("nmt"), "translate", nmt_model(exp), exp.prepared("test", exp.src), nmt_test_output(exp),
             "--device", exp.device, "--threads", str(exp.jobs), "--quiet"], exp.log_file("reranking")))
    specs = reranking_feature_specs(exp)
    for label in dict.fromkeys(f for fset in sets for f in fset.features if f != LIST_FEATURE):
        spec = specs[label]
        if spec is None:
            raise ExperimentError(f"reranking: {label} has no model")
        score_lists(exp, label, spec, runs)
    for k in range(1, runs + 1):
        todo = [fset for fset in sets if not exp.done(mert_stamp(fset, k))]
        if todo:
            lists = load_run_lists(exp, k)
            for fset in todo:
                exp.step(mert_stamp(fset, k), lambda f=fset, lists=lists: tune_set(exp, lists, f))
    return sets
