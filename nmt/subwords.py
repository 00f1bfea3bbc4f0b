"""Subword units: one sentencepiece model per side, trained on the training text, kept in the model file.

Why subwords: a Moses hypothesis may hold any word the phrase table has, and the score of a word the
model cannot spell would be meaningless; with sentencepiece's byte fallback every string has pieces,
so no word of a hypothesis is unknown. The input is Moses-tokenised text; sentencepiece reads the
spaces between tokens as word starts, and decoding gives back the tokenised text.

The reserved ids are the model's (:mod:`nmt.model`): PAD 0, UNK 1, BOS 2, EOS 3. The trained model's
serialised proto is what the model file stores (as a uint8 tensor, so that it loads with
``weights_only``).
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import sentencepiece as spm
import torch

from nmt.model import BOS_ID, EOS_ID, PAD_ID, UNK_ID, NMTError

#: Pieces sentencepiece may learn from at most this many sentences (its own default is 1M; a
#: random sample of them when the text is longer).
MAX_TRAINING_SENTENCES = 1_000_000


class Subwords:
    """A trained sentencepiece model: text ↔ ids."""

    def __init__(self, proto: bytes) -> None:
        self.proto = proto
        self.processor = spm.SentencePieceProcessor()
        try:
            self.processor.LoadFromSerializedProto(proto)
        except Exception as exc:  # sentencepiece raises RuntimeError or OSError on a bad proto
            raise NMTError(f"damaged sentencepiece model ({exc})") from exc
        specials = (self.processor.pad_id(), self.processor.unk_id(), self.processor.bos_id(), self.processor.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise NMTError(f"sentencepiece model with special ids {specials}, not {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}")

    def __len__(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, lines: list[str]) -> list[list[int]]:
        return self.processor.encode(lines, out_type=int)

    def decode(self, ids: list[list[int]] | list[tuple[int, ...]]) -> list[str]:
        """Tokenised text, single-spaced: a hypothesis cut at the length limit may end in a lone word
        boundary (a trailing blank), which Moses' formats and BLEU would read as an empty token."""
        return [" ".join(self.processor.decode(list(i)).split()) for i in ids]

    def to_tensor(self) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.proto), dtype=torch.uint8)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> Subwords:
        return cls(bytes(tensor.numpy().tobytes()))


def train_subwords(lines: Iterable[str], vocab_size: int, *, seed: int = 1234, byte_fallback: bool = True,
                   name: str = "this text") -> Subwords:
    """A unigram sentencepiece model of at most ``vocab_size`` pieces trained on ``lines``.

    The size is a limit, not a demand (``hard_vocab_limit`` off): a small text gets the pieces it has.
    With ``byte_fallback`` any character outside the pieces is spelled in bytes (256 pieces of the
    vocabulary), so nothing is unknown. ``name`` (the file) is what a too small ``vocab_size`` names.
    """
    lines = list(lines)
    needed = len(set("".join(lines)) - {" "}) + 1 + 4 + (256 if byte_fallback else 0)  # + "▁", specials, bytes
    if vocab_size < needed:
        raise NMTError(f"--vocab-size {vocab_size} is too small for {name}: its {needed - 261} characters, "
                       f"4 special units and 256 bytes need at least {needed}")
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, byte_fallback=byte_fallback, hard_vocab_limit=False,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        input_sentence_size=MAX_TRAINING_SENTENCES, shuffle_input_sentence=True,
        max_sentence_length=1 << 16, minloglevel=2, num_threads=1,
    )
    return Subwords(model.getvalue())
