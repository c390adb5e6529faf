"""``CellBatchSampler``: batches inside one ``(source, target)`` cell, distributed and resumable.

Each sample lands in its cell (the edge rule of :class:`~shapebucket.fit.cells.Cells`);
the cells then play the part buckets play for
:class:`~shapebucket.sampling.BucketBatchSampler`: the same
:func:`~shapebucket.fit.batches.plan_steps` and
:func:`~shapebucket.fit.batches.plan_epoch` cut each cell into global steps
(every rank in the same cell at the same step, disjoint samples, a short step
split evenly with the first indices repeated), and the resumable state is
:class:`~shapebucket.sampling.base.ResumableBatchSampler`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._validate import check_flag, check_int, check_lengths
from ..errors import ShapeBucketError
from ..fit.batches import EpochPlan, SamplerReport, StepPlan, plan_epoch, plan_steps
from ..fit.buckets import Buckets
from ..fit.cells import Cells
from .base import RankBatches, ResumableBatchSampler, Setting, check_one_of

__all__ = ["CellBatchSampler"]

Cell = tuple[int, int]


class CellBatchSampler(ResumableBatchSampler):
    """Yield batches of indices whose samples all land in one ``(source, target)`` cell.

    Use it as ``DataLoader(ds, batch_sampler=sampler, collate_fn=CellCollator(cells,
    rows=sampler.rows))``.

    Args:
        sources, targets: each dataset index's source and target length (ints >= 1).
        cells: the cells (:func:`~shapebucket.fit.cells.fit_cells` fits them).
        batch_size: samples per batch (per rank), the same in every cell. Or:
        tokens_per_batch: a token budget: cell ``(S, T)`` gets
            ``tokens_per_batch // (S + T)`` samples (a row's padded source plus
            target tokens), rounded down to a multiple of ``batch_multiple``.
        shuffle, seed, drop_last, num_replicas, rank: as for
            :class:`~shapebucket.sampling.BucketBatchSampler` (a cell's leftover
            is one short batch, or dropped with ``drop_last=True``).

    ``sampler.buckets`` are the cells' distinct sources; ``sampler.rows`` is
    ``{(S, T): rows}``. State, resume and ``set_epoch``: see
    :mod:`shapebucket.sampling.base`.

    >>> s = CellBatchSampler([3, 4, 20, 30], [30, 20, 4, 3], [(8, 32), (32, 8)], batch_size=2, shuffle=False)
    >>> list(s), sorted(s.shapes())
    ([[0, 1], [2, 3]], [(2, 8, 32), (2, 32, 8)])
    """

    _LIMIT = "longest source of the cells"
    _TOO_LONG = "add a cell with source >= {length}, or fit the cells on these lengths (fit_cells)"
    _FINGERPRINT = ("drop_last", "_targets_digest")

    cells = Setting[Cells]("The cells.")
    targets = Setting[np.ndarray]("The target lengths (a read-only array).")
    batch_size = Setting[int | None]("``batch_size=`` as given.")
    tokens_per_batch = Setting[int | None]("``tokens_per_batch=`` as given.")
    batch_multiple = Setting[int]("``batch_multiple=``.")
    drop_last = Setting[bool]("Whether leftovers are dropped.")
    cell_index = Setting[np.ndarray]("Each sample's cell index in ``cells.cells`` (read-only).")

    _plan: StepPlan

    def __init__(
        self,
        sources: Sequence[int] | np.ndarray,
        targets: Sequence[int] | np.ndarray,
        cells: Cells | Sequence[Cell],
        *,
        batch_size: int | None = None,
        tokens_per_batch: int | None = None,
        batch_multiple: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        table = cells if isinstance(cells, Cells) else Cells(cells)
        src = check_lengths(sources, name="sources")
        tgt = check_lengths(targets, name="targets").copy()
        index = table.index_for_many(src, tgt).astype(np.int32)  # names a sample no cell holds
        sources_of_cells = Buckets(sorted({s for s, _ in table}))
        super().__init__(
            src,
            sources_of_cells,
            shuffle=shuffle,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
        )
        tgt.flags.writeable = False
        index.flags.writeable = False
        self._cells, self._targets, self._cell_index = table, tgt, index
        self._targets_digest = hashlib.sha1(tgt.tobytes() + repr(table).encode()).hexdigest()
        self._rows = _rows_per_cell(table, batch_size, tokens_per_batch, batch_multiple)  # type: ignore[assignment]
        self._batch_size, self._tokens_per_batch = batch_size, tokens_per_batch
        self._batch_multiple, self._drop_last = batch_multiple, check_flag("drop_last", drop_last)
        self._plan = plan_steps(
            np.bincount(index, minlength=len(table)),
            [self._rows[c] for c in table],  # type: ignore[index]
            num_replicas=self._num_replicas,
            drop_last=self._drop_last,
        )

    def _epoch_plan(self, epoch: int, *, shuffle: bool | None = None) -> EpochPlan:
        return plan_epoch(
            self._plan,
            self._cell_index,
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
    def rows(self) -> dict[Any, int]:  # type: ignore[override]
        """Rows per batch in each cell: ``{(source, target): rows}`` (a copy); pass it to
        :class:`~shapebucket.collate.CellCollator` (``rows=``)."""
        return dict(self._rows)

    @property
    def stats(self) -> SamplerReport:
        """Counts for one epoch: batches, dropped and duplicated samples, shapes."""
        return self._plan.stats

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The cell of every batch of ``epoch`` (default: the current one), in order:
        an int array ``[batches, 2]`` of ``(source, target)``."""
        e = self._epoch if epoch is None else check_int("epoch", epoch, minimum=0)
        return np.asarray(self._cells.cells, dtype=np.int64)[self._epoch_plan(e).buckets]

    def shapes(self) -> frozenset[tuple[int, int, int]]:  # type: ignore[override]
        """Every ``(rows, source, target)`` this rank's batches have, in every epoch
        (``rows`` before the collator pads rows). Exact: a batch's samples share a cell,
        so the collator pads it to that cell (the edge rule of
        :class:`~shapebucket.fit.cells.Cells`), and the steps are the same every epoch.

        >>> s = CellBatchSampler([3, 4, 5], [9, 9, 9], [(8, 16)], batch_size=2)
        >>> sorted(s.shapes())
        [(1, 8, 16), (2, 8, 16)]
        """
        cells = self._cells.cells
        pairs = zip(self._plan.step_size.tolist(), self._plan.step_bucket.tolist(), strict=True)
        return frozenset((rows, *cells[j]) for rows, j in pairs)

    def __repr__(self) -> str:
        size = (
            f"batch_size={self._batch_size}"
            if self._batch_size is not None
            else f"tokens_per_batch={self._tokens_per_batch}"
        )
        return (
            f"CellBatchSampler({len(self._lengths):,} samples, {self._cells!r}, {size}, "
            f"shuffle={self._shuffle}, drop_last={self._drop_last}, "
            f"rank {self._rank}/{self._num_replicas}, {len(self)} batches)"
        )


def _rows_per_cell(
    cells: Cells, batch_size: int | None, tokens_per_batch: int | None, batch_multiple: int
) -> dict[Cell, int]:
    check_one_of(batch_size=batch_size, tokens_per_batch=tokens_per_batch)
    multiple = check_int("batch_multiple", batch_multiple, minimum=1)
    if batch_size is not None:
        size = check_int("batch_size", batch_size, minimum=1)
        return {c: size for c in cells}
    budget = check_int("tokens_per_batch", tokens_per_batch, minimum=1)
    widest = max(cells, key=lambda c: c[0] + c[1])
    if budget // (widest[0] + widest[1]) < multiple:
        raise ShapeBucketError(
            f"tokens_per_batch={budget} gives the widest cell {widest} (source + target = "
            f"{sum(widest)} tokens a row) fewer than batch_multiple={multiple} samples; use "
            f"tokens_per_batch >= {sum(widest) * multiple}"
        )
    return {c: (budget // (c[0] + c[1])) // multiple * multiple for c in cells}
