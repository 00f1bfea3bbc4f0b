"""How phrase pairs fit a parallel text, against counts made by hand on small files."""

from __future__ import annotations

from pathlib import Path

from moses_integration.phrase_coverage import Lengths, Proposal, reference_overlap, table_targets


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_reference_overlap_counts_each_source_once_per_sentence(tmp_path):
    proposals = {"red house": [Proposal("missing", "la maison rouge", -2.0), Proposal("missing", "maison rouge", -1.5)],
                 "cat": [Proposal("thin", "chatte", -0.7)], "blue sky": [Proposal("missing", "ciel bleu", -1.0)]}
    table = _write(tmp_path / "phrase-table", [
        "cat ||| chat ||| 0.5 0.5 0.5 0.5 ||| 0-0 ||| 2 2 2",
        "dog ||| chien ||| 0.5 0.5 0.5 0.5 ||| 0-0 ||| 2 2 2",
    ])
    src = _write(tmp_path / "test.en", ["the red house and the cat", "a cat , a red house"])
    ref = _write(tmp_path / "test.fr", ["la maison rouge et le chat", "une chatte , une maison"])
    lengths = Lengths()
    own = table_targets(table, set(proposals), lengths)
    assert own == {"cat": ["chat"]}
    assert (lengths.pairs, lengths.source_words, lengths.target_words, lengths.shorter_targets) == (2, 2, 2, 0)
    found = reference_overlap(proposals, own, src, ref)
    missing, thin = found["missing"], found["thin"]
    # "red house" in both sentences ("blue sky" in none): sentence 1's reference holds both of its
    # proposals, sentence 2's neither ("maison" alone is not "maison rouge").
    assert (missing.occurrences, missing.proposed, missing.proposed_in_ref) == (2, 4, 2)
    assert missing.occurrences_with_proposal_in_ref == 1 and missing.table == 0
    # "cat": the table's "chat" is in reference 1, the proposal "chatte" in reference 2 (whole tokens only).
    assert (thin.occurrences, thin.proposed_in_ref, thin.table, thin.table_in_ref) == (2, 1, 2, 1)


def test_lengths_count_targets_shorter_than_their_source():
    lengths = Lengths()
    lengths.add("the red house", "la maison")
    lengths.add("cat", "le chat")
    assert (lengths.pairs, lengths.source_words, lengths.target_words, lengths.shorter_targets) == (2, 4, 4, 1)
