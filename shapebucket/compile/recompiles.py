"""Watching the compiler: count compiles, fail on any recompile, check the recompile limit.

>>> f = torch.compile(lambda x: x * 2, dynamic=False, backend="eager")
>>> with CompileCounter() as cc:
...     _ = f(torch.ones(3))
>>> cc.graphs
1
"""

from __future__ import annotations

import collections
import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .. import _torch as compat
from .._torch.version import recompile_limit_fix
from .._validate import check_int
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets, as_buckets
from ..plan.shapes import ShapePlan
from .messages import (
    attribute_change,
    changes_keywords,
    is_recompile_error,
    limit_function,
    mode_change,
    parse_recompile_error,
)

__all__ = ["CompileCounter", "check_recompile_limit", "no_recompiles"]


def check_recompile_limit(
    shapes: ShapePlan | Buckets | Sequence[int], limit: int | None = None
) -> None:
    """Raise if ``shapes`` (a plan, or a bucket table) need more graphs than the compiler's
    per-function recompile limit.

    ``limit`` defaults to torch's ``recompile_limit`` (8 unless changed). With
    ``dynamic=False`` each shape is one graph; past the limit dynamo silently
    runs the function eagerly. :func:`~shapebucket.prewarm` raises the limit for
    you; this check is for compiling without it.

    >>> check_recompile_limit(Buckets([16, 32]), limit=8)
    >>> try:
    ...     check_recompile_limit([8, 16, 24], limit=2)
    ... except ShapeBucketError as e:
    ...     print(str(e)[:100])
    3 buckets exceed the compiler's recompile limit of 2 per function: past it torch.compile silently ru
    """
    table = _table_of(shapes, "check_recompile_limit")
    n = len(table)
    what = "shapes" if isinstance(shapes, ShapePlan) else "buckets"
    limit = compat.get_recompile_limit() if limit is None else check_int("limit", limit, minimum=1)
    if n > limit:
        raise ShapeBucketError(
            f"{n} {what} exceed the compiler's recompile limit of {limit} per function: "
            f"past it torch.compile silently runs eagerly. Use at most {limit} {what} "
            f"(e.g. shapebucket.fit_buckets(lengths, k={limit})), or raise the limit with "
            f"{recompile_limit_fix(n)} or shapebucket.prewarm(...), which does "
            "it for you"
        )


def _table_of(plan: Any, where: str) -> ShapePlan | Buckets:
    """A :class:`ShapePlan` as it is, a bucket table (a list or an array of ints) as
    ``Buckets``; anything else is refused, naming what ``where`` takes."""
    if isinstance(plan, (ShapePlan, Buckets)):
        return plan
    if isinstance(plan, np.ndarray) or (
        isinstance(plan, Sequence) and not isinstance(plan, (str, bytes))
    ):
        return as_buckets(plan)
    raise ShapeBucketError(
        f"{where} takes the ShapePlan that was prewarmed (or a bucket table: a list of ints), "
        f"got {type(plan).__name__}; pass ShapePlan.of(collator, sampler)"
    )


# -- counting compiles ----------------------------------------------------------------


class _ReasonHandler(logging.Handler):
    def __init__(self, sink: list[str], contains: str = "") -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink
        self.contains = contains

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.contains in message:
            self.sink.append(message)


#: The last functions seen hitting the recompile limit while a :class:`CompileCounter`
#: (and so ``prewarm``) watched, to name them in :func:`no_recompiles`' warning. Bounded;
#: the count of all hits comes from dynamo's own counters.
_SEEN_LIMIT_HITS: collections.deque[str] = collections.deque(maxlen=16)


class CompileCounter:
    """Count graphs compiled inside a ``with`` block and record every recompile's reason.

    ``graphs`` are the delta of dynamo's ``unique_graphs`` counter (which
    ``torch._dynamo.reset()`` does not clear): forward graphs. ``backward_graphs``
    counts the backward graphs compiled inside the block: AOT autograd (the
    ``aot_eager`` and ``inductor`` backends) compiles a graph's backward lazily, at
    the first ``backward()`` through it, which may be long after (and outside the
    block of) its forward. Reasons come from the ``recompiles`` log channel, switched
    on for the block and restored after. ``limit_hits`` collects dynamo's "hit
    config.recompile_limit" warnings: each is a function that from then on runs
    eagerly (or raises, under ``fullgraph``).

    >>> with CompileCounter() as cc:
    ...     pass
    >>> cc.graphs, cc.backward_graphs, cc.recompiles
    (0, 0, [])
    """

    def __init__(self) -> None:
        self.recompiles: list[str] = []
        self.limit_hits: list[str] = []
        self.backward_graphs = 0
        self._start: int | None = None
        self._end: int | None = None
        self._stack: contextlib.ExitStack | None = None

    @property
    def graphs(self) -> int:
        """Graphs compiled so far inside the block (final once the block exits)."""
        if self._start is None:
            return 0
        end = self._end if self._end is not None else compat.unique_graphs()
        return end - self._start

    def __enter__(self) -> CompileCounter:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(compat.add_recompile_handler(_ReasonHandler(self.recompiles)))
        self._stack.enter_context(
            compat.add_limit_handler(_ReasonHandler(self.limit_hits, "hit config."))
        )
        self._stack.enter_context(compat.on_compile_start(self._started))
        self._start, self._end = compat.unique_graphs(), None
        return self

    def _started(self, compile_id: str, backward: bool) -> None:
        self.backward_graphs += backward

    def __exit__(self, *exc: object) -> None:
        self._end = compat.unique_graphs()
        if self._stack is not None:
            self._stack.close()
        _SEEN_LIMIT_HITS.extend(limit_function(m) for m in self.limit_hits)

    def __str__(self) -> str:
        lines = [f"{self.graphs} graphs compiled, {len(self.recompiles)} recompiles"]
        if self.backward_graphs:
            lines[0] += f", {self.backward_graphs} backward graphs compiled"
        if self.limit_hits:
            lines[0] += f", recompile limit hit {len(self.limit_hits)} times"
        lines += [f"  - {r.strip().splitlines()[-1].strip()}" for r in self.recompiles]
        return "\n".join(lines)

    def __repr__(self) -> str:
        backward = f", backward_graphs={self.backward_graphs}" if self.backward_graphs else ""
        return f"CompileCounter(graphs={self.graphs}{backward}, recompiles={len(self.recompiles)})"


# -- no_recompiles --------------------------------------------------------------------


@contextlib.contextmanager
def no_recompiles(
    plan: ShapePlan | Buckets | Sequence[int] | None = None,
) -> Iterator[None]:
    """Fail on any recompile inside the block, with a :class:`ShapeBucketError`.

    Uses the compiler's ``fail_on_recompile`` stance (restored on exit, also on
    error). The error names the input size that was not prewarmed and, when
    ``plan`` is given (the :class:`~shapebucket.ShapePlan` that was prewarmed,
    or a bucket table), the shapes that were. (On torch 2.13 the stance refuses
    the first compile of a function never compiled before too.)

    A backward graph compiled inside the block fails too (as it starts): AOT autograd compiles a graph's backward lazily, at the
    first ``backward()`` through it, so a prewarm that ran no backward for a shape
    (an ``Inference()`` prewarm, a step that skips it) leaves that compile to the
    loop.

    Nothing stays installed in torch (a compile-start callback lives for the block
    only): a function that hit the recompile limit
    earlier (and so runs eagerly, which the stance cannot see) is counted from
    dynamo's own counters, and a warning says so on entry.

    >>> f = torch.compile(lambda x: x + 1, dynamic=False, backend="eager")
    >>> _ = f(torch.ones(2, 8))
    >>> with no_recompiles([8, 16]):
    ...     _ = f(torch.ones(2, 8))  # a compiled shape: fine
    >>> try:
    ...     with no_recompiles([8, 16]):
    ...         _ = f(torch.ones(2, 16))  # a new shape
    ... except ShapeBucketError as e:
    ...     print(str(e).splitlines()[0][:80])
    recompile inside no_recompiles(): input 'x' has size 16 at dim 1, a shape that w
    """
    table = None if plan is None else _table_of(plan, "no_recompiles")
    where = ""
    if isinstance(table, ShapePlan):
        where = f"the plan's shapes (rows, length) are {[tuple(s) for s in table]}"
    elif table is not None:
        where = f"buckets are {table!r}"
    hits = compat.recompile_limit_hits()
    if hits:
        _warn_past_limit(hits)
    try:
        with (
            torch.compiler.set_stance("fail_on_recompile"),
            compat.on_compile_start(_lazy_backwards(f" ({where})" if where else "")),
        ):
            yield
    except RuntimeError as e:
        if not is_recompile_error(e):
            raise
        text = str(e)
        what, fix = _cause(text)
        raise ShapeBucketError(
            f"recompile inside no_recompiles(): {what}{'; ' + where if where else ''}.{fix}\n"
            f"compiler said: {text}"
        ) from e


def _lazy_backwards(where: str) -> Callable[[str, bool], None]:
    """Inside :func:`no_recompiles`: a backward graph compiled in the block is refused as it
    starts (torch's ``fail_on_recompile`` stance cannot see it: no dynamo frame runs)."""

    def start(compile_id: str, backward: bool) -> None:
        if backward:  # a dynamo frame is the stance's to judge
            raise ShapeBucketError(
                f"backward graph compiled inside no_recompiles(): the forward graph {compile_id} "
                "was compiled before, but never its backward (AOT autograd compiles a backward "
                "at the first backward() through its graph). Prewarm the backward the loop runs"
                f"{where}: prewarm(model, plan) runs backward() on every output that requires "
                "grad; a step= must call backward() itself; Inference() prewarms forward only"
            )

    return start


def _warn_past_limit(hits: int) -> None:
    """Warn that ``hits`` functions hit the recompile limit earlier: they run eagerly for
    new shapes, which the ``fail_on_recompile`` stance cannot see."""
    names = sorted(set(_SEEN_LIMIT_HITS))
    named = f" ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})" if names else ""
    warnings.warn(
        f"{hits} compiled function(s) hit the recompile limit earlier in this process{named} "
        f"and now run eagerly, without an error, for shapes they were not compiled for; "
        "no_recompiles() cannot catch that. Raise the limit before compiling (prewarm does, or "
        f"{recompile_limit_fix('N')}), or reset the compiler and prewarm again",
        stacklevel=4,
    )


def _cause(text: str) -> tuple[str, str]:
    """What caused the recompile a ``fail_on_recompile`` error describes, and the fix to
    add after it (empty when the cause names its own): a mode, a model attribute the call
    changed, a new size, other keys than the example's, or another guard."""
    failures = parse_recompile_error(text)
    sizes = [f for f in failures if f.is_size]
    others = [f for f in failures if not f.is_size]
    modes = list(dict.fromkeys(m for f in others if (m := mode_change(f.text))))
    pad = (
        " Pad every batch to a bucket (BucketCollator) and prewarm every bucket (and batch "
        "size) first."
    )
    if modes:
        return "; ".join(modes), ""
    attributes = list(dict.fromkeys(a for f in others if (a := attribute_change(f.text))))
    if attributes:
        return "; ".join(attributes), ""
    if sizes and not others:
        f = sizes[0]
        return (
            f"input {f.name!r} has size {f.actual} at dim {f.dim}, a shape that was not prewarmed",
            pad,
        )
    keys = next((f for f in others if changes_keywords(f.text)), None)
    if keys is not None:
        return (
            f"the call passes other inputs than the prewarmed example did "
            f"({keys.text.split('#', 1)[0].strip()}); prewarm with an example of exactly the "
            "keys the loop passes (labels and masks included)"
        ), pad
    if others:
        return (
            f"an input failed a guard other than its size ({others[0].text}), e.g. a different "
            "stride, dtype or device than the prewarmed batch"
        ), pad
    return "an input or guard changed in a way that was not prewarmed", pad
