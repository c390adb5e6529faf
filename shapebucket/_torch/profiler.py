"""The profiler's undocumented event stream (``kineto_results``: every allocation and
free of torch's CPU allocator, in time order), read here only: a CPU step's peak memory
(CUDA has the allocator's own counters; a CPU has none; ``prof.events()`` attributes
allocations to ops and would hide a peak inside a compiled graph). A torch release that renames
the events breaks this module alone, with a :class:`~shapebucket.errors.ShapeBucketError`."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
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

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():
        prof.__enter__()  # the context protocol, entered and left with stderr caught
    try:
        step()
    finally:
        with _quiet_stderr():
            prof.__exit__(*sys.exc_info())
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


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 into a temporary file for the block (kineto's C++ logging goes
    there, not through ``sys.stderr``); what it caught is written back if the block
    raises."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no fd 2 (an embedded interpreter)
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            caught.seek(0)
            os.write(2, caught.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
