"""The CSLM inside the real Moses decoder: what Moses' NeuralLM adds is what ``cslm score --raw`` says.

Needs a Moses built with NPLM (``--with-nplm``, and NPLM with the hidden-layer fix that
docs/moses-nplm.md describes): ``MOSES_BIN_DIR``. Both cases are needed to catch NPLM's unfixed
``skip_hidden``, which is read from uninitialised memory and so breaks one shape or the other
depending on the heap: when it is false, the one-layer model (``num_hidden 0``, the shape that is
cheap inside the decoder and that SCALE=small and medium train) goes through NPLM's 1x1
placeholder second layer (``CSLM0=`` values of the order of 1e37); when it is true, the two-layer
model skips its second layer (scores off by up to 4.35 nats here, or a crash). Either case alone
passes on a broken build whose heap happens to favour it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from cslm.export import cslm_to_nplm
from cslm.model import CSLM, CSLMConfig
from cslm.scoring import sentence_log_probs
from moses_integration.decoder import decode
from moses_integration.moses_ini import MosesIni
from moses_integration.nbest import read_nbest
from moses_integration.nplm import write_nplm
from moses_integration.tokens import split_tokens
from neural.vocab import Vocab
from shared_paths import has_neural_lm, moses_bin_dir, shared_file

FIXTURE = "fixtures/hansard-enfr"


@pytest.mark.moses
@pytest.mark.slow
@pytest.mark.parametrize("hidden", [[48, 24], [48]], ids=["two-layers", "one-layer"])
def test_moses_neural_lm_adds_the_cslm_raw_sentence_score(tmp_path: Path, hidden: list[int]) -> None:
    bin_dir = moses_bin_dir()
    if not has_neural_lm(bin_dir):
        pytest.skip(f"{bin_dir}/moses was built without NPLM (no NeuralLM feature)")
    system = shared_file(f"{FIXTURE}/filtered/moses.ini").parent
    refs = shared_file(f"{FIXTURE}/data/dev.tok.tc.fr").read_text(encoding="utf-8").splitlines()
    counts: dict[str, int] = {}
    for line in refs:
        for word in split_tokens(line):
            counts[word] = counts.get(word, 0) + 1
    vocab = Vocab.from_counts(counts, shortlist=1500)  # many hypothesis words stay outside: <unk>
    torch.manual_seed(0)
    model = CSLM(CSLMConfig(vocab_size=len(vocab), order=7, embedding=16, hidden=hidden, init_range=0.3)).eval()
    nplm_path = tmp_path / "cslm.nplm"
    write_nplm(nplm_path, cslm_to_nplm(model, vocab))

    ini = MosesIni.read(system / "moses.ini")
    ini.absolutize_paths(system)
    ini.add_feature(f"NeuralLM factor=0 name=CSLM0 order=7 path={nplm_path}", [0.2])
    ini.write(tmp_path / "moses.ini")
    source = tmp_path / "dev.en"
    source.write_text("".join(shared_file(f"{FIXTURE}/data/dev.tok.tc.en").read_text(
        encoding="utf-8").splitlines(keepends=True)[:8]), encoding="utf-8")
    decode(bin_dir, tmp_path / "moses.ini", source, tmp_path / "dev.1best", nbest_path=tmp_path / "dev.nbest",
           nbest_size=20, threads=min(2, os.cpu_count() or 1))

    entries = list(read_nbest(tmp_path / "dev.nbest"))
    assert {e.sent_id for e in entries} == set(range(8))
    moses_values = np.array([dict(e.features)["CSLM0"][0] for e in entries])
    ours = sentence_log_probs(model, vocab, [split_tokens(e.hypothesis) for e in entries], normalize=False)
    # Moses prints 6 significant digits; NPLM sums float32 scores.
    np.testing.assert_allclose(moses_values, ours, atol=1e-3, rtol=5e-6)
    assert np.ptp(ours) > 1.0  # the hypotheses really differ in score: the check has teeth
