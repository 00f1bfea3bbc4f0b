"""Each benchmark whose figures README or docs/ cite runs at a tiny size and prints those figures:
a benchmark that breaks fails here rather than leaving a stale figure in the docs.
Sizes are chosen to finish in seconds on 2 busy cores; the figures themselves are not asserted."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from shared_paths import REPO_ROOT, has_neural_lm, moses_bin_dir, shared_file

pytestmark = pytest.mark.slow  # each one a process of its own that imports torch: 5-20 s on 2 busy cores

SAMPLE = str(REPO_ROOT / "examples" / "phrase-table.en-fr.gz")  # 366 lines, in the repository
NUMBER = r"[\d,.]+"
RunBenchmark = Callable[..., str]  # the fixture of conftest.py: NAME, *ARGS -> its stdout


def test_batch_size_effect_prints_each_batch_size_and_its_perplexity_table(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("batch_size_effect", "--table", SAMPLE, "--size", "tiny", "--max-time", "1",
                        "--batch-sizes", "16,32", "--valid-pairs", "32")
    for batch in (16, 32):
        assert re.search(rf"^batch {batch}: \d+ updates .* pairs/s .*best validation perplexity {NUMBER}", out,
                         re.M), out
        assert re.search(rf"^ +{batch} \| .*\|", out, re.M), out
    assert "validation perplexity reached by training pairs seen" in out


def test_score_speed_prints_pairs_per_second_and_the_share_of_peak(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("score_speed", "--table", SAMPLE, "--lines", "300", "--sizes", "small", "--repeat", "1",
                        "--workers", "0", "--chunk-lines", "100", "--device", "cpu", "--reverse")
    assert re.search(rf"fp32 matmul peak \(measured\): {NUMBER} GFLOP/s", out), out
    assert re.search(rf"^\[small\] d=256: {NUMBER} pairs/s end to end .* MFLOP/pair performed .*"
                     rf"{NUMBER} GFLOP/s = {NUMBER}% of matmul peak", out, re.M), out
    assert re.search(rf"without source sharing and length sorting: {NUMBER} pairs/s .*speed-up from both: "
                     rf"{NUMBER}x", out), out
    assert re.search(rf"with the reverse column too: {NUMBER} pairs/s end to end .*the reverse column alone "
                     rf"-?{NUMBER} s .* MFLOP/pair performed \(forward: {NUMBER}\), \d+ distinct targets", out), out
    assert re.search(rf"the model alone: forward column {NUMBER} pairs/s .* reverse column {NUMBER} pairs/s .*"
                     rf"the reverse costs {NUMBER}x the forward", out), out


def test_pipeline_speed_prints_each_stage_per_core_and_the_start_up(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("pipeline_speed", "--table", SAMPLE, "--workers", "1,2", "--chunk-lines", "100")
    for workers in (1, 2):
        assert re.search(rf"^-j {workers}: 366 lines in {NUMBER} s = {NUMBER} lines/s end to end", out, re.M), out
    assert len(re.findall(rf"^  per core, lines/s: .*read {NUMBER}k, .*format {NUMBER}k$", out, re.M)) == 2, out
    assert len(re.findall(rf"^  timeline, seconds since the run's start: .*first chunk prepared {NUMBER}; "
                          rf"first chunk scored {NUMBER};", out, re.M)) == 2, out
    assert len(re.findall(rf"^  main thread over \d+ chunks: waiting for a prepared chunk {NUMBER} s .*; "
                          rf"waiting for the writing stage {NUMBER} s", out, re.M)) == 2, out
    assert len(re.findall(rf"^  writing thread: waiting for its formatting {NUMBER} s .*; "
                          rf"writing \(data, fsync, progress record\) {NUMBER} s", out, re.M)) == 2, out
    assert re.search(rf"projected for 16 cores .*: {NUMBER}M lines/s", out), out
    assert re.search(rf"format stage apart, per core: formatting {NUMBER}k lines/s", out), out
    assert re.search(rf"^start-up: .* on 200 lines, start to exit: {NUMBER} s", out, re.M), out


def test_propose_speed_prints_sources_per_second_batched_and_one_at_a_time(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("propose_speed", "--table", SAMPLE, "--sources", "6", "--beam", "2", "--max-words", "2",
                        "--single", "2", "--precision", "fp32,bf16")
    for precision in ("fp32", "bf16"):
        assert re.search(rf"^batched, {precision}: {NUMBER} sources/s .* decoder rows per source.*; {NUMBER} GFLOP/s "
                         rf"performed = {NUMBER}% of the {precision} matmul peak measured in this run", out, re.M), out
    assert re.search(rf"^bf16 / fp32: {NUMBER}× sources/s; the same best target for \d+ of 6 sources", out, re.M)
    assert re.search(rf"^one source at a time: {NUMBER} sources/s; batching gains {NUMBER}x", out, re.M), out
    assert re.search(rf"full table \(1,468,693\): {NUMBER} h at this rate", out), out


def test_mert_speed_prints_its_time_bleu_and_the_ratio_to_moses(run_benchmark: RunBenchmark) -> None:
    shared_file("fixtures/hansard-enfr/nbest/dev.nbest.gz")
    out = run_benchmark("mert_speed", "--restarts", "0", "--repeats", "1")
    assert re.search(rf"^mert optimize \(0 restarts \+ start point, .*best {NUMBER} s of 1 runs .*BLEU {NUMBER}",
                     out, re.M), out
    assert re.search(rf"in process: load \+ BLEU statistics {NUMBER} s, optimisation {NUMBER} s", out), out
    assert re.search(rf"^time ratio ours/Moses: {NUMBER}; BLEU ours - Moses: [+-]{NUMBER}", out, re.M), out


@pytest.mark.moses
def test_cslm_decoder_speed_prints_the_slowdown_of_the_cslm_in_moses(run_benchmark: RunBenchmark) -> None:
    bin_dir = moses_bin_dir()
    if not has_neural_lm(bin_dir):
        pytest.skip(f"the Moses in {bin_dir} was built without NPLM (NeuralLM)")
    shared_file("fixtures/hansard-enfr/filtered/moses.ini")
    out = run_benchmark("cslm_decoder_speed", "--sentences", "1", "--sizes", "small-one-layer",
                        env={"MOSES_BIN_DIR": str(bin_dir)})
    assert re.search(rf"^\| plain \| {NUMBER} \({NUMBER}\) \| {NUMBER} \({NUMBER}\) \| {NUMBER} \| 1.0x \|$", out,
                     re.M), out
    assert re.search(rf"^\| CSLM small-one-layer \| .* \| {NUMBER}x \|$", out, re.M), out


def test_cslm_perplexity_prints_both_models_perplexities(run_benchmark: RunBenchmark, tmp_path: Path) -> None:
    pytest.importorskip("kenlm", reason="cslm_perplexity needs the kenlm module (pip install kenlm)")
    kenlm_model = shared_file("fixtures/hansard-enfr/filtered/lm.fr.binary")
    dev = shared_file("fixtures/hansard-enfr/data/dev.tok.tc.fr")
    import torch

    from cslm.model import CSLM, CSLMConfig
    from cslm.model_file import save_cslm
    from moses_integration.tokens import split_tokens
    from neural.vocab import Vocab

    lines = dev.read_text(encoding="utf-8").splitlines()[:5]
    text = tmp_path / "dev.fr"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    counts = Counter(w for line in lines for w in split_tokens(line))
    vocab = Vocab.from_counts(counts, shortlist=len(counts) // 2)  # half the words out of the shortlist
    torch.manual_seed(0)
    model = CSLM(CSLMConfig(vocab_size=len(vocab), embedding=8, hidden=[16]))
    cslm = save_cslm(tmp_path / "cslm.pt", model, vocab)
    out = run_benchmark("cslm_perplexity", str(cslm), str(kenlm_model), str(text))
    assert re.search(r": 5 sentences, \d+ tokens \(</s> included\); out of the CSLM shortlist \d+", out), out
    assert re.search(rf"all tokens: +CSLM +{NUMBER} +KenLM +{NUMBER}", out), out
    assert re.search(rf"in both vocabularies: +CSLM +{NUMBER} +KenLM +{NUMBER} +\(\d+ tokens\)", out), out


def test_nmt_speed_prints_both_models_target_units_per_second(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("nmt_speed", "--dim", "8", "--vocab", "300", "--batch", "4", "--length", "5", "--steps", "1",
                        "--precision", "fp32,bf16", "--sources", "2", "--hypotheses", "3", "--beam", "2")
    for precision in ("fp32", "bf16"):
        assert re.search(rf"^{precision}: nmt {NUMBER} target units/s, torch peer \(nn.GRU\) {NUMBER}: {NUMBER}x; "
                         rf"per CPU-second {NUMBER} and {NUMBER}: {NUMBER}x$", out, re.M), out
        assert re.search(rf"^  nmt: {NUMBER} GFLOP per update = {NUMBER}% of the {precision} matmul peak "
                         rf"\({NUMBER}% per CPU-second\)$", out, re.M), out
    flops = re.findall(rf"^  nmt: ({NUMBER}) GFLOP per update", out, re.M)
    assert len(flops) == 2 and flops[0] == flops[1], out  # the same matmuls, whatever their precision
    assert re.search(rf"^n-best scoring: {NUMBER} hypotheses/s sharing prefixes as an n-best list \({NUMBER} units "
                     rf"per decoder step\), {NUMBER} with nothing in common .*beam search .*: {NUMBER} sentences/s$",
                     out, re.M), out


def test_nmt_speed_without_sources_prints_the_training_figures_alone(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("nmt_speed", "--dim", "8", "--vocab", "300", "--batch", "4", "--length", "5", "--steps", "1",
                        "--precision", "fp32", "--sources", "0")
    assert re.search(rf"^fp32: nmt {NUMBER} target units/s", out, re.M) and "n-best scoring" not in out, out


def test_train_speed_times_the_optimisers_step_alone_against_the_memory_bandwidth(
        run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("train_speed", "--optimizer-only", "--sizes", "small", "--vocab", "50", "--steps", "1",
                        "--threads", "1", "--precision", "fp32,bf16", "--updates", "torch,chunked")
    assert re.search(rf"memory bandwidth measured \(c = a \+ b, fp32\): {NUMBER} GB/s", out), out
    for precision in ("fp32", "bf16"):
        for kind in ("torch", "chunked"):
            assert re.search(rf"^\[{precision}\] {kind}: {NUMBER} ms per step \({NUMBER} CPU-ms\), {NUMBER} GB/s = "
                             rf"{NUMBER}% of the memory bandwidth \({NUMBER}% per CPU-second\), {NUMBER}× torch's "
                             rf"speed; after 2 steps the weights differ from torch's by 0.0e\+00 of a tensor's "
                             "largest$", out, re.M), out  # the chunked step is torch's bit for bit


def test_train_speed_counts_each_modes_matmul_shapes_and_the_recurrences_share(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("train_speed", "--sizes", "small", "--vocab", "50", "--steps", "4", "--profile-steps", "1",
                        "--threads", "1", "--precision", "fp32", "--train-step", "eager-exact,eager-fixed")
    distinct = {}
    for mode in ("eager-exact", "eager-fixed"):
        assert re.search(rf"^\[fp32\] {mode}: {NUMBER} pairs/s", out, re.M), out
        found = re.search(rf"^\[fp32\] {mode}: (?:.*\n)*?  matmul shapes: (\d+) distinct in 4 updates, \d+ of them "
                          r"new in the last 2; the last new one in update \d$", out, re.M)
        assert found, out
        distinct[mode] = int(found.group(1))
    assert distinct["eager-fixed"] < distinct["eager-exact"], distinct
    shares = re.search(rf"^  recurrences: ({NUMBER})% of the CPU time, of which not matmuls {NUMBER}% "
                       rf"\(({NUMBER})% of the update: the most a fused GRU step could remove\)$", out, re.M)
    assert shares and 0 < float(shares.group(2)) <= float(shares.group(1)) <= 100, out


def test_gru_fusion_prints_eager_and_compiled_times_and_their_difference(run_benchmark: RunBenchmark) -> None:
    out = run_benchmark("gru_fusion", "--sizes", "8", "--rows", "4", "--rounds", "1")
    assert re.search(rf"memory bandwidth measured \(c = a \+ b, fp32\): {NUMBER} GB/s", out), out
    for kind in ("GRU backward step, H=8 rows=4", "attention scores, A=8 rows=4 source=28"):
        found = re.search(rf"^{re.escape(kind)}: eager {NUMBER} us \({NUMBER} GB/s = {NUMBER}% of the memory "
                          rf"bandwidth\), compiled {NUMBER} us \({NUMBER}%\): {NUMBER}x; largest difference "
                          rf"({NUMBER}e[-+]\d+)$", out, re.M)
        assert found and float(found.group(1)) < 1e-5, out  # the same arithmetic, compiled
