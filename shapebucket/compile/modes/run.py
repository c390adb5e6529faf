"""Modes that change how each batch runs: the recompile limit, inference mode, repeats, CUDA graphs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ... import _torch as compat
from ..._validate import check_flag, check_int
from ...errors import ShapeBucketError
from .base import Job, Mode

__all__ = ["CudaGraphs", "Inference", "RecompileLimit", "Repeat"]


@dataclass(frozen=True)
class RecompileLimit(Mode):
    """The recompile-limit policy (the default one is ``RecompileLimit()``).

    A plan with more shapes than the compiler's recompile limit needs one graph
    per shape, so the limit is raised globally to the number of shapes for the
    prewarm (torch sets a per-function limit only at ``torch.compile(...,
    recompile_limit=N)``) and put back afterwards, also on error: the graphs stay
    usable (the limit caps new compiles, not the use of compiled ones).
    ``raise_limit=False`` raises :class:`ShapeBucketError` instead.

    >>> from shapebucket.compile.report import PrewarmReport
    >>> from shapebucket.plan import ShapePlan
    >>> plan = ShapePlan.from_function([(1, 4), (1, 8)], lambda s: torch.ones(s.rows, s.length))
    >>> job = Job(None, None, plan, None, PrewarmReport(plan.shapes))
    >>> with RecompileLimit().scope(job):
    ...     compat.get_recompile_limit() >= 2 and job.report.limit >= 2
    True
    """

    raise_limit: bool = True

    def __post_init__(self) -> None:
        check_flag("RecompileLimit(raise_limit)", self.raise_limit)

    @contextlib.contextmanager
    def scope(self, job: Job) -> Iterator[None]:
        n, limit = len(job.plan), compat.get_recompile_limit()
        if n > limit and not self.raise_limit:
            raise ShapeBucketError(
                f"{n} shapes exceed the compiler's recompile limit of {limit}; compile with "
                f"{compat.recompile_limit_fix(n)}, drop RecompileLimit(raise_limit=False), "
                "or use fewer buckets"
            )
        with compat.raised_recompile_limit(n) as raised_from:
            job.report.limit_raised_from = raised_from
            job.report.limit = max(n, limit)
            yield


@dataclass(frozen=True)
class Inference(Mode):
    """Run forward only, under ``torch.inference_mode()`` (no backward, no optimizer).

    Serve under ``torch.inference_mode()`` too, as the compiled graphs guard on
    it, with batches made outside it (a tensor created inside inference mode is
    guarded as another kind of input).

    >>> with Inference().context():
    ...     torch.is_inference_mode_enabled()
    True
    """

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.inference_mode()


@dataclass(frozen=True)
class Repeat(Mode):
    """Run each prewarm batch ``n`` times.

    >>> Repeat(3).runs
    3
    """

    n: int = 1

    def __post_init__(self) -> None:
        check_int("Repeat(n)", self.n, minimum=1)

    @property
    def runs(self) -> int:
        return self.n


@dataclass(frozen=True)
class CudaGraphs(Mode):
    """For ``torch.compile(mode="reduce-overhead")``: cudagraph trees record a shape's CUDA
    graph only after warm-up runs, so each prewarm batch runs ``repeat`` times (warm-up,
    record, replay). On CUDA ``report.memory_mb`` gives the memory each shape kept, its
    graph's pool included.

    >>> CudaGraphs().runs
    3
    """

    repeat: int = 3

    def __post_init__(self) -> None:
        check_int("CudaGraphs(repeat)", self.repeat, minimum=1)

    @property
    def runs(self) -> int:
        return self.repeat
