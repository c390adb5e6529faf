"""Planning: which lengths batches are padded to, and which shapes a job will compile.

Pure functions and records, no torch state: bucket boundaries (:func:`fit_buckets`,
:class:`Buckets`), the padding they cost (:func:`padding_report`), the number of
buckets from the job (:func:`choose_k`), fixed policies side by side
(:func:`compare_policies`), packing row lengths (:func:`fit_packing`,
:func:`packing_report`), the set of batch shapes a loader makes
(:class:`ShapePlan`), two-length cells for encoder-decoders (:func:`fit_cells`)
and the strategy from the job (:func:`choose_strategy`).
"""

from .batches import plan_epoch, plan_steps
from .buckets import Buckets
from .cell_shapes import CellsReport, cells_report
from .cells import Cells, cells_lower_bound, fit_cells
from .fit import fit_buckets
from .kchoice import KChoiceReport, KEstimate, choose_k
from .packing import PackingReport, pack_rows, plan_packing, rows_for_tokens
from .packing_fit import PackingFitReport, fit_packing, packing_report
from .padding import PaddingReport, padding_report
from .policies import PolicyReport, compare_policies
from .shapes import CellShape, Shape, ShapePlan
from .strategy import StrategyEstimate, StrategyReport, choose_strategy
from .timing import StepTiming, time_steps

__all__ = [
    "Buckets",
    "CellShape",
    "Cells",
    "CellsReport",
    "KChoiceReport",
    "KEstimate",
    "PackingFitReport",
    "PackingReport",
    "PaddingReport",
    "PolicyReport",
    "Shape",
    "ShapePlan",
    "StepTiming",
    "StrategyEstimate",
    "StrategyReport",
    "cells_lower_bound",
    "cells_report",
    "choose_k",
    "choose_strategy",
    "compare_policies",
    "fit_buckets",
    "fit_cells",
    "fit_packing",
    "pack_rows",
    "packing_report",
    "padding_report",
    "plan_epoch",
    "plan_packing",
    "plan_steps",
    "rows_for_tokens",
    "time_steps",
]
