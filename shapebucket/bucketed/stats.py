"""``BucketedReport``: what a :class:`~shapebucket.bucketed.BucketedModel` padded."""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass, field

import torch

from .calls import Call, Side

#: where the frames of a wrapped call live that are not the caller's
_INSIDE = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)

__all__ = ["BucketedReport", "caller_level"]


def caller_level() -> int:
    """The ``stacklevel`` of the first frame outside shapebucket and torch (the caller's line,
    however deep the wrapped call), for a warning of the function that calls this."""
    here = inspect.currentframe()
    frame, level = (here.f_back if here is not None else None), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level


@dataclass
class BucketedReport:
    """Counts of a wrapper's calls: ``calls``, ``tokens`` (the callers' rows x lengths),
    ``padded_tokens`` (what ran), ``shapes`` (``{(rows, length[, target]): calls}``) and
    ``eager_calls`` (calls past the largest bucket run eagerly at their own shape,
    with ``overflow="eager"``), ``dynamic_calls`` (calls run at their own shape on the
    one dynamic graph, with ``overflow="dynamic"``), ``packed_calls`` (calls whose samples were packed
    into rows, their pads dropped), ``unpacked_calls`` (calls a packing wrapper
    padded instead, each for a reason it warned about once), ``graphs_captured`` (CUDA
    graphs a ``graphs=True`` wrapper captured, one per padded shape, train/eval mode
    and autocast state) and
    ``graph_replays`` (calls run by a replay of one, the capturing call included).

    >>> BucketedReport().token_efficiency
    1.0
    """

    calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    eager_calls: int = 0
    dynamic_calls: int = 0
    packed_calls: int = 0
    unpacked_calls: int = 0
    graphs_captured: int = 0
    graph_replays: int = 0
    shapes: dict[tuple[int, ...], int] = field(default_factory=dict)

    @property
    def token_efficiency(self) -> float:
        """Caller tokens over the tokens that ran (1.0 before any call)."""
        return self.tokens / self.padded_tokens if self.padded_tokens else 1.0

    def count(self, call: Call) -> None:
        """Count one padded call."""
        self.calls += 1
        self.packed_calls += call.packed is not None
        for side in call.sides.values():
            self.tokens += call.rows * side.length
            self.padded_tokens += call.padded_rows * side.bucket
        key = (call.padded_rows, *(s.bucket for s in call.sides.values()))
        self.shapes[key] = self.shapes.get(key, 0) + 1

    def unpacked(self, why: str) -> None:
        """Count (and, the first time, warn about) a call padded by a packing wrapper."""
        if self.unpacked_calls == 0:
            warnings.warn(
                f"BucketedModel: a call was padded, not packed: {why}. Such calls run at "
                "padded shapes, which a packed plan did not prewarm (each compiles a graph); "
                "they are counted in stats.unpacked_calls",
                stacklevel=caller_level(),
            )
        self.unpacked_calls += 1

    def count_unplanned(self, rows: int, sides: dict[str, Side], why: str, overflow: str) -> None:
        """Count (and, the first time, warn about) a call run at its own shape, ``why``
        (past which table of the plan, or cheaper there)."""
        longest = max(s.length for s in sides.values())
        counter = f"{overflow}_calls"  # eager_calls or dynamic_calls
        if getattr(self, counter) == 0:
            how = {
                "eager": "eagerly at its own shape (overflow='eager'): never compiled, no CUDA "
                "graph recorded",
                "dynamic": "at its own shape on the dynamic graph (overflow='dynamic'), "
                "compiled at this first such call",
            }[overflow]
            warnings.warn(
                f"BucketedModel: a call of {rows} rows and length {longest} ({why}) ran {how}; "
                f"such calls are counted in stats.{counter}",
                stacklevel=caller_level(),
            )
        setattr(self, counter, getattr(self, counter) + 1)
        self.calls += 1
        tokens = sum(rows * s.length for s in sides.values())
        self.tokens += tokens
        self.padded_tokens += tokens
