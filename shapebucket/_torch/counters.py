"""Dynamo's process-wide counters: graphs, compile events, cache hits, recompile-limit hits, and their reset."""

from __future__ import annotations

from .dynamo import dynamo_module


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

    ind = counters["inductor"]
    return int(ind["fxgraph_cache_hit"]), int(ind["fxgraph_cache_miss"])


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

    dynamo_module().reset()
    for k in [k for k in counters["unimplemented"] if k.startswith(_LIMIT_HIT)]:
        del counters["unimplemented"][k]
