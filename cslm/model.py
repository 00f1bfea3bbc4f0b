"""Schwenk's continuous-space language model (CSLM): the network and its sizes (SPEC §5).

The paper's configuration is a 7-gram model: the 6 previous words are each embedded in 512
dimensions and concatenated (3,072 inputs), followed by ReLU layers of 1,536 and 1,024 units and a
softmax over the target shortlist (15,000 words with ``[UNK]``, plus ``</s>``). The start of a
sentence is padded with ``<s>``, an input-only symbol: it is never predicted, so it has an input
embedding but no output unit. Weights start from U(−0.01, 0.01).

A sentence's score is the natural-log probability of its words and ``</s>``, each given its 6
predecessors. Words outside the shortlist are ``[UNK]`` on both sides: as history they use the
``[UNK]`` embedding, and as a predicted word they get the probability of the ``[UNK]`` class (all
out-of-shortlist words together), which is what the paper's model computes too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from infrastructure.errors import UserError
from neural.config import DictConfig, check_positive_int
from neural.layers import embedding_layer


class CSLMError(UserError):
    """A file that is not a usable CSLM model, or input the model cannot score."""


@dataclass
class CSLMConfig(DictConfig):
    """Sizes of the CSLM; the defaults are the paper's (SPEC §5).

    ``vocab_size`` counts output ids: the shortlist words, ``[UNK]`` and ``</s>`` (15,001 for a
    15,000-word shortlist). The input side has one more id, ``<s>`` (= ``vocab_size``).
    ``order`` is n: the model sees ``order - 1`` previous words.
    """

    vocab_size: int
    order: int = 7
    embedding: int = 512
    hidden: list[int] = field(default_factory=lambda: [1536, 1024])
    init_range: float = 0.01

    def __post_init__(self) -> None:
        check_positive_int("CSLMConfig", "vocab_size", self.vocab_size, minimum=2)
        check_positive_int("CSLMConfig", "order", self.order, minimum=2)
        check_positive_int("CSLMConfig", "embedding", self.embedding)
        self.hidden = list(self.hidden)
        for i, units in enumerate(self.hidden):
            check_positive_int("CSLMConfig", f"hidden[{i}]", units)
        if not (isinstance(self.init_range, (int, float)) and 0 < float(self.init_range) < 1):
            raise ValueError(f"CSLMConfig.init_range must be in (0, 1), got {self.init_range!r}")
        self.init_range = float(self.init_range)

    @property
    def context(self) -> int:
        return self.order - 1

    @property
    def bos_id(self) -> int:
        """The input-only ``<s>`` id that pads histories at the start of a sentence."""
        return self.vocab_size



class CSLM(nn.Module):
    """Embeddings of the ``order − 1`` previous words → ReLU layers → softmax over the shortlist."""

    def __init__(self, config: CSLMConfig, device: torch.device | str | None = None) -> None:
        """``device="meta"``: layers without memory or initialisation, for a model file's weights
        (passed to each layer: ``with torch.device(...)`` would import torch._dynamo, seconds of start-up)."""
        super().__init__()
        self.config = config
        self.embed = embedding_layer(config.vocab_size + 1, config.embedding, device)
        layers: list[nn.Module] = []
        width = config.context * config.embedding
        for units in config.hidden:
            layers += [nn.Linear(width, units, device=device), nn.ReLU()]
            width = units
        self.hidden_layers = nn.Sequential(*layers)
        self.output = nn.Linear(width, config.vocab_size, device=device)
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        r = self.config.init_range
        for p in self.parameters():
            p.uniform_(-r, r)

    def hidden(self, histories: torch.Tensor) -> torch.Tensor:
        """``[N, order−1]`` input ids → ``[N, H]`` last hidden layer."""
        return self.hidden_layers(self.embed(histories).flatten(1))

    def forward(self, histories: torch.Tensor) -> torch.Tensor:
        """Unnormalised scores ``[N, V]`` of every output word after each history."""
        return self.output(self.hidden(histories))

    def log_probs(self, histories: torch.Tensor) -> torch.Tensor:
        """Normalised log-probabilities ``[N, V]`` (fp32)."""
        return torch.log_softmax(self(histories).float(), dim=-1)
