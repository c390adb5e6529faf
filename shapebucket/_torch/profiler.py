"""The torch seam for the profiler's undocumented event stream: the one module that reads
``torch.profiler.profile().profiler.kineto_results`` (every allocation and free of
torch's CPU allocator, in time order). On CUDA the allocator's own counters give a
step's peak (:func:`shapebucket.calibrate.memory.step_peak_bytes`); a CPU has none.

The processed event list (``prof.events()``) attributes most allocations to their ops
and would hide a peak inside a compiled graph, so the peak comes from the raw events,
which torch does not document: a torch release that renames them breaks this module
alone, with a :class:`~shapebucket.errors.ShapeBucketError` that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = ["cpu_allocation_peak_bytes"]


def cpu_allocation_peak_bytes(step: Callable[[], Any]) -> int:
    """Bytes ``step()`` allocates on the CPU on top of what was live before it, at its
    peak: the running sum of torch's CPU allocator's allocations and frees recorded by
    ``torch.profiler`` (``profile_memory=True``), compiled kernels' buffers included.

    >>> cpu_allocation_peak_bytes(lambda: torch.zeros(2**18))  # 1 MiB
    1048576
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None or not hasattr(results, "events"):
        raise ShapeBucketError(
            f"torch {torch.__version__}'s profiler has no kineto_results.events(), which "
            "shapebucket reads to find a step's peak memory on a CPU; measure on CUDA, pass "
            "rows yourself, or use a torch release shapebucket supports"
        )
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in results.events()
        if e.name() == "[memory]" and "CPU" in str(e.device_type())
    )
    peak = live = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak
