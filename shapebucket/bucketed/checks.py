"""What a :class:`~shapebucket.BucketedModel` refuses: its settings, and a call whose pads
would reach a loss, a statistic or a position, each with the cause and the fix."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import _torch as compat
from ..errors import ShapeBucketError
from ..fit.step_cost import StepCost
from .calls import Call, Route, Side, takes
from .packed import packs

__all__ = [
    "batch_norms",
    "check_call",
    "check_costs",
    "check_pad_values",
    "check_sequence_keys",
    "check_settings",
    "packing_of",
    "refuse_empty",
]

_BATCH_NORMS = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.SyncBatchNorm,
)


def check_settings(
    model: Any, overflow: Any, padding_side: Any, params: Mapping[str, inspect.Parameter]
) -> None:
    """Refuse a wrapper's settings that cannot work for ``model``."""
    name = type(compat.unwrap_compiled(model)).__name__
    if not callable(model):
        raise ShapeBucketError(
            f"BucketedModel wraps a model (a module or function), got {type(model).__name__}"
        )
    if overflow not in ("error", "eager", "dynamic"):
        raise ShapeBucketError(f"overflow must be 'error', 'eager' or 'dynamic', got {overflow!r}")
    if padding_side not in ("right", "left"):
        raise ShapeBucketError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if padding_side == "left" and not takes(params, "attention_mask"):
        raise ShapeBucketError(
            f"padding_side='left' and {name}.forward takes no attention_mask: its real "
            "tokens would attend to the pads before them and sit at shifted positions; pad "
            "right (exact for a causal model), or pass a model that takes the mask"
        )
    if padding_side == "left" and not takes(params, "position_ids"):
        raise ShapeBucketError(
            f"padding_side='left' and {name}.forward takes no position_ids: it numbers "
            "positions itself, so every real token would sit as many positions later as "
            "there are pads before it; pad right, or pass a model that takes position_ids"
        )


def check_sequence_keys(sequence_keys: Sequence[str] | None) -> list[str] | None:
    if sequence_keys is None:
        return None
    if (
        isinstance(sequence_keys, (str, bytes))
        or not isinstance(sequence_keys, Sequence)
        or not sequence_keys
        or not all(isinstance(k, str) for k in sequence_keys)
    ):
        one = f"[{sequence_keys!r}]" if isinstance(sequence_keys, str) else "['input_ids']"
        raise ShapeBucketError(
            f"sequence_keys must be a non-empty list of the call's keyword names, got "
            f"{sequence_keys!r}; for one key write {one}"
        )
    return list(sequence_keys)


def check_pad_values(pad_values: Any) -> dict[str, Any]:
    if pad_values is not None and not isinstance(pad_values, Mapping):
        raise ShapeBucketError(
            f"pad_values must be a mapping key -> number, got {pad_values!r}; for example "
            "pad_values={'input_ids': 0}"
        )
    return dict(pad_values or {})


@dataclass(frozen=True)
class Packing:
    """How a model takes packed calls: ``document_ids`` (the bench GPT), else positions
    only with labels it shifts itself (a Hugging Face decoder)."""

    document_ids: bool


def packing_of(
    model: Any, packing: Any, row_buckets: list[int] | None, params: Mapping[str, Any]
) -> Packing | None:
    """The packing of a wrapper's calls (``BucketedModel``'s ``packing=``), or ``None``."""
    if packing is not None and not isinstance(packing, bool):  # 0 == False would pack
        raise ShapeBucketError(f"packing must be None, True or False, got {packing!r}")
    if packing is False:
        return None
    can = packs(model)
    if packing is True and not can:
        raise ShapeBucketError(
            f"packing=True, but {type(model).__name__} does not take packed input: a packed "
            "row would let its samples attend to each other. Packed calls need a Hugging "
            "Face decoder that reads samples from position_ids (sdpa, eager or flex "
            "attention) or a forward that takes document_ids; leave packing=None to pad"
        )
    if packing is True and row_buckets is None:
        raise ShapeBucketError(
            "packing=True needs row_buckets=[...]: a call's samples pack into a varying "
            "number of rows, which the row buckets bound; pass row_buckets, e.g. [1, 4, 16]"
        )
    if not can or row_buckets is None:
        return None
    return Packing(document_ids="document_ids" in params)


def check_costs(costs: Any, overflow: str) -> tuple[StepCost, StepCost] | None:
    """``costs``, the measured ``(static, dynamic)`` step costs, checked."""
    if costs is None:
        return None
    if (
        not isinstance(costs, tuple)
        or len(costs) != 2
        or not all(isinstance(c, StepCost) for c in costs)
    ):
        raise ShapeBucketError(
            f"costs must be a pair (static, dynamic) of StepCost, got {costs!r}; measure "
            "each with StepCost.from_steps({(rows, length): seconds, ...})"
        )
    if overflow != "dynamic":
        raise ShapeBucketError(
            f"costs=(static, dynamic) decides which calls run on the dynamic graph, but "
            f"overflow={overflow!r} has none; pass overflow='dynamic'"
        )
    return costs


def batch_norms(model: Any) -> list[str]:
    """The names of ``model``'s batch-norm layers (their statistics would see the pads)."""
    modules = model.modules() if isinstance(model, torch.nn.Module) else ()
    return [type(m).__name__ for m in modules if isinstance(m, _BATCH_NORMS)]


def check_call(
    call: Call, route: Route, kwargs: Mapping[str, Any], norms: list[str], training: bool
) -> None:
    """Refuse a call whose pads would enter a loss or a statistic."""
    if call.left and "labels" in kwargs:
        raise ShapeBucketError(
            "BucketedModel(padding_side='left') got a call with labels: a left pad sits "
            "before each row's first token, and a model that shifts its labels (a Hugging "
            "Face causal LM) would predict that token's label from the pad, a loss term the "
            "unpadded call does not have; pad right for training (left is for inference)"
        )
    keep = kwargs.get("logits_to_keep", 0)
    if not call.left and (isinstance(keep, torch.Tensor) or keep not in (0, None)):
        raise ShapeBucketError(
            f"BucketedModel: logits_to_keep={_short(keep)} keeps the last positions of each "
            "row the model runs, and a right-padded or packed row ends in pads, not in the "
            "caller's last tokens: its logits would be a pad's; pass logits_to_keep=0 and "
            "take logits[:, -n:] of the caller's rows, or padding_side='left'"
        )
    if norms and call.pads and training:
        raise ShapeBucketError(
            f"BucketedModel: the model has {norms[0]} and is training, so padding "
            f"this call ({call.rows} rows, lengths {[s.length for s in call.sides.values()]}) "
            "to its bucket would put the pads into the batch statistics; train it without "
            "the wrapper, use LayerNorm, or pad in the collator with exact-size batches"
        )
    if route.row_labels and call.rows != call.padded_rows:
        labels = kwargs["labels"]
        raise ShapeBucketError(
            f"BucketedModel: 'labels' has shape {tuple(labels.shape)}, one label per row, "
            f"and the call's {call.rows} rows are padded to {call.padded_rows}: a padded "
            "row's label would enter a regression or multi-label loss (only token labels "
            "of -100 are provably ignored); pass row_buckets=None, or batches of a row "
            "bucket's size"
        )


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)


def refuse_empty(sides: dict[str, Side], what: str = "the call") -> None:
    keys = [s.keys[0] for s in sides.values()]
    raise ShapeBucketError(
        f"BucketedModel: {what} has 0 rows ({keys[0]!r}), so there is no planned shape to "
        "run it at (a shape of 0 rows would compile a graph of its own); skip empty batches, "
        "or pass row_buckets=[...] to pad them to the smallest row bucket"
    )
