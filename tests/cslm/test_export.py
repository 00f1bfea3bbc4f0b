"""The CSLM in NPLM's format (what Moses' NeuralLM loads), raw scoring, and self-normalised training.

The exported file is read back by a reader written here from NPLM's format description
(``src/model.cpp``), not by the project's code, and every matrix is checked against the model; the
network NPLM runs (``src/propagator.h``: rectifier layers, a linear output row) is then computed on
those matrices with NumPy and compared with the CSLM's raw scores.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cslm.cli import main
from cslm.model import CSLM, CSLMConfig
from cslm.model_file import load_cslm, save_cslm
from cslm.scoring import sentence_log_probs, token_scores
from cslm.train import CSLMTrainConfig, Validation, train_cslm
from moses_integration.nplm import NPLMError, read_nplm_header
from neural.vocab import Vocab
from shared_paths import shared_file

WORDS = ["le", "la", "les", "de", "du", "des", "et", "à", "un", "une", "chat", "chien", "maison", "rouge"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def small_model(hidden: list[int], order: int = 4) -> tuple[CSLM, Vocab]:
    vocab = Vocab.from_counts({w: 100 - i for i, w in enumerate(WORDS)}, shortlist=10)  # some words are [UNK]
    torch.manual_seed(3)
    model = CSLM(CSLMConfig(vocab_size=len(vocab), order=order, embedding=5, hidden=hidden, init_range=0.5))
    return model.eval(), vocab


def read_nplm_file(path: Path) -> tuple[dict[str, str], dict[str, list[str]], dict[str, np.ndarray]]:
    """An independent reader: sections split at blank lines, matrices one row per line."""
    config: dict[str, str] = {}
    vocabs: dict[str, list[str]] = {}
    matrices: dict[str, np.ndarray] = {}
    blocks = path.read_text(encoding="utf-8").split("\n\n")
    assert blocks[-1] == "\\end\n"
    for block in blocks[:-1]:
        header, *rows = block.strip("\n").split("\n")
        name = header.lstrip("\\")
        if name == "config":
            config = dict(row.split(" ") for row in rows)
        elif name.endswith("vocab"):
            vocabs[name] = rows
        else:
            matrices[name] = np.array([[float(x) for x in row.split(" ")] for row in rows], dtype=np.float32)
    return config, vocabs, matrices


def nplm_raw_score(matrices: dict[str, np.ndarray], num_hidden: int, ngram: list[int]) -> float:
    """NPLM's forward pass for one n-gram (history ids, then the predicted id), in float64."""
    m = {k: v.astype(np.float64) for k, v in matrices.items()}
    x = np.concatenate([m["input_embeddings"][w] for w in ngram[:-1]])
    h = np.maximum(m["hidden_weights 1"] @ x + m["hidden_biases 1"][:, 0], 0)
    if num_hidden:
        h = np.maximum(m["hidden_weights 2"] @ h + m["hidden_biases 2"][:, 0], 0)
    return float(m["output_weights"][ngram[-1]] @ h + m["output_biases"][ngram[-1], 0])


@pytest.mark.parametrize("hidden", [[7, 6], [8]])
def test_every_matrix_of_the_export_is_the_model_and_nplm_computes_its_raw_scores(tmp_path: Path, hidden) -> None:
    model, vocab = small_model(hidden)
    path = tmp_path / "m.pt"
    save_cslm(path, model, vocab)
    out = tmp_path / "m.nplm"
    res = CliRunner().invoke(main, ["export-nplm", str(path), str(out)])
    assert res.exit_code == 0, res.output
    assert "order=4" in res.stderr and "without --self-normalize" in res.stderr

    config, vocabs, mats = read_nplm_file(out)
    V = model.config.vocab_size
    words = vocabs["input_vocab"]
    assert vocabs["output_vocab"] == words
    assert words[:2] == ["</s>", "<unk>"] and words[2:V] == list(vocab.words[2:]) and words[V:] == ["<s>", "<null>"]
    two = len(hidden) == 2
    assert config == {"version": "1", "ngram_size": "4", "input_vocab_size": str(V + 2),
                      "output_vocab_size": str(V + 2), "input_embedding_dimension": "5",
                      "num_hidden": str(hidden[0] if two else 0), "output_embedding_dimension": str(hidden[-1]),
                      "activation_function": "rectifier"}
    # %.9g round-trips float32: every value is exactly the model's.
    emb = model.embed.weight.detach().numpy()
    np.testing.assert_array_equal(mats["input_embeddings"][: V + 1], emb)  # the output ids, then <s>
    assert not mats["input_embeddings"][V + 1].any()  # <null>, as NPLM zeroes it
    linear = [m for m in model.hidden_layers if isinstance(m, torch.nn.Linear)]
    np.testing.assert_array_equal(mats["hidden_weights 1"], linear[0].weight.detach().numpy())
    np.testing.assert_array_equal(mats["hidden_biases 1"][:, 0], linear[0].bias.detach().numpy())
    if two:
        np.testing.assert_array_equal(mats["hidden_weights 2"], linear[1].weight.detach().numpy())
        np.testing.assert_array_equal(mats["hidden_biases 2"][:, 0], linear[1].bias.detach().numpy())
    else:
        assert mats["hidden_weights 2"].shape == (1, 1)
    np.testing.assert_array_equal(mats["output_weights"][:V], model.output.weight.detach().numpy())
    np.testing.assert_array_equal(mats["output_biases"][:V, 0], model.output.bias.detach().numpy())
    assert not mats["output_weights"][V:].any() and (mats["output_biases"][V:, 0] == -100).all()

    # NPLM's network on these matrices gives the CSLM's raw scores for every kind of n-gram.
    rng = np.random.default_rng(0)
    hist = rng.integers(0, V + 1, size=(50, 3))  # any input id, <s> (= V) included
    hist[0] = V  # a sentence start
    tgt = rng.integers(0, V, size=50)
    raw = token_scores(model, torch.from_numpy(hist), torch.from_numpy(tgt), normalize=False).logit.numpy()
    expected = [nplm_raw_score(mats, int(config["num_hidden"]), [*h, t]) for h, t in zip(hist, tgt, strict=True)]
    np.testing.assert_allclose(raw, expected, rtol=1e-5, atol=1e-5)
    # And the project's own header reader agrees (what moses.ini editing checks).
    header, header_vocab = read_nplm_header(out)
    assert header.ngram_size == 4 and header_vocab == words


@pytest.mark.parametrize(("alpha", "log_z", "warned"), [
    (0.1, 5.93, "log Z averages 5.93 on its validation text, not near 0: the raw scores Moses adds are the "
                "log-probabilities +5.93 per word; train it longer, or with more than --self-normalize 0.1"),
    (0.0, -1.5, "log Z averages -1.50 on its validation text, not near 0: the raw scores Moses adds are the "
                "log-probabilities -1.50 per word; train it with --self-normalize 0.1"),
    (0.1, 0.12, None)])
def test_export_warns_with_the_figure_when_log_z_is_far_from_zero(tmp_path: Path, alpha, log_z, warned) -> None:
    """Moses adds the raw scores as log-probabilities (docs/cslm.md: log Z must be near 0): a model whose
    last validation's log Z averaged far from 0 is exported with a warning that gives the figure, even
    one trained with --self-normalize."""
    model, vocab = small_model([8])
    history = [dataclasses.asdict(Validation(epoch, 1000 * epoch, 90.0, value, 0.2))
               for epoch, value in enumerate([6.2, log_z])]  # the file's model is its last validation's
    save_cslm(tmp_path / "m.pt", model, vocab, train_config=CSLMTrainConfig(self_normalize=alpha).to_dict(),
              train_state={"history": history})
    res = CliRunner().invoke(main, ["export-nplm", str(tmp_path / "m.pt"), str(tmp_path / "m.nplm")])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ([f"warning: {tmp_path / 'm.pt'}'s {warned}"] if warned else []), res.stderr


def test_raw_sentence_score_is_what_nplm_adds_with_its_start_padding_and_unk(tmp_path: Path) -> None:
    model, vocab = small_model([7, 6])
    save_cslm(tmp_path / "m.pt", model, vocab)
    out = tmp_path / "m.nplm"
    assert CliRunner().invoke(main, ["export-nplm", str(tmp_path / "m.pt"), str(out)]).exit_code == 0
    _, vocabs, mats = read_nplm_file(out)
    index = {w: i for i, w in enumerate(vocabs["input_vocab"])}
    sentence = ["le", "chien", "rouge", "mange", "la", "maison"]  # "mange" is outside the vocabulary: <unk>
    # Moses sends NeuralLM "<s> w1 … wk" (shorter than the order at the start; NPLM pads with <s>) then </s>.
    ids = [index["<s>"]] + [index.get(w, index["<unk>"]) for w in sentence] + [index["</s>"]]
    expected = 0.0
    for i in range(1, len(ids)):
        context = ids[max(0, i - 3) : i]
        padded = [index["<s>"]] * (3 - len(context)) + context
        expected += max(nplm_raw_score(mats, 7, [*padded, ids[i]]), -100.0)
    got = sentence_log_probs(model, vocab, [sentence], normalize=False)[0]
    assert got == pytest.approx(expected, abs=1e-4)
    res = CliRunner().invoke(main, ["score", "--raw", str(tmp_path / "m.pt"), "-"],
                             input=" ".join(sentence) + "\n")
    assert res.exit_code == 0, res.output
    assert float(res.stdout) == pytest.approx(expected, abs=1e-5)
    # Without --raw: the exact normalised log-probability, a different number.
    exact = sentence_log_probs(model, vocab, [sentence])[0]
    assert abs(exact - expected) > 0.1


def test_raw_scores_are_floored_at_minus_100_as_moses_floors_them() -> None:
    model, vocab = small_model([7, 6])
    with torch.no_grad():
        model.output.bias[vocab.eos_id] = -500.0
    raw = sentence_log_probs(model, vocab, [["le"]], normalize=False)[0]
    first = token_scores(model, torch.tensor([[model.config.bos_id] * 3]), torch.tensor([vocab.encode(["le"])[0]]),
                         normalize=False).logit.item()
    assert raw == pytest.approx(first - 100.0, abs=1e-4)


def test_export_refuses_a_vocabulary_nplm_cannot_hold(tmp_path: Path) -> None:
    vocab = Vocab(["</s>", "[UNK]", "le", "<null>"])  # a corpus that was never Moses-escaped
    model = CSLM(CSLMConfig(vocab_size=4, order=3, embedding=2, hidden=[3]))
    save_cslm(tmp_path / "m.pt", model, vocab)
    res = CliRunner().invoke(main, ["export-nplm", str(tmp_path / "m.pt"), str(tmp_path / "m.nplm")])
    assert res.exit_code == 1 and "'<null>' appears twice" in res.output
    assert not (tmp_path / "m.nplm").exists()


def test_header_reader_names_the_file_and_line_of_a_broken_model(tmp_path: Path) -> None:
    bad = tmp_path / "bad.nplm"
    bad.write_text("\\config\nversion 1\nngram_size seven\n\n\\end\n", encoding="utf-8")
    with pytest.raises(NPLMError, match=r"bad.nplm:1: \\config: invalid literal"):
        read_nplm_header(bad)
    model, vocab = small_model([4])
    save_cslm(tmp_path / "m.pt", model, vocab)
    assert CliRunner().invoke(main, ["export-nplm", str(tmp_path / "m.pt"), str(bad)]).exit_code == 0
    lines = bad.read_text(encoding="utf-8").splitlines(keepends=True)
    bad.write_text("".join(lines[: len(lines) // 2]), encoding="utf-8")  # an interrupted copy
    with pytest.raises(NPLMError, match=r"bad.nplm: no \\end line: the file is incomplete"):
        read_nplm_header(bad)


def _french_lines(n: int) -> list[str]:
    with gzip.open(shared_file("data/hansard/hansard.fr.gz"), "rt", encoding="utf-8") as fh:
        return list(itertools.islice(fh, 20000, 20000 + n))


@pytest.mark.slow
def test_self_normalised_training_brings_log_z_to_zero_at_little_cost(tmp_path: Path) -> None:
    """Same data, seed and budget, α = 0 and α = 0.5: with the penalty, log Z on held-out text (its
    mean, and its root mean square: the typical gap between a raw and an exact word score) falls far
    below the plain model's, so the raw score Moses adds is close to the log-probability, while the
    perplexity stays close."""
    corpus = tmp_path / "fr.txt"
    corpus.write_text("".join(_french_lines(1500)), encoding="utf-8")
    cfg = CSLMConfig(vocab_size=2, order=4, embedding=16, hidden=[32, 16])
    results = {}
    for alpha in (0.0, 0.5):
        results[alpha] = train_cslm(
            str(corpus), tmp_path / f"m{alpha}.pt", model_config=cfg, shortlist=800, progress=False,
            train_config=CSLMTrainConfig(max_epochs=3, batch_size=64, epoch_size=6400, self_normalize=alpha))
    plain, normed = results[0.0].history[-1], results[0.5].history[-1]
    assert abs(plain.log_z_mean) > 1.0, plain
    assert abs(normed.log_z_mean) < 0.25 * abs(plain.log_z_mean), (plain, normed)
    def rms(v: Validation) -> float:
        return (v.log_z_mean**2 + v.log_z_std**2) ** 0.5

    assert rms(normed) < 0.25 * rms(plain), (plain, normed)
    assert normed.perplexity < 1.2 * plain.perplexity, (plain, normed)
    loaded = load_cslm(tmp_path / "m0.5.pt")
    assert loaded.train_config["self_normalize"] == 0.5
    # What a user sees: raw and exact sentence scores now nearly agree on held-out text.
    sents = [line.split() for line in _french_lines(1600)[1500:]]
    raw = sentence_log_probs(loaded.model, loaded.vocab, sents, normalize=False)
    exact = sentence_log_probs(loaded.model, loaded.vocab, sents)
    tokens = sum(len(s) + 1 for s in sents)
    assert abs(raw.sum() - exact.sum()) / tokens < 0.25 * abs(plain.log_z_mean)
