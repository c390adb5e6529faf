"""Dynamo: its configuration (the recompile limit, automatic dynamic shapes), its
compile-start callbacks, what ``torch.compile`` returns for a module, and the loader of
dynamo itself."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch


def dynamo_module() -> Any:
    """``torch._dynamo``, imported at first use (``import shapebucket`` loads no compiler)."""
    import torch._dynamo

    return torch._dynamo


def get_recompile_limit() -> int:
    """Dynamo's per-code-object recompile limit (8 by default)."""
    return int(dynamo_module().config.recompile_limit)


def set_recompile_limit(value: int) -> int:
    """Set the global recompile limit; returns the previous value. Prefer
    :func:`raised_recompile_limit`, which puts it back."""
    config = dynamo_module().config
    old = int(config.recompile_limit)
    config.recompile_limit = int(value)
    # The accumulated limit caps all recompiles of one code object across guards.
    if config.accumulated_recompile_limit < value:
        config.accumulated_recompile_limit = int(value)
    return old


@contextlib.contextmanager
def raised_recompile_limit(at_least: int) -> Iterator[int | None]:
    """Raise dynamo's global recompile limit to ``at_least`` for the block if lower; yields
    the limit it raised from (``None``: high enough), puts both back on exit, also on error.

    >>> with raised_recompile_limit(get_recompile_limit() + 1) as was:
    ...     get_recompile_limit() == was + 1
    True
    >>> get_recompile_limit() == was
    True
    """
    config = dynamo_module().config
    old = int(config.recompile_limit)
    if at_least <= old:
        yield None
        return
    accumulated = max(at_least, int(config.accumulated_recompile_limit))
    with config.patch(recompile_limit=at_least, accumulated_recompile_limit=accumulated):
        yield old


def automatic_dynamic(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """Switch dynamo's automatic dynamic shapes (what ``dynamic=None`` does after a
    recompile) on or off for the block."""
    return dynamo_module().config.patch(automatic_dynamic_shapes=enabled)


def frame_callback_getter() -> Any:
    """The C function that returns dynamo's frame callback: set (not ``None`` or ``False``)
    inside a ``torch.compile``'d call, where ``torch.compiler.set_stance`` raises. A C
    function, so that a caller inside a compiled region can ask without dynamo tracing a
    Python frame of it."""
    from torch._C._dynamo.eval_frame import get_eval_frame_callback

    return get_eval_frame_callback


def fresh_forward(tag: str) -> Callable[[Any, dict[str, Any]], Any]:
    """``forward(model, batch) = model(**batch)`` with a code object of its own.

    Dynamo keys its graph cache and its recompile limit on the code object, so
    compiling this function once per strategy keeps each strategy's graphs (and
    its recompile count) to itself, with no compiler reset between them.

    >>> a, b = fresh_forward("a"), fresh_forward("b")
    >>> a.__code__ is b.__code__, a(lambda x: x + 1, {"x": 1})
    (False, 2)
    """

    def forward(model: Any, batch: dict[str, Any]) -> Any:
        return model(**batch)

    name = "forward_" + "".join(c if c.isalnum() else "_" for c in tag)
    code = forward.__code__.replace(co_name=name)  # a new code object, its own cache
    return types.FunctionType(code, forward.__globals__, name)


@contextlib.contextmanager
def on_compile_start(callback: Callable[[str, bool], None]) -> Iterator[None]:
    """Call ``callback(compile_id, backward)`` whenever the compiler starts work inside the
    block: a dynamo frame (``backward=False``) or the lazy compile of the backward graph of
    the frame ``compile_id`` names (``backward=True``). An exception the callback raises
    stops that compile and reaches the caller (of ``backward()`` for a backward graph).
    The callback is removed on exit."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    kinds = {CallbackTrigger.DYNAMO: False, CallbackTrigger.LAZY_BACKWARD: True}

    def start(args: Any) -> None:
        backward = kinds.get(args.callback_trigger)
        if backward is not None:
            callback(str(args.compile_id), backward)

    callback_handler.register_start_callback(start)
    try:
        yield
    finally:
        callback_handler.remove_start_callback(start)


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
