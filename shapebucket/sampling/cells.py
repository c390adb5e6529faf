"""``CellBatchSampler``: batches inside one ``(source, target)`` cell (by the edge rule of
:class:`~shapebucket.fit.cells.Cells`), distributed and resumable as the bucket sampler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .._lengths import check_lengths
from ..fit.buckets import Buckets
from ..fit.cells import Cells
from ..fit.packing import rows_for_tokens
from .common import Setting, refuse_rows
from .grouped import GroupedBatchSampler
from .state import fingerprint

__all__ = ["CellBatchSampler"]

Cell = tuple[int, int]


class CellBatchSampler(GroupedBatchSampler[Cell]):
    """Yield batches of indices whose samples all land in one ``(source, target)`` cell.

    Use it as ``DataLoader(ds, batch_sampler=sampler, collate_fn=CellCollator(sampler.cells,
    rows=sampler.rows))``.

    Args:
        sources, targets: each dataset index's source and target length (ints >= 1).
        cells: the cells (:func:`~shapebucket.fit.cell_fit.fit_cells` fits them); kept,
            weights included, as ``sampler.cells``.
        rows: samples (rows) per batch, per rank: an int for every cell, or
            ``{(source, target): samples}``. :meth:`for_tokens` sizes them from a
            token budget.
        shuffle, seed, drop_last, num_replicas, rank: as for
            :class:`~shapebucket.sampling.BucketBatchSampler` (a cell's leftover
            is one short batch, or dropped with ``drop_last=True``).

    ``sampler.buckets`` are the cells' distinct sources; ``sampler.rows`` is
    ``{(S, T): rows}``. State, resume and ``set_epoch``: ``docs/sampler.md``.

    >>> s = CellBatchSampler([3, 4, 20, 30], [30, 20, 4, 3], [(8, 32), (32, 8)], rows=2, shuffle=False)
    >>> list(s), sorted(s.shapes())
    ([[0, 1], [2, 3]], [Shape(rows=2, lengths=(8, 32)), Shape(rows=2, lengths=(32, 8))])
    """

    _LIMIT = "longest source of the cells"
    _TOO_LONG = "add a cell with source >= {length}, or fit the cells on these lengths (fit_cells)"
    _FINGERPRINT = ("drop_last", "_targets_digest")
    _TABLE = "cells"

    cells = Setting[Cells]("The cells (the table, weights included).")
    targets = Setting[np.ndarray]("The target lengths (a read-only array).")
    cell_index = Setting[np.ndarray]("Each sample's cell index in ``cells.cells`` (read-only).")

    def __init__(
        self,
        sources: Sequence[int] | np.ndarray,
        targets: Sequence[int] | np.ndarray,
        cells: Cells | Sequence[Cell],
        *,
        rows: int | Mapping[Cell, int],
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        table = cells if isinstance(cells, Cells) else Cells(cells)
        src = check_lengths(sources, name="sources")
        tgt = check_lengths(targets, name="targets").copy()
        index = table.index_for_many(src, tgt)  # names a sample no cell holds
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
        self._cells, self._targets = table, tgt
        self._targets_digest = fingerprint(tgt, (table,))
        self._cut(index, list(table), rows, drop_last)
        self._cell_index = self._group

    @classmethod
    def for_tokens(
        cls,
        sources: Sequence[int] | np.ndarray,
        targets: Sequence[int] | np.ndarray,
        cells: Cells | Sequence[Cell],
        tokens_per_batch: int,
        *,
        batch_multiple: int = 1,
        **options: Any,
    ) -> CellBatchSampler:
        """A sampler with a token budget per batch: cell ``(S, T)`` gets ``tokens_per_batch
        // (S + T)`` samples (a row's padded source plus target tokens), rounded down to a
        multiple of ``batch_multiple`` (the widest cell must get at least that many);
        ``options`` are the constructor's others.

        >>> CellBatchSampler.for_tokens([3], [9], [(8, 16), (32, 32)], 96).rows
        {(8, 16): 4, (32, 32): 1}
        """
        refuse_rows(options)
        table = cells if isinstance(cells, Cells) else Cells(cells)
        widths = [s + t for s, t in table]
        rows = rows_for_tokens(
            list(table),
            tokens_per_batch,
            widths=widths,
            multiple=batch_multiple,
            what="widest cell",
        )
        return cls(sources, targets, table, rows=rows, **options)
