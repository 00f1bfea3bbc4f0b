"""Configuration records both networks share: strict dict round trips and option choices.

A config is stored in a model file as a plain dict (so the file loads with
``torch.load(weights_only=True)``); ``from_dict`` is strict, because an unknown key almost
always means a file of another version or a typo, and ignoring it would build another model.
The option choices are here, torch-free, for the command lines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

# --precision choices (neural.device gives their meaning): here, torch-free, for the CLI.
PRECISIONS = ("auto", "fp32", "tf32", "bf16", "fp16")
#: ``auto`` trains in bf16 on a CPU whose bf16 matmuls, at the model's width, run at least this many
#: times as fast as its fp32 ones: below that, the parts of an update that stay fp32 (states, gates,
#: the softmax, the optimiser) and the casts eat the gain. Measured (docs/training-speed.md): on a
#: Zen 5 EPYC with AVX512-BF16, 3.6–4.3× at widths 256–1000 gave whole updates 1.16–2.0× fp32's (the
#: RNN at d = 256 and paper size, the CSLM, the NMT model); on a Xeon with AVX512-BF16 and no AMX,
#: 0.55× gave 0.64–0.84×.
CPU_BF16_PAYS_AT = 3.0
#: What ``--precision auto`` means for a training (neural.device.training_precision).
TRAINING_PRECISION_HELP = (f"auto: bf16 autocast on a GPU; on a CPU, bf16 where its bf16 matmuls measure "
                           f"{CPU_BF16_PAYS_AT:g}x its fp32 ones at the model's width, else fp32 (the choice and why "
                           "are printed and recorded)")


# --train-step choices (rescorer.training.step gives their meaning), torch-free for the CLI too.
TRAIN_STEPS = ("auto", "eager", "static", "captured")
#: The command lines' limit on a layer's or an embedding's size, for every model: 8 times the phrase RNN
#: paper's d = 1000 (a GRU of d = 8192 holds ~0.5 G weights, 2 GB in fp32, and trains for weeks on a CPU);
#: ``--hidden 1000000`` asked torch for terabytes and failed in a 50-frame allocation traceback.
MAX_LAYER_SIZE = 8192

#: The widest beam: 25 times propose's 40 with a reverse model. A beam weighs beam x shortlist candidates
#: at each step (15M at 1000 with the paper's shortlist); ``--beam 1000000000000`` asked torch for
#: petabytes and failed in an allocation traceback.
MAX_BEAM = 1000

#: Seconds between saves of ``MODEL.last`` in between validations (every training's ``checkpoint_every``):
#: a run killed outright (no signal handler sees SIGKILL, the end of a session, a power cut) loses at most
#: this much training, for a save that takes seconds.
CHECKPOINT_EVERY = 600.0


_C = TypeVar("_C")


def _strict_from_dict(cls: type[_C], data: Mapping[str, Any]) -> _C:
    """Build dataclass ``cls`` from ``data``, naming unknown and missing keys in the error."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__}.from_dict expects a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown {cls.__name__} key(s): {', '.join(map(str, unknown))} "
            f"(known keys: {', '.join(fields)})"
        )
    missing = [
        name
        for name, f in fields.items()
        if name not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"missing {cls.__name__} key(s): {', '.join(missing)}")
    return cls(**dict(data))


class DictConfig:
    """The one config round-trip of the project: ``to_dict`` and a strict ``from_dict``.

    Mixed into every dataclass config (the RNN's and the CSLM's), so that all of them are stored in
    model files and read back the same way.
    """

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of builtins (safe for ``torch.load(weights_only=True)`` and JSON)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_C], data: Mapping[str, Any]) -> _C:
        """Inverse of :meth:`to_dict`; unknown or missing keys raise ``ValueError``."""
        return _strict_from_dict(cls, data)


def check_positive_int(owner: str, name: str, value: object, minimum: int = 1) -> None:
    """Reject floats/bools/small values early: a bad size otherwise fails deep inside torch."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an integer >= {minimum}, got {value!r}")
