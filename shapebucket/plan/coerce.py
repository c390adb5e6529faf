"""What :func:`shapebucket.prewarm` takes as its plan (:func:`as_plan`): a
:class:`~shapebucket.plan.ShapePlan`, or the buckets and an example batch, re-padded by a default collator. That is safe because
such batches are only compiled for (a graph depends on keys, shapes and dtypes); an
example the default collator cannot re-pad exactly is refused, naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ShapeBucketError
from ..fit.buckets import Buckets, as_buckets
from .contract import batch_items
from .shapes import ShapePlan

__all__ = ["as_plan"]


def as_plan(plan: Any, example: Any, default: Callable[[Buckets], Any]) -> ShapePlan:
    """``plan`` as a :class:`ShapePlan`, checked to come with what its batches need.

    ``plan`` is a ``ShapePlan`` (a collator's plan needs ``example``, a batch the
    collator made), or buckets (a :class:`~shapebucket.fit.Buckets` or a list of ints)
    with ``example``: then every bucket at the example's rows, re-padded by
    ``default(buckets)`` (the caller passes ``BucketCollator``; ``plan/`` imports no
    collator). The errors name ``prewarm``, the one caller.

    >>> from shapebucket import BucketCollator
    >>> collate = BucketCollator([8, 16])
    >>> batch = collate([{"input_ids": [1, 2]}, {"input_ids": [3]}])
    >>> as_plan([8, 16], batch, BucketCollator).shapes
    (Shape(rows=2, length=8), Shape(rows=2, length=16))
    """
    if isinstance(plan, ShapePlan):
        if plan.collator is not None and example is None:
            raise ShapeBucketError(
                "prewarm: this plan re-pads an example to each shape: pass "
                "example=next(iter(loader))"
            )
        return plan
    if not isinstance(plan, (Buckets, np.ndarray)) and (
        isinstance(plan, (str, bytes)) or not isinstance(plan, Sequence)
    ):
        raise ShapeBucketError(
            "prewarm takes a ShapePlan (or the buckets and example=), got "
            f"{type(plan).__name__}: build it with ShapePlan.of(collator, sampler) or "
            "ShapePlan.from_function(shapes, make_batch)"
        )
    try:  # a list or array of bucket lengths: Buckets names a bad one (a float, a bool, 0)
        buckets = as_buckets(plan)
    except ShapeBucketError as e:
        raise ShapeBucketError(
            f"prewarm: the buckets {plan!r} are not a bucket table ({e}); pass a ShapePlan, or "
            "sorted, unique int lengths >= 2 with example="
        ) from None
    if example is None:
        raise ShapeBucketError(
            "prewarm(model, buckets) has nothing to "
            "build a batch of each bucket from: pass example=next(iter(loader)) (a batch "
            "your collator made), or a ShapePlan"
        )
    rows = _rows_of(example, buckets)
    return ShapePlan([(rows, b) for b in buckets], default(buckets))


def _rows_of(example: Any, buckets: Buckets) -> int:
    """The example's row count, refusing a batch the default collator would re-pad to
    shapes the loader never makes."""
    items = batch_items(example, "prewarm: example must be a batch a BucketCollator made")
    tensors = [(k, v) for k, v in items if isinstance(v, torch.Tensor) and v.ndim >= 1]
    if not tensors:
        raise ShapeBucketError(
            f"prewarm: example has no tensor to re-pad (keys {[k for k, _ in items]})"
        )
    rows = int(tensors[0][1].shape[0])
    if rows == 0:
        raise ShapeBucketError(
            f"prewarm: example[{tensors[0][0]!r}] has shape {tuple(tensors[0][1].shape)}: a "
            "batch of 0 rows has nothing to re-pad; pass a batch of the loader "
            "(example=next(iter(loader)))"
        )
    fix = "build the plan with ShapePlan.of(collator, sampler) from the loader's collator"
    for k, v in tensors:
        if v.shape[0] != rows:
            raise ShapeBucketError(
                f"prewarm: example[{k!r}] has shape {tuple(v.shape)} but {tensors[0][0]!r} "
                f"has {rows} rows: a default BucketCollator re-pads per-row values only, so it "
                f"would keep {k!r} as it is at every bucket; {fix}"
            )
        if v.ndim >= 2 and v.shape[1] not in buckets:
            raise ShapeBucketError(
                f"prewarm: example[{k!r}] has shape {tuple(v.shape)}: its dim 1 ({v.shape[1]}) "
                f"is not a bucket of {list(buckets)}, so a default BucketCollator (sequences at "
                f"dim 1, every 2-D value a sequence) would pad the wrong dim; {fix}"
            )
    return rows
