"""The mode hooks (:class:`Mode`) and the job they act on (:class:`Job`), shared by every mode."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...plan.shapes import Shape, ShapePlan
from ..report import PrewarmReport

__all__ = ["Job", "Mode"]


@dataclass
class Job:
    """What a mode sees of one :func:`~shapebucket.prewarm` call."""

    model: Any
    step: Callable[[Any], Any] | None
    plan: ShapePlan
    example: Any
    report: PrewarmReport
    modes: tuple[Mode, ...] = ()
    memo: dict[str, Any] = field(default_factory=dict)
    shape: Shape | None = None  # the shape prewarm compiles now (None in the verify pass)

    def batch(self, shape: Shape) -> Any:
        """A fresh batch of ``shape`` (``plan.batch(example, shape)``)."""
        return self.plan.batch(self.example, shape)


@dataclass(frozen=True)
class Mode:
    """A part of prewarm; every hook does nothing by default.

    Order: ``scope`` (around everything), ``setup``, then per shape ``runs`` runs
    inside ``context``; ``finish`` at the end.
    """

    @property
    def runs(self) -> int:
        """How many times each prewarm batch runs."""
        return 1

    def scope(self, job: Job) -> contextlib.AbstractContextManager[Any]:
        """The block the whole job runs in (entered before ``setup``, exited last, also
        on error)."""
        return contextlib.nullcontext()

    def setup(self, job: Job) -> None:
        """Called once before the first shape."""

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """The block every run (prewarm's and the verify pass's) happens in."""
        return contextlib.nullcontext()

    def finish(self, job: Job) -> None:
        """Called once after every shape compiled (not after an error)."""
