"""The whole-job time model behind :func:`~shapebucket.advise.strategy.choose_strategy`:
what a job of given shapes costs eagerly, compiled first, or compiled while it trains.

A *load* is one shape's share of the job: its number of batches and the estimated
seconds of all of them eagerly and compiled. Every number here is an estimate from
the caller's timed step and the cost model :func:`unit_cost`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODES", "ShapeLoad", "compile_first", "compile_while_training", "eager", "unit_cost"]

#: the three ways to run a job's shapes, in the order a tie is broken (simplest first)
MODES = ("eager", "compile-first", "compile-while-training")


def unit_cost(rows: int, length: int, width: int) -> float:
    """Estimated cost of one batch of ``rows x length`` tokens in a model of width ``width``:
    ``rows * length * (1 + length / (6 * width))`` (a transformer block's linear layers do
    about ``24 d^2`` multiply-adds per token, its dense attention ``4 L d``).

    >>> unit_cost(2, 96, 16)  # attention doubles a token's cost when L = 6 d
    384.0
    """
    return rows * length * (1 + length / (6 * width))


@dataclass(frozen=True)
class ShapeLoad:
    """One shape's part of the job: ``batches`` of it, and the seconds all of them take
    eagerly (``eager_seconds``) and compiled (``compiled_seconds``)."""

    rows: int
    length: int
    batches: float
    eager_seconds: float
    compiled_seconds: float


def eager(loads: list[ShapeLoad]) -> tuple[float, float]:
    """``(warm-up, training)`` seconds of running every shape eagerly."""
    return 0.0, sum(s.eager_seconds for s in loads)


def compile_first(loads: list[ShapeLoad], compile_seconds: float) -> tuple[float, float]:
    """``(warm-up, training)``: every shape compiled before the first step, then all compiled."""
    return len(loads) * compile_seconds, sum(s.compiled_seconds for s in loads)


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

    >>> loads = [ShapeLoad(1, 8, 10, 100.0, 50.0)]
    >>> compile_while_training(loads, 10.0)  # 10 s eager (1/10 of the job), then 45 s compiled
    (10.0, 55.0)
    """
    order = sorted(loads, key=lambda s: -s.batches)
    t = progress = 0.0
    for j in range(len(order)):
        duration = _whole_job(order, j)  # one whole job at the current speeds
        ready = (j + 1) * compile_seconds
        remaining = (1.0 - progress) * duration * contention  # to the end at this speed
        if t + remaining <= ready:
            return len(order) * compile_seconds, t + remaining
        progress += (ready - t) / (duration * contention)
        t = ready + load_seconds
    return len(order) * compile_seconds, t + (1.0 - progress) * _whole_job(order, len(order))


def _whole_job(order: list[ShapeLoad], ready: int) -> float:
    """Seconds of one whole job with the first ``ready`` shapes of ``order`` compiled (summed
    afresh: adding and taking away each shape's seconds cancels to nonsense, even below 0,
    when the eager seconds dwarf the compiled ones)."""
    return sum(s.compiled_seconds for s in order[:ready]) + sum(
        s.eager_seconds for s in order[ready:]
    )
