"""Shapes from the machine: rows per length calibrated to a memory budget.

>>> import shapebucket.calibrate as cal
>>> sorted(cal.__all__)[:2]
['Probe', 'RowsReport']
"""

from .memory import device_memory, live_tensor_bytes, steady_peak_bytes, step_peak_bytes
from .report import Probe, RowsReport
from .rows import calibrate_rows

__all__ = [
    "Probe",
    "RowsReport",
    "calibrate_rows",
    "device_memory",
    "live_tensor_bytes",
    "steady_peak_bytes",
    "step_peak_bytes",
]
