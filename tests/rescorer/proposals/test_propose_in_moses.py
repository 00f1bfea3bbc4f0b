"""The completed table and its moses.ini load and decode in the real Moses decoder, proposals used.

A proposed line has fewer fields than the table's own lines, no entry in the reordering table and
three more columns than the ini had: only the real decoder shows that Moses takes all of that.
Skipped unless MOSES_BIN_DIR is set.
"""

from __future__ import annotations

import gzip

import pytest
from click.testing import CliRunner

from moses_integration.decoder import decode
from moses_integration.nbest import read_nbest
from proposal_system import write_model, write_word_tables
from rescorer.cli import main
from shared_paths import moses_bin_dir
from small_system import small_system

pytestmark = [pytest.mark.slow, pytest.mark.moses]


def test_moses_decodes_with_proposals_in_the_table(tmp_path) -> None:
    bindir = moses_bin_dir()
    system = small_system(tmp_path)
    table, sentences = system.table, system.sentences
    write_word_tables(table, tmp_path)  # beside the table, where train-model.perl puts them
    model = write_model(table, tmp_path / "model.pt")
    text = tmp_path / "dev.en"
    text.write_text("\n".join(sentences) + "\n")

    out = tmp_path / "phrase-table.proposed.gz"
    # A large weight on the indicator makes the decoder prefer proposed pairs: they must be usable.
    result = CliRunner().invoke(main, [
        "propose", str(table), str(out), "--model", str(model), "--for-text", str(text), "--thin-below", "5",
        "--beam", "4", "--per-source", "2", "--moses-ini", str(tmp_path / "moses.ini"),
        "--moses-ini-out", str(tmp_path / "moses.proposed.ini"), "--proposed-weight", "5",
        "--device", "cpu", "--threads", "1", "-q"])
    assert result.exit_code == 0, result.output
    lines = gzip.decompress(out.read_bytes()).splitlines()
    proposed = sum(line.split(b" ||| ")[2].endswith(b" 2.71828") for line in lines)
    assert proposed > 0

    decoded = decode(bindir, tmp_path / "moses.proposed.ini", text, tmp_path / "dev.out",
                     nbest_path=tmp_path / "dev.nbest", nbest_size=5, cwd=tmp_path)
    assert len(decoded.output.read_text().splitlines()) == 2
    entries = list(read_nbest(tmp_path / "dev.nbest"))
    tm = [dict(e.features)["TranslationModel0"] for e in entries]
    assert all(len(v) == 7 for v in tm)
    # Moses reads the indicator back as the number of proposed pairs a translation uses (ln 2.71828
    # = 0.9999993 each).
    used = [v[6] for v in tm]
    assert all(abs(u - round(u)) < 1e-4 and u > -1e-6 for u in used)
    assert max(used) > 0.99
