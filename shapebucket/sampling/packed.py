"""``PackedBatchSampler``: batches of whole samples packed into rows (each epoch's packing is
:func:`~shapebucket.fit.packing.pack_epoch`; the state is
:class:`~shapebucket.sampling.base.ResumableBatchSampler`'s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from .._validate import check_int, rows_per_key
from ..fit.batches import SamplerReport
from ..fit.buckets import Buckets
from ..fit.packing import PackedEpoch, pack_epoch, rows_for_tokens
from ..plan.shapes import Shape
from .base import ResumableBatchSampler
from .common import Setting, refuse_rows

__all__ = ["PackedBatchSampler"]

_KEEP = 2  # packed epochs kept: the one being iterated and the next (len() once it is done)


class PackedBatchSampler(ResumableBatchSampler[int]):
    """Yield batches of indices to pack: each batch fills ``rows[L]`` rows of one row length
    ``L``, several whole samples per row (see :mod:`shapebucket.fit.packing`).

    Use it with :class:`~shapebucket.PackedCollator` and the same row lengths and rows:
    ``DataLoader(ds, batch_sampler=sampler, collate_fn=PackedCollator(buckets,
    rows=sampler.rows))``. Every batch then has one of ``len(buckets)`` shapes.

    Args:
        lengths: one length per dataset index (ints >= 1, <= the longest row length).
        buckets: the row lengths (:func:`~shapebucket.fit_packing` chooses them).
        rows: rows per batch, an int or ``{row length: rows}``; :meth:`for_tokens`
            sizes them from a token budget.
        shuffle: shuffle from ``seed`` and the epoch (``False``: dataset order, longest
            first within each window).
        window: samples packed together; larger windows pack a little tighter and
            mix a little less.
        num_replicas, rank: distributed world size and rank (default: from
            ``torch.distributed`` when initialised). Every rank gets a batch of the
            same shape at every step, and disjoint samples.

    The number of batches varies a little from epoch to epoch; ``len(sampler)`` and
    ``sampler.stats`` are the current epoch's, and :meth:`packing` is an epoch's packing
    with its :class:`~shapebucket.fit.packing.PackingReport`. State, resume and
    ``set_epoch``: ``docs/sampler.md``.

    >>> s = PackedBatchSampler([5, 3, 8, 2, 6], [8], rows=2, shuffle=False)
    >>> list(s), s.packing().report.token_efficiency
    ([[2, 4, 3], [0, 1]], 0.75)
    """

    packs: ClassVar[bool] = True
    _LIMIT = "longest row length"
    _TOO_LONG = "packing never cuts a sample: add a row length >= {length}"
    _FINGERPRINT = ("window",)

    window = Setting[int]("Samples packed together.")

    _cache: dict[tuple[int, int], PackedEpoch]

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        *,
        rows: int | Mapping[int, int],
        shuffle: bool = True,
        seed: int = 0,
        window: int = 16384,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__(
            lengths, buckets, shuffle=shuffle, seed=seed, num_replicas=num_replicas, rank=rank
        )
        self._rows = rows_per_key(rows, self._buckets.lengths)
        self._window = check_int("window", window, minimum=1)
        self._cache = {}

    @classmethod
    def for_tokens(
        cls,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        tokens_per_batch: int,
        **options: Any,
    ) -> PackedBatchSampler:
        """A sampler with a token budget per batch: ``tokens_per_batch // L`` rows at row
        length ``L`` (:func:`~shapebucket.fit.packing.rows_for_tokens`); ``options`` are
        the constructor's others.

        >>> PackedBatchSampler.for_tokens([3, 9], [8, 16], 64).rows
        {8: 8, 16: 4}
        """
        refuse_rows(options)
        return cls(lengths, buckets, rows=rows_for_tokens(buckets, tokens_per_batch), **options)

    def packing(self, epoch: int | None = None) -> PackedEpoch:
        """The packed batches of ``epoch`` (default: the current one), all ranks, with their
        :class:`~shapebucket.fit.packing.PackingReport` (``.report``)."""
        e = self.epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        return self._packed(self._seed, e)

    def _packed(self, seed: int, epoch: int) -> PackedEpoch:
        packed = self._cache.get((seed, epoch))
        if packed is None:
            packed = self._pack(seed, epoch)
            while len(self._cache) >= _KEEP:
                del self._cache[next(iter(self._cache))]
            self._cache[seed, epoch] = packed
        return packed

    def _pack(self, seed: int, epoch: int) -> PackedEpoch:
        return pack_epoch(
            self._lengths,
            self._buckets,
            self._rows,
            seed=seed,
            epoch=epoch,
            shuffle=self._shuffle,
            num_replicas=self._num_replicas,
            window=self._window,
        )

    def _batches(self, epoch: int) -> PackedEpoch:
        return self._packed(self._seed, epoch)

    def _count_for(self, seed: int, epoch: int) -> int:
        return len(self._packed(seed, epoch))

    @property
    def stats(self) -> SamplerReport:
        """The current epoch's counts, as for the other samplers (a short batch: a step in
        which some rank's batch has empty rows); token efficiency is in :meth:`packing`."""
        report = self.packing().report
        return SamplerReport(
            num_samples=report.num_samples,
            batches=report.steps,
            full_batches=report.steps - report.short_steps,
            short_batches=report.short_steps,
            dropped=0,
            duplicated=report.duplicated,
            promotions=0,
            num_shapes=report.num_shapes,
        )

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The row length of every batch of ``epoch`` (default: the current one), in order."""
        return self.packing(epoch).row_length.copy()

    def shapes(self) -> frozenset[Shape]:
        """Every :class:`~shapebucket.plan.Shape` a batch of this rank can have, in any
        epoch: ``rows`` is ``self.rows[L]``, the rows of a packed batch once the collator
        has padded it, at row length ``L``.

        The same on every rank. With one window over the whole dataset it is exactly
        the row lengths packing uses (the same every epoch); with several, every row
        length some sample needs as its smallest fit (a superset, never missing one).

        >>> s = PackedBatchSampler([3, 8], [4, 8], rows={4: 4, 8: 2})
        >>> sorted(s.shapes())
        [Shape(rows=2, length=8), Shape(rows=4, length=4)]
        """
        if self._window >= len(self._lengths):
            used = np.unique(self._pack(0, 0).row_length)
        else:
            used = np.asarray(self._buckets.lengths)[
                np.unique(self._buckets.index_for_many(self._lengths))
            ]
        return frozenset(Shape(self._rows[int(L)], int(L)) for L in used.tolist())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}  # packed epochs are rebuilt where they are needed, never pickled
        return state
