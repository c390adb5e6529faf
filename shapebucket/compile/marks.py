"""Marking a batch's length dims dynamic (``mark_dynamic``)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .. import _torch as compat
from .._validate import check_int
from ..errors import ShapeBucketError
from ..plan.contract import walk_batch

__all__ = ["mark_dynamic"]

_warned_keys: set[str] = set()


def _check_mark_args(
    sequence_keys: Sequence[str] | None, min: int | None, max: int | None, strict: bool
) -> None:
    if sequence_keys is not None and (
        isinstance(sequence_keys, (str, bytes)) or not isinstance(sequence_keys, Sequence)
    ):
        raise ShapeBucketError(
            f"sequence_keys must be a list of keys, got {sequence_keys!r}; "
            f"for one key write sequence_keys=[{sequence_keys!r}]"
        )
    if (min is not None or max is not None) and not strict:
        raise ShapeBucketError(
            f"min={min}, max={max} need strict=True: maybe_mark_dynamic (strict=False) takes no range"
        )
    if min is not None and min < 2:
        raise ShapeBucketError(
            f"min must be >= 2, got {min}: the compiler always specialises sizes 0 and 1, so they are "
            "never part of a dynamic range; use min=2"
        )
    if min is not None and max is not None and max < min:
        raise ShapeBucketError(f"max ({max}) must be >= min ({min})")


def mark_dynamic(
    batch: Any,
    dim: int = 1,
    *,
    sequence_keys: Sequence[str] | None = None,
    min: int | None = None,
    max: int | None = None,
    strict: bool = False,
) -> list[str]:
    """Mark dim ``dim`` of every tensor in a (nested) batch as dynamic; returns the marked paths.

    Non-tensors and tensors with no dim ``dim`` are skipped; ``sequence_keys``
    limits the marking to those top-level keys (or paths such as ``"0"``,
    ``"[1]"``).

    * ``strict=False`` (default) uses ``maybe_mark_dynamic``: if the model
      specialises the dim (a graph break on the length, a Python ``if`` on it),
      compilation still succeeds, but with a static graph per length, which
      brings back the recompiles. A one-time warning per key says so.
    * ``strict=True`` uses ``mark_dynamic``: the compiler raises
      ``ConstraintViolationError`` when the model specialises the dim, and
      ``min``/``max`` become the compiler's value range for it (``maybe_mark_dynamic``
      takes no range, so ``min``/``max`` need ``strict=True``).

    Sizes 0 and 1 are always specialised by the compiler, so a dynamic range
    must start at 2 or above: ``min`` < 2 raises.

    Marks live on the tensor objects: apply them after the batch is moved to
    its device (``.to()`` returns new tensors without the marks).

    >>> batch = {"input_ids": torch.zeros(2, 5, dtype=torch.long), "id": 3, "pair": (torch.zeros(2, 5), torch.zeros(2))}
    >>> mark_dynamic(batch, strict=True)
    ['input_ids', 'pair[0]']
    """
    dim = check_int("dim", dim, minimum=0)
    _check_mark_args(sequence_keys, min, max, strict)
    wanted = None if sequence_keys is None else {str(k) for k in sequence_keys}
    marked = []
    for path, value in walk_batch(batch):
        if not isinstance(value, torch.Tensor) or value.ndim <= dim:
            continue
        path = path or "<tensor>"
        top = re.split(r"[.\[]", path, maxsplit=1)[0] or path
        if wanted is not None and path not in wanted and top not in wanted:
            continue
        size = value.shape[dim]
        if (min is not None and size < min) or (max is not None and size > max):
            raise ShapeBucketError(
                f"{path!r} has size {size} at dim {dim}, outside min={min}, max={max}"
            )
        compat.mark_dynamic_dim(value, dim, strict=strict, min=min, max=max)
        marked.append(path)
        if not strict and path not in _warned_keys:
            _warned_keys.add(path)
            warnings.warn(
                f"shapebucket.compile.mark_dynamic: {path!r} dim {dim} is marked with maybe_mark_dynamic (strict=False). "
                "If the model specialises this dim, torch.compile quietly builds one static graph per length "
                "and falls back to eager after the recompile limit; pass strict=True to get an error instead.",
                stacklevel=2,
            )
    _refuse_unmarked(batch, dim, wanted, marked)
    return marked


def _refuse_unmarked(batch: Any, dim: int, wanted: set[str] | None, marked: list[str]) -> None:
    """Refuse ``sequence_keys`` (``wanted``) that name no marked tensor, or a batch with none."""
    if wanted is not None:
        missing = wanted - set(marked) - {re.split(r"[.\[]", p, maxsplit=1)[0] for p in marked}
        if missing:
            raise ShapeBucketError(
                f"sequence_keys {sorted(missing)} name no tensor with a dim {dim} in the batch"
            )
    if not marked:
        raise ShapeBucketError(
            f"mark_dynamic found no tensor with a dim {dim} in the batch ({type(batch).__name__}); "
            "pass the collated batch (a tensor, or a dict/tuple of tensors) after moving it to its device"
        )
