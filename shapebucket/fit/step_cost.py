"""``StepCost``: measured seconds per token by row length, for :func:`fit_packing` to use
in place of the ``1 + L / (6 * model_dim)`` formula.

A pure record (no torch): the seconds per token a whole training step took at each
measured length, from the machine (prewarm's timed steps, the benchmark's limit row,
your own timer). Between measured lengths the cost per token is interpolated
linearly; outside them it is held at the nearest one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .._validate import check_int
from ..errors import ShapeBucketError

__all__ = ["StepCost"]


@dataclass(frozen=True)
class StepCost:
    """Seconds per token of a whole step at each measured length (``{length: seconds}``).

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
        checked = {}
        for L, s in self.seconds_per_token.items():
            length = check_int("StepCost length", L, minimum=1)
            if (
                isinstance(s, bool)
                or not isinstance(s, (int, float))
                or not math.isfinite(s)
                or s <= 0
            ):
                raise ShapeBucketError(
                    f"StepCost: length {length} has {s!r} seconds per token; give a positive, "
                    "finite number (a whole step's seconds over its rows x length)"
                )
            checked[length] = float(s)
        object.__setattr__(self, "seconds_per_token", dict(sorted(checked.items())))

    @classmethod
    def from_steps(cls, steps: Mapping[tuple[int, int], float]) -> StepCost:
        """From whole-step seconds keyed by ``(rows, length)`` shapes (the fastest step of a
        length kept when several shapes share it)."""
        per: dict[int, float] = {}
        for shape, seconds in steps.items():
            rows, length = (check_int("rows", v, minimum=1) for v in tuple(shape)[:2])
            value = float(seconds) / (rows * length)
            per[length] = min(per.get(length, value), value)
        return cls(per)

    def per_token(self, length: int) -> float:
        """Seconds per token at ``length`` (linear between measured lengths)."""
        grid = list(self.seconds_per_token)
        return float(np.interp(length, grid, [self.seconds_per_token[L] for L in grid]))

    def row(self, length: int) -> float:
        """One row of ``length`` in token units: its seconds over the cost per token at the
        shortest measured length (the formula's ``L * (1 + L / (6 d))`` counterpart)."""
        first = next(iter(self.seconds_per_token.values()))
        return length * self.per_token(length) / first
