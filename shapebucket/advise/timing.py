"""One timed training step, what :func:`~shapebucket.advise.strategy.choose_strategy` needs:
:class:`StepTiming` and :func:`time_steps` (which calls your step functions; no torch here)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._validate import check_int, check_number
from ..errors import ShapeBucketError

__all__ = ["StepTiming", "time_steps"]


@dataclass(frozen=True)
class StepTiming:
    """The measured timings of a job: one shape's compile (``compile_seconds``, forward
    and backward), one step of shape ``rows x length`` eagerly (``eager_seconds``) and
    compiled (``compiled_seconds``), and what compiling while training costs:
    one shape's compile in the background process (``background_compile_seconds``,
    default ``compile_seconds``; more when it shares cores with training), how many
    times slower a training step runs while it compiles (``contention`` >= 1; 1: the
    compile has a core of its own) and the pause when training switches a shape to its
    compiled graph (``load_seconds``, loading the cache artifacts).

    >>> StepTiming(compile_seconds=12.5, eager_seconds=0.06, compiled_seconds=0.045, rows=48, length=32)
    StepTiming(compile_seconds=12.5, eager_seconds=0.06, compiled_seconds=0.045, rows=48, length=32, background_compile_seconds=None, contention=1.0, load_seconds=0.0)
    """

    compile_seconds: float
    eager_seconds: float
    compiled_seconds: float
    rows: int
    length: int
    background_compile_seconds: float | None = None
    contention: float = 1.0
    load_seconds: float = 0.0

    def __post_init__(self) -> None:
        names = ["compile_seconds", "eager_seconds", "compiled_seconds"]
        if self.background_compile_seconds is not None:
            names.append("background_compile_seconds")
        for name in names:
            self._set(name, check_number(name, getattr(self, name), above=0))
        self._set("rows", check_int("rows", self.rows, minimum=1))
        self._set("length", check_int("length", self.length, minimum=1))
        hint = " (a background compile never speeds training up)"
        self._set("contention", check_number("contention", self.contention, at_least=1, hint=hint))
        self._set("load_seconds", check_number("load_seconds", self.load_seconds, at_least=0))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


def _shape_of(batch: Any) -> tuple[int, int] | None:
    """``(rows, length)`` of ``batch["input_ids"]`` (or the first 2-D value), if any."""
    if not isinstance(batch, Mapping):
        return None
    values = [batch["input_ids"]] if "input_ids" in batch else list(batch.values())
    for value in values:
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) == 2:
            return int(shape[0]), int(shape[1])
    return None


def time_steps(
    step: Callable[[Any], Any],
    compiled_step: Callable[[Any], Any],
    batch: Any,
    *,
    rows: int | None = None,
    length: int | None = None,
    repeats: int = 3,
    sync: Callable[[], Any] | None = None,
) -> StepTiming:
    """Time ``step(batch)`` (eager) and ``compiled_step(batch)`` (its compiled twin) for
    :func:`choose_strategy`: one warm-up eager call, then the median of ``repeats``
    calls of each; ``compile_seconds`` is the first compiled call minus the median
    compiled step. These are real training steps: the weights and the optimizer state
    change (time a copy, or do it before loading the checkpoint). ``rows`` and ``length``
    default to ``batch["input_ids"].shape``; ``sync`` (e.g. ``torch.cuda.synchronize``)
    is called around each timed call.

    >>> import numpy as np
    >>> t = time_steps(lambda b: None, lambda b: None, {"input_ids": np.zeros((4, 16))})
    >>> (t.rows, t.length)
    (4, 16)
    """
    repeats = check_int("repeats", repeats, minimum=1)
    shape = _shape_of(batch)
    if rows is None or length is None:
        if shape is None:
            raise ShapeBucketError(
                "time_steps: cannot read the batch's shape (no 2-D 'input_ids'); pass rows= and length="
            )
        rows = shape[0] if rows is None else rows
        length = shape[1] if length is None else length

    def timed(fn: Callable[[Any], Any]) -> float:
        if sync is not None:
            sync()
        start = time.perf_counter()
        fn(batch)
        if sync is not None:
            sync()
        return time.perf_counter() - start

    timed(step)
    eager_s = statistics.median(timed(step) for _ in range(repeats))
    first = timed(compiled_step)
    compiled_s = statistics.median(timed(compiled_step) for _ in range(repeats))
    tiny = 1e-9  # a no-op step still needs a time > 0
    return StepTiming(
        compile_seconds=max(first - compiled_s, tiny),
        eager_seconds=max(eager_s, tiny),
        compiled_seconds=max(compiled_s, tiny),
        rows=rows,
        length=length,
    )
