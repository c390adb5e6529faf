"""The one step-cost model: :func:`row_cost`, a row's estimated cost from a model width
(the ``1 + L / (6 * model_dim)`` formula) or from :class:`StepCost`, seconds per token of a
whole step measured by row length (the benchmark, your own timer: :meth:`StepCost.from_steps`).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .._lengths import MAX_BUCKET
from .._validate import check_int, check_number
from ..errors import ShapeBucketError

__all__ = ["StepCost", "row_cost"]


@dataclass(frozen=True)
class StepCost:
    """Seconds per token of a whole step at each measured length (``{length: seconds}``).

    A row must not be measured cheaper than a shorter one (``length x seconds`` per token
    may not fall from one measured length to the next): that is noise or a unit slip,
    refused with the two lengths named.

    >>> cost = StepCost({64: 2e-6, 256: 3e-6})
    >>> cost.per_token(128), cost.row(64), cost.row(256)
    (2.333333333333333e-06, 64.0, 384.0)
    >>> StepCost.from_steps({(32, 64): 0.004, (8, 256): 0.006}).seconds_per_token
    {64: 1.953125e-06, 256: 2.9296875e-06}
    """

    seconds_per_token: Mapping[int, float]
    source: str = "measured step times"

    def __post_init__(self) -> None:
        if not isinstance(self.seconds_per_token, Mapping) or not self.seconds_per_token:
            raise ShapeBucketError(
                "StepCost needs {length: seconds per token} for at least one length, got "
                f"{self.seconds_per_token!r}"
            )
        if not isinstance(self.source, str):
            raise ShapeBucketError(f"StepCost source must be a str, got {self.source!r}")
        checked = {}
        for L, s in self.seconds_per_token.items():
            length = check_int("StepCost length", L, minimum=1, maximum=MAX_BUCKET)
            checked[length] = check_number(
                f"StepCost: length {length}'s seconds per token",
                s,
                above=0,
                hint=" (a positive, finite number: a whole step's seconds over its rows x length)",
            )
        table = dict(sorted(checked.items()))
        grid, values = tuple(table), tuple(table.values())
        _check_rows_grow(grid, values)
        if not math.isfinite(MAX_BUCKET * values[-1] / values[0]):
            raise ShapeBucketError(
                f"StepCost: seconds per token from {values[0]!r} to {values[-1]!r} span more "
                "than a float holds; check the units (seconds over rows x length)"
            )
        object.__setattr__(self, "seconds_per_token", table)

    def __hash__(self) -> int:
        return hash((tuple(self.seconds_per_token.items()), self.source))

    @classmethod
    def from_steps(cls, steps: Mapping[tuple[int, int], float]) -> StepCost:
        """From whole-step seconds keyed by ``(rows, length)`` shapes (the fastest step of a
        length kept when several shapes share it)."""
        if not isinstance(steps, Mapping):
            raise ShapeBucketError(
                "StepCost.from_steps needs {(rows, length): seconds of one step}, got "
                f"{type(steps).__name__}"
            )
        per: dict[int, float] = {}
        for shape, seconds in steps.items():
            if not isinstance(shape, tuple) or len(shape) != 2:
                raise ShapeBucketError(
                    f"StepCost.from_steps: key {shape!r} is not a (rows, length) shape; key "
                    "each step's seconds by its batch's rows and length"
                )
            rows = check_int("rows", shape[0], minimum=1, maximum=MAX_BUCKET)
            length = check_int("length", shape[1], minimum=1, maximum=MAX_BUCKET)
            value = check_number(f"seconds of the {rows}x{length} step", seconds, above=0)
            value /= rows * length
            per[length] = min(per.get(length, value), value)
        return cls(per)

    def per_token(self, length: int) -> float:
        """Seconds per token at ``length``: between two measured lengths, linear where the
        cost per token rises (the formula's shape), and a row's seconds linear where it falls
        (a fixed overhead per step); outside them, the nearest measured length's."""
        check_number("length", length, at_least=0, hint=" (a row length in tokens)")
        grid, values = tuple(self.seconds_per_token), tuple(self.seconds_per_token.values())
        if length <= grid[0]:
            return values[0]
        if length >= grid[-1]:
            return values[-1]
        i = bisect_right(grid, length) - 1
        (la, lb), (pa, pb) = grid[i : i + 2], values[i : i + 2]
        t = (length - la) / (lb - la)
        if pb >= pa:  # rising: per token linear (the formula's 1 + L/(6d) exactly)
            return pa + t * (pb - pa)
        return (la * pa + t * (lb * pb - la * pa)) / length  # falling: a row's seconds linear

    def row(self, length: int) -> float:
        """One row of ``length`` in token units: its seconds over the cost per token at the
        shortest measured length (the formula's ``L * (1 + L / (6 d))`` counterpart); it
        never falls as the row gets longer."""
        return length * self.per_token(length) / next(iter(self.seconds_per_token.values()))


def row_cost(model_dim: int | StepCost | None) -> Callable[[int], float]:
    """The estimated cost of one row of length ``L`` in token units: ``L`` (``model_dim=None``),
    or with a model width ``L * (1 + L / (6 * model_dim))`` (a transformer block's linear
    layers do about ``24 d^2`` multiply-adds per token, its dense attention ``4 L d``), or
    measured (:meth:`StepCost.row`); ``model_dim`` already checked.

    >>> row_cost(16)(96), row_cost(None)(96)  # attention doubles a token's cost at L = 6 d
    (192.0, 96.0)
    """
    if model_dim is None:
        return float
    if isinstance(model_dim, StepCost):
        return model_dim.row
    return lambda L: L * (1 + L / (6 * model_dim))


def _check_rows_grow(grid: tuple[int, ...], values: tuple[float, ...]) -> None:
    """Refuse a row measured cheaper than a shorter one."""
    for i in range(len(grid) - 1):
        a, b = grid[i] * values[i], grid[i + 1] * values[i + 1]
        if b < a:
            raise ShapeBucketError(
                f"StepCost: a row of {grid[i + 1]} is measured cheaper than a row of {grid[i]} "
                f"({grid[i + 1]} x {values[i + 1]:.4g} s < {grid[i]} x {values[i]:.4g} s per "
                "token); a longer row never costs less: time more steps (from_steps keeps the "
                "fastest of a length) or drop one of the two lengths"
            )
