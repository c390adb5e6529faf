"""``PrewarmReport``: what prewarm compiled, per shape."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..plan.shapes import Shape

__all__ = ["PrewarmReport"]


@dataclass
class PrewarmReport:
    """What :func:`~shapebucket.prewarm` compiled, keyed by :class:`~shapebucket.plan.Shape`.

    Per shape (``rows``, ``length``): ``seconds``, ``graphs`` (dynamo graphs
    compiled, backward graphs not counted), ``backward_graphs`` (backward graphs
    AOT autograd compiled: the ``aot_eager`` and ``inductor`` backends), ``how`` (``"compiled"``, loaded from
    the ``"cache"``, ``"none"`` when nothing new compiled) and, on CUDA,
    ``memory_mb`` (device memory the shape kept). A ``Shape`` is a tuple, so
    ``report.graphs[(4, 128)]`` works. :meth:`by_length` sums graphs per length.

    >>> import torch
    >>> from shapebucket.compile.prewarm import prewarm
    >>> from shapebucket.plan.shapes import ShapePlan
    >>> plan = ShapePlan.from_function([(2, 4), (2, 8)], lambda s: torch.ones(s.rows, s.length))
    >>> report = prewarm(lambda x: x.sum(), plan, progress=False)
    >>> report.num_shapes, report.total_graphs  # an uncompiled function: nothing to compile
    (2, 0)
    """

    shapes: tuple[Shape, ...]
    seconds: dict[Shape, float] = field(default_factory=dict)
    graphs: dict[Shape, int] = field(default_factory=dict)
    backward_graphs: dict[Shape, int] = field(default_factory=dict)
    how: dict[Shape, str] = field(default_factory=dict)
    memory_mb: dict[Shape, float] = field(default_factory=dict)
    total_seconds: float = 0.0
    verify_seconds: float = 0.0
    limit: int = 0
    limit_raised_from: int | None = None
    optimizers_found: int = 0
    cache_path: str | None = None
    cache_loaded: bool = False
    cache_saved: bool = False
    cache_wait_s: float = 0.0  # waiting for another process building the same cache

    @property
    def num_shapes(self) -> int:
        """How many shapes the plan has."""
        return len(self.shapes)

    @property
    def total_graphs(self) -> int:
        return sum(self.graphs.values())

    def by_length(self) -> dict[int, int]:
        """Graphs compiled per length, summed over the row counts."""
        out: dict[int, int] = {}
        for shape, graphs in self.graphs.items():
            out[shape.length] = out.get(shape.length, 0) + graphs
        return out

    def to_dict(self) -> dict[str, Any]:
        """The fields, JSON-ready: a dict keyed by shape gets ``"RxL"`` keys, the shapes lists."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = {f"{s.rows}x{s.length}": v for s, v in value.items()}
            elif isinstance(value, tuple):
                value = [list(s) for s in value]
            out[f.name] = value
        return out | {"num_shapes": self.num_shapes, "total_graphs": self.total_graphs}

    def __str__(self) -> str:
        lines = [f"{'rows':>6s} {'length':>7s} {'seconds':>8s} {'graphs':>6s}  how"]
        lines += [
            f"{s.rows:>6d} {s.length:>7d} {self.seconds[s]:>8.2f} {self.graphs[s]:>6d}  "
            f"{self.how.get(s, '')}"
            + (f"  {self.memory_mb[s]:.0f} MB" if s in self.memory_mb else "")
            for s in self.seconds
        ]
        lines.append(f"{'total':>14s} {self.total_seconds:>8.2f} {self.total_graphs:>6d}")
        if self.total_graphs == 0:
            lines.append(
                "nothing was compiled: the model is not torch.compile'd, or it was compiled "
                "for every shape before this call"
            )
        elif self.verify_seconds:
            lines.append(
                f"verified: every shape ran again with no recompile ({self.verify_seconds:.2f} s)"
            )
        if self.optimizers_found:
            lines.append(
                f"restored {self.optimizers_found} optimizer(s) the step used but prewarm was not given"
            )
        if self.cache_path is not None:
            got = "loaded" if self.cache_loaded else "nothing usable there"
            lines.append(
                f"compile cache {self.cache_path}: {got}"
                + ("; saved after prewarm" if self.cache_saved else "")
            )
        if self.limit_raised_from is not None:
            lines.append(
                f"recompile limit raised from {self.limit_raised_from} to {self.limit} for "
                f"{self.num_shapes} shapes"
            )
        return "\n".join(lines)
