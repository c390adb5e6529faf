"""``BucketBatchSampler``: batches formed inside one bucket (the smallest that holds each
sample), distributed and resumable."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ShapeBucketError
from ..fit.batches import GlobalSteps, Leftovers
from ..fit.buckets import Buckets, as_buckets
from ..fit.packing import rows_for_tokens
from .common import Setting, refuse_rows
from .grouped import GroupedBatchSampler

__all__ = ["BucketBatchSampler"]


class BucketBatchSampler(GroupedBatchSampler[int]):
    """Yield batches of indices whose samples all fit one bucket.

    Use it as ``DataLoader(ds, batch_sampler=sampler, collate_fn=BucketCollator(buckets,
    rows=sampler.rows))``.

    Args:
        lengths: one length per dataset index (ints >= 1, <= ``buckets.max_len``).
        buckets: the bucket lengths.
        rows: samples (rows) per batch, per rank: an int for every bucket, or
            ``{bucket: samples}``. :meth:`for_tokens` sizes them from a token budget.
        shuffle: shuffle inside buckets and across batches from ``seed`` and the
            epoch; ``False`` yields buckets in ascending order, indices sorted.
        drop_last: drop each bucket's leftover samples (counted in ``stats``).
        leftovers: ``"keep"`` (each bucket's leftover is one short batch) or
            ``"promote"`` (leftovers join the next larger bucket's batches; only
            the largest bucket can end short).
        num_replicas, rank: distributed world size and rank; read from
            ``torch.distributed`` when it is initialised, else 1 and 0.

    The settings read as attributes (``sampler.drop_last``) but cannot be assigned.
    Epochs, passes and resuming: ``docs/sampler.md``.

    >>> s = BucketBatchSampler([3, 5, 9, 12, 4], [8, 16], rows=2, shuffle=False)
    >>> list(s), len(s), s.rows
    ([[0, 1], [4], [2, 3]], 3, {8: 2, 16: 2})
    >>> sorted(s.shapes())
    [Shape(rows=1, length=8), Shape(rows=2, length=8), Shape(rows=2, length=16)]
    """

    _TOO_LONG = (
        "add a bucket >= {length}, or clip the lengths you pass here and collate with "
        "overflow='truncate'"
    )
    _FINGERPRINT = ("drop_last", "leftovers")

    leftovers = Setting[Leftovers]("``'keep'`` or ``'promote'``.")
    bucket_index = Setting[np.ndarray]("Each sample's bucket index (read-only).")

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        *,
        rows: int | Mapping[int, int],
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        leftovers: Leftovers = "keep",
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__(
            lengths, buckets, shuffle=shuffle, seed=seed, num_replicas=num_replicas, rank=rank
        )
        if leftovers not in ("keep", "promote"):
            raise ShapeBucketError(f"leftovers must be 'keep' or 'promote', got {leftovers!r}")
        self._leftovers = leftovers
        table = self._buckets
        index = table.index_for_many(self._lengths)
        counts = self._cut(index, list(table), rows, drop_last, leftovers)
        self._bucket_index = self._group
        if self._drop_last:
            _warn_unseen_buckets(self._steps, table, counts, leftovers)

    @classmethod
    def for_tokens(
        cls,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        tokens_per_batch: int,
        *,
        batch_multiple: int = 1,
        **options: Any,
    ) -> BucketBatchSampler:
        """A sampler with a token budget per batch: bucket ``b`` gets ``tokens_per_batch //
        b`` samples, rounded down to a multiple of ``batch_multiple`` (the largest bucket
        must get at least that many); ``options`` are the constructor's others.

        >>> BucketBatchSampler.for_tokens([3, 9], [8, 16], 64, batch_multiple=4).rows
        {8: 8, 16: 4}
        """
        refuse_rows(options)
        table = as_buckets(buckets)
        rows = rows_for_tokens(
            table.lengths, tokens_per_batch, multiple=batch_multiple, what="largest bucket"
        )
        return cls(lengths, table, rows=rows, **options)


def _warn_unseen_buckets(
    steps: GlobalSteps, buckets: Buckets, counts: np.ndarray, leftovers: Leftovers
) -> None:
    """Warn that drop_last=True loses every bucket smaller than one (global) batch."""
    seen = np.bincount(steps.step_bucket, minlength=len(buckets)) > 0
    lost = [j for j in range(len(buckets)) if counts[j] and not seen[j]]
    if not lost:
        return
    names = [buckets.lengths[j] for j in lost]
    n = int(sum(counts[j] for j in lost))
    promote = (
        ""
        if leftovers == "promote"
        else ("leftovers='promote' (leftovers join the next larger bucket) or ")
    )
    warnings.warn(
        f"drop_last=True drops every sample of bucket(s) {names} ({n} samples, "
        f"{steps.stats.dropped} dropped in all): each holds fewer samples than one batch, so "
        f"they are never trained on. Pass {promote}drop_last=False (short batches, padded "
        "to full ones with the collator's rows)",
        stacklevel=3,
    )
