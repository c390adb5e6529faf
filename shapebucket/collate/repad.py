"""Re-padding a collator's batch to another :class:`~shapebucket.plan.Shape` (the batches
:func:`shapebucket.prewarm` compiles for): one :func:`repad_batch` for every collator, a
:class:`Rule` per key saying how; the engine pads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._memory import check_fits_in_memory
from ..errors import ShapeBucketError
from ..plan.contract import batch_items
from ..plan.shapes import Shape
from .engine import Key, pad_rows, regrid, regrid_boundaries
from .values import check_pad_fits

__all__ = ["Items", "Rule", "repad_batch"]

Items = list[tuple[Key, Any]]


@dataclass(frozen=True)
class Rule:
    """How one value of a batch is re-padded: ``"sequence"`` along ``dim`` to the shape's
    ``lengths[axis]`` and to its rows (:func:`~.engine.regrid`), ``"row"`` a per-row tensor
    or list to the rows (:func:`~.engine.pad_rows`), ``"boundaries"`` packed varlen
    boundaries moved to the new grid (:func:`~.engine.regrid_boundaries`), ``"keep"`` as is.

    >>> Rule("sequence", pad=-100), Rule("row", pad=False).kind
    (Rule(kind='sequence', pad=-100, dim=1, axis=0), 'row')
    """

    kind: str  # "sequence", "row", "boundaries" or "keep"
    pad: Any = 0
    dim: int = 1  # "sequence": the dim of the padded length
    axis: int = 0  # "sequence": which of the shape's lengths (0; 1 for a cell's target)


def repad_batch(batch: Any, shape: Shape, rules: Mapping[Key, Rule], *, left: bool = False) -> Any:
    """``batch`` cut or padded to ``shape`` by ``rules`` (one per key of the batch), in the
    batch's own container; every tensor comes back contiguous, as a collated one.

    >>> batch = {"input_ids": torch.tensor([[1, 2], [3, 0]]), "n": torch.tensor([2, 1])}
    >>> rules = {"input_ids": Rule("sequence"), "n": Rule("row")}
    >>> out = repad_batch(batch, Shape(3, 4), rules)
    >>> out["input_ids"].tolist(), out["n"].tolist()
    ([[1, 2, 0, 0], [3, 0, 0, 0], [0, 0, 0, 0]], [2, 1, 0])
    """
    items = batch_items(batch)
    grid = _grid(items, rules, shape)
    for k, v in items:  # a pad that does not fit would wrap (-100 in uint8 is 156) or raise
        if rules[k].kind in ("sequence", "row") and isinstance(v, torch.Tensor):
            check_pad_fits(k, rules[k].pad, v.dtype)
    check_fits_in_memory(shape.rows, max(shape.lengths), len(items), list(shape.lengths))
    out: Items = []
    for k, v in items:
        rule = rules[k]
        if rule.kind == "sequence":
            length = shape.lengths[rule.axis]
            out.append((k, regrid(v, rule.dim, shape.rows, length, rule.pad, left=left)))
        elif rule.kind == "row":
            out.append((k, pad_rows(v, shape.rows, rule.pad)))
        elif rule.kind == "boundaries":
            out.append((k, regrid_boundaries(v, grid, shape.rows, shape.length)))
        else:
            out.append((k, v))
    if isinstance(batch, Mapping):
        return dict(out)
    if isinstance(batch, torch.Tensor):
        return out[0][1]
    return type(batch)(v for _, v in out)


def _grid(items: Items, rules: Mapping[Key, Rule], shape: Shape) -> tuple[int, int]:
    """The batch's rows and first length, checked: sequence values agree in rows and, per
    axis, in length; each axis is one of the shape's."""
    seq = [(k, v, rules[k]) for k, v in items if rules[k].kind == "sequence"]
    if not seq:
        raise ShapeBucketError(
            f"repad found no sequence tensor in the batch (keys {[k for k, _ in items]}); "
            "pass a batch this collator made"
        )
    first: dict[int, tuple[Key, torch.Tensor, int]] = {}
    _, v0, _ = seq[0]
    for k, v, rule in seq:
        if rule.axis >= len(shape.lengths):
            raise ShapeBucketError(
                f"repad: {k!r} is padded on axis {rule.axis}, but shape {tuple(shape)} has "
                f"{len(shape.lengths)} length(s)"
            )
        ka, va, da = first.setdefault(rule.axis, (k, v, rule.dim))
        if v.shape[0] != v0.shape[0] or v.shape[rule.dim] != va.shape[da]:
            raise ShapeBucketError(
                f"repad: {k!r} has shape {tuple(v.shape)}, but {ka!r} has {tuple(va.shape)}: "
                f"sequence values must agree in rows and in length (dim {rule.dim}); "
                "name the keys to pad with sequence_keys"
            )
    return int(v0.shape[0]), int(first[0][1].shape[first[0][2]]) if 0 in first else 0
