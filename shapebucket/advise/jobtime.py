"""The one whole-job time model of :mod:`shapebucket.advise`: what a job of given shapes
costs eagerly, compiled first, or compiled while it trains (:func:`job_seconds`), and the
one loop over bucket counts (:func:`fitted_sets`).

>>> rates = Rates(eager=0.01, compiled=0.01)  # 100 tokens/s
>>> job_seconds("compile-first", [rates.load(1, 8, 50)], compile_seconds=3.0)
(3.0, 4.0, 7.0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ShapeBucketError
from ..fit.buckets import Buckets
from ..fit.step_cost import StepCost, check_model_dim, row_cost

__all__ = [
    "MODES",
    "Rates",
    "ShapeLoad",
    "compile_while_training",
    "fitted_sets",
    "job_seconds",
    "unit_cost",
]

#: the three ways to run a job's shapes, in the order a tie is broken (simplest first)
MODES = ("eager", "compile-first", "compile-while-training")


def unit_cost(rows: int, length: int, model_dim: int | StepCost | None) -> float:
    """Estimated cost of one batch of ``rows x length`` tokens: ``rows`` times
    :func:`~shapebucket.fit.step_cost.row_cost` of ``model_dim`` (a width, or a measured
    :class:`~shapebucket.fit.step_cost.StepCost`); ``None``: one unit per token.

    >>> unit_cost(2, 96, 16)  # attention doubles a token's cost when L = 6 d
    384.0
    >>> unit_cost(2, 96, None)
    192
    >>> unit_cost(2, 96, StepCost({48: 1e-6, 96: 2e-6}))  # measured: twice the cost at 96
    384.0
    """
    if model_dim is None:
        return rows * length
    if not isinstance(model_dim, StepCost) and (type(model_dim) is not int or model_dim < 1):
        model_dim = check_model_dim(model_dim)  # an int >= 1 needs no more than this
    return rows * row_cost(model_dim)(length)


@dataclass(frozen=True)
class ShapeLoad:
    """One shape's part of the job: ``batches`` of it, and the seconds all of them take
    eagerly (``eager_seconds``) and compiled (``compiled_seconds``)."""

    batches: float
    eager_seconds: float
    compiled_seconds: float


@dataclass(frozen=True)
class Rates:
    """Seconds per cost unit (:func:`unit_cost`) eagerly and compiled, and the model width
    (or :class:`~shapebucket.fit.step_cost.StepCost`; ``None``: one unit per token) the
    units are counted for."""

    eager: float
    compiled: float
    model_dim: int | StepCost | None = None

    def load(self, rows: int, length: int, batches: float) -> ShapeLoad:
        """``batches`` of ``rows x length``: their seconds eagerly and compiled."""
        units = batches * unit_cost(rows, length, self.model_dim)
        return ShapeLoad(batches, units * self.eager, units * self.compiled)


def job_seconds(
    mode: str,
    loads: list[ShapeLoad],
    compile_seconds: float,
    *,
    background_seconds: float | None = None,
    contention: float = 1.0,
    load_seconds: float = 0.0,
) -> tuple[float, float, float]:
    """``(warm-up, training, job)`` seconds of ``loads`` run in ``mode`` (one of
    :data:`MODES`); the keywords price compile-while-training
    (:func:`compile_while_training`; ``background_seconds`` defaults to ``compile_seconds``)."""
    if mode == "eager":
        train = sum(s.eager_seconds for s in loads)
        return 0.0, train, train
    if mode == "compile-first":
        warm, train = len(loads) * compile_seconds, sum(s.compiled_seconds for s in loads)
        return warm, train, warm + train
    if mode == "compile-while-training":
        seconds = compile_seconds if background_seconds is None else background_seconds
        warm, job = compile_while_training(loads, seconds, contention, load_seconds)
        return warm, job, job
    raise ShapeBucketError(f"mode must be one of {MODES}, got {mode!r}")


def fitted_sets(fit: Callable[[int], Buckets], max_k: int) -> tuple[list[Buckets], bool]:
    """The bucket sets ``fit(K)`` for ``K = 1..max_k``, and whether the loop stopped early
    because one more bucket changed nothing (every distinct aligned length has its bucket).

    >>> fitted_sets(lambda k: Buckets([8, 16][-k:]), 5)
    ([Buckets([16]), Buckets([8, 16])], True)
    """
    sets: list[Buckets] = []
    for k in range(1, max_k + 1):
        buckets = fit(k)
        if sets and buckets == sets[-1]:
            return sets, True
        sets.append(buckets)
    return sets, False


def compile_while_training(
    loads: list[ShapeLoad],
    compile_seconds: float,
    contention: float = 1.0,
    load_seconds: float = 0.0,
) -> tuple[float, float]:
    """``(time until every shape is compiled, job seconds)`` when training starts at once.

    One background worker compiles the shapes one after another, most batches first;
    shape ``j`` (0-based in that order) is ready at ``(j + 1) * compile_seconds`` and
    runs compiled from then on, eagerly before. Batches of every shape are spread evenly
    through the job, so while a set of shapes is ready the job progresses at one whole
    job per ``sum(compiled of ready) + sum(eager of the rest)`` seconds, times
    ``contention`` while the background compile runs (1.0: it has a core of its own).
    Switching a shape to its compiled graph pauses training ``load_seconds``.

    >>> loads = [ShapeLoad(10, 100.0, 50.0)]
    >>> compile_while_training(loads, 10.0)  # 10 s eager (1/10 of the job), then 45 s compiled
    (10.0, 55.0)
    """
    order = sorted(loads, key=lambda s: -s.batches)

    def whole_job(ready: int) -> float:
        # summed afresh: adding and taking away each shape's seconds cancels to nonsense,
        # even below 0, when the eager seconds dwarf the compiled ones
        return sum(s.compiled_seconds for s in order[:ready]) + sum(
            s.eager_seconds for s in order[ready:]
        )

    t = progress = 0.0
    for j in range(len(order)):
        duration = whole_job(j)  # one whole job at the current speeds
        ready = (j + 1) * compile_seconds
        remaining = (1.0 - progress) * duration * contention  # to the end at this speed
        if t + remaining <= ready:
            return len(order) * compile_seconds, t + remaining
        progress += (ready - t) / (duration * contention)
        t = ready + load_seconds
    return len(order) * compile_seconds, t + (1.0 - progress) * whole_job(len(order))
