"""Every use of torch's private compiler APIs lives here (``AotCache``'s at the end).

shapebucket supports torch >= 2.11 (:mod:`shapebucket._torch_version` holds the floor
and the features that need a newer torch); nothing here falls back to older releases.
A torch upgrade that moves one of these names touches this file only (the wording of its recompile messages, which is not a
public API either: :mod:`shapebucket.compile.messages`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import os
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ._torch_version import check_floor, recompile_limit_fix  # noqa: F401 (modes.py asks the seam)

# no __all__: every name here is shapebucket's own seam to a private torch API

check_floor()


def _dynamo() -> Any:
    import torch._dynamo

    return torch._dynamo


def get_recompile_limit() -> int:
    """Dynamo's per-code-object recompile limit (8 by default)."""
    return int(_dynamo().config.recompile_limit)


def set_recompile_limit(value: int) -> int:
    """Set the global recompile limit; returns the previous value. Prefer
    :func:`raised_recompile_limit`, which puts it back."""
    config = _dynamo().config
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
    config = _dynamo().config
    old, old_accumulated = int(config.recompile_limit), int(config.accumulated_recompile_limit)
    if at_least <= old:
        yield None
        return
    set_recompile_limit(at_least)
    try:
        yield old
    finally:
        config.recompile_limit = old
        config.accumulated_recompile_limit = old_accumulated


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


def unique_graphs() -> int:
    """Graphs dynamo compiled in this process so far (``torch._dynamo.reset`` does not clear it)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def compile_events() -> int:
    """Timed compiler phases recorded in this process so far (dynamo's
    ``compilation_time_metrics``): it grows whenever the compiler works, also for work
    no new dynamo graph counts (a lazily compiled backward, a recompile's lowering)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(len(v) for v in compilation_time_metrics.values())


def inductor_cache_counts() -> tuple[int, int]:
    """Inductor's FX-graph cache hits and misses in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]), int(
        counters["inductor"]["fxgraph_cache_miss"]
    )


def mark_dynamic_dim(
    t: torch.Tensor, dim: int, *, strict: bool, min: int | None, max: int | None
) -> None:
    """``mark_dynamic`` with its range when ``strict``, else ``maybe_mark_dynamic`` (no range)."""
    d = _dynamo()
    if strict:
        kwargs = {k: v for k, v in (("min", min), ("max", max)) if v is not None}
        d.mark_dynamic(t, dim, **kwargs)
    else:
        # maybe_mark_dynamic takes no range in any supported torch release.
        d.maybe_mark_dynamic(t, dim)


def skip_frame_only(fn: Any) -> Any:
    """Mark ``fn``'s own frames never to be compiled, while the functions it calls still
    are (``torch._dynamo.decorators.skip``; the public ``torch.compiler.disable(fn,
    recursive=False)`` wraps ``fn`` in a skipped frame but compiles ``fn``'s own). Returns
    ``fn``."""
    from torch._dynamo.decorators import skip

    return skip(fn)


@functools.lru_cache(maxsize=64)
def _size_predicates(sizes: tuple[int, ...]) -> list[Any]:
    return [lambda s, n=n: s == n for n in sizes]


def mark_dynamic_specialized(t: torch.Tensor, dim: int, sizes: Sequence[int]) -> None:
    """Mark ``dim`` dynamic with one specialisation per size in ``sizes``: one dynamic trace,
    a kernel compiled for each listed size, and the generic kernel for any other size.
    The predicates are made once per set of sizes, so every batch carries the same ones."""
    _dynamo().mark_dynamic(t, dim, specialize_on=_size_predicates(tuple(sizes)))


@contextlib.contextmanager
def add_recompile_handler(handler: logging.Handler) -> Iterator[None]:
    """Send dynamo's ``recompiles`` log records to ``handler`` for the block.

    Turns the artifact on the way ``TORCH_LOGS=recompiles`` does, and restores the
    previous logging state afterwards.
    """
    from torch._logging import _internal

    logger = logging.getLogger("torch._dynamo.guards.__recompiles")
    state = _internal.log_state
    was_enabled = state.is_artifact_enabled("recompiles")
    if not was_enabled:
        state.enable_artifact("recompiles")
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
        if not was_enabled:
            state.artifact_names.discard("recompiles")


def inductor_cache_dir() -> str:
    """Directory inductor keeps compiled kernels and FX graphs in."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return str(cache_dir())


def save_cache_artifacts() -> bytes | None:
    """The compiler's portable cache artifacts of this process (``None``: nothing to save)."""
    result = torch.compiler.save_cache_artifacts()
    return None if result is None else result[0]


def load_cache_artifacts(data: bytes) -> bool:
    """Load the compiler's cache artifacts; False when it could not read them (torch logs
    a warning and returns None for corrupt bytes; that log is silenced here)."""
    logger = logging.getLogger("torch.compiler._cache")
    old = logger.disabled
    logger.disabled = True
    try:
        return torch.compiler.load_cache_artifacts(data) is not None
    finally:
        logger.disabled = old


def clear_cache_artifacts() -> None:
    """Forget the cache artifacts recorded so far, so the next :func:`save_cache_artifacts`
    holds only what was compiled after this call (one shape's artifacts at a time)."""
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()


def cache_hit_counts() -> dict[str, int]:
    """AOTAutograd and FX-graph cache hits and misses in this process so far: a graph whose
    compiled code came from a loaded cache counts an ``aot_hit`` (forward and backward)."""
    from torch._dynamo.utils import counters

    aot, ind = counters["aot_autograd"], counters["inductor"]
    return {
        "aot_hit": int(aot["autograd_cache_hit"]),
        "aot_miss": int(aot["autograd_cache_miss"]),
        "fx_hit": int(ind["fxgraph_cache_hit"]),
        "fx_miss": int(ind["fxgraph_cache_miss"]),
    }


def set_compile_threads(n: int) -> None:
    """Inductor's pool of compile workers (not part of its cache key): 1 compiles in-process."""
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = int(n)


@contextlib.contextmanager
def fresh_inductor_cache(directory: str) -> Iterator[None]:
    """Compile into an empty inductor cache for the block (and clear in-memory caches),
    so each benchmark strategy pays its own cold compile."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    with temporary_cache_dir(directory):
        yield


_LIMIT_HIT = "Dynamo recompile limit exceeded"


def recompile_limit_hits() -> int:
    """How many times a compiled function hit the recompile limit in this process (since
    :func:`reset_compiler`), from dynamo's own counters: no handler needs to be installed."""
    from torch._dynamo.utils import counters

    return sum(n for k, n in counters["unimplemented"].items() if k.startswith(_LIMIT_HIT))


def reset_compiler() -> None:
    """Forget every compiled graph (``torch._dynamo.reset``) and the recompile-limit hits
    counted so far (the functions that hit it compile again)."""
    from torch._dynamo.utils import counters

    _dynamo().reset()
    for k in [k for k in counters["unimplemented"] if k.startswith(_LIMIT_HIT)]:
        del counters["unimplemented"][k]


_LIMIT_LOGGER = "torch._dynamo.convert_frame"


@contextlib.contextmanager
def add_limit_handler(handler: logging.Handler) -> Iterator[None]:
    """Send dynamo's 'hit config.recompile_limit' warnings to ``handler`` for the block."""
    logger = logging.getLogger(_LIMIT_LOGGER)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


@contextlib.contextmanager
def automatic_dynamic(enabled: bool) -> Iterator[None]:
    """Switch dynamo's automatic dynamic shapes (what ``dynamic=None`` does after a
    recompile) on or off for the block."""
    config = _dynamo().config
    old = config.automatic_dynamic_shapes
    config.automatic_dynamic_shapes = enabled
    try:
        yield
    finally:
        config.automatic_dynamic_shapes = old


# -- the compiler's recompile messages -----------------------------------------------


def is_specialization_source_error(error: BaseException) -> bool:
    """Whether ``error`` is dynamo failing to find a ``specialize_on`` dim among its graph
    inputs (``TensorPropertySource(...) is not in list``): torch keeps one source of equal
    dynamic sizes as the graph's input, and which one depends on the model (a ``[B, L]``
    mask's for ``x * mask[:, None]``, a ``[B, F, L]`` value's behind a transpose and a
    ``Linear``); a specialisation on the other source is not found."""
    from torch._dynamo.exc import InternalTorchDynamoError

    text = str(error)
    return (
        isinstance(error, InternalTorchDynamoError)
        and "TensorPropertySource" in text
        and "is not in list" in text
    )


# -- ahead-of-time compiled calls (compile.aot.AotCache) -------------------------------------

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
        with _dynamo().config.patch(automatic_dynamic_shapes=False):
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
