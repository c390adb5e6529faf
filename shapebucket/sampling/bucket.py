"""``BucketBatchSampler``: batches formed inside one bucket, distributed and resumable.

The plan is :func:`~shapebucket.fit.batches.plan_steps` (the same every epoch)
and :func:`~shapebucket.fit.batches.plan_epoch` (the order of one epoch, from
``(seed, epoch)`` alone); the sampler adds the resumable state of
:class:`~shapebucket.sampling.base.ResumableBatchSampler`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from .._validate import check_batch_sizes, check_flag, check_int
from ..errors import ShapeBucketError
from ..fit.batches import EpochPlan, Leftovers, SamplerReport, StepPlan, plan_epoch, plan_steps
from ..fit.buckets import Buckets
from .base import RankBatches, ResumableBatchSampler, Setting, check_one_of

__all__ = ["BucketBatchSampler"]


class BucketBatchSampler(ResumableBatchSampler):
    """Yield batches of indices whose samples all fit one bucket.

    Use it as ``DataLoader(ds, batch_sampler=sampler, collate_fn=BucketCollator(buckets,
    rows=sampler.rows))``.

    Args:
        lengths: one length per dataset index (ints >= 1, <= ``buckets.max_len``).
        buckets: the bucket lengths.
        batch_size: samples per batch (per rank): an int for every bucket, or a
            mapping ``{bucket: samples}`` with every bucket (such as
            :func:`shapebucket.calibrate.calibrate_rows`' ``rows``). Or:
        tokens_per_batch: a token budget per batch: bucket ``b`` gets
            ``tokens_per_batch // b`` samples, rounded down to a multiple of
            ``batch_multiple``. Exactly one of the two.
        shuffle: shuffle inside buckets and across batches from ``seed`` and the
            epoch; ``False`` yields buckets in ascending order, indices sorted.
        drop_last: drop each bucket's leftover samples (counted in ``stats``).
        leftovers: ``"keep"`` (each bucket's leftover is one short batch) or
            ``"promote"`` (leftovers join the next larger bucket's batches; only
            the largest bucket can end short).
        num_replicas, rank: distributed world size and rank; read from
            ``torch.distributed`` when it is initialised, else 1 and 0.

    The settings are fixed once the plan is built: they read as attributes
    (``sampler.drop_last``) but cannot be assigned; make a new sampler instead.
    Epochs, passes and resuming: see :mod:`shapebucket.sampling.base`.

    >>> s = BucketBatchSampler([3, 5, 9, 12, 4], [8, 16], batch_size=2, shuffle=False)
    >>> list(s), len(s), s.rows
    ([[0, 1], [4], [2, 3]], 3, {8: 2, 16: 2})
    """

    _TOO_LONG = (
        "add a bucket >= {length}, or clip the lengths you pass here and collate with "
        "overflow='truncate'"
    )
    _FINGERPRINT = ("drop_last", "leftovers")

    batch_size = Setting[int | Mapping[int, int] | None]("``batch_size=`` as given.")
    tokens_per_batch = Setting[int | None]("``tokens_per_batch=`` as given.")
    batch_multiple = Setting[int]("``batch_multiple=``.")
    drop_last = Setting[bool]("Whether leftovers are dropped.")
    leftovers = Setting[Leftovers]("``'keep'`` or ``'promote'``.")
    bucket_index = Setting[np.ndarray]("Each sample's bucket index (read-only).")

    _plan: StepPlan

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        *,
        batch_size: int | Mapping[int, int] | None = None,
        tokens_per_batch: int | None = None,
        batch_multiple: int = 1,
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
        table = self._buckets
        self._rows = _rows_per_bucket(table, batch_size, tokens_per_batch, batch_multiple)
        self._batch_size = dict(batch_size) if isinstance(batch_size, Mapping) else batch_size
        self._tokens_per_batch = tokens_per_batch
        self._batch_multiple = batch_multiple
        self._drop_last, self._leftovers = check_flag("drop_last", drop_last), leftovers
        index = table.index_for_many(self._lengths).astype(np.int32)
        index.flags.writeable = False
        self._bucket_index = index
        counts = np.bincount(index, minlength=len(table))
        self._plan = plan_steps(
            counts,
            [self._rows[b] for b in table],
            num_replicas=self._num_replicas,
            drop_last=self._drop_last,
            leftovers=leftovers,
        )
        if self._drop_last:
            _warn_unseen_buckets(self._plan, table, counts, leftovers)

    def _epoch_plan(self, epoch: int, *, shuffle: bool | None = None) -> EpochPlan:
        return plan_epoch(
            self._plan,
            self._bucket_index,
            seed=self._seed,
            epoch=epoch,
            shuffle=self._shuffle if shuffle is None else shuffle,
            num_replicas=self._num_replicas,
        )

    def _rank_batches(self, epoch: int) -> Sequence[list[int]]:
        return RankBatches(self._epoch_plan(epoch), self._rank)

    def __len__(self) -> int:
        return self._plan.stats.batches

    @property
    def stats(self) -> SamplerReport:
        """Counts for one epoch: batches, dropped and duplicated samples, shapes."""
        return self._plan.stats

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The bucket length of every batch of ``epoch`` (default: the current one), in order."""
        e = self._epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        return np.asarray(self._buckets.lengths)[self._epoch_plan(e).buckets]

    def shapes(self) -> frozenset[tuple[int, int]]:
        """Every ``(rows, bucket)`` this rank's batches have, in every epoch: ``rows`` is
        the batch's sample count before the collator pads rows, ``bucket`` the one the
        collator pads it to (the smallest that fits its longest sample: with
        ``leftovers="promote"`` a batch of promoted samples only is smaller than planned).

        Exact for every epoch: an epoch shuffles which samples fill each batch, never
        which bucket each position of the bucket-grouped order holds, so epoch 0
        unshuffled has the same shapes as any other.

        >>> s = BucketBatchSampler([3, 5, 9, 12, 4], [8, 16], batch_size=2)
        >>> sorted(s.shapes())
        [(1, 8), (2, 8), (2, 16)]
        """
        plan = self._epoch_plan(0, shuffle=False)
        if not len(plan):
            return frozenset()
        top = np.append(self._bucket_index[plan.flat], 0)  # a sentinel past the end
        lo = plan.offsets + self._rank * plan.sizes
        bucket = np.maximum.reduceat(top, np.stack([lo, lo + plan.sizes], axis=1).ravel())[::2]
        lengths = np.asarray(self._buckets.lengths)[bucket]
        return frozenset(zip(plan.sizes.tolist(), lengths.tolist(), strict=True))

    def __repr__(self) -> str:
        size = (
            f"batch_size={self._batch_size}"
            if self._batch_size is not None
            else f"tokens_per_batch={self._tokens_per_batch}"
        )
        return (
            f"BucketBatchSampler({len(self._lengths):,} samples, {self._buckets!r}, {size}, "
            f"shuffle={self._shuffle}, drop_last={self._drop_last}, leftovers={self._leftovers!r}, "
            f"rank {self._rank}/{self._num_replicas}, {len(self)} batches)"
        )


def _warn_unseen_buckets(
    plan: StepPlan, buckets: Buckets, counts: np.ndarray, leftovers: Leftovers
) -> None:
    """drop_last=True silently loses a whole bucket when it holds fewer samples than one
    (global) batch: often the longest samples of the dataset. Say so."""
    seen = np.bincount(plan.step_bucket, minlength=len(buckets)) > 0
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
        f"{plan.stats.dropped} dropped in all): each holds fewer samples than one batch, so "
        f"they are never trained on. Pass {promote}drop_last=False (short batches, padded "
        "to full ones with the collator's rows)",
        stacklevel=3,
    )


def _rows_per_bucket(
    buckets: Buckets,
    batch_size: int | Mapping[int, int] | None,
    tokens_per_batch: int | None,
    batch_multiple: int,
) -> dict[int, int]:
    check_one_of(batch_size=batch_size, tokens_per_batch=tokens_per_batch)
    multiple = check_int("batch_multiple", batch_multiple, minimum=1)
    if batch_size is not None:
        size = check_batch_sizes(batch_size, buckets.lengths, name="batch_size")
        return {b: size[b] if isinstance(size, dict) else int(size or 0) for b in buckets}
    budget = check_int("tokens_per_batch", tokens_per_batch, minimum=1)
    largest = buckets.max_len
    if budget // largest < multiple:
        raise ShapeBucketError(
            f"tokens_per_batch={budget} gives the largest bucket {largest} fewer than "
            f"batch_multiple={multiple} samples; use tokens_per_batch >= {largest * multiple}"
        )
    return {b: (budget // b) // multiple * multiple for b in buckets}
