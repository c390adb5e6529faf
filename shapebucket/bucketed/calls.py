"""Reading one call of a wrapped model: which keys follow which length, and which shape
it is padded to.

A call's keyword tensors fall into one or two *sides*: the source (``input_ids``,
``attention_mask``, ...) and, for an encoder-decoder, the target (every
``decoder_*`` key, and ``labels`` when the model is an encoder-decoder). Each side
has one length: the size at dim 1 of its first key (``input_ids``,
``decoder_input_ids``, ``labels``, else the first tensor of the side); its
sequence keys are the tensors with the call's rows at dim 0 and that length at
dim 1. Everything else with the call's rows at dim 0 (``pixel_values``) is a
per-row value: padded along the rows only, never along a length.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = ["Call", "Side", "forward_of", "read_call", "takes"]

#: the key whose length is a side's length, in order of preference
_LEADS = ("input_ids", "inputs_embeds", "decoder_input_ids", "decoder_inputs_embeds", "labels")
#: the token-mask key the model takes on each side (added when the call has none)
MASK_KEYS = {"source": "attention_mask", "target": "decoder_attention_mask"}


def forward_of(model: Any) -> Any:
    """What a call of ``model`` runs: a module's ``forward``, else the function itself."""
    return getattr(model, "forward", model)


def takes(model: Any, name: str) -> bool:
    """Whether ``model.forward`` (or the function) names a parameter ``name``
    (``**kwargs`` does not count).

    >>> takes(torch.nn.Linear(2, 2), "input"), takes(lambda input_ids: input_ids, "input_ids")
    (True, True)
    """
    try:
        params = inspect.signature(forward_of(model)).parameters
    except (TypeError, ValueError):
        return False
    return name in params and params[name].kind is not inspect.Parameter.VAR_KEYWORD


def is_encoder_decoder(model: Any) -> bool:
    """A Hugging Face encoder-decoder (its config says so)."""
    return getattr(getattr(model, "config", None), "is_encoder_decoder", False) is True


@dataclass
class Side:
    """One length of a call: its keys, its length, and the bucket it is padded to."""

    name: str  # "source" or "target"
    keys: list[str]
    length: int
    bucket: int = 0


@dataclass
class Call:
    """What one call is padded from and to (and so what its outputs are cut back to)."""

    rows: int
    padded_rows: int
    sides: dict[str, Side] = field(default_factory=dict)
    left: bool = False
    planned: bool = True  # False: past the largest bucket, run eagerly at its own shape

    @property
    def pads(self) -> bool:
        """Whether anything is padded at all."""
        return self.rows != self.padded_rows or any(
            s.length != s.bucket for s in self.sides.values()
        )


def _side_of(key: str, enc_dec: bool) -> str:
    if key.startswith("decoder_") or (enc_dec and key == "labels"):
        return "target"
    return "source"


def _lead(keys: Sequence[str]) -> str:
    for name in _LEADS:
        if name in keys:
            return name
    return keys[0]


def read_call(
    kwargs: Mapping[str, Any], enc_dec: bool, sequence_keys: Sequence[str] | None
) -> tuple[int, dict[str, Side]]:
    """The call's rows and its sides (before bucketing).

    >>> rows, sides = read_call({"input_ids": torch.ones(2, 5), "pixel_values": torch.ones(2, 3, 8, 8)}, False, None)
    >>> rows, sides["source"].keys, sides["source"].length
    (2, ['input_ids'], 5)
    """
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.ndim >= 2}
    if sequence_keys is not None:
        missing = [k for k in sequence_keys if k in kwargs and k not in tensors]
        if missing:
            raise ShapeBucketError(
                f"sequence_keys names {missing}, but the call's value there is not a tensor of "
                "[rows, length, ...]; name only the keys padded along their length"
            )
        tensors = {k: v for k, v in tensors.items() if k in sequence_keys}
    if not tensors:
        raise ShapeBucketError(
            f"the call has no [rows, length] tensor to pad (keys {sorted(kwargs)}); pass the "
            "token ids by name (model(input_ids=...)), or name them with sequence_keys="
        )
    by_side: dict[str, list[str]] = {}
    for k in tensors:
        by_side.setdefault(_side_of(k, enc_dec), []).append(k)
    lead = tensors[_lead(by_side.get("source") or by_side["target"])]
    rows = int(lead.shape[0])
    sides = {}
    for name, keys in by_side.items():
        length = int(tensors[_lead(keys)].shape[1])
        picked = [k for k in keys if tensors[k].shape[0] == rows and tensors[k].shape[1] == length]
        if sequence_keys is not None and len(picked) != len(keys):
            odd = [k for k in keys if k not in picked]
            raise ShapeBucketError(
                f"sequence_keys {odd} have shapes {[tuple(tensors[k].shape) for k in odd]}, "
                f"not [{rows}, {length}, ...] like {_lead(keys)!r}: every key of a side must "
                "share its rows and its length"
            )
        sides[name] = Side(name, picked, length)
    _refuse_square_masks(kwargs, sides)
    return rows, sides


def _refuse_square_masks(kwargs: Mapping[str, Any], sides: dict[str, Side]) -> None:
    """A mask of more than 2 dims (``[rows, 1, L, L]``) has the length at dims the
    padding does not reach; it would reach the model with its old size."""
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and v.ndim > 2 and "mask" in k:
            side = _side_of(k, "target" in sides)
            raise ShapeBucketError(
                f"{k!r} has shape {tuple(v.shape)}: a mask of more than 2 dims cannot be padded "
                "to the bucket (its length is not only at dim 1); pass the 2-D [rows, length] "
                f"{MASK_KEYS[side]!r} and let the model build its own"
            )
