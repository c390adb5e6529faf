"""The cache key of a prewarm job: everything that invalidates compiled code, hashed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from ... import _torch as compat

__all__ = ["describe_batch", "job_key"]


def _code_text(code: Any) -> str:
    """A code object's bytecode, names and constants (nested code objects included)."""
    consts = [_code_text(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
    return " ".join([code.co_code.hex(), repr(code.co_names), *consts])


def _function_code(f: Any) -> str:
    code = getattr(f, "__code__", None)
    return _code_text(code) if code is not None else repr(type(f))


def _class_code(cls: type) -> str:
    """What defines a class that has no source file (a notebook cell, ``exec``'d code):
    its name and the code of every function it and its bases define."""
    parts = []
    for klass in cls.__mro__:
        if klass is object or klass.__module__.split(".")[0] == "torch":
            continue  # torch's own classes: covered by the torch version
        parts.append(f"{klass.__module__}.{klass.__qualname__}")
        for name, attr in sorted(vars(klass).items()):
            attr = getattr(attr, "__func__", attr)  # staticmethod, classmethod
            if callable(attr) or isinstance(attr, property):
                fget = getattr(attr, "fget", attr)
                parts.append(f"{name}: {_function_code(fget)}")
    return "\n".join(parts)


def _code_of(obj: Any) -> list[str]:
    """Source files (or code) that define what ``obj`` computes."""
    import inspect

    out: list[str] = []
    modules = []
    if isinstance(obj, torch.nn.Module):
        modules = [compat.unwrap_compiled(m) for m in obj.modules()]
    targets: list[Any] = [type(m) for m in modules] if modules else [obj]
    for t in targets:
        try:
            path = inspect.getsourcefile(t)
        except TypeError:
            path = None
        if path and Path(path).is_file():
            out.append(Path(path).read_text(errors="replace"))
        elif isinstance(t, type):
            out.append(_class_code(t))
        else:
            f = getattr(t, "__wrapped__", t)
            out.append(_function_code(f) if hasattr(f, "__code__") else _class_code(type(f)))
    return sorted(set(out))


def _tensors_of(model: Any) -> str:
    """Every parameter's and buffer's name, shape, dtype and ``requires_grad``: two models
    of one class at other widths or dtypes compile other kernels."""
    if not isinstance(model, torch.nn.Module):
        return ""
    model = compat.unwrap_compiled(model)
    named = [*model.named_parameters(), *model.named_buffers()]
    return repr([(n, tuple(t.shape), str(t.dtype), t.requires_grad) for n, t in named])


def describe_batch(batch: Any) -> Any:
    """What the compiler guards on, per tensor of a (nested) batch: shape, dtype, device, strides.

    >>> describe_batch({"x": torch.ones(2, 3)})
    [('x', ((2, 3), 'torch.float32', 'cpu', (3, 1)))]
    """
    if isinstance(batch, torch.Tensor):
        return (tuple(batch.shape), str(batch.dtype), str(batch.device), batch.stride())
    if isinstance(batch, dict):
        return sorted((str(k), describe_batch(v)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return [describe_batch(v) for v in batch]
    return type(batch).__name__


def job_key(
    model: Any, step: Any, batches: Mapping[Any, Any] | Iterable[tuple[Any, Any]], extra: str = ""
) -> str:
    """A key for one prewarm job's compile cache: what invalidates compiled code.

    It hashes the torch version, the devices, the code of every module class of
    ``model`` (its source file, or for a class without one, such as a notebook's,
    its name and bytecode) and of ``step``, the name, shape, dtype and ``requires_grad``
    of every parameter and buffer of ``model``, every prewarmed batch's shapes,
    dtypes, devices and strides (``batches`` maps a name to a batch, or yields
    ``(name, batch)`` pairs: each is described as it comes), and ``extra`` (put
    the compile options there: mode, backend, ``fullgraph``). A change in any of
    them gives another key, so a stale cache is never loaded for a changed job.

    >>> a = job_key(torch.nn.Linear(2, 2), None, {8: torch.ones(2, 8)})
    >>> a == job_key(torch.nn.Linear(2, 2), None, {8: torch.ones(2, 8)}), len(a)
    (True, 16)
    >>> a == job_key(torch.nn.Linear(2, 2), None, {16: torch.ones(2, 16)})
    False
    >>> a == job_key(torch.nn.Linear(2, 3), None, {8: torch.ones(2, 8)})  # another width
    False
    """
    h = hashlib.sha256()
    devices = sorted(
        {str(p.device) for p in model.parameters()} if isinstance(model, torch.nn.Module) else []
    )
    if torch.cuda.is_available() and any(d.startswith("cuda") for d in devices):
        devices.append(torch.cuda.get_device_name())
    pairs = batches.items() if isinstance(batches, Mapping) else batches
    shapes = {str(k): describe_batch(v) for k, v in pairs}
    parts = [
        torch.__version__,
        repr(devices),
        *_code_of(model),
        _tensors_of(model),
        *(_code_of(step) if step is not None else []),
        repr(sorted(shapes.items())),
        extra,
    ]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
