"""The RNN as an n-best feature (``mert tune --feature RNN:model.pt``), against ground truth.

What a user reranking n-best lists would notice: a hypothesis' value is what the decoder puts in the
n-best list for the p_RNN column of the table ``rescore-phrase-table`` writes with the same model,
the sum of ln p over its phrase pairs as Moses reads them back; the reverse model gives p(f|e), the
``--reverse-model`` column; a list decoded without segmentation, or against another source, is one
line. The models are tiny and trained here, on the fixture system's table cut to two dev sentences.
"""

from __future__ import annotations

import gzip
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from infrastructure.errors import UserError
from mert.features import absolute_spec_path, add_features, load_feature
from moses_integration.nbest import NBestEntry, read_nbest
from rescorer.model.checkpoint import load_checkpoint
from rescorer.model.config import ModelSizes, TrainConfig
from rescorer.nbest import RNNFeature, RNNFeatureError
from rescorer.pipeline.moses_config import write_moses_ini
from rescorer.pipeline.rescore import RescoreOptions, rescore
from rescorer.pipeline.train_or_load import Models
from rescorer.training.train import train_on_phrase_table
from small_system import SmallSystem, small_system

pytestmark = pytest.mark.slow

SMALL = ModelSizes(hidden=32, embedding=16, maxout_units=16, output_rank=16)


@dataclass
class Trained:
    system: SmallSystem
    forward: Path
    reverse: Path
    rescored: Path  # the system's table with p_RNN(e|f), exp(-unk) and p_RNN(f|e) appended


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    folder = tmp_path_factory.mktemp("rnn-feature")
    system = small_system(folder)
    models = {}
    for direction in ("forward", "reverse"):
        # A shortlist smaller than the table's words: some words are [UNK], as in a real table.
        models[direction] = folder / f"{direction}.pt"
        train_on_phrase_table(str(system.table), models[direction], model_sizes=replace(SMALL, direction=direction),
                              train_config=TrainConfig(max_steps=20, valid_every=20, patience=None),
                              shortlist=300, device="cpu", progress=False)
    rescored = folder / "phrase-table.rnn-both.gz"
    rescore(str(system.table), str(rescored),
            Models(load_checkpoint(models["forward"]), reverse=load_checkpoint(models["reverse"])),
            RescoreOptions(progress=False, device="cpu", workers=0))
    return Trained(system, models["forward"], models["reverse"], rescored)


def table_pairs(path: Path) -> dict[tuple[str, str], list[float]]:
    """{(source, target): score columns} of a table."""
    pairs = {}
    for line in gzip.decompress(path.read_bytes()).decode().splitlines():
        source, target, scores = line.split(" ||| ")[:3]
        pairs[source, target] = [float(v) for v in scores.split()]
    return pairs


def as_moses_reads(p: float) -> float:
    """ln of a table's probability as Moses reads it: a float32, its ln floored at -100."""
    return max(math.log(float(np.float32(p))), -100.0)


def segmented(pairs: list[tuple[str, str]], order: list[int], sent_id: int = 0) -> tuple[str, NBestEntry]:
    """A source sentence made of the pairs' sources, and a hypothesis of their targets in ``order``,
    with its segmentation as Moses writes it."""
    starts = np.cumsum([0] + [len(s.split()) for s, _ in pairs])
    spans, words = [], []
    for k in order:
        source, target = pairs[k]
        spans.append((int(starts[k]), int(starts[k + 1]) - 1, len(words), len(words) + len(target.split()) - 1))
        words += target.split()
    entry = NBestEntry(sent_id, " ".join(words), [("F", [0.0])], 0.0, line_no=7 + sent_id, segmentation=tuple(spans))
    return " ".join(s for s, _ in pairs), entry


def test_the_value_is_the_sum_of_the_tables_column_over_the_phrases_each_direction(trained):
    table = table_pairs(trained.rescored)
    # Pairs of the table with distinct sources, one- and several-word ones, some with [UNK] words.
    chosen, seen = [], set()
    for source, target in table:
        if source not in seen and len(chosen) < 12 and (len(chosen) % 3 == 0) == (" " in source):
            chosen.append((source, target))
            seen.add(source)
    assert any(scores[5] < 1 for pair, scores in table.items() if pair in chosen)  # a pair with [UNK] words
    sources, entries = zip(*(segmented(chosen[k:k + 4], order, sent_id)
                             for sent_id, (k, order) in enumerate([(0, [0, 1, 2, 3]), (4, [3, 1, 0, 2]),
                                                                   (8, [2, 3, 1, 0])])), strict=True)
    forward, reverse = load_feature(f"RNN:{trained.forward}"), load_feature(f"RNN:{trained.reverse}")
    assert (forward.name, reverse.name) == ("RNN0", "RNNReverse0")
    for feature, column in ((forward, 4), (reverse, 6)):
        values = feature.score(list(sources), list(entries))
        expected = [sum(as_moses_reads(table[pair][column]) for pair in chosen[k:k + 4]) for k in (0, 4, 8)]
        np.testing.assert_allclose(values[:, 0], expected, rtol=0, atol=4e-5)
    # The two directions are two different models' scores of the same pairs, not one column twice.
    assert not np.allclose(forward.score(list(sources), list(entries)), reverse.score(list(sources), list(entries)))


def test_with_table_a_word_moses_passes_through_unknown_is_worth_0(trained, tmp_path):
    """Moses gives a source word no one-word phrase of its table holds a pass-through pair whose
    columns are 0; with table= the feature does too, and without it the model scores the pair."""
    table = table_pairs(trained.rescored)
    pairs = [*list(table)[:2], ("zzqx", "zzqx")]
    source, entry = segmented(pairs, [2, 0, 1])
    with_table = load_feature(f"RNN:{trained.forward},table={trained.system.table}").score([source], [entry])
    without = load_feature(f"RNN:{trained.forward}").score([source], [entry])
    assert with_table[0, 0] == pytest.approx(sum(as_moses_reads(table[pair][4]) for pair in pairs[:2]), abs=2e-5)
    assert without[0, 0] < with_table[0, 0] - 0.01
    garbage = tmp_path / "phrase-table.minphr"
    garbage.write_bytes(b"\x00\x01binary\n")
    with pytest.raises(UserError, match=f"{garbage}:1: ") as err:
        load_feature(f"RNN:{trained.forward},table={garbage}")
    assert "\n" not in str(err.value)


def test_each_distinct_pair_is_scored_once_per_call(trained):
    feature = RNNFeature(str(trained.forward))
    pairs = list(table_pairs(trained.rescored))[:3]
    source, entry = segmented(pairs, [0, 1, 2])
    other = replace(segmented(pairs, [2, 0, 1])[1], line_no=8)
    asked = []
    log_probs = feature.scorer.log_probs
    feature.scorer.log_probs = lambda distinct: asked.append(list(distinct)) or log_probs(distinct)
    values = feature.score([source], [entry, other, entry])
    assert [len(a) for a in asked] == [3]
    assert values[0, 0] == pytest.approx(values[1, 0], abs=1e-9) and values[0, 0] == values[2, 0]


def test_a_list_without_segmentation_or_with_another_source_is_one_line(trained, tmp_path):
    feature = RNNFeature(str(trained.forward))
    pairs = list(table_pairs(trained.rescored))[:2]
    source, entry = segmented(pairs, [1, 0])
    with pytest.raises(RNNFeatureError, match="n-best line 7 has no phrase segmentation: .* decode with moses "
                                              "-include-segmentation-in-n-best"):
        feature.score([source], [replace(entry, segmentation=None)])
    with pytest.raises(RNNFeatureError, match=rf"n-best line 7: its phrases cover {len(source.split())} source "
                                              rf"words but sentence 0 of the source has {len(source.split()) + 1}:"):
        feature.score([source + " extra"], [entry])
    # Through mert's rewriter: one line, the output not written.
    nbest = tmp_path / "plain.nbest"
    nbest.write_text(f"0 ||| {entry.hypothesis} ||| F= 0 ||| 0\n")
    with pytest.raises(UserError) as err:
        add_features(nbest, tmp_path / "out.nbest", [source], [feature])
    assert "\n" not in str(err.value) and not (tmp_path / "out.nbest").exists()
    for bad in (f"{trained.forward},weight=1", f"{trained.forward},name=RNN_x", ""):
        with pytest.raises(UserError, match="RNN"):
            load_feature(f"RNN:{bad}")


def test_spec_paths_are_made_absolute(trained, monkeypatch):
    monkeypatch.chdir(trained.forward.parent)
    spec = "RNN:forward.pt,name=RNNf,table=phrase-table.gz"
    assert absolute_spec_path(spec) == (f"RNN:{trained.forward},name=RNNf,"
                                        f"table={trained.forward.parent / 'phrase-table.gz'}")


@pytest.mark.moses
def test_in_moses_the_feature_equals_the_decoders_p_rnn_column(trained, tmp_path):
    """The strongest ground truth: decode the six-column table with segmentation, and compare the
    feature with the n-best's own p_RNN value (TranslationModel0's fifth)."""
    from moses_integration.decoder import decode
    from shared_paths import moses_bin_dir

    bindir = moses_bin_dir()
    system = trained.system
    six = tmp_path / "phrase-table.rnn.gz"
    rescore(str(system.table), str(six), Models(load_checkpoint(trained.forward)),
            RescoreOptions(progress=False, device="cpu", workers=0))
    write_moses_ini(str(system.ini), str(tmp_path / "moses.rnn.ini"), str(six), (0.0, 0.2))
    source = tmp_path / "dev.en"
    source.write_text("\n".join(system.sentences) + "\n")
    decode(bindir, tmp_path / "moses.rnn.ini", source, tmp_path / "dev.out", nbest_path=tmp_path / "dev.nbest",
           nbest_size=50, cwd=tmp_path, extra_args=["-include-segmentation-in-n-best"])
    # With table=, the words Moses passes through unknown ("Republican") are 0, as in its column.
    add_features(tmp_path / "dev.nbest", tmp_path / "dev.rnn.nbest", source,
                 [load_feature(f"RNN:{trained.forward},table={system.table}")])
    entries = list(read_nbest(tmp_path / "dev.rnn.nbest"))
    assert len(entries) > 50 and all(e.segmentation for e in entries)
    decoder = np.array([dict(e.features)["TranslationModel0"][4] for e in entries])
    ours = np.array([dict(e.features)["RNN0"][0] for e in entries])
    np.testing.assert_allclose(ours, decoder, rtol=2e-5, atol=0)
    same_text = sum(f"{a:.6g}" == f"{b:.6g}" for a, b in zip(ours, decoder, strict=True))
    assert same_text >= 0.9 * len(entries)


@pytest.mark.moses
def test_mert_tune_and_evaluate_with_the_feature_on_the_real_decoder(trained, tmp_path):
    """``mert tune --feature RNN:…`` decodes with Moses' segmentation by itself (the feature's
    ``decoder_flags``): every hypothesis gets RNN0, MERT weighs it, the sidecar keeps the spec, and
    ``mert evaluate`` decodes and reranks the test set with it."""
    from mert.evaluate import decode_test_set
    from mert.features import read_sidecar
    from mert.tune import TuneOptions, tune
    from shared_paths import moses_bin_dir, shared_file

    bindir, system = moses_bin_dir(), trained.system
    source, reference = tmp_path / "dev.en", tmp_path / "dev.fr"
    source.write_text("\n".join(system.sentences) + "\n")
    french = (shared_file("fixtures/hansard-enfr") / "data/dev.tok.tc.fr").read_text().splitlines()
    reference.write_text("\n".join(french[:len(system.sentences)]) + "\n")
    spec = f"RNN:{trained.forward},table={system.table}"
    work = tmp_path / "work"
    result = tune(TuneOptions(ini=system.ini, source=source, references=[reference], work_dir=work,
                              moses_bin_dir=bindir, max_iterations=2, restarts=3, feature_specs=[spec]),
                  log=lambda _: None)
    entries = list(read_nbest(work / "run1.nbest.gz"))
    assert entries and all(e.features[-1][0] == "RNN0" and e.segmentation for e in entries)
    assert len(result.weights["RNN0"]) == 1
    assert [(e.spec, e.name) for e in read_sidecar(work / "moses.ini")] == [(spec, "RNN0")]
    out = decode_test_set(work / "moses.ini", source, tmp_path / "test.tok", moses_bin_dir=bindir, nbest_size=20)
    assert len(out.read_text().splitlines()) == len(system.sentences)
    rescored = list(read_nbest(tmp_path / "test.tok.nbest.gz"))
    assert rescored and all(e.features[-1][0] == "RNN0" and e.segmentation for e in rescored)
