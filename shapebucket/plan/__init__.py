"""The shape plan: every batch shape a loader makes, and how to make a batch of each.

>>> from shapebucket.plan import Shape
>>> Shape(4, 128)
Shape(rows=4, length=128)
"""

from .cell_shapes import CellsReport, cells_report
from .shapes import CellShape, Shape, ShapePlan

__all__ = ["CellShape", "CellsReport", "Shape", "ShapePlan", "cells_report"]
