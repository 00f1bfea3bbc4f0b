"""The steps that build the systems: raw text (``data``), Moses' preprocessing (``prepare``), the
Baseline Moses system (``baseline``), the RNN column (``rnn``; with a ``reverse`` row, the reverse
model and the table with both RNN columns too), the table the RNN completes (``proposals``) and the
CSLM (``cslm``)."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

from infrastructure.files import atomic_path
from infrastructure.lines import text_lines
from moses_integration.moses_ini import MosesIni
from moses_integration.nplm import neural_lm_feature_line
from table1 import wmt14
from table1.data_selection import SelectionSettings, select_lines
from table1.settings import RnnSettings, SelectionBudget, TextSlice
from table1.system_training import (
    build_language_model,
    eflomal_align,
    filter_for_input,
    run_logged,
    symmetrize,
    train_model_command,
)
from table1.text_prep import (
    CleanRules,
    clean_corpus_files,
    tokenize_lines,
    train_truecaser,
    truecase_lines,
    write_text_lines,
)
from table1.workspace import RERANK_STEP, TABLE2_KINDS, Experiment, ExperimentError, run_tool, say, single_phrase_table

# --------------------------------------------------------------------------------------------
# data: the raw text slices


def _slice_lines(data: Path, piece: TextSlice, lang: str):
    path = data / piece.path.format(lang=lang)
    if not path.exists():
        raise ExperimentError(f"missing input {path} (see docs/table1.md for the expected files)")
    return text_lines(path, first=piece.first, last=piece.last)


def _write_slices(data: Path, pieces: list[TextSlice], lang: str, out: Path) -> int:
    def lines():
        for piece in pieces:
            yield from _slice_lines(data, piece, lang)

    return write_text_lines(out, lines())


def _data_parts(exp: Experiment) -> list[tuple[str, list[TextSlice], tuple[str, ...]]]:
    """``(raw file stem, slices, languages)`` of every text the scale reads from ``DATA``."""
    s, both = exp.settings, (exp.src, exp.tgt)
    in_domain = [("train-in", list(s.train_in_domain), both)] if s.train_in_domain else []
    return [("train", s.train, both), *in_domain, ("dev", s.dev, both), ("test", [s.test], both),
            ("lm", s.lm, (exp.tgt,)), ("lm-valid", [s.lm_valid], (exp.tgt,))]


def missing_inputs(exp: Experiment) -> list[str]:
    """The files of ``DATA`` (relative paths) that the scale reads and that are not there."""
    assert exp.data is not None
    wanted = {piece.path.format(lang=lang) for _, pieces, langs in _data_parts(exp) for piece in pieces
              for lang in langs}
    return sorted(p for p in wanted if not (exp.data / p).exists())


def parallel_texts(exp: Experiment) -> tuple[str, ...]:
    """The raw parallel texts of the scale: the general training text, the in-domain one where the
    scale has it, dev and test."""
    return ("train", "train-in", "dev", "test") if exp.settings.train_in_domain else ("train", "dev", "test")


def step_data(exp: Experiment, mirror: str = wmt14.STATMT) -> None:
    """Copy the slices the scale names from ``DATA`` into ``raw/`` (untokenised text).

    Files of the WMT'14 data that ``DATA`` lacks are fetched first from their official sources
    (:mod:`table1.wmt14`; ``mirror`` stands for ``https://www.statmt.org/``); any other missing
    file is an error that names it.
    """
    if exp.data is None:
        raise ExperimentError("give DATA= (the folder of the raw text; SCALE=small: ../shared/data)")

    def body() -> dict[str, object]:
        missing = missing_inputs(exp)
        fetched: dict[str, object] = {}
        if missing:
            if not all(wmt14.provides(p) for p in missing):
                raise ExperimentError(f"missing input(s) in {exp.data}: {', '.join(missing)} (see "
                                      "docs/table1.md for the expected files)")
            say(f"data: fetching {', '.join(missing)} into {exp.data}")
            try:
                fetched = wmt14.fetch(exp.data, missing, mirror=mirror)  # type: ignore[arg-type]
            except wmt14.DataFetchError as exc:
                raise ExperimentError(str(exc)) from exc
        raw = exp.path("raw")
        raw.mkdir(parents=True, exist_ok=True)
        counts: dict[str, int] = {}
        for name, pieces, langs in _data_parts(exp):
            for lang in langs:
                counts[f"{name}.{lang}"] = _write_slices(exp.data, pieces, lang, raw / f"{name}.{lang}")  # type: ignore[arg-type]
        for name in parallel_texts(exp):
            if counts[f"{name}.{exp.src}"] != counts[f"{name}.{exp.tgt}"]:
                raise ExperimentError(f"{name}: {counts[f'{name}.{exp.src}']} {exp.src} lines but "
                                      f"{counts[f'{name}.{exp.tgt}']} {exp.tgt} lines")
        return {"lines": counts, **({"fetched": fetched} if fetched else {})}

    exp.step("data", body)


# --------------------------------------------------------------------------------------------
# prepare: tokenise, truecase, clean


def step_prepare(exp: Experiment) -> None:
    """Moses' preprocessing: tokenise (escaped), truecaser trained on the training side(s), clean;
    then, where the scale selects, the data selection (:func:`select_training_text`)."""
    exp.require("data")
    raw, prep = exp.path("raw"), exp.path("prepared")
    prep.mkdir(parents=True, exist_ok=True)
    scratch = prep / "tmp"  # joblib's temporary folder: in the work folder, not /dev/shm (text_prep._map_batches)
    parallel = parallel_texts(exp)
    training = [name for name in parallel if name.startswith("train")]
    sets = {exp.src: parallel, exp.tgt: (*parallel, "lm", "lm-valid")}

    for lang, names in sets.items():
        for name in names:
            exp.step(f"prepare/tokenize.{name}.{lang}", lambda n=name, lg=lang: {"lines": write_text_lines(
                prep / f"{n}.tok.{lg}", tokenize_lines(text_lines(raw / f"{n}.{lg}"), lg, jobs=exp.jobs,
                                                       temp_folder=scratch))})
        exp.step(f"prepare/truecaser.{lang}", lambda lg=lang: train_truecaser(
            [prep / f"{n}.tok.{lg}" for n in training], prep / f"truecase-model.{lg}"))
        for name in names:
            exp.step(f"prepare/truecase.{name}.{lang}", lambda n=name, lg=lang: {"lines": write_text_lines(
                exp.prepared(n, lg), truecase_lines(text_lines(prep / f"{n}.tok.{lg}"), prep / f"truecase-model.{lg}",
                                                    jobs=exp.jobs, temp_folder=scratch))})
    shutil.rmtree(scratch, ignore_errors=True)  # whatever a killed run left there

    for name in training:  # the stamp of the general text keeps its old name: work folders made before resume
        def clean(n: str = name) -> dict[str, object]:
            read, kept = clean_corpus_files(
                exp.prepared(n, exp.src), exp.prepared(n, exp.tgt),
                prep / f"{n}.clean.{exp.src}", prep / f"{n}.clean.{exp.tgt}",
                CleanRules(min_words=1, max_words=exp.settings.max_sentence_words),
            )
            return {"pairs_read": read, "pairs_kept": kept}

        exp.step("prepare/clean" if name == "train" else f"prepare/clean.{name}", clean)
    if exp.settings.selection:
        select_training_text(exp, exp.settings.selection)
    exp.step("prepare", lambda: None)


def select_training_text(exp: Experiment, budget: SelectionBudget) -> None:
    """The paper's data selection: the bitext by Axelrod et al.'s bilingual cross-entropy
    difference, the LM text by Moore & Lewis', both against the dev set (newstest2012+2013) and the
    scale's in-domain parallel text. That text is then added whole to the selected pairs: it is the
    training text the selection looks for."""

    prep, log = exp.path("prepared"), exp.log_file("selection")
    settings = SelectionSettings(order=budget.order, min_count=budget.min_count)
    langs = (exp.src, exp.tgt)
    in_domain_extra = exp.settings.train_in_domain

    def in_domain_text() -> None:
        for lg in langs:
            write_text_lines(prep / f"in-domain.{lg}", itertools.chain(
                text_lines(exp.prepared("dev", lg)), text_lines(prep / f"train-in.clean.{lg}")))

    if in_domain_extra:
        exp.step("prepare/in-domain", in_domain_text)
    in_domain = ([prep / f"in-domain.{lg}" for lg in langs] if in_domain_extra
                 else [exp.prepared("dev", lg) for lg in langs])
    selected = prep / "train.sel-general" if in_domain_extra else exp.train_corpus
    exp.step("prepare/select-train", lambda: select_lines(
        exp.moses(), [prep / f"train.clean.{lg}" for lg in langs], in_domain,
        [Path(f"{selected}.{lg}") for lg in langs], budget.train_words, prep / "selection-train", log,
        settings, progress=say).to_json())
    if in_domain_extra:
        exp.step("prepare/add-in-domain", lambda: {"lines": {lg: write_text_lines(
            Path(f"{exp.train_corpus}.{lg}"), itertools.chain(
                text_lines(Path(f"{selected}.{lg}")), text_lines(prep / f"train-in.clean.{lg}")))
            for lg in langs}})
    if budget.lm_words is not None:
        lm_budget = budget.lm_words
        exp.step("prepare/select-lm", lambda: select_lines(
            exp.moses(), [exp.prepared("lm", exp.tgt)], [in_domain[-1]], [exp.lm_text], lm_budget,
            prep / "selection-lm", log, settings, progress=say).to_json())


# --------------------------------------------------------------------------------------------
# baseline: alignment, LM, train-model.perl, filtering


def step_baseline(exp: Experiment, aligner: str = "auto") -> None:
    """A Moses system with ``train-model.perl``'s defaults, and its tables filtered for dev+test."""
    exp.require("prepare")
    base = exp.path("baseline")
    corpus = exp.train_corpus
    log = exp.log_file("baseline")
    if aligner == "auto":
        aligner = "giza" if exp.moses().has_giza() else "eflomal"
    if aligner not in ("giza", "eflomal"):
        raise ExperimentError(f"ALIGNER={aligner}: expected giza, eflomal or auto")
    gdfa = base / "model" / "aligned.grow-diag-final-and"
    src_text, tgt_text = Path(f"{corpus}.{exp.src}"), Path(f"{corpus}.{exp.tgt}")
    if aligner == "eflomal":
        align = base / "align"

        def run_eflomal() -> None:
            align.mkdir(parents=True, exist_ok=True)
            with atomic_path(align / f"fwd.{exp.src}-{exp.tgt}") as fwd, \
                    atomic_path(align / f"rev.{exp.src}-{exp.tgt}") as rev:
                # eflomal-align refuses to write over a file, even an empty one: it makes them itself
                fwd.unlink()
                rev.unlink()
                eflomal_align(src_text, tgt_text, fwd, rev, log)

        exp.step("baseline/eflomal", run_eflomal)

        def run_symal() -> None:
            gdfa.parent.mkdir(parents=True, exist_ok=True)
            symmetrize(exp.moses(), src_text, tgt_text, align / f"fwd.{exp.src}-{exp.tgt}",
                       align / f"rev.{exp.src}-{exp.tgt}", gdfa, log)

        exp.step("baseline/symal-gdfa", run_symal)

    lm = base / "lm" / f"lm.{exp.tgt}.binary"
    s = exp.settings
    exp.step("baseline/lm", lambda: {"seconds_tools": build_language_model(
        exp.moses(), exp.lm_text, lm, base / "lm" / "tmp", log,
        order=s.lm_order, prune=s.lm_prune, memory=s.lm_memory)})

    def train_model() -> None:
        model = base / "model"
        for leftover in ("moses.ini", "phrase-table.gz"):
            (model / leftover).unlink(missing_ok=True)
        moses = exp.moses()
        command = train_model_command(moses, base, corpus, exp.src, exp.tgt, lm, lm_order=s.lm_order, jobs=exp.jobs,
                                      first_step=1 if aligner == "giza" else 4)
        run_logged(command, log, cwd=base)
        if not (model / "moses.ini").exists():
            raise ExperimentError(f"train-model.perl wrote no {model / 'moses.ini'}; see {log}")

    exp.step("baseline/train-model", train_model)

    def filtered() -> None:
        devtest = devtest_source(exp)
        write_text_lines(devtest, (line for name in ("dev", "test")
                                   for line in text_lines(exp.prepared(name, exp.src))))
        filter_for_input(exp.moses(), base / "model" / "moses.ini", devtest, base / "filtered", log)

    exp.step("baseline/filter", filtered)
    exp.step("baseline", lambda: {"aligner": aligner})



# --------------------------------------------------------------------------------------------
# rnn: train on the full table, score the filtered one


def rnn_train_command(exp: Experiment, model: Path, reverse: bool = False, max_steps: int | None = None,
                      sizes: RnnSettings | None = None, max_time: float | None = None) -> list[object]:
    """``rescorer train`` on the baseline's full table with the scale's sizes and budget; with
    ``reverse``, the reverse model p(f|e) (``--reverse``), trained alike; ``max_steps`` caps its
    updates as well as its time. ``sizes`` and ``max_time``: another model's (the reranking's
    paper-size RNN, trained on the same table and read out at several budgets)."""
    r = sizes or exp.settings.rnn
    full_table = exp.path("baseline", "model", "phrase-table.gz")
    sizes = ["--hidden", str(r.hidden), "--embedding", str(r.embedding), "--maxout-units", str(r.maxout_units),
             "--output-rank", str(r.output_rank), "--shortlist", str(r.shortlist), "--init-std", str(r.init_std)]
    return [exp.console("rescorer"), "train", full_table, model, *sizes, "--max-time", str(max_time or r.max_time),
            # shortlists: the most frequent words of the training text, as in the paper
            "--vocab-corpus-src", f"{exp.train_corpus}.{exp.src}",
            "--vocab-corpus-tgt", f"{exp.train_corpus}.{exp.tgt}", *(["--reverse"] if reverse else []),
            *(["--max-steps", str(max_steps or r.max_steps)] if max_steps or r.max_steps else []),
            "--patience", str(r.patience), "--device", exp.device, "--threads", str(exp.jobs), "--resume", "--quiet"]


def trained_updates(model: Path) -> int:
    """How many updates a finished training made: the step of its last state (``MODEL.last``, else the model)."""
    # Imported here: table1 runs the models as tools, and only this reads one (torch loads with it).
    from neural.training import last_checkpoint_path
    from rescorer.model.checkpoint import load_checkpoint

    last = last_checkpoint_path(model)
    state = load_checkpoint(last if last.exists() else model).train_state or {}
    if "step" not in state:
        raise ExperimentError(f"{model} holds no training state: its number of updates is unknown")
    return int(state["step"])


def filtered_table(exp: Experiment) -> tuple[Path, str]:
    """The baseline's system filtered for dev+test, and the path of its phrase table."""
    filtered_ini = exp.path("baseline", "filtered", "moses.ini")
    _, table, _ = single_phrase_table(filtered_ini)
    return filtered_ini, str(filtered_ini.parent / table)  # an absolute path= stays as it is


def step_rnn(exp: Experiment) -> None:
    """``rescorer train`` on the baseline's full table, then ``rescore-phrase-table`` on the filtered one."""
    exp.require("baseline")
    out = exp.path("rnn")
    out.mkdir(parents=True, exist_ok=True)
    log = exp.log_file("rnn")
    model = out / "model.pt"
    full_table = exp.path("baseline", "model", "phrase-table.gz")
    exp.step("rnn/train", lambda: run_tool(rnn_train_command(exp, model), log))

    filtered_ini, table = filtered_table(exp)
    exp.step("rnn/rescore", lambda: run_tool(
        [exp.console("rescore-phrase-table"), table, out / "phrase-table.rnn.gz", "--model", model,
         "--moses-ini", filtered_ini, "--moses-ini-out", exp.rnn_ini, "--device", exp.device, "--resume",
         "--workers", str(exp.jobs), "--quiet"], log))
    for kind in TABLE2_KINDS:  # the paper's Table 2, which its argument for the RNN rests on
        exp.step(f"rnn/compare-{kind}", lambda k=kind: run_tool(
            [exp.console("rescorer"), "compare", model, full_table, f"--{k}", "--device", exp.device, "--quiet"],
            log, exp.table2_path(k)))
    exp.step("rnn", lambda: None)


def step_rnn_both(exp: Experiment) -> None:
    """The ``reverse`` rows' system: a reverse model (``rescorer train --reverse``) trained beside the
    forward one with the same sizes and budget, then the filtered table scored with both
    (``--reverse-model``): the 7-column system, p_RNN(f|e) after U, all new weights starting at 0.

    The budget is time, and the updates the forward model made in it: a time budget alone gives the
    direction trained on a quieter machine more updates (small-news: the forward model made 8,737 in
    its hour beside other work, the reverse one 8.5 a second alone), and the rows would then compare
    two directions trained unequally, not the directions."""
    exp.require("rnn")
    out = exp.rnn_both_ini.parent
    out.mkdir(parents=True, exist_ok=True)
    log = exp.log_file("rnn-both")
    model = exp.reverse_model
    exp.step("rnn-both/train", lambda: run_tool(rnn_train_command(
        exp, model, reverse=True, max_steps=trained_updates(exp.path("rnn", "model.pt"))), log))
    filtered_ini, table = filtered_table(exp)
    exp.step("rnn-both/rescore", lambda: run_tool(
        [exp.console("rescore-phrase-table"), table, out / "phrase-table.rnn-both.gz", "--model",
         exp.path("rnn", "model.pt"), "--reverse-model", model, "--moses-ini", filtered_ini, "--moses-ini-out",
         exp.rnn_both_ini, "--device", exp.device, "--resume", "--workers", str(exp.jobs), "--quiet"], log))
    exp.step("rnn-both", lambda: None)


# --------------------------------------------------------------------------------------------
# proposals: the RNN completes the filtered table for the dev+test text


def devtest_source(exp: Experiment) -> Path:
    """dev + test's tokenised, truecased source: what the baseline's tables are filtered for."""
    return exp.path("prepared", f"devtest.tok.tc.{exp.src}")


def step_proposals(exp: Experiment, system: str = "proposals") -> None:
    """``rescorer propose`` on the filtered table for the dev+test text's missing and thin sources,
    with the RNN of the ``rnn`` step and the training's word tables; writes the 7-column system.

    The filtered table is the one the other rows decode with, so a proposals row differs from + RNN
    only by the proposed lines and their indicator column (docs/proposals.md). ``proposals-both``:
    with the reverse model of the ``rnn-both`` step too, the candidates of rescorer's collecting beam
    (its default width for a reranked run) are reranked by both directions and the table carries
    p_RNN(f|e) as well, the 8-column system; sources and targets per source are the same settings,
    the rerank weights those chosen on dev for these models (:func:`rerank_weights`)."""
    exp.require("rnn")
    both = system == "proposals-both"
    if both:
        exp.require("rnn-both")
    p = exp.settings.proposals
    ini = exp.system_ini(system)
    ini.parent.mkdir(parents=True, exist_ok=True)
    filtered_ini, table = filtered_table(exp)
    model_dir = exp.path("baseline", "model")
    search = ["--reverse-model", exp.reverse_model] if both else ["--beam", str(p.beam)]
    if both and not exp.done(system):  # chosen before the first proposal; a finished table needs none
        reverse, length = rerank_weights(exp)
        search += ["--rerank-reverse-weight", str(reverse), "--rerank-length-weight", str(length)]
    exp.step(system, lambda: run_tool(
        [exp.console("rescorer"), "propose", table, ini.parent / "phrase-table.proposed.gz", "--model",
         exp.path("rnn", "model.pt"), "--for-text", devtest_source(exp), "--thin-below", str(p.thin_below),
         *search, "--per-source", str(p.per_source), "--lex-e2f", model_dir / "lex.e2f",
         "--lex-f2e", model_dir / "lex.f2e", "--moses-ini", filtered_ini, "--moses-ini-out", ini,
         "--list", exp.proposals_list(system), "--device", exp.device, "--threads", str(exp.jobs),
         "--workers", str(exp.jobs), "--resume", "--quiet"], exp.log_file(system)))


def rerank_weights(exp: Experiment) -> tuple[float, float]:
    """The rerank weights (λ, μ) ``proposals-both`` proposes with: ``rescorer rerank-weights`` on dev's
    first sentences, with the rows' own two RNNs and the filtered table the rows decode with, before
    any proposal is made. Dev only, so no test figure can steer them; a new system's models get their
    own choice rather than the defaults chosen on another's. Every point's figures are kept in
    ``proposals-both/rerank-weights.txt``, the choice in the stamp."""
    p, grid = exp.settings.proposals, exp.settings.rerank
    model_dir = exp.path("baseline", "model")

    def choose() -> dict[str, object]:
        exp.rerank_report.parent.mkdir(parents=True, exist_ok=True)
        ran = run_tool(
            [exp.console("rescorer"), "rerank-weights", filtered_table(exp)[1], "--model", exp.path("rnn", "model.pt"),
             "--reverse-model", exp.reverse_model, "--text", exp.prepared("dev", exp.src),
             "--reference", exp.prepared("dev", exp.tgt),
             *(["--sentences", str(grid.sentences)] if grid.sentences else []),
             "--reverse-grid", ",".join(map(str, grid.reverse)), "--length-grid", ",".join(map(str, grid.length)),
             "--thin-below", str(p.thin_below), "--per-source", str(p.per_source), "--lex-e2f", model_dir / "lex.e2f",
             "--lex-f2e", model_dir / "lex.f2e", "--device", exp.device, "--threads", str(exp.jobs)],
            exp.log_file("proposals-both"), stdout=exp.rerank_report)
        reverse, length = chosen_weights(exp.rerank_report)
        say(f"{RERANK_STEP}: λ {reverse:g}, μ {length:g} chosen on dev (see {exp.rerank_report})")
        return {**ran, "reverse": reverse, "length": length}

    exp.step(RERANK_STEP, choose)
    stamp = exp.read_stamp(RERANK_STEP)
    return stamp["reverse"], stamp["length"]


def chosen_weights(report: Path) -> tuple[float, float]:
    """(λ, μ) from the last line of ``rescorer rerank-weights``' output: ``chosen: λ 0.5, μ 0 (…)``."""
    lines = report.read_text(encoding="utf-8").splitlines()
    found = re.match(r"chosen: λ (\S+), μ (\S+) \(", lines[-1]) if lines else None
    if not found:
        raise ExperimentError(f"{report}: rescorer rerank-weights chose no weights (its last line is not 'chosen: …')")
    return float(found[1]), float(found[2])


# --------------------------------------------------------------------------------------------
# cslm: the continuous-space LM on the LM text


def step_cslm(exp: Experiment) -> None:
    """``cslm train`` (self-normalised) on the prepared LM text, early-stopped on held-out
    news text, then ``export-nplm`` for the decoder."""
    exp.require("prepare")
    c = exp.settings.cslm
    exp.cslm_model.parent.mkdir(parents=True, exist_ok=True)
    exp.step("cslm", lambda: run_tool(
        [exp.console("cslm"), "train", exp.lm_text, exp.cslm_model,
         "--valid", exp.prepared("lm-valid", exp.tgt), "--max-time", str(c.max_time), "--embedding", str(c.embedding),
         "--hidden", ",".join(map(str, c.hidden)), "--shortlist", str(c.shortlist),
         "--self-normalize", str(c.self_normalize), "--device", exp.device,
         *(["--epoch-size", str(c.epoch_size)] if c.epoch_size else []),
         *(["--max-epochs", str(c.max_epochs)] if c.max_epochs else []),
         "--threads", str(exp.jobs), "--resume", "--quiet"], exp.log_file("cslm")))
    exp.step("cslm/export", lambda: run_tool(
        [exp.console("cslm"), "export-nplm", exp.cslm_model, exp.cslm_nplm], exp.log_file("cslm")))


def cslm_system(exp: Experiment) -> Path:
    """The CSLM rows' moses.ini, written once (stamped ``cslm/ini``) from the exported CSLM."""
    exp.require("cslm", "cslm/export")
    exp.step("cslm/ini", lambda: write_cslm_ini(exp))
    return exp.cslm_ini


def write_cslm_ini(exp: Experiment) -> None:
    """The CSLM rows' system: the 6-column ini plus ``NeuralLM name=CSLM0`` at weight 0 (the start
    is the + RNN system, as for every extra column)."""
    ini = MosesIni.read(exp.rnn_ini)
    ini.add_feature(neural_lm_feature_line(exp.cslm_nplm, "CSLM0"), [0.0])
    ini.write(exp.cslm_ini)


