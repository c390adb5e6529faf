"""The ``shapebucket-calibrated`` strategy's rows: packing's row lengths, each with the
rows calibrated to memory (:func:`shapebucket.calibrate.calibrate_rows`) instead of
``tokens_per_batch // L``.

The budget is the memory the token budget already needs at its worst: the measured
peak of one step of the packed strategy's longest row length at its token-budget
rows, with no margin. So the calibrated strategy never peaks above
``shapebucket-packed``, and its shorter row lengths get as many rows as fit under
that same peak. (A job on a GPU would pass a fraction of the device's memory
instead; the benchmark compares the two strategies at one peak.)
"""

from __future__ import annotations

from typing import Any

import torch

from ..calibrate import calibrate_rows, steady_peak_bytes
from ..calibrate.report import RowsReport
from ..collate.packed import PackedCollator
from ..fit.packing_fit import PackingFitReport
from ..plan.shapes import Shape
from .memory import step_autocast

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
    the token budget's peak at its longest row length, measured with eager steps of the run's model (setup ``s``) and AdamW, in
    the timed steps' precision (:func:`~shapebucket.bench.memory.step_autocast`)."""
    torch.manual_seed(s.args.seed)
    model = s.make_model().to(s.device)
    model.load_state_dict(s.init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    vocab = int(s.model_config["vocab"])

    autocast = step_autocast(s.device)  # the timed steps' precision (bf16 on CUDA)

    def step(batch: dict[str, Any]) -> None:
        with autocast:
            loss = model(**batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def make_batch(shape: Shape) -> dict[Any, Any]:
        return _packed_batch(shape, vocab, s.device)

    longest = max(fit.buckets)
    batch = make_batch(Shape(fit.rows[longest], longest))
    stated = getattr(s.args, "rows_budget_mb", None)  # --rows-budget-mb, else measured
    budget = (
        int(stated * 2**20)
        if stated is not None
        else steady_peak_bytes(lambda: step(batch), model, opt, batch, device=s.device)
    )
    torch.manual_seed(s.args.seed)
    model.load_state_dict(s.init_state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return calibrate_rows(
        model, list(fit.buckets), budget, make_batch, step=step, restore=[opt], margin=0.0
    )
