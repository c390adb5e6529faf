"""What ``torch.compile`` returns for a module: recognise it and reach the module it wraps."""

from __future__ import annotations

from typing import Any

import torch


def is_compiled_module(obj: Any) -> bool:
    """Whether ``obj`` is what ``torch.compile(module)`` returns (an ``OptimizedModule``)."""
    return isinstance(obj, torch.nn.Module) and hasattr(obj, "_orig_mod")


def unwrap_compiled(obj: Any) -> Any:
    """The module a ``torch.compile``'d module wraps (its ``_orig_mod``); anything else as it is.

    >>> m = torch.nn.Linear(2, 2)
    >>> unwrap_compiled(torch.compile(m)) is m, unwrap_compiled(m) is m
    (True, True)
    """
    return getattr(obj, "_orig_mod", obj) if is_compiled_module(obj) else obj
