"""``fit_buckets``: the optimal K bucket boundaries for a dataset.

The objective depends on how batches are formed, so it is an explicit choice:

* ``batching="bucketed"`` (the library's :class:`BucketBatchSampler`): each
  sample is padded to its own bucket. Minimise ``sum_i cost(bucket_for(len_i))``.
* ``batching="random"`` (plain shuffled batches of ``batch_size``): a batch is
  padded to the bucket of its longest member, whose distribution is
  ``P(max <= m) = F(m) ** batch_size``. Minimise the expected cost of that bucket.

The exact solver is :mod:`.optimal`; how much a set pads is :mod:`.padding`; K
itself can come from the job (``k="auto"``, :mod:`.kchoice`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from ..errors import ShapeBucketError
from .buckets import Buckets
from .optimal import DEFAULT_ALIGN, Cost, optimal_buckets
from .padding import Batching

__all__ = ["fit_buckets"]


def fit_buckets(
    lengths: Sequence[int] | np.ndarray,
    k: int | Literal["auto"] = 8,
    *,
    align: int = DEFAULT_ALIGN,
    max_len: int | None = None,
    batch_size: int = 1,
    batching: Batching = "bucketed",
    cost: Cost = "tokens",
    compile_seconds: float | None = None,
    job_samples: int | None = None,
    tokens_per_second: float | None = None,
) -> Buckets:
    """The at-most-``k`` aligned buckets that minimise the expected padded cost.

    Args:
        lengths: sample lengths, ints >= 1 (a sequence or 1-D array, up to tens of millions).
        k: the most buckets to return (keep it <= the recompile limit, 8), or
            ``"auto"`` to choose it from the job.
        align: every bucket is a multiple of this (default 8, which suits tensor
            cores; 1 fits the lengths exactly).
        max_len: the largest bucket covers ``max_len`` instead of ``max(lengths)``;
            lengths above it raise.
        batch_size: batch size, used by ``batching="random"`` only.
        batching: ``"bucketed"`` (default) if batches are formed inside a bucket
            (:class:`BucketBatchSampler`), ``"random"`` for plain shuffled batches.
        cost: ``"tokens"`` (padded length), ``"attention"`` (its square) or a
            non-decreasing callable ``length -> cost``.
        compile_seconds, job_samples, tokens_per_second: with ``k="auto"``, the
            job that decides K: seconds to compile one bucket, samples the job
            trains on, and computed tokens per second of the step. ``k="auto"``
            picks the K with the shortest prewarm plus training (:func:`choose_k`,
            which also gives the table).

    The result is exact: no aligned set of at most ``k`` boundaries covering the
    longest length has a lower objective.

    >>> fit_buckets([3, 3, 5, 9, 30], k=2)
    Buckets([8, 32])
    >>> fit_buckets([4, 4, 5, 9, 30], k=3, align=1)
    Buckets([5, 9, 30])
    """
    job = {
        "compile_seconds": compile_seconds,
        "job_samples": job_samples,
        "tokens_per_second": tokens_per_second,
    }
    if isinstance(k, str) and k == "auto":
        missing = [name for name, value in job.items() if value is None]
        if missing or max_len is not None or not (isinstance(cost, str) and cost == "tokens"):
            raise ShapeBucketError(
                "k='auto' needs compile_seconds=, job_samples= and tokens_per_second= (missing: "
                f"{missing}) and fits by tokens without max_len"
            )
        from ..advise.kchoice import choose_k  # k='auto' moves to shapebucket.advise (round 4)

        return choose_k(
            lengths,
            align=align,
            batch_size=batch_size,
            batching=batching,
            **job,  # type: ignore[arg-type]
        ).buckets
    if any(value is not None for value in job.values()):
        raise ShapeBucketError(
            "compile_seconds=, job_samples= and tokens_per_second= describe the job for "
            f"k='auto'; with k={k!r} they would be ignored: pass k='auto' or leave them out"
        )
    if isinstance(k, str):
        raise ShapeBucketError(f"k must be an int >= 1 or 'auto', got {k!r}")
    return optimal_buckets(
        lengths,
        k,
        align=align,
        max_len=max_len,
        batch_size=batch_size,
        batching=batching,
        cost=cost,
    )
