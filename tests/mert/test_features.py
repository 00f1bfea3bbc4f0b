"""Extra n-best features: built-ins, appending to real Moses n-best lists, loading, the sidecar."""

from __future__ import annotations

import gzip
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mert.features import (
    FEATURE_ENTRY_POINT_GROUP,
    ExtraFeatureWeights,
    FeatureError,
    LengthRatio,
    WordCount,
    add_features,
    check_feature_name,
    decoder_flags,
    load_feature,
    load_features,
    parse_feature_spec,
    read_sidecar,
    registered_features,
    sidecar_path,
    write_sidecar,
)
from moses_integration.nbest import NBestEntry, NBestError, load_nbest_arrays, read_nbest
from shared_paths import shared_file

NBEST = "fixtures/hansard-enfr/nbest/dev.nbest.gz"
SOURCE = "fixtures/hansard-enfr/data/dev.tok.tc.en"
SENTENCES = 5


@pytest.fixture
def small_list(tmp_path: Path) -> tuple[Path, Path]:
    """The first SENTENCES sentences of the fixture's real 100-best list, and their source lines."""
    lines = gzip.decompress(shared_file(NBEST).read_bytes()).decode("utf-8").splitlines()
    keep = [line for line in lines if int(line.split(" ||| ", 1)[0]) < SENTENCES]
    nbest = tmp_path / "dev.nbest"
    nbest.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    source = tmp_path / "dev.en"
    src_lines = shared_file(SOURCE).read_text(encoding="utf-8").splitlines()[:SENTENCES]
    source.write_text("".join(line + "\n" for line in src_lines), encoding="utf-8")
    return nbest, source


def test_add_features_appends_values_that_read_nbest_reads_back(small_list: tuple[Path, Path], tmp_path: Path) -> None:
    nbest, source = small_list
    out = tmp_path / "dev.extra.nbest.gz"
    count = add_features(nbest, out, source, [WordCount(), LengthRatio("1.1")])
    before = list(read_nbest(nbest))
    after = list(read_nbest(out))
    assert count == len(before) == len(after) > SENTENCES * 50
    src = source.read_text(encoding="utf-8").splitlines()
    for old, new in zip(before, after, strict=True):
        assert new.hypothesis == old.hypothesis and new.sent_id == old.sent_id and new.total == old.total
        assert new.features[:-2] == old.features  # Moses' own features untouched, in order
        assert new.features[-2][0] == "WordCount" and new.features[-1][0] == "LengthRatio"
        words = len(old.hypothesis.split())
        assert new.features[-2][1] == [words]
        expected = -((math.log((words + 1) / (len(src[old.sent_id].split()) + 1)) - math.log(1.1)) ** 2)
        assert new.features[-1][1][0] == pytest.approx(expected, rel=1e-5, abs=1e-6)  # 6 significant digits
    # The rewritten list is a valid dense list for MERT, with the two columns at the end.
    arrays = load_nbest_arrays(out, expected_sentences=SENTENCES)
    assert arrays.feature_names[-2:] == [("WordCount", 1), ("LengthRatio", 1)]
    assert arrays.features.shape == (count, 16)
    # WordCount is exactly minus Moses' own WordPenalty0 on a real list.
    wp = arrays.column_names().index("WordPenalty0_0")
    assert np.array_equal(arrays.features[:, -2], -arrays.features[:, wp])


def test_add_features_without_features_reproduces_the_list_byte_for_byte(
    small_list: tuple[Path, Path], tmp_path: Path
) -> None:
    nbest, source = small_list
    out = tmp_path / "copy.nbest"
    add_features(nbest, out, source, [])
    assert out.read_bytes() == nbest.read_bytes()


class _Recorder:
    """A feature that records what it was given, to check the chunking contract."""

    name = "Recorder"
    num_values = 2

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        self.calls.append([e.sent_id for e in entries])
        return np.array([[e.sent_id, len(source_sentences)] for e in entries], dtype=float)


def test_features_see_whole_sentences_in_bounded_chunks(small_list: tuple[Path, Path], tmp_path: Path) -> None:
    nbest, source = small_list
    rec = _Recorder()
    add_features(nbest, tmp_path / "out.nbest", source, [rec], chunk_hypotheses=120)
    assert len(rec.calls) > 1
    seen = [sid for call in rec.calls for sid in call]
    assert seen == sorted(seen) and len(set(seen)) == SENTENCES
    for a, b in zip(rec.calls, rec.calls[1:], strict=False):
        assert a[-1] < b[0]  # no sentence split across two calls
    values = [e.features[-1] for e in read_nbest(tmp_path / "out.nbest")]
    assert all(v == ("Recorder", [e_id, SENTENCES]) for v, e_id in zip(values, seen, strict=True))


class _Bad:
    name = "Bad"
    num_values = 1

    def __init__(self, result: np.ndarray | None = None) -> None:
        self.result = result

    def score(self, source_sentences: list[str], entries: list[NBestEntry]) -> np.ndarray:
        if self.result is not None:
            return self.result
        values = np.zeros((len(entries), 1))
        values[len(entries) // 2, 0] = np.nan
        return values


def test_bad_scores_are_errors_and_leave_no_output(small_list: tuple[Path, Path], tmp_path: Path) -> None:
    nbest, source = small_list
    out = tmp_path / "out.nbest.gz"
    with pytest.raises(FeatureError, match="non-finite value"):
        add_features(nbest, out, source, [_Bad()])
    with pytest.raises(FeatureError, match=r"shape \(3, 1\)"):
        add_features(nbest, out, source, [_Bad(np.zeros((3, 1)))])
    assert not out.exists() and list(tmp_path.glob(".out.nbest.gz*")) == []


def test_feature_already_in_the_list_and_short_source_are_errors(
    small_list: tuple[Path, Path], tmp_path: Path
) -> None:
    nbest, source = small_list
    with pytest.raises(NBestError, match="already has feature"):
        add_features(nbest, tmp_path / "o", source, [WordCount(name="LM0")])
    short = tmp_path / "short.en"
    short.write_text("".join(source.read_text().splitlines(keepends=True)[:3]))
    with pytest.raises(NBestError, match="out of range: expected 3 sentences"):
        add_features(nbest, tmp_path / "o", short, [WordCount()])


def test_feature_names_must_be_dense_moses_names() -> None:
    assert check_feature_name("CSLM0") == "CSLM0"
    with pytest.raises(FeatureError, match="sparse"):
        check_feature_name("my_feature")
    for bad in ("", "0abc", "a b", "LM0="):
        with pytest.raises(FeatureError):
            check_feature_name(bad)
    with pytest.raises(FeatureError, match="sparse"):
        WordCount(name="Word_Count")


def test_feature_specs_and_loading() -> None:
    assert parse_feature_spec("LengthRatio:1.1").arg == "1.1"
    assert parse_feature_spec("WordCount").arg is None
    spec = parse_feature_spec("some.module:Cls:a:b")
    assert (spec.module, spec.class_name, spec.arg) == ("some.module", "Cls", "a:b")
    feature = load_feature("mert.features:LengthRatio:1.25")
    assert isinstance(feature, LengthRatio) and feature.ratio == 1.25
    assert isinstance(load_feature("WordCount"), WordCount)
    with pytest.raises(FeatureError, match="cannot import"):
        load_feature("no_such_module_xyz:Cls")
    with pytest.raises(FeatureError, match="has no 'Nope'"):
        load_feature("mert.features:Nope")
    with pytest.raises(FeatureError, match="expected module:Class"):
        load_feature("justaname")
    with pytest.raises(FeatureError, match="ratio must be positive"):
        load_feature("LengthRatio:-2")
    with pytest.raises(FeatureError, match="not an n-best feature"):
        load_feature("fractions:Fraction:3")  # builds, but is not a feature
    with pytest.raises(FeatureError, match="used twice"):
        load_features(["WordCount", "mert.features:WordCount"])


def _register(monkeypatch: pytest.MonkeyPatch, folder: Path, entries: str) -> None:
    """An installed package that registers features: its metadata on sys.path, as pip leaves it."""
    info = folder / "feature_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: feature-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{FEATURE_ENTRY_POINT_GROUP}]\n{entries}\n")
    monkeypatch.syspath_prepend(str(folder))


def test_a_package_registers_a_feature_under_a_short_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Features come from above: a short name an installed package registers loads its class, with the
    argument after the ``:``; a built-in name still wins over a registered one."""
    _register(monkeypatch, tmp_path, "Ratio2 = mert.features:LengthRatio\nWordCount = mert.features:LengthRatio")
    assert registered_features()["Ratio2"] == ("mert.features", "LengthRatio")
    spec = parse_feature_spec("Ratio2:1.5")
    assert (spec.module, spec.class_name, spec.arg, spec.with_arg("2")) == ("mert.features", "LengthRatio", "1.5",
                                                                            "Ratio2:2")
    feature = load_feature("Ratio2:1.5")
    assert isinstance(feature, LengthRatio) and feature.ratio == 1.5
    assert isinstance(load_feature("WordCount"), WordCount)
    with pytest.raises(FeatureError, match=r"registered feature\[:arg\] \(entry points mert.features: .*Ratio2"):
        load_feature("Unknown")


def test_the_project_registers_the_cslm_and_mert_loads_no_model_without_it() -> None:
    """``--feature CSLM:model.pt`` works through the project's registration (pyproject.toml; a stale
    install lacks it: pip install -e .), and MERT parsing that spec, or using its built-ins, never
    imports the CSLM's package or torch."""
    assert registered_features().get("CSLM") == ("cslm.nbest", "CSLMFeature"), (
        "the installed metadata lacks pyproject.toml's [project.entry-points.\"mert.features\"]: pip install -e .")
    assert registered_features().get("NMT") == ("nmt.nbest", "NMTFeature")
    code = ("import sys; from mert.features import load_feature, parse_feature_spec; import mert.cli, mert.tune; "
            "spec = parse_feature_spec('CSLM:m.pt'); load_feature('LengthRatio:1.1'); "
            "print(spec.module, sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'cslm', 'rescorer'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    assert out.split() == ["cslm.nbest", "[]"]


def test_sidecar_round_trip_and_stale_sidecar_removed(tmp_path: Path) -> None:
    ini = tmp_path / "moses.ini"
    extras = [ExtraFeatureWeights("LengthRatio:1.1", "LengthRatio", (0.0123456789,))]
    path = write_sidecar(ini, extras)
    assert path == sidecar_path(ini) == tmp_path / "moses.ini.extra-features"
    assert read_sidecar(ini) == extras  # exact floats survive
    assert write_sidecar(ini, []) is None
    assert not path.exists() and read_sidecar(ini) == []
    path.write_text("{not json")
    with pytest.raises(FeatureError, match="not a valid extra-features file"):
        read_sidecar(ini)


def test_word_counts_use_moses_tokens() -> None:
    # Moses' WordPenalty counts "la<U+00A0>maison" as one word; str.split() would count two.
    entries = [NBestEntry(0, "la\u00a0maison  bleue", [("LM0", [-1.0])], -1.0)]
    assert WordCount().score(["the blue\thouse"], entries).tolist() == [[2.0]]
    expected = -((math.log(3 / 4)) ** 2)
    assert LengthRatio().score(["the blue\thouse"], entries)[0, 0] == pytest.approx(expected)


def test_the_decoder_flags_features_need_are_added_once() -> None:
    """A feature scoring phrase pairs needs Moses' segmentation: ``mert tune`` and ``mert evaluate``
    decode with the flags the features name, after the user's, each once."""

    class NeedsSegmentation(WordCount):
        decoder_flags = ("-include-segmentation-in-n-best", "-x")

    features = [WordCount(), NeedsSegmentation(), NeedsSegmentation("Other")]
    assert decoder_flags(features, ["-x", "-distortion-limit", "6"]) == [
        "-x", "-distortion-limit", "6", "-include-segmentation-in-n-best"]
    assert decoder_flags([WordCount()]) == []


@pytest.mark.parametrize("spec, files", [
    ("CSLM:/m/cslm.pt,name=CSLM1", ["/m/cslm.pt"]),
    ("RNN:/m/rnn.pt", ["/m/rnn.pt"]),
    ("RNN:/m/rnn.pt,name=RNN1,table=/t/phrase-table.gz", ["/m/rnn.pt", "/t/phrase-table.gz"]),
    ("NMT:/m/nmt.pt,reverse=/m/reverse.pt,normalize", ["/m/nmt.pt", "/m/reverse.pt"]),
    ("NMT:/m/nmt.pt", ["/m/nmt.pt"]),
    ("WordCount", []),
    ("LengthRatio:1.1", []),
])
def test_feature_files_are_the_files_each_feature_reads(spec: str, files: list[str]) -> None:
    """What ``mert evaluate`` records of an extra feature beside its spec: the models (and the RNN's table)."""
    from mert.features import feature_files

    assert feature_files(spec) == [Path(f) for f in files]
