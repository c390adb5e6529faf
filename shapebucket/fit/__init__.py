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

from .buckets import Buckets
from .cell_fit import cells_report, fit_cells
from .cells import Cells
from .optimal import fit_buckets
from .packing_fit import PackingTrial, fit_packing, packing_report
from .padding import padding_report
from .step_cost import StepCost

__all__ = [
    "Buckets",
    "Cells",
    "PackingTrial",
    "StepCost",
    "cells_report",
    "fit_buckets",
    "fit_cells",
    "fit_packing",
    "packing_report",
    "padding_report",
]
