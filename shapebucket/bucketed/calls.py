"""Reading the calls of a wrapped model: which keys follow which length, from their
names (the rule: ``docs/bucketed.md``, "What a call does", step 1), read once per kind
of call (its keys, dtypes and ranks), never from sizes that happen to match."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _torch as compat
from ..errors import ShapeBucketError

__all__ = ["Call", "Route", "Side", "bind", "forward_of", "parameters", "route_of", "wrapped"]

_SOURCE = (
    "input_ids",
    "inputs_embeds",
    "src",
    "attention_mask",
    "token_type_ids",
    "position_ids",
    "special_tokens_mask",
    "src_key_padding_mask",
    "memory",
    "memory_key_padding_mask",
)
_TARGET = (
    "decoder_input_ids",
    "decoder_inputs_embeds",
    "tgt",
    "decoder_attention_mask",
    "decoder_token_type_ids",
    "decoder_position_ids",
    "tgt_key_padding_mask",
)
#: keys whose length is their side's length, in order of preference
LEADS = ("input_ids", "inputs_embeds", "src", "decoder_input_ids", "decoder_inputs_embeds", "tgt")
#: the token-mask key the model takes on each side (added when the call has none)
MASK_KEYS = {"source": "attention_mask", "target": "decoder_attention_mask"}
#: torch's masks where True means a pad (``nn.Transformer``'s)
PAD_TRUE = ("src_key_padding_mask", "tgt_key_padding_mask", "memory_key_padding_mask")
#: the keys that hold token ids, padded with the model config's ``pad_token_id``
ID_KEYS = ("input_ids", "decoder_input_ids")


def wrapped(model: Any) -> Any:
    """The module a call of ``model`` reaches, seen through ``torch.compile`` and DDP."""
    inner = compat.unwrap_compiled(model)
    if isinstance(inner, torch.nn.parallel.DistributedDataParallel):
        inner = compat.unwrap_compiled(inner.module)
    return inner


def forward_of(model: Any) -> Any:
    """What a call of ``model`` runs: the :func:`wrapped` module's ``forward``, else the
    function itself."""
    inner = wrapped(model)
    return getattr(inner, "forward", inner)


def parameters(model: Any) -> Mapping[str, inspect.Parameter]:
    """The parameters of ``forward_of(model)`` (none when it has no signature)."""
    try:
        return inspect.signature(forward_of(model)).parameters
    except (TypeError, ValueError):
        return {}


def bind(
    params: Mapping[str, inspect.Parameter],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    model: Any,
) -> dict[str, Any]:
    """A call's positional ``args`` named by ``model``'s ``forward`` parameters
    (``params``), with its ``kwargs``; refused when they cannot be named.

    >>> bind(parameters(torch.nn.Linear(2, 2)), (torch.ones(1, 2),), {}, None).keys()
    dict_keys(['input'])
    """
    name = type(compat.unwrap_compiled(model)).__name__
    try:
        bound = inspect.Signature(list(params.values())).bind_partial(*args, **kwargs)
    except TypeError as e:
        raise ShapeBucketError(
            f"BucketedModel could not name the call's positional arguments by "
            f"{name}.forward's parameters ({e}); pass them by name"
        ) from None
    if any(
        p.kind is p.VAR_POSITIONAL
        for p in bound.signature.parameters.values()
        if p.name in bound.arguments
    ):
        raise ShapeBucketError(
            f"{name}.forward takes *args, so the call's positional values have no names "
            "to pad them by; pass them by keyword"
        )
    return dict(bound.arguments)


def takes(params: Mapping[str, inspect.Parameter], name: str) -> bool:
    """Whether a signature names ``name`` (``**kwargs`` does not count)."""
    return name in params and params[name].kind is not inspect.Parameter.VAR_KEYWORD


@dataclass
class Side:
    """One length of a call: its keys, its length, and the bucket it is padded to."""

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
    outputs: Any = None  # the output roles of its route (outputs.OutputRoles)
    packed: Any = None  # a packed call's placement.PackedCall (None: padded)

    @property
    def pads(self) -> bool:
        """Whether anything is padded at all."""
        return self.rows != self.padded_rows or any(
            s.length != s.bucket for s in self.sides.values()
        )


@dataclass
class Route:
    """How one kind of call (its keys, dtypes and ranks) is padded: read once, then used
    for every call of that kind. ``sides`` maps a side to its sequence keys, lead first;
    ``masks`` the token mask added on a side (the call has none, the model takes one)."""

    sides: dict[str, list[str]]
    row_keys: list[str]
    masks: dict[str, str]
    pad_values: dict[str, Any]
    positions: bool = False  # add position_ids (padding left)
    row_labels: bool = False  # labels per row: padded rows would enter the loss
    outputs: Any = None  # the learned output roles (outputs.OutputRoles)
    packer: Any = None  # a packed route's packed.Packer (None: its calls are padded)


def signature_of(kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """What decides a call's route: each key with its tensor's dtype, rank and device."""
    return tuple(
        (k, v.dtype, v.ndim, v.device) if isinstance(v, torch.Tensor) else (k, _hashable(v))
        for k, v in kwargs.items()
    )


def _hashable(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str, type(None))) else type(v)


def _side_of(key: str, enc_dec: bool) -> str | None:
    if key in _TARGET or (enc_dec and key == "labels"):
        return "target"
    if key in _SOURCE or key == "labels":
        return "source"
    return "target" if key.startswith("decoder_") else None


def route_of(
    kwargs: Mapping[str, Any],
    *,
    enc_dec: bool,
    sequence_keys: Sequence[str] | None,
    params: Mapping[str, inspect.Parameter],
    pad_values: Mapping[str, Any],
    left: bool,
    class_labels: bool = False,
) -> Route:
    """The route of a call like ``kwargs`` (the name rule). ``class_labels``: the
    model's loss over per-row integer labels ignores -100 (a Hugging Face single-label
    classifier), so such labels are padded along the rows with -100.

    >>> r = route_of({"input_ids": torch.ones(2, 5, dtype=torch.long), "pixel_values": torch.ones(2, 3)},
    ...              enc_dec=False, sequence_keys=None, params={}, pad_values={}, left=False)
    >>> r.sides, r.row_keys
    ({'source': ['input_ids']}, ['pixel_values'])
    """
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    sides = _sequence_sides(tensors, kwargs.keys(), enc_dec=enc_dec, sequence_keys=sequence_keys)
    padded = {k for keys in sides.values() for k in keys}
    masks = {
        s: MASK_KEYS[s] for s in sides if MASK_KEYS[s] not in kwargs and takes(params, MASK_KEYS[s])
    }
    values = {k: _pad_value(k, tensors[k], pad_values) for k in padded}
    values.update({m: 0 for m in masks.values()})
    positions = left and "source" in sides and "position_ids" not in kwargs
    labels = tensors.get("labels")
    row_labels = labels is not None and "labels" not in padded
    ignored = (
        labels is not None
        and row_labels
        and class_labels
        and labels.ndim == 1
        and not labels.is_floating_point()
    )
    if ignored:
        values["labels"] = -100  # padded rows' labels: ignored by the loss
    return Route(
        sides=sides,
        row_keys=[k for k in tensors if k not in padded and tensors[k].ndim >= 1],
        masks=masks,
        pad_values=values,
        positions=positions and takes(params, "position_ids"),
        row_labels=row_labels and not ignored,
    )


def _sequence_sides(
    tensors: Mapping[str, torch.Tensor],
    keys: Iterable[str],
    *,
    enc_dec: bool,
    sequence_keys: Sequence[str] | None,
) -> dict[str, list[str]]:
    """The call's sequence keys by side, lead first (the name rule); ``keys``: all its keys."""
    sides: dict[str, list[str]] = {}
    for k, v in tensors.items():
        side = _side_of(k, enc_dec)
        if sequence_keys is not None:
            named = k in sequence_keys
            side = (side or "source") if named else None
        elif k == "labels" and (v.ndim != 2 or v.is_floating_point()):  # not token labels
            side = None
        if side is None:
            continue
        if v.ndim < 2:
            raise ShapeBucketError(
                f"{k!r} has shape {tuple(v.shape)}, but it is a sequence key (padded along "
                "dim 1 of [rows, length, ...]); pass it as [rows, length], or leave it out "
                "of sequence_keys"
            )
        sides.setdefault(side, []).append(k)
    if sequence_keys is not None:
        _refuse_left_out(tensors, sides, sequence_keys, enc_dec)
    if not sides:
        raise ShapeBucketError(
            f"the call has no sequence key to pad (keys {sorted(keys)}); pass the token ids "
            "by name (model(input_ids=...)), or name the keys padded along their length with "
            "sequence_keys=[...]"
        )
    for side_keys in sides.values():
        side_keys.sort(key=lambda k: LEADS.index(k) if k in LEADS else len(LEADS))
    _refuse_square_masks(tensors, sides)
    return sides


def _refuse_left_out(
    tensors: Mapping[str, torch.Tensor],
    sides: dict[str, list[str]],
    sequence_keys: Sequence[str],
    enc_dec: bool,
) -> None:
    """Refuse a key the rule names a sequence key but ``sequence_keys`` leaves out."""
    padded = [k for keys in sides.values() for k in keys]
    for k in tensors:
        if padded and k not in padded and k != "labels" and _side_of(k, enc_dec) is not None:
            raise ShapeBucketError(
                f"{k!r} is a sequence key by name but not in sequence_keys={list(sequence_keys)}"
                f": it would reach the model at the call's length {tuple(tensors[k].shape)} "
                f"beside {padded[0]!r} padded to a bucket; add {k!r} to sequence_keys, or "
                "leave it out of the call"
            )


def _pad_value(key: str, v: torch.Tensor, pad_values: Mapping[str, Any]) -> Any:
    """A key's pad value (the user's, else by its name), refused when its dtype cannot hold it."""
    if key in pad_values:
        value = pad_values[key]
    elif key.startswith("labels") or key.endswith("labels"):
        value = -100
    elif key in PAD_TRUE:
        value = True
    else:
        value = 0
    if isinstance(value, bool) or v.dtype == torch.bool:
        return bool(value)
    try:
        fits = torch.tensor(value, dtype=v.dtype).item() == value
    except (TypeError, RuntimeError, OverflowError):
        fits = False
    if not fits:
        raise ShapeBucketError(
            f"pad value {value!r} for {key!r} does not fit the call's dtype "
            f"{str(v.dtype).removeprefix('torch.')}: it would be stored as another number; "
            f"pass pad_values={{{key!r}: ...}} with a value the dtype holds, or cast the input"
        )
    return value


def _refuse_square_masks(tensors: Mapping[str, torch.Tensor], sides: dict[str, list[str]]) -> None:
    """Refuse a mask of more than 2 dims (``[rows, 1, L, L]``): padding reaches dim 1 only."""
    for side, keys in sides.items():
        for k in keys:
            if tensors[k].ndim > 2 and "mask" in k:
                raise ShapeBucketError(
                    f"{k!r} has shape {tuple(tensors[k].shape)}: a mask of more than 2 dims "
                    "cannot be padded to the bucket (its length is not only at dim 1); pass "
                    f"the 2-D [rows, length] {MASK_KEYS[side]!r} and let the model build its own"
                )


def read_call(kwargs: Mapping[str, Any], route: Route) -> tuple[int, dict[str, Side]]:
    """The call's rows and its sides (before bucketing), checked against its route: every
    sequence key of a side has the side's rows (or 1, broadcast) and length.

    >>> route = Route({"source": ["input_ids"]}, [], {}, {})
    >>> rows, sides = read_call({"input_ids": torch.ones(2, 5)}, route)
    >>> rows, sides["source"].length
    (2, 5)
    """
    first = next(iter(route.sides.values()))[0]
    rows = int(kwargs[first].shape[0])
    sides = {}
    for name, keys in route.sides.items():
        lead = kwargs[keys[0]]
        length = int(lead.shape[1])
        for k in keys[1:]:
            v = kwargs[k]
            if v.shape[1] != length or v.shape[0] not in (rows, 1):
                raise ShapeBucketError(
                    f"{k!r} has shape {tuple(v.shape)}, not [{rows}, {length}, ...] like "
                    f"{keys[0]!r} {tuple(lead.shape)}: every sequence key of a side shares its "
                    "rows and its length; fix the call, or name the keys padded along the "
                    "length with sequence_keys=[...]"
                )
        sides[name] = Side(keys, length)
    return rows, sides
