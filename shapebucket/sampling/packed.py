"""PackedBatchSampler: batches of whole samples packed into rows (see :mod:`shapebucket.plan.packing`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import check_int, check_lengths
from ..errors import ShapeBucketError
from ..plan.buckets import Buckets, as_buckets
from ..plan.packing import (
    PackedEpoch,
    PackingReport,
    _check_rows,
    _check_sample_lengths,
    plan_packing,
    rows_for_tokens,
)
from .bucket import RankBatches, ResumableBatchSampler, resolve_world


@dataclass(frozen=True)
class _Settings:
    buckets: Buckets
    lengths: np.ndarray
    rows: dict[int, int]
    shuffle: bool
    window: int
    num_replicas: int
    rank: int


class PackedBatchSampler(ResumableBatchSampler):
    """Yield batches of indices to pack: each batch fills ``rows[L]`` rows of one row length
    ``L``, several whole samples per row (see :mod:`shapebucket.plan.packing`).

    Use it with :class:`~shapebucket.PackedCollator` and the same row lengths and rows:
    ``DataLoader(ds, batch_sampler=sampler, collate_fn=PackedCollator(buckets,
    rows=sampler.rows))``. Every batch then has one of ``len(buckets)`` shapes.

    Args:
        lengths: one length per dataset index (ints >= 1, <= the longest row length).
        buckets: the row lengths (:func:`fit_packing` chooses them).
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
    ``sampler.stats`` its :class:`PackingReport`. State, resume and ``set_epoch``
    work as for :class:`~shapebucket.BucketBatchSampler`.

    >>> s = PackedBatchSampler([5, 3, 8, 2, 6], [8], rows=2, shuffle=False)
    >>> list(s), s.stats.token_efficiency
    ([[2, 4, 3], [0, 1]], 0.75)
    """

    _SETTINGS = frozenset(_Settings.__dataclass_fields__) | {"seed", "epoch"}
    _cfg: _Settings
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
        table = as_buckets(buckets)
        arr = check_lengths(lengths)
        _check_sample_lengths(arr, table)
        arr = arr.copy()
        arr.flags.writeable = False
        if (rows is None) == (tokens_per_batch is None):
            raise ShapeBucketError(
                f"pass exactly one of rows and tokens_per_batch, got rows={rows!r}, "
                f"tokens_per_batch={tokens_per_batch!r}"
            )
        per = (
            _check_rows(table, rows)
            if rows is not None
            else rows_for_tokens(table, tokens_per_batch)  # type: ignore[arg-type]
        )
        num_replicas, rank = resolve_world(num_replicas, rank)
        cfg = _Settings(
            buckets=table,
            lengths=arr,
            rows=per,
            shuffle=bool(shuffle),
            window=check_int("window", window, minimum=1),
            num_replicas=num_replicas,
            rank=rank,
        )
        object.__setattr__(self, "_cfg", cfg)
        object.__setattr__(self, "_cache", None)
        self._init_state(seed)

    buckets = property(lambda self: self._cfg.buckets, doc="The row lengths.")
    lengths = property(lambda self: self._cfg.lengths, doc="The lengths (a read-only array).")
    shuffle = property(lambda self: self._cfg.shuffle, doc="Whether the order is shuffled.")
    window = property(lambda self: self._cfg.window, doc="Samples packed together.")
    num_replicas = property(lambda self: self._cfg.num_replicas, doc="The world size.")
    rank = property(lambda self: self._cfg.rank, doc="This process's rank.")

    @property
    def rows(self) -> dict[int, int]:
        """Rows per batch: ``{row length: rows}`` (a copy); pass it to the collator and prewarm."""
        return dict(self._cfg.rows)

    def plan(self, epoch: int | None = None) -> PackedEpoch:
        """The packed plan of ``epoch`` (default: the current one), all ranks."""
        e = self._epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        return self._plan_for(self._seed, e)

    def _plan_for(self, seed: int, epoch: int) -> PackedEpoch:
        cached = self._cache
        if cached is not None and cached[:2] == (seed, epoch):
            return cached[2]
        cfg = self._cfg
        plan = plan_packing(
            cfg.lengths,
            cfg.buckets,
            cfg.rows,
            seed=seed,
            epoch=epoch,
            shuffle=cfg.shuffle,
            num_replicas=cfg.num_replicas,
            window=cfg.window,
        )
        object.__setattr__(self, "_cache", (seed, epoch, plan))
        return plan

    def _rank_batches(self, epoch: int) -> Sequence[list[int]]:
        return RankBatches(self._plan_for(self._seed, epoch), self._cfg.rank)

    def _count_for(self, seed: int, epoch: int) -> int:
        return len(self._plan_for(seed, epoch))

    @property
    def stats(self) -> PackingReport:
        """The current epoch's accounting (all ranks)."""
        return self.plan().report

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The row length of every batch of ``epoch`` (default: the current one), in order."""
        return self.plan(epoch).row_length.copy()

    def _fingerprint(self) -> str:
        cfg = self._cfg
        h = hashlib.sha1(cfg.lengths.tobytes())
        h.update(
            repr(
                (
                    "packed",
                    cfg.buckets.lengths,
                    sorted(cfg.rows.items()),
                    cfg.shuffle,
                    cfg.window,
                    cfg.num_replicas,
                )
            ).encode()
        )
        return h.hexdigest()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = None  # a plan is rebuilt where it is needed, never pickled
        return state

    def __repr__(self) -> str:
        cfg = self._cfg
        return (
            f"PackedBatchSampler({len(cfg.lengths):,} samples, row lengths {list(cfg.buckets)}, "
            f"rows={cfg.rows}, shuffle={cfg.shuffle}, window={cfg.window}, "
            f"rank {cfg.rank}/{cfg.num_replicas})"
        )
