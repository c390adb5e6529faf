"""Shapes from the machine: rows per length calibrated to a memory budget.

>>> import shapebucket.calibrate as cal
>>> cal.__all__
['calibrate_rows', 'steady_peak_bytes']
"""

from .memory import steady_peak_bytes
from .rows import calibrate_rows

__all__ = [
    "calibrate_rows",
    "steady_peak_bytes",
]
