"""The shape plan: every batch shape a loader makes, and how to make a batch of each.

A collator joins the plan through one protocol (:class:`ShapedCollator`):
``shapes(sampler)`` and ``repad(batch, shape)``.

>>> from shapebucket.plan import Shape
>>> Shape(4, 128)
Shape(rows=4, length=128)
"""

from .protocol import ShapedCollator, ShapedSampler
from .shapes import Shape, ShapePlan

__all__ = [
    "Shape",
    "ShapePlan",
    "ShapedCollator",
    "ShapedSampler",
]
