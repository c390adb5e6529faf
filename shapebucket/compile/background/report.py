"""``BackgroundReport``: what :func:`~shapebucket.compile.compile_in_background` did, per shape."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...plan.shapes import Shape
from ..report import report_dict

__all__ = ["BackgroundReport"]


@dataclass
class BackgroundReport:
    """Per shape (in compile order): ``compile_seconds`` (in the background process),
    ``ready_at`` and ``switched_at`` (seconds since the start: loaded, first compiled call),
    ``switch_seconds`` (that first call: trace plus cache load), ``graphs`` compiled by it,
    ``how`` (``"cache"``: the background's code was used; ``"compiled here"``: it missed),
    and the training calls that ran ``eager_calls`` / ``compiled_calls``; ``eval_calls``
    counts evaluation calls (no grad, inference mode or ``model.eval()``: always eager,
    the background compiled the training step's graph). ``first_call_seconds``
    and ``all_ready_seconds`` are since the start; ``unplanned_calls`` counts calls whose
    tensors match no shape of the plan (run eagerly); ``error`` is the background's.

    >>> r = BackgroundReport((Shape(4, 8),))
    >>> r.num_shapes, r.num_switched
    (1, 0)
    """

    order: tuple[Shape, ...]
    compile_seconds: dict[Shape, float] = field(default_factory=dict)
    ready_at: dict[Shape, float] = field(default_factory=dict)
    switched_at: dict[Shape, float] = field(default_factory=dict)
    switch_seconds: dict[Shape, float] = field(default_factory=dict)
    graphs: dict[Shape, int] = field(default_factory=dict)
    how: dict[Shape, str] = field(default_factory=dict)
    eager_calls: Counter[Shape] = field(default_factory=Counter)
    compiled_calls: Counter[Shape] = field(default_factory=Counter)
    eval_calls: Counter[Shape] = field(default_factory=Counter)
    unplanned_calls: int = 0
    first_call_seconds: float | None = None
    all_ready_seconds: float | None = None
    limit_raised_from: int | None = None
    error: str | None = None

    @property
    def num_shapes(self) -> int:
        return len(self.order)

    @property
    def num_switched(self) -> int:
        return len(self.switched_at)

    def to_dict(self) -> dict[str, Any]:
        return report_dict(self)

    def __str__(self) -> str:
        lines = [
            f"{'shape':>10} {'compile s':>9} {'ready at':>8} {'switch s':>8} {'how':>13} "
            f"{'eager':>6} {'compiled':>8}"
        ]

        def f(d: dict[Shape, float], s: Shape) -> str:
            return f"{d[s]:.1f}" if s in d else "-"

        for s in self.order:
            lines.append(
                f"{s.rows:>4}x{s.length:<5} {f(self.compile_seconds, s):>9} {f(self.ready_at, s):>8} "
                f"{f(self.switch_seconds, s):>8} {self.how.get(s, 'not yet'):>13} "
                f"{self.eager_calls[s]:>6} {self.compiled_calls[s]:>8}"
            )
        if self.error:
            lines.append(f"background failed: {self.error.strip().splitlines()[-1]}")
        return "\n".join(lines)
