"""How much memory one call of a training step peaks at, on the device it runs on: the
bytes the step's own objects hold (:func:`live_tensor_bytes`) plus what the step allocates
on top (:func:`step_peak_bytes`), measured in steady state (:func:`steady_peak_bytes`).
What is measured on each device, and why the second step: ``docs/calibrate.md``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .._memory import physical_memory
from .._torch import cpu_allocation_peak_bytes
from ..errors import ShapeBucketError

__all__ = [
    "collect",
    "device_memory",
    "live_tensor_bytes",
    "steady_peak_bytes",
    "step_peak_bytes",
    "tensors_of",
]


def step_peak_bytes(step: Callable[[], Any], device: torch.device) -> int:
    """Bytes of tensor memory allocated on top of what was live before ``step()``, at the
    step's peak (CPU: through the profiler's seam :mod:`shapebucket._torch.profiler`; CUDA:
    the allocator's peak minus what was allocated before the call).

    >>> step_peak_bytes(lambda: torch.zeros(2**18), torch.device("cpu"))  # 1 MiB
    1048576
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - before)
    return cpu_allocation_peak_bytes(step)


def tensors_of(obj: Any) -> Iterable[torch.Tensor]:
    """The tensors ``obj`` holds: a tensor, a module's parameters, gradients and buffers, an
    optimizer's state, and those in mappings, lists and tuples of them."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        for p in obj.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        yield from obj.buffers()
    elif isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))
    elif isinstance(obj, Mapping):  # a tokenizer's BatchEncoding too
        for v in obj.values():
            yield from tensors_of(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_of(v)


def live_tensor_bytes(*objects: Any, device: torch.device) -> int:
    """Bytes of the distinct storages on ``device`` held by ``objects`` (modules: their
    parameters, gradients and buffers; optimizers: their state; tensors, and dicts, lists
    and tuples of them), on any device type: not everything the process holds.

    >>> live_tensor_bytes(torch.nn.Linear(4, 4), {"x": torch.zeros(8)}, device=torch.device("cpu"))
    112
    """
    seen: dict[tuple[str, int], int] = {}
    for obj in objects:
        for t in tensors_of(obj):
            if t.device.type != device.type or t.numel() == 0:
                continue
            if t.is_sparse:  # a sparse embedding's gradient: no storage of its own
                c = t.coalesce()
                seen["sparse", id(t)] = c.indices().nbytes + c.values().nbytes
            else:
                storage = t.untyped_storage()
                seen["storage", storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def steady_peak_bytes(step: Callable[[], Any], *objects: Any, device: torch.device) -> int:
    """The peak of ``step()`` in steady state, in bytes: ``step()`` once unmeasured, then
    the bytes ``objects`` hold (:func:`live_tensor_bytes`: pass the model, the optimizers
    and the batch) plus what a second ``step()`` allocates at its peak
    (:func:`step_peak_bytes`). Both calls step the model: put its state back after.

    >>> model, x = torch.nn.Linear(4, 4), torch.zeros(8, 4)
    >>> steady_peak_bytes(lambda: model(x).sum().backward(), model, x, device=x.device) > 0
    True
    """
    if not callable(step):
        raise ShapeBucketError(
            f"steady_peak_bytes: step must be a function of no arguments, got {step!r:.80}"
        )
    if not isinstance(device, torch.device):
        raise ShapeBucketError(
            f"steady_peak_bytes: device must be a torch.device, got {device!r:.80}; pass "
            "torch.device('cuda') or torch.device('cpu')"
        )
    step()
    return live_tensor_bytes(*objects, device=device) + step_peak_bytes(step, device)


def device_memory(device: torch.device) -> int:
    """The device's memory in bytes: the GPU's total memory, or this machine's physical
    memory for the CPU.

    >>> device_memory(torch.device("cpu")) > 0
    True
    """
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    total = physical_memory()
    if total is None:
        raise ShapeBucketError(
            "this platform does not report its physical memory, so a budget given as a fraction "
            "of it cannot be turned into bytes; pass budget as bytes (an int)"
        )
    return total


def collect(device: torch.device) -> None:
    """Free what Python still holds from the last probe before measuring the next."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
