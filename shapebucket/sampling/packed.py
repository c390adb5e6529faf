"""``PackedBatchSampler``: batches of whole samples packed into rows (the plan is
:func:`~shapebucket.fit.packing.plan_packing`; the state is
:class:`~shapebucket.sampling.base.ResumableBatchSampler`'s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._validate import check_int
from ..fit.buckets import Buckets
from ..fit.packing import PackedEpoch, PackingReport, plan_packing, rows_by_length, rows_for_tokens
from .base import RankBatches, ResumableBatchSampler, Setting, check_one_of

__all__ = ["PackedBatchSampler"]


class PackedBatchSampler(ResumableBatchSampler):
    """Yield batches of indices to pack: each batch fills ``rows[L]`` rows of one row length
    ``L``, several whole samples per row (see :mod:`shapebucket.fit.packing`).

    Use it with :class:`~shapebucket.PackedCollator` and the same row lengths and rows:
    ``DataLoader(ds, batch_sampler=sampler, collate_fn=PackedCollator(buckets,
    rows=sampler.rows))``. Every batch then has one of ``len(buckets)`` shapes.

    Args:
        lengths: one length per dataset index (ints >= 1, <= the longest row length).
        buckets: the row lengths (:func:`~shapebucket.fit_packing` chooses them).
        rows: rows per batch, an int or ``{row length: rows}``. Or:
        tokens_per_batch: a token budget: ``tokens_per_batch // L`` rows at length ``L``.
            Exactly one of the two.
        shuffle: shuffle from ``seed`` and the epoch (``False``: dataset order, longest
            first within each window).
        window: samples packed together; larger windows pack a little tighter and
            mix a little less.
        num_replicas, rank: distributed world size and rank (default: from
            ``torch.distributed`` when initialised). Every rank gets a batch of the
            same shape at every step, and disjoint samples.

    The number of batches varies a little from epoch to epoch (it depends on how
    the shuffled samples pack); ``len(sampler)`` is the current epoch's, and
    ``sampler.stats`` its :class:`~shapebucket.fit.packing.PackingReport`. State,
    resume and ``set_epoch``: see :mod:`shapebucket.sampling.base`.

    >>> s = PackedBatchSampler([5, 3, 8, 2, 6], [8], rows=2, shuffle=False)
    >>> list(s), s.stats.token_efficiency
    ([[2, 4, 3], [0, 1]], 0.75)
    """

    packs = True  # its batches are packed rows (the collator protocol pairs by it)
    _LIMIT = "longest row length"
    _TOO_LONG = "packing never cuts a sample: add a row length >= {length}"
    _FINGERPRINT = ("window",)

    window = Setting[int]("Samples packed together.")

    _cache: tuple[int, int, PackedEpoch] | None

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        *,
        rows: int | Mapping[int, int] | None = None,
        tokens_per_batch: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        window: int = 16384,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        super().__init__(
            lengths, buckets, shuffle=shuffle, seed=seed, num_replicas=num_replicas, rank=rank
        )
        check_one_of(rows=rows, tokens_per_batch=tokens_per_batch)
        self._rows = (
            rows_by_length(self._buckets, rows)
            if rows is not None
            else rows_for_tokens(self._buckets, tokens_per_batch)  # type: ignore[arg-type]
        )
        self._window = check_int("window", window, minimum=1)
        self._cache = None

    def plan(self, epoch: int | None = None) -> PackedEpoch:
        """The packed plan of ``epoch`` (default: the current one), all ranks."""
        e = self._epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        return self._plan_for(self._seed, e)

    def _plan_for(self, seed: int, epoch: int) -> PackedEpoch:
        cached = self._cache
        if cached is not None and cached[:2] == (seed, epoch):
            return cached[2]
        plan = self._pack(seed, epoch)
        self._cache = (seed, epoch, plan)
        return plan

    def _pack(self, seed: int, epoch: int) -> PackedEpoch:
        return plan_packing(
            self._lengths,
            self._buckets,
            self._rows,
            seed=seed,
            epoch=epoch,
            shuffle=self._shuffle,
            num_replicas=self._num_replicas,
            window=self._window,
        )

    def _rank_batches(self, epoch: int) -> Sequence[list[int]]:
        return RankBatches(self._plan_for(self._seed, epoch), self._rank)

    def _count_for(self, seed: int, epoch: int) -> int:
        return len(self._plan_for(seed, epoch))

    @property
    def stats(self) -> PackingReport:
        """The current epoch's accounting (all ranks)."""
        return self.plan().report

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The row length of every batch of ``epoch`` (default: the current one), in order."""
        return self.plan(epoch).row_length.copy()

    def shapes(self) -> frozenset[tuple[int, int]]:
        """Every ``(rows, row length)`` a batch of this rank can have, in any epoch: ``rows``
        is ``self.rows[L]``, the rows of a packed batch once the collator has padded it.

        Every rank has a batch at every step, so the set is the same on every rank.
        When one window holds the whole dataset, packing depends only on the lengths,
        so every epoch uses the same row lengths and the set is exactly theirs. With
        several windows, which row lengths an epoch opens rows of can change with the
        shuffle: the set is then every row length some sample needs as its smallest
        fit (a superset of any one epoch's, never missing one).

        >>> s = PackedBatchSampler([3, 8], [4, 8], rows={4: 4, 8: 2})
        >>> sorted(s.shapes())
        [(2, 8), (4, 4)]
        """
        if self._window >= len(self._lengths):
            used = np.unique(self._pack(0, 0).row_length)
        else:
            used = np.asarray(self._buckets.lengths)[
                np.unique(self._buckets.index_for_many(self._lengths))
            ]
        return frozenset((self._rows[int(L)], int(L)) for L in used.tolist())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = None  # a plan is rebuilt where it is needed, never pickled
        return state

    def __repr__(self) -> str:
        return (
            f"PackedBatchSampler({len(self._lengths):,} samples, row lengths "
            f"{list(self._buckets)}, rows={self._rows}, shuffle={self._shuffle}, "
            f"window={self._window}, rank {self._rank}/{self._num_replicas})"
        )
