"""The CSLM as an NPLM model file, for Moses' in-decoder ``NeuralLM`` feature.

NPLM's network is the CSLM's exactly (SPEC §5): the ``order − 1`` history words embedded and
concatenated, one or two rectifier layers, a linear output layer. What differs is bookkeeping:

* **One vocabulary.** NeuralLM reads a single word list for input and output. The CSLM's output
  ids (``</s>``, ``[UNK]``, the shortlist) keep their ids, ``[UNK]`` renamed ``<unk>`` (the word
  NeuralLM maps unknown words to); the input-only ``<s>`` keeps its id ``V``, and ``<null>``
  (NPLM's padding for a history cut short away from the sentence start) is ``V + 1``.
* **Rows the CSLM does not have** get what NPLM's own tools give them: ``<null>``'s input
  embedding is zero (NPLM zeroes it when it trains with input dropout), and the output rows of
  ``<s>`` and ``<null>``, which are never predicted, are zero with bias ``LOG_FLOOR`` so that even
  a normalising reader gives them no probability mass.
* **No normaliser.** NeuralLM adds the raw output score. The file is exact; whether that score is
  a log-probability depends on training (``cslm train --self-normalize``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from cslm.model import CSLM
from cslm.model_file import CSLMFile
from moses_integration.nplm import BOS, NULL, UNK, NPLMConfig, NPLMError, NPLMModel
from moses_integration.phrase_table import LOG_FLOOR
from neural.vocab import Vocab


def nplm_vocabulary(vocab: Vocab) -> list[str]:
    """The NPLM word list: the CSLM's output ids in order (``[UNK]`` as ``<unk>``), then ``<s>``, ``<null>``."""
    words = list(vocab.words)
    words[vocab.unk_id] = UNK
    return [*words, BOS, NULL]


def cslm_to_nplm(model: CSLM, vocab: Vocab) -> NPLMModel:
    """The NPLM model that computes the CSLM's output scores (unnormalised), in float32."""
    cfg = model.config
    if len(cfg.hidden) not in (1, 2):
        raise NPLMError("<model>", None, f"NPLM has one or two hidden layers; this CSLM has {len(cfg.hidden)}")
    words = nplm_vocabulary(vocab)
    n_words = len(words)

    def array(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().cpu().numpy()

    embeddings = np.zeros((n_words, cfg.embedding), dtype=np.float32)
    embeddings[: cfg.vocab_size + 1] = array(model.embed.weight)  # output ids and <s>
    linear = [m for m in model.hidden_layers if isinstance(m, nn.Linear)]
    out_dim = cfg.hidden[-1]
    output_weights = np.zeros((n_words, out_dim), dtype=np.float32)
    output_weights[: cfg.vocab_size] = array(model.output.weight)
    output_biases = np.full(n_words, LOG_FLOOR, dtype=np.float32)
    output_biases[: cfg.vocab_size] = array(model.output.bias)
    two_layers = len(linear) == 2
    config = NPLMConfig(
        ngram_size=cfg.order,
        input_vocab_size=n_words,
        output_vocab_size=n_words,
        input_embedding_dimension=cfg.embedding,
        num_hidden=cfg.hidden[0] if two_layers else 0,
        output_embedding_dimension=out_dim,
        activation_function="rectifier",
    )
    matrices = {
        "input_embeddings": embeddings,
        "hidden_weights 1": array(linear[0].weight),
        "hidden_biases 1": array(linear[0].bias),
        "hidden_weights 2": array(linear[1].weight) if two_layers else np.zeros((1, 1), np.float32),
        "hidden_biases 2": array(linear[1].bias) if two_layers else np.zeros(1, np.float32),
        "output_weights": output_weights,
        "output_biases": output_biases,
    }
    return NPLMModel(config, words, matrices)


def self_normalization(loaded: CSLMFile) -> float:
    """The ``--self-normalize`` α the model was trained with (0 for files from before it existed)."""
    return float((loaded.train_config or {}).get("self_normalize", 0.0))


#: How far from 0 the mean log Z of a model's validation may be before ``export-nplm`` warns: one nat
#: per word is a factor e between the raw score NeuralLM adds and the probability.
LOG_Z_TOLERANCE = 1.0


def validation_log_z(loaded: CSLMFile) -> float | None:
    """The mean log Z of the model's last validation, as its training printed it (None where the file
    records none: no training state, or a file from before log Z was recorded).

    ``MODEL`` is saved right after the validation that found it best, so its history's last entry is
    that model's; ``MODEL.last``'s is the latest validation.
    """
    history = (loaded.train_state or {}).get("history") or []
    mean = history[-1].get("log_z_mean") if history else None
    return None if mean is None else float(mean)

