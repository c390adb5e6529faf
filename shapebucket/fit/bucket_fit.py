"""``fit_buckets``: the optimal K bucket boundaries for a dataset (the exact solver is
:mod:`.optimal`; K from the job is :func:`shapebucket.advise.choose_k`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ShapeBucketError
from .buckets import Buckets
from .optimal import DEFAULT_ALIGN, Cost, optimal_buckets
from .padding import Batching

__all__ = ["fit_buckets"]


def fit_buckets(
    lengths: Sequence[int] | np.ndarray,
    k: int = 8,
    *,
    align: int = DEFAULT_ALIGN,
    max_len: int | None = None,
    batch_size: int = 1,
    batching: Batching = "bucketed",
    cost: Cost = "tokens",
) -> Buckets:
    """The at-most-``k`` aligned buckets that minimise the expected padded cost.

    Args:
        lengths: sample lengths, ints >= 1 (a sequence or 1-D array, up to tens of millions).
        k: the most buckets to return (keep it <= the recompile limit, 8; to choose it
            from the job, :func:`shapebucket.advise.choose_k`).
        align: every bucket is a multiple of this (default 8, which suits tensor
            cores; 1 fits the lengths exactly).
        max_len: the largest bucket covers ``max_len`` instead of ``max(lengths)``;
            lengths above it raise.
        batch_size: batch size, used by ``batching="random"`` only.
        batching: ``"bucketed"`` (default) if batches are formed inside a bucket
            (:class:`BucketBatchSampler`), ``"random"`` for plain shuffled batches.
        cost: ``"tokens"`` (padded length), ``"attention"`` (its square) or a
            non-decreasing callable ``length -> cost``.

    The result is exact: no aligned set of at most ``k`` boundaries covering the
    longest length has a lower objective.

    >>> fit_buckets([3, 3, 5, 9, 30], k=2)
    Buckets([8, 32])
    >>> fit_buckets([4, 4, 5, 9, 30], k=3, align=1)
    Buckets([5, 9, 30])
    """
    if isinstance(k, str):
        raise ShapeBucketError(
            f"k must be an int >= 1, got {k!r}; to choose k from the job use "
            "shapebucket.advise.choose_k(lengths, compile_seconds=, job_samples=, "
            "tokens_per_second=).chosen.k"
        )
    return optimal_buckets(
        lengths,
        k,
        align=align,
        max_len=max_len,
        batch_size=batch_size,
        batching=batching,
        cost=cost,
    )
