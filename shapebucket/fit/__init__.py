"""Fitting: which lengths batches are padded to, and which samples share a batch or a row.

Pure functions and records: no torch state, no compiler config, no user code. Bucket
boundaries (:func:`fit_buckets`, :class:`Buckets`), the padding they cost
(:func:`padding_report`), packing row lengths (:func:`fit_packing`,
:func:`packing_report`), bucketed and packed batch composition, and two-length
cells for encoder-decoders (:func:`fit_cells`).

>>> from shapebucket.fit import fit_buckets
>>> fit_buckets([5, 9, 12, 30, 31], k=2, align=8)
Buckets([16, 32])
"""

from .batches import cut_steps, epoch_batches
from .bucket_fit import fit_buckets
from .buckets import Buckets
from .cell_report import CellsReport, cells_report
from .cells import Cells, cells_lower_bound, fit_cells
from .packing import PackingReport, pack_epoch, pack_rows, rows_for_tokens
from .packing_fit import PackingFitReport, PackingTrial, fit_packing, packing_report
from .padding import PaddingReport, padding_report
from .step_cost import StepCost

__all__ = [
    "Buckets",
    "Cells",
    "CellsReport",
    "PackingFitReport",
    "PackingReport",
    "PackingTrial",
    "PaddingReport",
    "StepCost",
    "cells_lower_bound",
    "cells_report",
    "cut_steps",
    "epoch_batches",
    "fit_buckets",
    "fit_cells",
    "fit_packing",
    "pack_epoch",
    "pack_rows",
    "packing_report",
    "padding_report",
    "rows_for_tokens",
]
