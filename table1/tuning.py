"""The steps that tune and decode: decoding speed (``speed``), the MERT runs of every configuration
(``tune``) and the decodes of dev and test with each tuned system (``eval``). Each tuning run
resumes by itself (``mert tune --continue``) and is stamped separately, so rows can be added later."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from infrastructure.lines import text_lines
from mert.evaluate import decode_test_set
from mert.tune import read_state
from moses_integration.decoder import decode
from moses_integration.moses_ini import MosesIni
from table1.reranking_models import reranking_feature_specs
from table1.settings import ALL_CONFIGURATIONS, CONFIGURATIONS_BY_KEY, OPTIONAL_ROWS, Configuration, RunPlan
from table1.systems import cslm_system
from table1.text_prep import (
    write_text_lines,
)
from table1.workspace import RUNNING, STAMPS, Experiment, ExperimentError, run_tool, say, single_phrase_table

# --------------------------------------------------------------------------------------------
# speed: how fast each system decodes, measured before the tuning runs are sized by it

#: Dev sentences decoded (1 thread, the tuning n-best size) to measure each system's speed.
SPEED_SENTENCES = 40


def step_speed(exp: Experiment, configs: list[Configuration]) -> None:
    """Decoding speed of the systems the chosen rows tune (:func:`speed_systems`). One thread, the
    first dev sentences, n-best lists as in tuning; Moses' loading time is measured apart (on an
    empty input), since every MERT iteration and every evaluation starts the decoder again. The
    report turns these into the budget."""
    for name in speed_systems(configs):
        if name == "cslm":
            ini = cslm_system(exp)
        else:
            exp.require(name)  # each other system is its step's stamp
            ini = exp.system_ini(name)
        exp.step(f"speed/{name}", lambda n=name, i=ini: measure_decoding(exp, n, i))


def speed_systems(configs: list[Configuration]) -> list[str]:
    """The systems the ``speed`` step measures: the 6-column one always (the time plan's reference),
    then each other system a chosen row decodes with, in table order."""
    return list(dict.fromkeys(["rnn"] + [c.decoded_system for c in configs]))


def measure_decoding(exp: Experiment, name: str, ini: Path) -> dict[str, object]:
    folder = exp.path("speed")
    folder.mkdir(parents=True, exist_ok=True)
    empty, head = folder / "empty.txt", folder / f"dev-head.{exp.src}"
    empty.write_text("", encoding="utf-8")
    sentences = write_text_lines(head, itertools.islice(text_lines(exp.prepared("dev", exp.src)), SPEED_SENTENCES))
    timed = {}
    for label, source in (("load", empty), ("decode", head)):
        started = time.perf_counter()
        decode(exp.moses().bin_dir, ini, source, folder / f"{name}.{label}.out", nbest_path=folder / f"{name}.nbest",
               nbest_size=exp.settings.nbest_size, threads=1)
        timed[label] = time.perf_counter() - started
    per_sentence = max(timed["decode"] - timed["load"], 0.0) / sentences
    return {"sentences": sentences, "load_seconds": round(timed["load"], 2),
            "seconds_per_sentence": round(per_sentence, 4)}


@dataclass(frozen=True)
class OptimisationCost:
    """MERT's own optimisation, measured on the tuning iterations this work folder has finished.

    Each iteration optimises on every n-best list so far, merged, so its time grows with the
    pool: measured on Table 1's small-news pools (38k to 263k hypotheses, 20 restarts, one
    core) it was 5.0, 12.3, 19.5 and 25.9 s, near-linear. Over a run at the cap the pool reaches
    ``cap`` iterations' new hypotheses, so the optimisation grows with cap² while decoding grows
    with cap: at medium's 25 iterations it is a real share of a run, where at small's 10 it was
    seconds against minutes.
    """

    seconds_per_hypothesis: float  # the iterations' optimisation seconds over their merged pools
    new_per_sentence: float  # the new hypotheses an iteration adds to the pool, per dev sentence
    iterations: int  # how many iterations it was measured on

    def run_seconds(self, dev: int, cap: int) -> float:
        """At most, for a run at the cap: iteration k optimises on k iterations' new hypotheses."""
        return self.seconds_per_hypothesis * self.new_per_sentence * dev * cap * (cap + 1) / 2


def tuning_iterations(exp: Experiment, keys: set[str] | None = None) -> list[dict]:
    """The finished iterations recorded in the ``tuning-state.json`` of the work folder's runs (of
    the rows ``keys`` only, where given)."""
    return [it for path in sorted(exp.path("tune").glob("*/run*/")) if keys is None or path.parent.name in keys
            for it in ((read_state(path) or {}).get("iterations") or [])]


def measured_optimisation(exp: Experiment, dev: int) -> OptimisationCost | None:
    """:class:`OptimisationCost` from every run of the work folder, ``dev`` sentences a tuning
    iteration (None before the first iteration that optimised)."""
    done = [it for it in tuning_iterations(exp) if it.get("optimised_bleu") is not None and it.get("merged_hypotheses")]
    if not done or not dev:
        return None
    return OptimisationCost(sum(it["optimise_seconds"] for it in done) / sum(it["merged_hypotheses"] for it in done),
                            sum(it["new_hypotheses"] for it in done) / len(done) / dev, len(done))


@dataclass(frozen=True)
class MeasuredDecoding:
    """A system's MERT iterations as the work folder's runs of it decoded them: under the machine's
    real load, which the ``speed`` step's 40 sentences in a quiet moment do not see (at small-news
    its 1.2 min an iteration against a measured 3.5)."""

    seconds_per_iteration: float  # the mean of the iterations' decode times
    iterations: int


def measured_decoding(exp: Experiment, system: str) -> MeasuredDecoding | None:
    """:class:`MeasuredDecoding` of ``system`` from the runs of every row that decodes with it."""
    keys = {c.key for c in ALL_CONFIGURATIONS if c.decoded_system == system}
    done = [it["decode_seconds"] for it in tuning_iterations(exp, keys) if it.get("decode_seconds")]
    return MeasuredDecoding(sum(done) / len(done), len(done)) if done else None


@dataclass(frozen=True)
class RowCost:
    """What a row's runs cost: decoding, from its system's tuning iterations so far or else the
    ``speed`` step's measurement, and MERT's optimisation where tuning iterations measured it."""

    speed: dict[str, float]  # the speed stamp: sentences, load_seconds, seconds_per_sentence
    dev: int
    test: int
    threads: int
    cap: int  # MERT's iteration cap
    optimisation: OptimisationCost | None = None
    decoding: MeasuredDecoding | None = None

    @property
    def iteration_seconds(self) -> float:
        """One MERT iteration's decoding."""
        if self.decoding is not None:
            return self.decoding.seconds_per_iteration
        return self.speed["load_seconds"] + self.dev * self.speed["seconds_per_sentence"] / self.threads

    @property
    def optimisation_hours(self) -> float:
        """One tuning run's optimisation at the cap (0 where not measured yet)."""
        return 0.0 if self.optimisation is None else self.optimisation.run_seconds(self.dev, self.cap) / 3600

    @property
    def tuning_hours(self) -> float:
        """One tuning run at the cap: its decoding and its optimisation."""
        return self.cap * self.iteration_seconds / 3600 + self.optimisation_hours

    @property
    def evaluation_hours(self) -> float:
        """One run's dev + test decodes, each sentence at an iteration's pace."""
        load = self.speed["load_seconds"]
        per_sentence = max(self.iteration_seconds - load, 0.0) / self.dev
        return (2 * load + (self.dev + self.test) * per_sentence) / 3600


class FolderMeasures:
    """What every row's cost shares, read from the work folder at most once per plan or report, and
    only when a row's speed is measured: the dev and test sizes and MERT's optimisation over all the
    runs so far."""

    def __init__(self, exp: Experiment) -> None:
        self.exp = exp

    @cached_property
    def dev(self) -> int:
        return sum(1 for _ in text_lines(self.exp.prepared("dev", self.exp.src)))

    @cached_property
    def test(self) -> int:
        return sum(1 for _ in text_lines(self.exp.prepared("test", self.exp.src)))

    @cached_property
    def optimisation(self) -> OptimisationCost | None:
        return measured_optimisation(self.exp, self.dev)


def row_cost(exp: Experiment, config: Configuration, measures: FolderMeasures) -> RowCost | None:
    """The cost of ``config``'s runs (None: its system's speed is not measured)."""
    system = config.decoded_system
    if not exp.done(f"speed/{system}"):
        return None
    return RowCost(exp.read_stamp(f"speed/{system}"),
                   dev=measures.dev, test=measures.test, threads=exp.jobs, cap=exp.settings.tune_max_iterations,
                   optimisation=measures.optimisation, decoding=measured_decoding(exp, system))


def decoding_note(cost: RowCost) -> str:
    """Where a row's decoding hours come from."""
    d = cost.decoding
    if d is None:
        return "decoding as the speed step measured it"
    return f"decoding {d.seconds_per_iteration / 60:.1f} min an iteration, as {d.iterations} tuning iterations measured"


def optimisation_note(cost: RowCost) -> str:
    """How the optimisation is counted in a row's hours."""
    o = cost.optimisation
    if o is None:
        return "MERT's optimisation not counted (no tuning iteration of this work folder has measured it yet)"
    return (f"MERT's optimisation ≤ {cost.optimisation_hours:.1f} h of them ({1000 * o.seconds_per_hypothesis:.3f} ms "
            f"per merged hypothesis and {o.new_per_sentence:.0f} new hypotheses per sentence an iteration, "
            f"measured on {o.iterations} iterations)")


def budget_notes(exp: Experiment, configs: list[Configuration], runs: int) -> list[str]:
    """The tuning budget from the measured speeds: decoding time of one MERT iteration and of a row's
    runs at the iteration cap, with ``jobs`` decoder threads, and MERT's optimisation where measured."""
    notes, measures = [], FolderMeasures(exp)
    for config in configs:
        cost = row_cost(exp, config, measures)
        if cost is None:
            continue
        speed = cost.speed
        notes.append(
            f"Budget, {config.label}: {speed['seconds_per_sentence']:.3f} s per dev sentence on 1 thread and "
            f"{speed['load_seconds']:.0f} s to load (measured on {speed['sentences']:.0f} sentences); one MERT "
            f"iteration decodes {cost.dev} sentences with {cost.threads} thread{'s' if cost.threads != 1 else ''} "
            f"in ~{cost.iteration_seconds / 60:.1f} min ({decoding_note(cost)}), so {runs} "
            f"run{'s' if runs != 1 else ''} at the {cost.cap}-iteration cap take "
            f"≤ {runs * cost.tuning_hours:.1f} h "
            f"({optimisation_note(cost)}), and their dev + test evaluation ({cost.dev} + {cost.test} sentences) "
            f"{runs * cost.evaluation_hours:.1f} h.")
    return notes


def hours_done(exp: Experiment) -> float:
    """Wall hours of the steps stamped so far: the leaf stamps (a step whose parts are stamped too is
    counted through its parts), so an interruption between sessions does not count."""
    seconds = {}
    for stamp in exp.path(STAMPS).glob("*.json"):
        info = json.loads(stamp.read_text(encoding="utf-8"))
        seconds[info["step"]] = float(info.get("seconds", 0.0))
    return sum(t for name, t in seconds.items() if not any(other.startswith(name + "/") for other in seconds)) / 3600


def tuning_hours_left(exp: Experiment, plans: list[RunPlan], cost: RowCost) -> tuple[float, float]:
    """Hours still to go for the tuning runs of ``plans`` at the cap, and the hours the unfinished
    ones have taken already (a run resumed across sessions: its clock in ``stamps/running/``), which
    come off their cap's hours."""
    left, started = 0.0, 0.0
    for plan in plans:
        if exp.done(f"tune/{plan.name}"):
            continue
        so_far = exp.seconds_so_far(f"tune/{plan.name}") / 3600
        started += so_far
        left += max(cost.tuning_hours - so_far, 0.0)
    return left, started


def finished_pace_note(exp: Experiment, plans: list[RunPlan], evaluations: float) -> str:
    """What a row's runs still to go take at the pace of its finished ones, beside the cap's bound: MERT
    usually converges well before its cap (medium's first Baseline run: 7 of 25 iterations), so the cap
    alone would plan three times the hours."""
    finished = [float(exp.read_stamp(f"tune/{p.name}")["seconds"]) / 3600 for p in plans if exp.done(f"tune/{p.name}")]
    to_go = [p for p in plans if not exp.done(f"tune/{p.name}")]
    if not finished or not to_go:
        return ""
    pace = sum(finished) / len(finished)
    likely = sum(max(pace - exp.seconds_so_far(f"tune/{p.name}") / 3600, 0.0) for p in to_go) + evaluations
    runs = f"{len(finished)} finished run{'s' if len(finished) != 1 else ''}"
    return f"; {likely:.1f} h at the pace of its {runs} ({pace:.1f} h each)"


def time_plan(exp: Experiment, configs: list[Configuration], runs: int) -> list[str]:
    """The plan printed before the first tuning run, so that a user sees what fits in the time they
    have: hours per tuning run (at the cap) and per evaluation of each chosen row, their total with
    what is done, and which optional rows (:data:`OPTIONAL_ROWS`) would fit in the scale's
    ``plan_hours`` after them, in order."""
    lines, total, measures = [], hours_done(exp), FolderMeasures(exp)
    plans_of = {config.key: [RunPlan(config, k) for k in range(1, runs + 1)] for config in configs}
    unfinished = sum(exp.seconds_so_far(f"tune/{plan.name}") for plans in plans_of.values() for plan in plans) / 3600
    total += unfinished
    lines.append(f"time plan: {total:.1f} h of steps done so far"
                 + (f" ({unfinished:.1f} h of it in tuning runs not finished)" if unfinished else ""))
    for config in configs:
        cost = row_cost(exp, config, measures)
        if cost is None:
            lines.append(f"time plan: {config.label}: its system's speed is not measured")
            continue
        plans = plans_of[config.key]
        left = sum(not exp.done(f"tune/{plan.name}") for plan in plans)
        tuning_left, started = tuning_hours_left(exp, plans, cost)
        evaluations = sum(not exp.done(f"eval/{plan.name}/test") for plan in plans) * cost.evaluation_hours
        row = tuning_left + evaluations
        total += row
        lines.append(f"time plan: {config.label}: {cost.tuning_hours:.1f} h per tuning run at the {cost.cap}-iteration "
                     f"cap ({decoding_note(cost)}; {optimisation_note(cost)}), {cost.evaluation_hours:.2f} h per dev "
                     f"+ test evaluation; "
                     f"{left} of {runs} runs to go: {row:.1f} h"
                     + (f" ({started:.1f} h of their tuning done)" if started else "")
                     + finished_pace_note(exp, plans, evaluations))
    budget = exp.settings.plan_hours
    planned = f" of the {budget:.0f} h planned" if budget else ""
    lines.append(f"time plan: chosen rows: {total:.1f} h in all{planned}")
    if budget is None:
        return lines
    chosen = {c.key for c in configs}
    for key in (k for k in OPTIONAL_ROWS if k not in chosen):
        config = CONFIGURATIONS_BY_KEY[key]
        cost = row_cost(exp, config, measures)
        if cost is None:
            lines.append(f"time plan: optional {config.label}: its system's speed is not measured")
            continue
        training = exp.settings.cslm.max_time / 3600 if config.cslm and not exp.done("cslm") else 0.0
        extra = runs * (cost.tuning_hours + cost.evaluation_hours) + training
        fits = total + extra <= budget
        total += extra if fits else 0
        lines.append(f"time plan: optional {config.label}: {extra:.1f} h"
                     + (" (with the CSLM's training; n-best rescoring not counted)" if config.cslm else "")
                     + (f": fits, {total:.1f} h in all" if fits else f": does not fit ({total + extra:.1f} h)"))
    return lines


# --------------------------------------------------------------------------------------------
# tune: every configuration, RUNS times


def tune_command(exp: Experiment, plan: RunPlan) -> list[str]:
    """The ``mert tune`` call of one run: 6-column system (7 with proposals), columns outside the row
    fixed at 0."""
    table_feature, _, num_scores = single_phrase_table(exp.table_system(plan.config))
    s = exp.settings
    command = [
        exp.console("mert"), "tune", "--moses-ini", str(exp.tuned_system(plan)),
        "--src", str(exp.prepared("dev", exp.src)), "--ref", str(exp.prepared("dev", exp.tgt)),
        "--work-dir", str(exp.tune_dir(plan)), "--threads", str(exp.jobs), "--seed", str(plan.seed),
        "--max-iterations", str(s.tune_max_iterations), "--nbest-size", str(s.nbest_size),
        "--restarts", str(s.restarts), "--continue",
    ]
    command += ["--moses-bin-dir", str(exp.moses().bin_dir)]
    for column in plan.config.fixed_columns(table_feature, num_scores):
        command += ["--fixed", column]
    for spec in [*plan.config.feature_specs(str(exp.cslm_model)), *nbest_feature_specs(exp, plan.config)]:
        command += ["--feature", spec]
    return command


def nbest_feature_specs(exp: Experiment, config: Configuration) -> list[str]:
    """``mert tune --feature`` values of the reranking's models the row tunes with (none trained: an error)."""
    specs = reranking_feature_specs(exp)
    missing = [label for label in config.nbest_features if not specs.get(label)]
    if missing:
        raise ExperimentError(f"{config.label} needs {', '.join(missing)}, not trained in {exp.work}: "
                              "run table1 reranking-models first")
    return [str(specs[label]) for label in config.nbest_features]


def check_start_weights(exp: Experiment, config: Configuration) -> None:
    """Fixed columns stay at their start weight: it must be 0, or Baseline is not the original system."""
    ini = exp.table_system(config)
    table_feature, _, num_scores = single_phrase_table(ini)
    weights = MosesIni.read(ini).weights().get(table_feature, [])
    for column in config.fixed_columns(table_feature, num_scores):
        value = weights[int(column.rsplit("_", 1)[1])]
        if value != 0.0:
            raise ExperimentError(f"{ini}: {column} starts at {value}, but {config.label} holds it fixed; "
                                  "its start weight must be 0 (rescore-phrase-table --rnn-weight 0 --wp-weight 0)")


def tuned_seed(exp: Experiment, plan: RunPlan) -> int | None:
    """The seed a run was tuned with, from its tuning state (None: not started)."""

    return state_seed(read_state(exp.tune_dir(plan)) or {})


def state_seed(state: dict[str, object]) -> int | None:
    """``mert tune``'s seed as its tuning state records it (None: no state, or random seeds), in its
    options (or, written by an earlier version, its fingerprint)."""
    options = state.get("options", state.get("fingerprint"))
    seed = options.get("seed") if isinstance(options, dict) else None
    return seed if isinstance(seed, int) else None


def check_run_current(exp: Experiment, plan: RunPlan) -> None:
    """Refuse to reuse a run made under other rules: tuned with another seed (work folders from
    before run seeds became 1000, 1001, ...), or decoded before its tuning last finished.

    Nothing is removed: the message says what to move aside so that the run is done again.
    """
    name = f"tune/{plan.name}"
    evals = [f"eval/{plan.name}/{split}" for split in ("dev", "test")]
    stamps = ", ".join(exp.stamp_path(n).name for n in (name, *evals))
    aside = (f"move {exp.tune_dir(plan)} and the stamps {stamps} (in {exp.path(STAMPS)}; "
             f"the run's time so far in {RUNNING}/ too) aside")
    seed = tuned_seed(exp, plan)
    if seed is not None and seed != plan.seed:
        raise ExperimentError(f"{exp.tune_dir(plan)}: tuned with seed {seed}, but run {plan.run} is tuned with seed "
                              f"{plan.seed} now (run seeds 1000 k shared restart points across iterations); "
                              f"{aside} to tune it again")
    if not exp.done(name):
        return
    tuned = _stamp_finished(exp, name)
    for ev in evals:
        if exp.done(ev) and _stamp_finished(exp, ev) < tuned:
            raise ExperimentError(f"{exp.stamp_path(ev)}: decoded before {name} last finished ({tuned}); "
                                  f"move that stamp aside to decode the tuned system again")


def _stamp_finished(exp: Experiment, name: str) -> str:
    """When a step finished (ISO 8601 UTC, as stamped: compares as text)."""
    return str(exp.read_stamp(name).get("finished", ""))


def step_tune(exp: Experiment, configs: list[Configuration], runs: int) -> None:
    """Tune each configuration ``runs`` times (seeds 1000, 1001, ...); each run resumes by itself."""
    exp.require("rnn")
    if not all(exp.done(f"tune/{RunPlan(c, k).name}") for c in configs for k in range(1, runs + 1)):
        for line in time_plan(exp, configs, runs):
            say(line)
    for config in configs:
        if config.nbest_features:
            nbest_feature_specs(exp, config)  # one line before any tuning when a model is missing
        if config.cslm_nbest:
            exp.require("cslm", "cslm/export")
        elif config.cslm_in_search:
            cslm_system(exp)
        exp.require(config.table_system)
        for k in range(1, runs + 1):
            plan = RunPlan(config, k)
            check_run_current(exp, plan)
            if not exp.done(f"tune/{plan.name}"):  # finished runs are kept whatever the ini says now
                check_start_weights(exp, config)
            exp.tune_dir(plan).parent.mkdir(parents=True, exist_ok=True)
            exp.step(f"tune/{plan.name}", lambda p=plan: run_tool(
                tune_command(exp, p), exp.log_file(f"tune-{p.config.key}-run{p.run}")))


# --------------------------------------------------------------------------------------------
# eval: decode dev and test with every tuned system


def details_output(output: Path) -> Path:
    """Where a test decode keeps Moses' translation details of its 1-best (``runK.test.tok.details``)."""
    return output.with_name(output.name + ".details")


def step_eval(exp: Experiment, configs: list[Configuration], runs: int) -> None:
    """Decode dev and test with each tuned config (the CSLM in the decoder, or by n-best rescoring).

    The test decodes also keep Moses' translation details (each 1-best's source spans and target
    phrases), from which the report shows where the RNN changed the phrase choice; not for rows
    whose output n-best rescoring picks, since the details describe Moses' own 1-best."""

    for config in configs:
        for k in range(1, runs + 1):
            plan = RunPlan(config, k)
            exp.require(f"tune/{plan.name}")
            check_run_current(exp, plan)
            for split in ("dev", "test"):
                output = exp.eval_output(plan, split)
                details = details_output(output) if split == "test" and not config.nbest_rescored else None
                exp.step(f"eval/{plan.name}/{split}", lambda p=plan, sp=split, out=output, d=details: decode_test_set(
                    exp.tune_dir(p) / "moses.ini", exp.prepared(sp, exp.src), out,
                    moses_bin_dir=exp.moses().bin_dir, threads=exp.jobs, nbest_size=exp.settings.nbest_size,
                    keep_nbest=True, details=d,
                ) and {"output": str(out), **({"details": str(d)} if d else {})})
