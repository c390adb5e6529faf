"""Ahead-of-time compiled calls (dynamo's ``aot_compile_fullgraph``) for ``AotCache``: compile, guard, run, serialise."""

from __future__ import annotations

import copy
import functools
import pickle
from collections.abc import Sequence
from typing import Any

from .dynamo import automatic_dynamic, unwrap_compiled

AOT_MISS = object()  # what aot_call returns when the function's guards reject the call


_CODE_GUARDS = {
    "MODULE_MATCH",
    "BUILTIN_MATCH",
    "CLOSURE_MATCH",
    "FUNCTION_MATCH",
    "DUPLICATE_INPUT",
}


def has_hooks(compiled: Any) -> bool:
    """Whether ``compiled``'s module has hooks an ahead-of-time ``forward`` would skip: its
    own forward or backward hooks, or global ones."""
    from torch.nn.modules import module as nn_module

    m = unwrap_compiled(compiled)
    own = m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
    return bool(own) or nn_module._has_any_global_hook()


def aot_compile_call(compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One call of the ``torch.compile``'d module ``compiled`` compiled ahead of time
    (dynamo's experimental ``aot_compile_fullgraph``) with the module's own backend: one
    whole static graph of these inputs (and its backward under grad) in the current grad
    and autocast state, with its own guards; run it with :func:`aot_call`."""
    from torch._dynamo.aot_compile import aot_compile_fullgraph
    from torch._dynamo.eval_frame import innermost_backend

    ctx, module = compiled.dynamo_ctx, unwrap_compiled(compiled)
    # a copy: torch sets its guard filter, which drops every guard on a global, on the hooks
    hooks, backend = copy.copy(ctx._hooks), innermost_backend(ctx.callback)
    dropped: list[str] = []
    hooks.guard_filter_fn = functools.partial(_aot_guards, dropped=dropped)
    grads = {p: p.grad for p in module.parameters()}  # saved .grads would not load back
    try:
        for p in grads:
            p.grad = None
        with automatic_dynamic(False):
            fn = aot_compile_fullgraph(
                module.forward, (args, kwargs), hooks, backend, dynamic=False
            )
    finally:
        for p, g in grads.items():
            p.grad = g
    if dropped:  # a loaded function would not see these globals change: refuse, not guess
        raise RuntimeError(f"the model reads global variables it would not guard ({dropped})")
    return fn


def _aot_guards(entries: Sequence[Any], dropped: list[str]) -> list[bool]:
    """torch's filter for ahead-of-time functions (no guard on a global, none it cannot
    save); each global the model reads as a value, not as code, goes to ``dropped``."""
    from torch._dynamo.guards import CheckFunctionManager

    for g in entries:
        # dynamo's own globals, torch, and a global function's defaults or code: not values
        internal = g.name.startswith(("G['__", "G['torch']")) or ".__" in g.name
        if g.is_global and not internal and g.guard_type not in _CODE_GUARDS:
            dropped.append(g.name)
    unsaved = CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES
    return [not (g.is_global or g.guard_type in unsaved) for g in entries]


def aot_call(fn: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(module, *args, **kwargs)`` if its guards accept the call, else ``AOT_MISS``."""
    return fn.fn(module, *args, **kwargs) if fn.guard_check(module, *args, **kwargs) else AOT_MISS


def aot_serialize(functions: Sequence[Any]) -> bytes:
    """The functions as bytes (their code refers to inductor's cache: save it too)."""
    from torch._dynamo.aot_compile import AOTCompiledFunction

    return pickle.dumps([AOTCompiledFunction.serialize(f).serialized_data for f in functions])


def aot_deserialize(data: bytes) -> list[Any]:
    """What :func:`aot_serialize` wrote (read only from a cache its manifest checked)."""
    from torch._dynamo import convert_frame
    from torch._dynamo.aot_compile import AOTCompiledFunction
    from torch._dynamo.utils import get_metrics_context
    from torch._guards import CompileContext, compile_context

    out = []
    for item in pickle.loads(data):
        with (
            compile_context(CompileContext(convert_frame.get_compile_id({}))),
            get_metrics_context(),
        ):
            out.append(AOTCompiledFunction.deserialize(item))
    return out
