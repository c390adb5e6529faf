"""Device memory, synchronisation and precision of the benchmark's timed steps."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

__all__ = ["peak_memory_mb", "reset_peak_memory", "step_autocast", "sync"]


def step_autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The precision of every bench step on ``device``: bf16 autocast on CUDA, none on a
    CPU. The memory calibration measures under the same context as the timed steps."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak: the CUDA allocator's, or this process's resident set (Linux)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: reset the peak resident set size (VmHWM) of this process


def peak_memory_mb(device: torch.device) -> float:
    """The peak since :func:`reset_peak_memory`, in MiB (CPU: the process's VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
