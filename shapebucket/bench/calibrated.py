"""The ``shapebucket-calibrated`` strategy's rows: packing's row lengths, each with the rows
:func:`~shapebucket.calibrate.calibrate_rows` fits under the peak the packed strategy's token
budget needs at its longest row length (or ``--rows-budget-mb``), no margin."""

from __future__ import annotations

from typing import Any

import torch

from ..calibrate import calibrate_rows, steady_peak_bytes
from ..calibrate.report import RowsReport
from ..collate.packed import PackedCollator
from ..fit.packing_fit import PackingFitReport
from ..plan.shapes import Shape

__all__ = ["calibrated_rows"]


def _packed_batch(shape: Shape, vocab: int, device: torch.device) -> dict[Any, Any]:
    """A packed batch of ``shape``: every row one sample as long as the row (the document
    mask and the activations have the same size however a row is filled)."""
    ids = torch.randint(0, vocab, (shape.length,))
    collate = PackedCollator(
        [shape.length],
        rows=shape.rows,
        mask_key=None,
        label_shift="none",
    )
    batch = collate([{"input_ids": ids, "labels": ids}] * shape.rows)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def calibrated_rows(s: Any, fit: PackingFitReport) -> RowsReport:
    """Rows per row length of ``fit`` within ``--rows-budget-mb`` when given, else within
    the token budget's peak at its longest row length, measured with the run's training
    step (:meth:`~shapebucket.bench.batching.Setup.training_step`)."""
    vocab = int(s.model_config["vocab"])

    def make_batch(shape: Shape) -> dict[Any, Any]:
        return _packed_batch(shape, vocab, s.device)

    longest = max(fit.buckets)
    stated = s.args.rows_budget_mb
    if stated is not None:
        budget = int(stated * 2**20)
    else:
        step, model, opt = s.training_step()
        batch = make_batch(Shape(fit.rows[longest], longest))
        budget = steady_peak_bytes(lambda: step(batch), model, opt, batch, device=s.device)
    step, model, opt = s.training_step()
    return calibrate_rows(
        model, list(fit.buckets), budget, make_batch, step=step, restore=[opt], margin=0.0
    )
