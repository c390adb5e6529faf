"""``GroupedBatchSampler``: batches of samples of one group each (a bucket length, or a
``(source, target)`` cell), the shared part of the bucket and cell samplers. A subclass
finds each sample's group and calls :meth:`GroupedBatchSampler._cut`, which cuts the
groups into global steps (:func:`~shapebucket.fit.batches.cut_steps`, the same every epoch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._validate import check_flag, check_int, rows_per_key
from ..fit.batches import (
    EpochBatches,
    GlobalSteps,
    Leftovers,
    SamplerReport,
    cut_steps,
    epoch_batches,
)
from ..plan.shapes import Shape
from .base import K, ResumableBatchSampler
from .common import Setting

__all__ = ["GroupedBatchSampler"]


class GroupedBatchSampler(ResumableBatchSampler[K]):
    """Batches of samples of one group each (see the module docstring)."""

    drop_last = Setting[bool]("Whether each group's leftover samples are dropped.")

    _steps: GlobalSteps
    _group: np.ndarray  # each sample's group index (read-only)
    _keys: list[K]  # the groups, in order (their index is the group index)
    _key_array: np.ndarray  # the keys as ints: [groups] for buckets, [groups, 2] for cells

    def _cut(
        self,
        group: np.ndarray,
        keys: Sequence[K],
        rows: int | Mapping[K, int],
        drop_last: bool,
        leftovers: Leftovers = "keep",
    ) -> np.ndarray:
        """Set the rows, the groups and the steps; the samples per group, returned."""
        self._keys = list(keys)
        self._rows = rows_per_key(rows, self._keys)
        self._drop_last = check_flag("drop_last", drop_last)
        group = group.astype(np.int32)
        group.flags.writeable = False
        self._group = group
        self._key_array = np.asarray(self._keys, dtype=np.int64)
        counts = np.bincount(group, minlength=len(self._keys))
        self._steps = cut_steps(
            counts,
            [self._rows[k] for k in self._keys],
            num_replicas=self._num_replicas,
            drop_last=self._drop_last,
            leftovers=leftovers,
        )
        return counts

    def _batches(self, epoch: int, *, shuffle: bool | None = None) -> EpochBatches:
        return epoch_batches(
            self._steps,
            self._group,
            seed=self._seed,
            epoch=epoch,
            shuffle=self._shuffle if shuffle is None else shuffle,
            num_replicas=self._num_replicas,
        )

    def _count_for(self, seed: int, epoch: int) -> int:
        return self._steps.stats.batches

    @property
    def stats(self) -> SamplerReport:
        """Counts for one epoch: batches, dropped and duplicated samples, shapes."""
        return self._steps.stats

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The key of every batch of ``epoch`` (default: the current one), in order: a bucket
        length each (``[batches]``), or a cell each (``[batches, 2]`` of ``(source, target)``)."""
        e = self.epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        return self._key_array[self._batches(e).buckets]

    def shapes(self) -> frozenset[Shape]:
        """Every :class:`~shapebucket.plan.Shape` this rank's batches have, in every epoch:
        ``rows`` is the batch's sample count before the collator pads rows, the lengths
        those of the smallest group that fits its longest sample. Epoch 0 unshuffled
        has the shapes of any epoch: a shuffle moves samples, never groups.
        """
        ordered = self._batches(0, shuffle=False)
        if not len(ordered):
            return frozenset()
        top = np.append(self._group[ordered.flat], 0)  # a sentinel past the end
        lo = ordered.offsets + self._rank * ordered.sizes
        ends = np.stack([lo, lo + ordered.sizes], axis=1).ravel()
        group = np.maximum.reduceat(top, ends)[::2]
        lengths = self._key_array[group].reshape(len(group), -1).tolist()
        return frozenset(
            Shape(rows, *axes) for rows, axes in zip(ordered.sizes.tolist(), lengths, strict=True)
        )
