"""Shapes from the machine: rows per length calibrated to a memory budget."""

from .memory import steady_peak_bytes
from .rows import calibrate_rows

__all__ = ["calibrate_rows", "steady_peak_bytes"]
