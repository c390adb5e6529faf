"""Two-length shapes: how much a cell table pads (:func:`cells_report`), and the
``(rows, source, target)`` shapes of a two-length loader that :class:`~.shapes.ShapePlan`
lists (:func:`cell_shapes`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import check_lengths
from ..errors import ShapeBucketError
from ..fit.cells import Cells

__all__ = ["CellsReport", "cell_shapes", "cells_report", "check_cell_shapes", "two_length"]


@dataclass(frozen=True)
class CellsReport:
    """How much a cell table pads a dataset (each sample in its cell, rows not padded).

    ``token_efficiency`` is the real share of all padded tokens, source and
    target together; ``source_efficiency`` and ``target_efficiency`` each side's.
    ``num_shapes`` counts the cells that receive samples.
    """

    num_samples: int
    num_shapes: int
    token_efficiency: float
    source_efficiency: float
    target_efficiency: float
    samples_per_cell: dict[tuple[int, int], int]


def cells_report(
    cells: Cells | Sequence[Any], sources: Sequence[int] | np.ndarray, targets: Any
) -> CellsReport:
    """Pad each sample to its cell and count.

    >>> r = cells_report(Cells([(8, 8), (16, 8)]), [4, 16], [8, 2])
    >>> r.num_shapes, r.token_efficiency
    (2, 0.75)
    """
    table = cells if isinstance(cells, Cells) else Cells(cells)
    s, t = check_lengths(sources), check_lengths(targets)
    index = table.index_for_many(s, t)
    src = np.asarray([c[0] for c in table.cells], dtype=np.int64)[index]
    tgt = np.asarray([c[1] for c in table.cells], dtype=np.int64)[index]
    counts = np.bincount(index, minlength=len(table))
    used = {table.cells[j]: int(n) for j, n in enumerate(counts.tolist()) if n}
    return CellsReport(
        num_samples=len(s),
        num_shapes=len(used),
        token_efficiency=float((s.sum() + t.sum()) / (src.sum() + tgt.sum())),
        source_efficiency=float(s.sum() / src.sum()),
        target_efficiency=float(t.sum() / tgt.sum()),
        samples_per_cell=used,
    )


# -- the shape plan of a two-length loader (used by ShapePlan) ------------------------------


def two_length(obj: Any) -> bool:
    """Whether ``obj`` is a two-length sampler or collator (by class: plan imports neither)."""
    return any(c.__name__ in ("CellBatchSampler", "CellCollator") for c in type(obj).__mro__)


def check_cell_shapes(shapes: Iterable[Any], collator: Any) -> None:
    """Refuse a ``(rows, source, target)`` shape the :class:`~shapebucket.collate.CellCollator`
    never makes."""
    for s in shapes:
        cell = tuple(s[1:])
        if len(s) != 3 or cell not in collator.cells:
            raise ShapeBucketError(
                f"shape {tuple(s)} is not (rows, source, target) of a cell of the collator "
                f"({collator.cells!r}); use ShapePlan.of(collator, sampler)"
            )
        if collator.rows is not None and s[0] != collator.rows_for(cell):
            raise ShapeBucketError(
                f"shape {tuple(s)}: the collator pads every batch of cell {cell} to "
                f"rows={collator.rows_for(cell)}; use ShapePlan.of(collator, sampler)"
            )


def cell_shapes(collator: Any, sampler: Any) -> set[tuple[int, int, int]]:
    """Every ``(rows, source, target)`` of a loader made of a ``CellCollator`` and (unless
    the collator pads rows) its ``CellBatchSampler`` (:meth:`ShapePlan.of`)."""
    if not two_length(collator):
        raise ShapeBucketError(
            f"a CellBatchSampler's batches need a CellCollator, got {type(collator).__name__}"
        )
    if sampler is None:
        if collator.rows is None:
            raise ShapeBucketError(
                "CellCollator pads no rows (no rows=), so a batch's row count comes from the "
                "sampler: pass ShapePlan.of(collator, sampler), or give the collator rows="
            )
        return {(collator.rows_for(c), *c) for c in collator.cells}
    if not two_length(sampler):
        raise ShapeBucketError(
            f"a CellCollator's batches come from a CellBatchSampler, got {type(sampler).__name__}"
        )
    used = {(int(r), int(s), int(t)) for r, s, t in sampler.shapes()}
    unknown = sorted({(s, t) for _, s, t in used} - set(collator.cells))
    if unknown:
        raise ShapeBucketError(
            f"the sampler makes batches in cells {unknown}, which the collator "
            f"({collator.cells!r}) does not have; give both the same cells"
        )
    if collator.rows is None:
        return used
    for r, s, t in used:
        if r > collator.rows_for((s, t)):
            raise ShapeBucketError(
                f"the sampler makes batches of {r} rows in cell {(s, t)}, more than the "
                f"collator's rows={collator.rows_for((s, t))}; pass CellCollator(rows=sampler.rows)"
            )
    return {(collator.rows_for((s, t)), s, t) for _, s, t in used}
