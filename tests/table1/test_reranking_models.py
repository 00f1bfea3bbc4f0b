"""The reranking's models step without training: the command lines it runs (a recording ``run_tool``
that writes what the trainers would), its read-out schedule, resuming, and the feature specs."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import zlib
from pathlib import Path

import numpy as np
import pytest

from table1 import reranking_models
from table1.settings import SMALL, NmtSettings, RerankingSettings, RnnSettings
from table1.workspace import RERANKING_STEP
from table1_folders import small_experiment, write_lines

TINY = RerankingSettings(
    nmt=NmtSettings(embedding=8, hidden=12, alignment=10, maxout=6, vocab_size=300, max_time=30, valid_lines=5),
    big_rnn=RnnSettings(hidden=20, embedding=4, maxout_units=6, output_rank=3, shortlist=50, max_time=12 * 3600),
    big_rnn_readouts=(24.0, 6.0, 12.0))


#: A + RNN table: 40 sources of 1 to 4 targets each; lex(e|f) falls with the target's length and its p_RNN
#: rises with it.
RNN_TABLE = [f"src{s} ||| {' '.join(['w'] * (t + 1))} ||| 0.5 0.5 0.5 {math.exp(-t - 0.1 * s):.6g} "
             f"{math.exp(t):.6g} 1 ||| 0-0 ||| 1 1 1" for s in range(40) for t in range(1 + s % 4)]


class Trainers:
    """Records each command; ``rescorer train`` leaves a model holding its --max-time and a perplexity
    line in the log, as the real one does; ``fail_at`` (hours) is a training killed at that budget."""

    def __init__(self, fail_at: float | None = None) -> None:
        self.commands: list[list[str]] = []
        self.fail_at = fail_at

    def __call__(self, command: list, log: Path, *args: object) -> dict[str, object]:
        command = [str(c) for c in command]
        self.commands.append(command)
        if Path(command[0]).name == "rescore-phrase-table":  # p_RNN = exp(-2 x the target's words), WP 1
            with gzip.open(command[1], "rt", encoding="utf-8") as fin, gzip.open(command[2], "wt") as out:
                for line in fin:
                    fields = line.rstrip("\n").split(" ||| ")
                    fields[2] += f" {math.exp(-2 * len(fields[1].split())):.6g} 1"
                    out.write(" ||| ".join(fields) + "\n")
            return {}
        if Path(command[0]).name == "rescorer":
            seconds = float(command[command.index("--max-time") + 1])
            if self.fail_at is not None and seconds == self.fail_at * 3600:
                raise KeyboardInterrupt
            Path(command[3]).write_text(f"model after {seconds:g} s\n")
            with log.open("a") as fh:
                fh.write(f"trained 10 steps; best validation perplexity {seconds / 1000:.2f} at step 7; model: x\n")
        return {}


def reranking_experiment(tmp_path: Path, monkeypatch, trainers: Trainers):
    exp = small_experiment(tmp_path)
    exp.settings = dataclasses.replace(SMALL, reranking=TINY)
    for stamp in ("prepare", "baseline", "rnn", "rnn-both/train", "rnn-both/rescore", "rnn-both", "cslm",
                  "cslm/export"):  # Table 1's steps: reused, not rerun
        exp.step(stamp, lambda: None)
    filtered = exp.path("baseline", "filtered")  # the table the n-best lists are decoded from
    filtered.mkdir(parents=True)
    (filtered / "moses.ini").write_text("[feature]\nPhraseDictionaryMemory name=TranslationModel0 num-features=4 "
                                        "path=phrase-table.0-0.1.1.gz input-factor=0 output-factor=0\n\n"
                                        "[weight]\nTranslationModel0= 0.2 0.2 0.2 0.2\n")
    write_lines(exp.path("rnn", "phrase-table.rnn.gz"), RNN_TABLE, gz=True)  # the + RNN system's 6 columns
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nmt", "rescorer", "rescore-phrase-table"):
        (bin_dir / name).write_text("")
    exp.python = str(bin_dir / "python")
    monkeypatch.setattr(reranking_models, "run_tool", trainers)
    monkeypatch.setattr(reranking_models, "READOUT_SAMPLE_EVERY", 2)  # 40 sources: half of them
    return exp


def test_nmt_trains_both_directions_on_the_moses_bitext_with_the_settings(tmp_path, monkeypatch) -> None:
    trainers = Trainers()
    exp = reranking_experiment(tmp_path, monkeypatch, trainers)
    reranking_models.step_reranking_models(exp)
    corpus, bin_dir = exp.train_corpus, tmp_path / "bin"
    nmt = [c for c in trainers.commands if c[0].endswith("nmt")]
    common = ["--valid-lines", "5", "--vocab-size", "300", "--embedding", "8", "--hidden", "12", "--alignment", "10",
              "--maxout", "6", "--max-time", "30", "--device", "auto", "--threads", "2", "--resume", "--quiet"]
    assert nmt == [
        [str(bin_dir / "nmt"), "train", f"{corpus}.en", f"{corpus}.fr", str(exp.path("reranking", "nmt-forward.pt")),
         *common],
        [str(bin_dir / "nmt"), "train", f"{corpus}.fr", f"{corpus}.en", str(exp.path("reranking", "nmt-reverse.pt")),
         *common]]


def test_the_big_rnn_is_read_out_at_each_hour_up_to_its_budget(tmp_path, monkeypatch, capsys) -> None:
    trainers = Trainers()
    exp = reranking_experiment(tmp_path, monkeypatch, trainers)
    reranking_models.step_reranking_models(exp)
    rnn = [c for c in trainers.commands if c[0].endswith("rescorer")]
    assert [c[c.index("--max-time") + 1] for c in rnn] == ["21600.0", "43200.0"]  # 6 h, then 12 h; 24 h skipped
    assert all(c[3] == str(exp.path("reranking", "big-rnn.pt")) and "--resume" in c for c in rnn)
    assert rnn[0][rnn[0].index("--hidden") + 1] == "20" and rnn[0][rnn[0].index("--shortlist") + 1] == "50"
    assert exp.path("reranking", "big-rnn@6h.pt").read_text() == "model after 21600 s\n"
    assert exp.path("reranking", "big-rnn@12h.pt").read_text() == "model after 43200 s\n"
    record = json.loads(exp.path("reranking", "big-rnn@6h.json").read_text())
    sampled = [line for line in RNN_TABLE if zlib.crc32(line.split(" ||| ")[0].encode()) % 2 == 0]
    assert {k: record[k] for k in ("hours", "valid_perplexity", "step", "model", "sample_pairs")} == {
        "hours": 6.0, "valid_perplexity": 21.6, "step": 7, "model": "big-rnn@6h.pt", "sample_pairs": len(sampled)}
    assert 0 < len(sampled) < len(RNN_TABLE)
    words = [len(line.split(" ||| ")[1].split()) for line in sampled]
    lex = [math.log(float(line.split(" ||| ")[2].split()[3])) for line in sampled]
    assert record["lex_e_f"]["pearson"] == pytest.approx(np.corrcoef(lex, [-2.0 * w for w in words])[0, 1], abs=1e-5)
    # among a source's targets only the length is left: the read-out agrees with lex(e|f), the + RNN model not
    assert record["lex_e_f"]["pearson_same_source"] == pytest.approx(1.0)
    assert record["rnn_step_lex_e_f"]["pearson_same_source"] == pytest.approx(-1.0)
    assert exp.path("reranking", "big-rnn@6h.sample.gz").exists()
    assert json.loads(exp.path("reranking", "big-rnn@12h.json").read_text())["valid_perplexity"] == 43.2
    assert not exp.path("reranking", "big-rnn@24h.pt").exists()
    err = capsys.readouterr().err
    assert "read-out at 24h skipped" in err
    assert "time plan: RNN d=20: read-outs at 6h, 12h; 12.0 h to go (beyond its max_time, skipped: 24h)" in err
    assert exp.done(RERANKING_STEP)


def test_a_kill_between_read_outs_resumes_without_redoing_the_stamped_one(tmp_path, monkeypatch, capsys) -> None:
    killed = Trainers(fail_at=12)
    exp = reranking_experiment(tmp_path, monkeypatch, killed)
    with pytest.raises(KeyboardInterrupt):
        reranking_models.step_reranking_models(exp)
    assert exp.done("reranking/big-rnn@6h") and not exp.done("reranking/big-rnn@12h")
    assert not exp.done(RERANKING_STEP)
    specs = reranking_models.reranking_feature_specs(exp)
    table = f",table={exp.path('baseline', 'filtered', 'phrase-table.0-0.1.1.gz')}"
    assert specs["RNN d=20 @6h"] == f"RNN:{exp.path('reranking', 'big-rnn@6h.pt')}{table}"
    assert specs["RNN d=20 @12h"] is None
    again = Trainers()
    monkeypatch.setattr(reranking_models, "run_tool", again)
    capsys.readouterr()
    reranking_models.step_reranking_models(exp)
    assert "time plan: RNN d=20: read-outs at 6h, 12h; 6.0 h to go" in capsys.readouterr().err
    assert again.commands and all(c[c.index("--max-time") + 1] == "43200.0" for c in again.commands
                                  if c[0].endswith("rescorer"))
    assert not [c for c in again.commands if c[0].endswith("nmt")]  # both directions were stamped
    assert exp.path("reranking", "big-rnn@6h.pt").read_text() == "model after 21600 s\n"
    assert exp.done(RERANKING_STEP)


def test_a_table_too_small_for_a_sample_gives_no_correlation(tmp_path, monkeypatch) -> None:
    exp = reranking_experiment(tmp_path, monkeypatch, Trainers())
    monkeypatch.setattr(reranking_models, "READOUT_SAMPLE_EVERY", 10**9)
    reranking_models.step_reranking_models(exp)
    record = json.loads(exp.path("reranking", "big-rnn@6h.json").read_text())
    assert record["sample_pairs"] == 0 and record["lex_e_f"] is None and record["valid_perplexity"] == 21.6


def test_feature_specs_are_none_until_each_model_is_trained(tmp_path, monkeypatch) -> None:
    exp = small_experiment(tmp_path)
    exp.settings = dataclasses.replace(SMALL, reranking=TINY)
    labels = ["RNN(f|e)", "CSLM", "NMT p(e|f)", "NMT p(e|f)+p(f|e)", "RNN d=20 @6h", "RNN d=20 @12h"]
    assert reranking_models.reranking_feature_specs(exp) == dict.fromkeys(labels)
    trainers = Trainers()
    exp = reranking_experiment(tmp_path / "trained", monkeypatch, trainers)
    reranking_models.step_reranking_models(exp)
    forward, reverse = exp.path("reranking", "nmt-forward.pt"), exp.path("reranking", "nmt-reverse.pt")
    table = f",table={exp.path('baseline', 'filtered', 'phrase-table.0-0.1.1.gz')}"
    assert reranking_models.reranking_feature_specs(exp) == {
        "RNN(f|e)": f"RNN:{exp.path('rnn-both', 'model.reverse.pt')}{table}",
        "CSLM": f"CSLM:{exp.path('cslm', 'model.pt')}",
        "NMT p(e|f)": f"NMT:{forward}",
        "NMT p(e|f)+p(f|e)": f"NMT:{forward},reverse={reverse}",
        "RNN d=20 @6h": f"RNN:{exp.path('reranking', 'big-rnn@6h.pt')}{table}",
        "RNN d=20 @12h": f"RNN:{exp.path('reranking', 'big-rnn@12h.pt')}{table}"}
