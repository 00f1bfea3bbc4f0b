"""Perplexity of a CSLM next to a KenLM model on the same tokenized text, counting the same tokens.

Usage: python -m benchmarks.cslm_perplexity CSLM_MODEL KENLM_MODEL TEXT [TEXT ...]

Needs the ``kenlm`` Python module (``pip install kenlm``; not a dependency of the project). Each
line is split the Moses way; every word and the sentence end ``</s>`` is one predicted token on
both sides (KenLM's ``full_scores`` with bos and eos). Two figures per file:

* all tokens: the CSLM gives an out-of-shortlist word the probability of its ``[UNK]`` class (all
  such words together), KenLM gives a word outside its vocabulary its ``<unk>`` probability;
* in-vocabulary tokens: only the tokens that are in the CSLM's shortlist *and* known to KenLM
  (``</s>`` included), where both models give the probability of that very word. Histories are
  left as they are (an unknown history word is ``[UNK]`` / ``<unk>``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

from cslm.model_file import load_cslm
from cslm.scoring import encode_sentences, gather_histories, sentence_positions, token_scores
from moses_integration.tokens import split_tokens


def cslm_token_log_probs(path: str, sentences: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Natural-log probability of every token (words + ``</s>``) and whether it is in the shortlist."""
    loaded = load_cslm(path)
    cfg = loaded.model.config
    ids, lengths = encode_sentences(loaded.vocab, sentences)
    positions = sentence_positions(lengths, cfg.context)
    hist = gather_histories(ids, positions, np.arange(len(ids)), cfg.context, cfg.bos_id)
    lp = token_scores(loaded.model, torch.from_numpy(hist), torch.from_numpy(ids)).log_probs()
    in_shortlist = np.ones(len(ids), dtype=bool)  # </s> is always predicted as itself
    at = 0
    for s in sentences:
        in_shortlist[at : at + len(s)] = [loaded.vocab.is_known(w) for w in s]
        at += len(s) + 1
    return lp.double().numpy(), in_shortlist


def kenlm_token_log_probs(path: str, sentences: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    try:
        import kenlm
    except ImportError:
        sys.exit("this measurement needs the kenlm module: pip install kenlm")
    model = kenlm.Model(path)
    lps, oov = [], []
    for s in sentences:
        for log10p, _, is_oov in model.full_scores(" ".join(s), bos=True, eos=True):
            lps.append(log10p * math.log(10))
            oov.append(is_oov)
    return np.array(lps), np.array(oov, dtype=bool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cslm")
    parser.add_argument("kenlm")
    parser.add_argument("texts", nargs="+")
    args = parser.parse_args()
    for text in args.texts:
        sentences = [split_tokens(line) for line in Path(text).read_text(encoding="utf-8").splitlines()]
        c_lp, in_sl = cslm_token_log_probs(args.cslm, sentences)
        k_lp, oov = kenlm_token_log_probs(args.kenlm, sentences)
        if len(c_lp) != len(k_lp):
            sys.exit(f"{text}: {len(c_lp)} CSLM tokens but {len(k_lp)} KenLM tokens")
        both = in_sl & ~oov
        n = len(c_lp)
        print(f"{text}: {len(sentences)} sentences, {n} tokens (</s> included); "
              f"out of the CSLM shortlist {int((~in_sl).sum())} ({(~in_sl).mean():.1%}), "
              f"KenLM OOV {int(oov.sum())} ({oov.mean():.1%})")
        print(f"  all tokens:            CSLM {math.exp(-c_lp.mean()):8.2f}   KenLM {math.exp(-k_lp.mean()):8.2f}")
        print(f"  in both vocabularies:  CSLM {math.exp(-c_lp[both].mean()):8.2f}   "
              f"KenLM {math.exp(-k_lp[both].mean()):8.2f}   ({int(both.sum())} tokens)")


if __name__ == "__main__":
    main()
