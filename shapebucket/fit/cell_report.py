"""How much a cell table pads a dataset: :func:`cells_report` (a pure report, as
:func:`~shapebucket.fit.padding_report` is for buckets)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lengths import check_lengths
from .cells import Cells

__all__ = ["CellsReport", "cells_report"]


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
