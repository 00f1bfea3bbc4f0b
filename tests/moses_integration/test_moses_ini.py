"""Tests of moses.ini parsing and editing: byte-identical round trips and the num-features edit.

The three real configs of the hansard-enfr fixture (written by train-model.perl, the filter script
and mert-moses.pl) anchor the format; small hand-written configs cover the edge cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moses_integration.moses_ini import (
    MosesIni,
    MosesIniError,
    dense_feature_name_problem,
    format_weight,
)
from moses_integration.phrase_table import read_phrase_table
from shared_paths import REPO_ROOT, shared_file

REAL_INIS = ["filtered/moses.ini", "model/moses.ini", "tuning/moses.ini"]
FIXTURE = "fixtures/hansard-enfr"

SMALL = """\
# top comment
[input-factors]
0

[feature]
UnknownWordPenalty
WordPenalty  # inline comment
PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=pt.gz input-factor=0 output-factor=0
Distortion

[foo]
anything = goes here   # and stays

[weight]
# comment inside [weight]
UnknownWordPenalty0= 1
WordPenalty0= -1
TranslationModel0= 0.2 0.2 0.2 0.2   # tm weights
Distortion0= 0.3
""".replace("output-factor=0\n", "output-factor=0 \n")  # trailing blank as train-model.perl writes it


def real_ini(name: str) -> Path:
    return shared_file(f"{FIXTURE}/{name}")


# ---------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("name", REAL_INIS)
def test_real_ini_round_trip_is_byte_identical(tmp_path: Path, name: str) -> None:
    path = real_ini(name)
    ini = MosesIni.read(path)
    assert ini.text().encode("utf-8") == path.read_bytes()
    out = tmp_path / "moses.ini"
    ini.write(out)
    assert out.read_bytes() == path.read_bytes()


def test_crlf_and_missing_final_newline_round_trip() -> None:
    text = "[feature]\r\nWordPenalty\r\n[weight]\r\nWordPenalty0= -1"
    ini = MosesIni.parse(text)
    assert ini.text() == text
    assert ini.weights() == {"WordPenalty0": [-1.0]}
    assert [f.name for f in ini.feature_lines()] == ["WordPenalty0"]


# ---------------------------------------------------------------------------------------------
# Reading features and weights


def test_real_features_names_and_defaults() -> None:
    ini = MosesIni.read(real_ini("filtered/moses.ini"))
    features = ini.feature_lines()
    assert [(f.type, f.name) for f in features] == [
        ("UnknownWordPenalty", "UnknownWordPenalty0"),
        ("WordPenalty", "WordPenalty0"),
        ("PhrasePenalty", "PhrasePenalty0"),
        ("PhraseDictionaryMemory", "TranslationModel0"),
        ("LexicalReordering", "LexicalReordering0"),
        ("Distortion", "Distortion0"),
        ("KENLM", "LM0"),
    ]
    tm = ini.find_feature("TranslationModel0")
    assert tm is not None
    assert tm.num_features == 4 and tm.path == "phrase-table.0-0.1.1.gz" and tm.line_no == 21
    assert list(tm.args) == ["name", "num-features", "path", "input-factor", "output-factor"]
    assert [f.name for f in ini.phrase_tables()] == ["TranslationModel0"]
    assert [f.name for f in features if not f.tuneable] == ["UnknownWordPenalty0"]
    assert ini.find_feature("LM1") is None


def test_real_tuned_weights_in_weight_section_order() -> None:
    weights = MosesIni.read(real_ini("tuning/moses.ini")).weights()
    assert list(weights) == [
        "LexicalReordering0",
        "Distortion0",
        "LM0",
        "WordPenalty0",
        "PhrasePenalty0",
        "TranslationModel0",
        "UnknownWordPenalty0",
    ]
    assert weights["TranslationModel0"] == [0.0511706, 0.0479339, 0.0333075, 0.0765164]
    assert weights["WordPenalty0"] == [-0.293221]


def test_unnamed_features_are_counted_per_type() -> None:
    ini = MosesIni.parse(
        "[feature]\nWordPenalty\nKENLM name=LM0 factor=0 path=a order=4\nKENLM factor=0 path=b order=3\n"
        "WordPenalty\nDistortion tuneable=false\n"
    )
    assert [f.name for f in ini.feature_lines()] == [
        "WordPenalty0",
        "LM0",
        "KENLM0",
        "WordPenalty1",
        "Distortion0",
    ]
    assert [f.explicit_name for f in ini.feature_lines()] == [False, True, False, False, False]
    distortion = ini.find_feature("Distortion0")
    assert distortion is not None and not distortion.tuneable


def test_comments_and_unknown_sections_are_parsed_like_moses() -> None:
    ini = MosesIni.parse(SMALL, "small.ini")
    assert [f.name for f in ini.feature_lines()] == [
        "UnknownWordPenalty0",
        "WordPenalty0",
        "TranslationModel0",
        "Distortion0",
    ]
    assert ini.weights()["TranslationModel0"] == [0.2] * 4
    assert ini.text() == SMALL


def test_phrase_table_types() -> None:
    ini = MosesIni.parse(
        "[feature]\nPhraseDictionaryCompact name=A num-features=4 path=a\n"
        "PhraseDictionaryOnDisk name=B num-features=5 path=b\nProbingPT name=C num-features=4 path=c\n"
        "LexicalReordering name=R num-features=6 path=r\n"
    )
    assert [f.name for f in ini.phrase_tables()] == ["A", "B", "C"]


# ---------------------------------------------------------------------------------------------
# Editing


def test_add_phrase_table_scores_on_real_ini(tmp_path: Path) -> None:
    path = real_ini("filtered/moses.ini")
    original = path.read_text()
    ini = MosesIni.read(path)
    updated = ini.add_phrase_table_scores("phrase-table.rnn.gz", [0.1, -0.05])
    assert updated.num_features == 6 and updated.path == "phrase-table.rnn.gz"
    assert ini.weights()["TranslationModel0"] == [0.2, 0.2, 0.2, 0.2, 0.1, -0.05]
    new_text = ini.text()
    old_lines, new_lines = original.splitlines(keepends=True), new_text.splitlines(keepends=True)
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert changed == [
        (
            "PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table.0-0.1.1.gz "
            "input-factor=0 output-factor=0 \n",
            "PhraseDictionaryMemory name=TranslationModel0 num-features=6 path=phrase-table.rnn.gz "
            "input-factor=0 output-factor=0 \n",
        ),
        ("TranslationModel0= 0.2 0.2 0.2 0.2\n", "TranslationModel0= 0.2 0.2 0.2 0.2 0.1 -0.05\n"),
    ]
    out = tmp_path / "moses.rnn.ini"
    ini.write(out)
    again = MosesIni.read(out)
    assert again.text() == new_text
    assert again.phrase_tables()[0].num_features == 6 and len(again.weights()["TranslationModel0"]) == 6


def test_add_phrase_table_scores_keeps_comments_and_unknown_sections() -> None:
    ini = MosesIni.parse(SMALL, "small.ini")
    ini.add_phrase_table_scores("pt.rnn.gz", [0.05, -0.1])
    text = ini.text()
    for kept in [
        "# top comment\n",
        "WordPenalty  # inline comment\n",
        "[foo]\nanything = goes here   # and stays\n",
    ]:
        assert kept in text
    assert "TranslationModel0= 0.2 0.2 0.2 0.2 0.05 -0.1   # tm weights\n" in text
    assert "num-features=6 path=pt.rnn.gz input-factor=0 output-factor=0 \n" in text
    tm = ini.find_feature("TranslationModel0")
    assert tm is not None and tm.num_features == 6 and len(ini.weights()["TranslationModel0"]) == 6


def test_add_phrase_table_scores_mismatch_raises_and_leaves_config_unchanged() -> None:
    text = SMALL.replace("TranslationModel0= 0.2 0.2 0.2 0.2", "TranslationModel0= 0.2 0.2 0.2")
    ini = MosesIni.parse(text, "bad.ini")
    with pytest.raises(MosesIniError) as info:
        ini.add_phrase_table_scores("pt.rnn.gz", [0.1, 0.1])
    assert info.value.path == "bad.ini" and info.value.line_no == 18
    assert "num-features=4 but 3 weights" in str(info.value)
    assert str(info.value).startswith("bad.ini:18: ")
    assert ini.text() == text


def test_add_phrase_table_scores_needs_a_single_or_named_table() -> None:
    text = (
        "[feature]\nPhraseDictionaryMemory name=TM0 num-features=4 path=a.gz\n"
        "PhraseDictionaryMemory name=TM1 num-features=2 path=b.gz\nWordPenalty\n"
        "[weight]\nTM0= 1 1 1 1\nTM1= 0.5 0.5\nWordPenalty0= -1\n"
    )
    ini = MosesIni.parse(text)
    with pytest.raises(MosesIniError, match="exactly one phrase table, found 2"):
        ini.add_phrase_table_scores("x.gz", [0.1])
    with pytest.raises(MosesIniError, match="not a phrase table"):
        ini.add_phrase_table_scores("x.gz", [0.1], table_name="WordPenalty0")
    with pytest.raises(MosesIniError, match="no phrase table named 'TM9'; its phrase tables: TM0, TM1"):
        ini.add_phrase_table_scores("x.gz", [0.1], table_name="TM9")
    assert ini.text() == text
    ini.add_phrase_table_scores(None, [0.1], table_name="TM1")
    assert ini.weights() == {"TM0": [1.0] * 4, "TM1": [0.5, 0.5, 0.1], "WordPenalty0": [-1.0]}
    tm1 = ini.find_feature("TM1")
    assert tm1 is not None and tm1.num_features == 3 and tm1.path == "b.gz"


def test_add_phrase_table_scores_requires_weights_and_num_features() -> None:
    no_weight = MosesIni.parse("[feature]\nPhraseDictionaryMemory name=TM0 num-features=1 path=a\n[weight]\n")
    with pytest.raises(MosesIniError, match=r"no \[weight\] line for TM0"):
        no_weight.add_phrase_table_scores("b", [0.1])
    no_count = MosesIni.parse("[feature]\nPhraseDictionaryMemory name=TM0 path=a\n[weight]\nTM0= 1\n")
    with pytest.raises(MosesIniError, match="TM0 has no num-features"):
        no_count.add_phrase_table_scores("b", [0.1])
    ok = MosesIni.parse(
        "[feature]\nPhraseDictionaryMemory name=TM0 num-features=1 path=a\n[weight]\nTM0= 1\n"
    )
    with pytest.raises(MosesIniError, match="must be non-empty, without blanks"):
        ok.add_phrase_table_scores("has space.gz", [0.1])


def test_set_feature_arg_replaces_or_appends_one_token() -> None:
    ini = MosesIni.parse(SMALL)
    ini.set_feature_arg("WordPenalty0", "tuneable", "false")
    ini.set_feature_arg("TranslationModel0", "path", "other.gz")
    text = ini.text()
    assert "WordPenalty tuneable=false  # inline comment\n" in text
    assert "num-features=4 path=other.gz input-factor=0" in text
    wp = ini.find_feature("WordPenalty0")
    assert wp is not None and not wp.tuneable
    with pytest.raises(MosesIniError, match="no feature named"):
        ini.set_feature_arg("Nope0", "path", "x")


def test_set_weights_replaces_or_adds_lines() -> None:
    ini = MosesIni.parse(SMALL)
    ini.set_weights("Distortion0", [0.1234567890123])
    ini.set_weights("LM0", [0.5])
    weights = ini.weights()
    assert weights["Distortion0"] == [0.1234567890123]
    assert list(weights)[-1] == "LM0" and weights["LM0"] == [0.5]
    assert "Distortion0= 0.1234567890123\nLM0= 0.5\n" in ini.text()
    ini.set_weights("TranslationModel0", [1, 2, 3, 4])
    assert "TranslationModel0= 1 2 3 4   # tm weights\n" in ini.text()


def test_set_weights_creates_weight_section_when_missing() -> None:
    ini = MosesIni.parse("[feature]\nWordPenalty")
    ini.set_weights("WordPenalty0", [-1])
    assert ini.text() == "[feature]\nWordPenalty\n[weight]\nWordPenalty0= -1\n"
    assert ini.weights() == {"WordPenalty0": [-1.0]}


def test_format_weight_is_exact_and_short() -> None:
    assert format_weight(1.0) == "1"
    assert format_weight(-0.293221) == "-0.293221"
    assert format_weight(1e-7) == "1e-07"
    for value in [0.1, 1 / 3, -2.5e-12, 123456.789]:
        assert float(format_weight(value)) == value
    with pytest.raises(ValueError):
        format_weight(float("nan"))


# ---------------------------------------------------------------------------------------------
# Errors name the file and line


@pytest.mark.parametrize(
    ("text", "line_no", "reason"),
    [
        ("[feature]\nWordPenalty\nKENLM path\n", 3, "is not key=value"),
        ("[feature]\nKENLM path=a path=b\n", 2, "duplicate key 'path'"),
        ("[feature]\nWordPenalty\nWordPenalty name=WordPenalty0\n", 3, "already used on line 2"),
        ("[feature]\nWordPenalty tuneable=maybe\n", 2, "is not a boolean"),
        ("[feature]\nPhraseDictionaryMemory num-features=four\n", 2, "is not a count"),
        ("\n[weight]\nWordPenalty0= -1 x\n", 3, "non-number"),
        ("[weight]\nWordPenalty0 -1\n", 2, "is not 'Name= w1 w2 ...'"),
        ("[weight]\nA= 1\nA= 2\n", 3, "already given on line 2"),
        ("[feature]\n[weight\n", 2, "has no ']'"),
    ],
)
def test_errors_name_file_and_line(text: str, line_no: int, reason: str) -> None:
    with pytest.raises(MosesIniError) as info:
        ini = MosesIni.parse(text, "conf/moses.ini")
        ini.feature_lines()
        ini.weights()
    err = info.value
    assert (err.path, err.line_no) == ("conf/moses.ini", line_no)
    assert str(err).startswith(f"conf/moses.ini:{line_no}: ")
    assert reason in str(err)


def test_read_rejects_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "moses.ini"
    path.write_bytes(b"[feature]\nWordPenalty\nKENLM path=\xff\n")
    with pytest.raises(MosesIniError, match=r"moses.ini:3: not valid UTF-8"):
        MosesIni.read(path)


# ---------------------------------------------------------------------------------------------
# The project's built-in sample config


def test_example_ini_matches_example_table() -> None:
    ini = MosesIni.read(REPO_ROOT / "examples" / "moses.ini")
    (table,) = ini.phrase_tables()
    assert table.name == "TranslationModel0" and table.num_features == 4
    assert table.path is not None
    table_path = REPO_ROOT / "examples" / table.path
    first = next(read_phrase_table(table_path))
    assert len(first.scores) == table.num_features
    weights = ini.weights()
    assert len(weights["TranslationModel0"]) == table.num_features
    assert {feature.name for feature in ini.feature_lines()} == set(weights)
    assert ini.text() == (REPO_ROOT / "examples" / "moses.ini").read_text()


def test_absolutize_paths_pins_relative_model_paths(tmp_path):
    ini = MosesIni.parse(
        "[feature]\nKENLM name=LM0 factor=0 path=lm.bin order=4\n"
        "PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=/abs/pt.gz input-factor=0\n"
        "[weight]\nLM0= 0.5\nTranslationModel0= 0.2 0.2 0.2 0.2\n"
    )
    ini.absolutize_paths(tmp_path)
    assert ini.find_feature("LM0").path == str(tmp_path / "lm.bin")
    assert ini.find_feature("TranslationModel0").path == "/abs/pt.gz"


# ---------------------------------------------------------------------------------------------
# Adding a feature (the in-decoder CSLM: Moses' NeuralLM)

NEURAL_LM = "NeuralLM factor=0 name=CSLM0 order=3 path=/abs/cslm.nplm"


def test_add_feature_appends_the_line_and_its_weight_keeping_everything_else() -> None:
    ini = MosesIni.parse(SMALL)
    added = ini.add_feature(NEURAL_LM, [0.1])
    assert added.name == "CSLM0" and added.type == "NeuralLM"
    assert added.args == {"factor": "0", "name": "CSLM0", "order": "3", "path": "/abs/cslm.nplm"}
    expected = SMALL.replace("Distortion\n\n[foo]", f"Distortion\n{NEURAL_LM}\n\n[foo]").replace(
        "Distortion0= 0.3\n", "Distortion0= 0.3\nCSLM0= 0.1\n")
    assert ini.text() == expected  # one line in each section, nothing else touched
    assert added.line_no == expected.splitlines().index(NEURAL_LM) + 1
    assert ini.weights()["CSLM0"] == [0.1]
    assert MosesIni.parse(ini.text()).find_feature("CSLM0") == added  # reads back the same


def test_add_feature_goes_after_the_last_value_not_after_a_comment_for_the_next_section() -> None:
    text = "[feature]\nWordPenalty\n\n# weights follow\n[weight]\nWordPenalty0= -1\n"
    ini = MosesIni.parse(text)
    ini.add_feature("NeuralLM factor=0 order=5 path=/m.nplm", [0])
    assert ini.text() == ("[feature]\nWordPenalty\nNeuralLM factor=0 order=5 path=/m.nplm\n\n# weights follow\n"
                          "[weight]\nWordPenalty0= -1\nNeuralLM0= 0\n")  # unnamed: Moses' default name


def test_add_feature_keeps_crlf_and_a_missing_final_newline() -> None:
    ini = MosesIni.parse("[feature]\r\nWordPenalty\r\n[weight]\r\nWordPenalty0= -1")
    ini.add_feature(NEURAL_LM, [0.5])
    assert ini.text() == (f"[feature]\r\nWordPenalty\r\n{NEURAL_LM}\r\n[weight]\r\nWordPenalty0= -1\r\n"
                          "CSLM0= 0.5\r\n")


def test_add_feature_opens_a_weight_section_when_there_is_none() -> None:
    ini = MosesIni.parse("[feature]\nWordPenalty\n")
    ini.add_feature(NEURAL_LM, [0])
    assert ini.text() == f"[feature]\nWordPenalty\n{NEURAL_LM}\n[weight]\nCSLM0= 0\n"


def test_add_feature_counts_default_names_per_type() -> None:
    ini = MosesIni.parse(SMALL)
    assert ini.add_feature("WordPenalty", [-1]).name == "WordPenalty1"  # SMALL has one unnamed WordPenalty


@pytest.mark.parametrize(
    "line, weights, reason",
    [
        ("Distortion name=Distortion0", [0.1], r"<string>:9: feature name 'Distortion0' is already used by this "
                                               "Distortion"),
        ("KENLM name=WordPenalty0 order=3 path=/m", [0.1], "'WordPenalty0' is already used"),  # a default name
        ("NeuralLM name=TranslationModel0 order=3 path=/m", [0.1], "already used by this PhraseDictionaryMemory"),
        ("NeuralLM name=CSLM_0 order=3 path=/m", [0.1], "contains '_', which Moses' extractor reads as a sparse"),
        ("NeuralLM name=0CSLM order=3 path=/m", [0.1], "must be a letter followed by letters or digits"),
        ("NeuralLM name=CSLM0 order=3 path=/with space/m.nplm", [0.1], "'space/m.nplm' is not key=value"),
        ("NeuralLM name=CSLM0 order=3 path=", [0.1], "value of path= '' must be non-empty"),
        ("NeuralLM name=CSLM0 order=3 path=/m#1", [0.1], "without '#'"),
        ("NeuralLM name=CSLM0 order=3\npath=/m", [0.1], "must be one line"),
        ("NeuralLM name=CSLM0 num-features=2 order=3 path=/m", [0.1], "num-features=2 but 1 weights"),
        ("NeuralLM name=CSLM0 order=3 path=/m", [], "no weights given"),
        ("NeuralLM name=CSLM0 tuneable=maybe order=3 path=/m", [0.1], "tuneable='maybe' is not a boolean"),
    ],
)
def test_add_feature_refuses_and_changes_nothing(line: str, weights: list[float], reason: str) -> None:
    ini = MosesIni.parse(SMALL)
    with pytest.raises(MosesIniError, match=reason):
        ini.add_feature(line, weights)
    assert ini.text() == SMALL


def test_add_feature_refuses_an_orphan_weight_line_a_missing_section_and_bad_weights() -> None:
    orphan = "[feature]\nWordPenalty\n[weight]\nWordPenalty0= -1\nCSLM0= 0.3\n"
    ini = MosesIni.parse(orphan)
    with pytest.raises(MosesIniError, match="<string>:5: a weight line for CSLM0 exists, but no feature"):
        ini.add_feature(NEURAL_LM, [0.1])
    assert ini.text() == orphan
    no_features = "[weight]\nWordPenalty0= -1\n"
    ini = MosesIni.parse(no_features)
    with pytest.raises(MosesIniError, match=r"no \[feature\] section"):
        ini.add_feature(NEURAL_LM, [0.1])
    assert ini.text() == no_features
    ini = MosesIni.parse(SMALL)
    with pytest.raises(ValueError, match="not finite"):
        ini.add_feature(NEURAL_LM, [float("nan")])
    assert ini.text() == SMALL


@pytest.mark.parametrize("name", ["CSLM0", "LM", "a1"])
def test_dense_feature_names(name: str) -> None:
    assert dense_feature_name_problem(name) is None


@pytest.mark.parametrize("name", ["", "CSLM_0", "1LM", "C SLM", "CSLM0\n", "CS=LM", "CSLM#"])
def test_not_dense_feature_names(name: str) -> None:
    assert dense_feature_name_problem(name)


def test_model_files_are_the_files_moses_reads_for_each_path(tmp_path: Path) -> None:
    """As Moses resolves ``path=``: against the decoder's folder, with the suffixes it adds, a folder whole."""
    system, elsewhere = tmp_path / "system", tmp_path / "elsewhere"
    (system / "probing").mkdir(parents=True)
    elsewhere.mkdir()
    files = [system / "lm.fr.binary", system / "phrase-table.gz", system / "probing" / "source_vocabs.dat",
             system / "probing" / "binfile.dat", elsewhere / "reordering.minlexr"]
    for f in [*files, system / "other.gz", system / "phrase.gz"]:  # the last two: no feature names them
        f.write_text("x")
    ini = system / "moses.ini"
    ini.write_text("[feature]\nKENLM name=LM0 factor=0 path=lm.fr.binary order=5\n"
                   "PhraseDictionaryMemory name=TranslationModel0 num-features=4 path=phrase-table input-factor=0 "
                   "output-factor=0\nProbingPT name=TranslationModel1 num-features=4 path=probing input-factor=0 "
                   "output-factor=0\nLexicalReordering name=LexicalReordering0 num-features=6 "
                   f"type=msd-bidirectional-fe input-factor=0 output-factor=0 path={elsewhere / 'reordering'}\n"
                   "KENLM name=LM1 factor=0 path=missing.binary order=5\nWordPenalty\n")
    assert MosesIni.read(ini).model_files() == sorted(files)
    (elsewhere / "lm.fr.binary").write_text("y")  # run from elsewhere: the relative paths are read there
    assert MosesIni.read(ini).model_files(elsewhere) == [elsewhere / "lm.fr.binary", elsewhere / "reordering.minlexr"]
