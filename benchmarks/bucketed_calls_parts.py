"""The parts of ``benchmarks/bucketed_calls.py``: the streams of calls, the models, the
strategies (:data:`STRATEGY_BUILDERS`: a new strategy joins by adding a builder there)
and the wrapper's own host time per call.

Imported by the benchmark from its own folder (``python benchmarks/bucketed_calls.py``
puts ``benchmarks/`` on ``sys.path``); it is not part of the package.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import shapebucket
from shapebucket import BucketedModel
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.bench.runner import fresh_forward
from shapebucket.bucketed import fit_calls, graphs
from shapebucket.compile import CudaGraphs, Inference
from shapebucket.data import mixture_lengths


@dataclass(frozen=True)
class Stream:
    """Calls of 1 to ``max_rows`` samples; lengths are the mixture (6..256) times
    ``scale``, capped at ``max_len``; each call padded to its longest (by the caller)."""

    max_rows: int
    max_len: int
    scale: int


#: the issue's two streams: compute-bound (large) and overhead-bound (small) calls
STREAMS = {"large": Stream(max_rows=64, max_len=1024, scale=4), "small": Stream(8, 256, 1)}

#: the bench GPT's sizes: a small one for a CPU, the issue's realistic one for a GPU
MODELS = {
    "small": {"vocab": 512, "dim": 64, "layers": 2, "heads": 4},
    "realistic": {"vocab": 16384, "dim": 1024, "layers": 4, "heads": 16},
}


def call_lengths(stream: Stream, calls: int, seed: int) -> list[np.ndarray]:
    """The real lengths of ``calls`` calls (one array per call, one length per row)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(calls):
        rows = int(rng.integers(1, stream.max_rows + 1))
        lengths = mixture_lengths(rows, seed=int(rng.integers(1 << 31))) * stream.scale
        out.append(np.minimum(lengths, stream.max_len))
    return out


def make_calls(
    lengths: list[np.ndarray], vocab: int, device: str, seed: int
) -> list[dict[str, torch.Tensor]]:
    """The calls a loop with its own collator sends: ids, a boolean mask and labels (-100
    on the pads), padded to the call's longest, on ``device``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for real in lengths:
        rows, longest = len(real), int(real.max())
        mask = torch.arange(longest)[None, :] < torch.as_tensor(real)[:, None]
        ids = torch.randint(0, vocab, (rows, longest), generator=g).masked_fill(~mask, 0)
        batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(~mask, -100)}
        out.append({k: v.to(device) for k, v in batch.items()})
    return out


def build_model(a: argparse.Namespace) -> GPT:
    """The bench GPT of ``--model``, long enough for the stream, in bf16 on CUDA."""
    torch.manual_seed(a.seed)
    cfg = GPTConfig(**MODELS[a.model], max_len=max(STREAMS[s].max_len for s in a.streams))
    model = GPT(cfg).train(a.mode == "train").to(a.device)
    return model.to(torch.bfloat16) if a.device == "cuda" else model


# -- the strategies -------------------------------------------------------------------


@dataclass
class Strategy:
    """A strategy ready to run: ``call(**batch)`` returns the loss; ``tokens_run`` (when
    the strategy counts its own) is the tokens it has run so far, else the caller's
    ``rows x length`` are what ran."""

    call: Callable[..., Any]
    tokens_run: Callable[[], int] | None = None
    info: dict[str, Any] | None = None


@dataclass
class Context:
    """What a builder gets: the arguments, the stream and the warm-up calls (a separate
    sample of the same stream, never the timed calls)."""

    args: argparse.Namespace
    stream: Stream
    warm_calls: list[dict[str, torch.Tensor]]
    warm_lengths: list[np.ndarray]


def compile_with(fn: Any, a: argparse.Namespace, **options: Any) -> Any:
    """``torch.compile(fn, **options)`` with ``--backend``; a ``mode`` only means something
    to inductor, so another backend (``eager``, for the tests) drops it."""
    if a.backend != "inductor":
        options.pop("mode", None)
    return torch.compile(fn, backend=a.backend, **options)


def _compiled(name: str, model: torch.nn.Module, ctx: Context, **options: Any) -> Strategy:
    """``torch.compile`` of a code object of the strategy's own (no graph shared)."""
    compiled = compile_with(fresh_forward(f"{name}_{ctx.args.mode}"), ctx.args, **options)
    return Strategy(lambda **batch: compiled(model, batch))


def build_eager(model: torch.nn.Module, ctx: Context) -> Strategy:
    return Strategy(model)


def build_dynamic(model: torch.nn.Module, ctx: Context) -> Strategy:
    return _compiled("dynamic", model, ctx, dynamic=True)


def build_compile(model: torch.nn.Module, ctx: Context) -> Strategy:
    return _compiled("compile", model, ctx)


def build_reduce_overhead(model: torch.nn.Module, ctx: Context) -> Strategy:
    return _compiled("reduce_overhead", model, ctx, mode="reduce-overhead")


def fitted_shapes(ctx: Context, packed_row_length: int | None = None) -> Any:
    """``fit_calls`` on the warm-up calls and one call at the stream's limits (the
    longest call the loop can send, which a user knows: a fresh call may be longer
    than any warm-up call, and the plan must hold it)."""
    limit = (ctx.stream.max_rows, ctx.stream.max_len)
    return fit_calls(
        [*ctx.warm_calls, limit],
        k=ctx.args.k,
        row_k=ctx.args.row_k,
        align=8,
        packed_row_length=packed_row_length,
    )


def own_forward(model: torch.nn.Module, tag: str) -> torch.nn.Module:
    """``model`` with a ``forward`` of its own code object (same signature and body), so
    that two strategies compiling the same module class keep their graphs (and their
    recompile counts) apart: dynamo keys both on the code object."""
    cls = type(model)
    fn = cls.forward
    code = fn.__code__.replace(co_name=f"forward_{tag}")
    fresh = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    fresh.__kwdefaults__, fresh.__annotations__ = fn.__kwdefaults__, fn.__annotations__
    model.__class__ = type(f"{cls.__name__}_{tag}", (cls,), {"forward": fresh})
    return model


def _wrapped(
    model: torch.nn.Module, ctx: Context, shapes: Any, packing: bool, graphs: bool = False
) -> Strategy:
    a = ctx.args
    tag = f"{'packed' if packing else 'padded'}{'_graphs' if graphs else ''}"
    model = own_forward(model, f"{tag}_{len(shapes.buckets)}_{a.mode}")
    buckets, row_buckets = list(shapes.buckets), list(shapes.row_buckets)
    # the wrapper's own graphs need the default mode inside (reduce-overhead records its own)
    mode = "reduce-overhead" if a.device == "cuda" and not graphs else "default"
    wrapped = BucketedModel(
        compile_with(model, a, dynamic=False, mode=mode),
        buckets,
        row_buckets=row_buckets,
        packing=packing,
        graphs=graphs,
    )
    modes: list[Any] = [Inference()] if a.mode == "eval" else []
    modes += [CudaGraphs()] if a.device == "cuda" and not graphs else []
    shapebucket.prewarm(wrapped, wrapped.plan(ctx.warm_calls[0]), modes=modes, progress=False)
    info = {"fit": str(shapes)}
    return Strategy(wrapped, tokens_run=lambda: wrapped.stats.padded_tokens, info=info)


def build_bucketed(model: torch.nn.Module, ctx: Context) -> Strategy:
    """The padding wrapper around ``torch.compile(dynamic=False)`` (``reduce-overhead``
    on CUDA), shapes from :func:`fitted_shapes`, prewarmed on its plan."""
    return _wrapped(model, ctx, fitted_shapes(ctx), packing=False)


def build_bucketed_packed(model: torch.nn.Module, ctx: Context) -> Strategy:
    """The packing wrapper on the padding fit's shapes: each call's samples packed into
    rows of the bucket that holds its longest sample, the rows padded to a row bucket."""
    return _wrapped(model, ctx, fitted_shapes(ctx), packing=True)


def build_bucketed_packed_one(model: torch.nn.Module, ctx: Context) -> Strategy:
    """The packing wrapper on one row length (the stream's longest, rounded up to 8) and
    row buckets fitted on the calls' packed rows (``fit_calls(packed_row_length=)``)."""
    row_length = -(-ctx.stream.max_len // 8) * 8
    return _wrapped(model, ctx, fitted_shapes(ctx, row_length), packing=True)


def build_bucketed_graphs(model: torch.nn.Module, ctx: Context) -> Strategy:
    """The padding wrapper around ``torch.compile(dynamic=False)`` in the default mode,
    replaying its own CUDA graphs (``graphs=True``: ``--modes eval`` calls, under
    ``inference_mode``, replay; ``train`` calls run without graphs), prewarmed on its
    plan (which captures each shape's graph before the stream). CUDA only."""
    return _wrapped(model, ctx, fitted_shapes(ctx), packing=False, graphs=True)


def build_bucketed_packed_graphs(model: torch.nn.Module, ctx: Context) -> Strategy:
    """:func:`build_bucketed_graphs` with packed calls (as ``bucketed-packed``). CUDA only."""
    return _wrapped(model, ctx, fitted_shapes(ctx), packing=True, graphs=True)


#: strategy name -> builder(model copy, context) -> Strategy; a new strategy joins here.
STRATEGY_BUILDERS: dict[str, Callable[[torch.nn.Module, Context], Strategy]] = {
    "eager": build_eager,
    "dynamic": build_dynamic,
    "compile": build_compile,
    "reduce-overhead": build_reduce_overhead,
    "bucketed": build_bucketed,
    "bucketed-packed": build_bucketed_packed,
    "bucketed-packed-one": build_bucketed_packed_one,
    "bucketed-graphs": build_bucketed_graphs,
    "bucketed-packed-graphs": build_bucketed_packed_graphs,
}
#: the strategies that capture CUDA graphs: skipped, with the reason printed, off CUDA
CUDA_ONLY = ("bucketed-graphs", "bucketed-packed-graphs")


# -- the wrapper's own host time ------------------------------------------------------


class Echo(torch.nn.Module):
    """A model that does nothing: returns its input, so a call's time is the host's."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return input_ids


class PackedEcho(torch.nn.Module):
    """:class:`Echo` that takes ``document_ids``: the wrapper packs its calls."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return input_ids


def _call_times_us(
    fn: Callable[..., Any], batches: list[dict[str, Any]], warm: int, n: int
) -> list[float]:
    """The wall time of ``n`` calls after ``warm``, cycling through ``batches``."""
    for i in range(warm):
        fn(**batches[i % len(batches)])
    out = []
    for i in range(n):
        batch = batches[(warm + i) % len(batches)]
        t0 = time.perf_counter_ns()
        fn(**batch)
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def _fresh_lengths(rows: int, length: int, count: int) -> list[dict[str, Any]]:
    """``count`` calls of ``rows x length`` whose real lengths differ call to call (1 to
    ``length``, seeded), so that a packing wrapper plans a new layout for nearly every one."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        real = torch.randint(1, length + 1, (rows,), generator=g)
        mask = (torch.arange(length)[None, :] < real[:, None]).long()
        out.append(
            {"input_ids": torch.ones(rows, length, dtype=torch.long), "attention_mask": mask}
        )
    return out


def host_time(calls: int, warm: int) -> list[dict[str, Any]]:
    """The wrapper's time per call around :class:`Echo` against the bare module: a 1-row
    call (1 x 8, padded to 2 x 16) and a 16-row call (16 x 24, padded to 16 x 32); and
    around :class:`PackedEcho`, whose calls it packs (1 x 8 into 2 x 16; 16 x 24 into
    16 x 32, each sample a row). The same call repeats, so a packing wrapper plans its
    layout once; "packed, fresh lengths" is 16 x 24 calls whose real lengths change
    every call (a layout planned nearly every call: best fit, index grids); and with
    ``graphs=True`` on the emulated capture (``graphs.emulated_capture``: no CUDA graph
    on a CPU; its replay runs the module again and copies its outputs in place, so the
    row is the wrapper's work around a replay, the key, the copy in, the cut and the
    clones, not a CUDA replay's cost)."""
    bare = Echo()
    wrapped = BucketedModel(bare, [16, 32], row_buckets=[2, 16])
    packed = BucketedModel(PackedEcho(), [16, 32], row_buckets=[2, 16])
    graphed = BucketedModel(bare, [16, 32], row_buckets=[2, 16], graphs=True)
    rows = []
    for r, length in [(1, 8), (16, 24)]:
        batch = {
            "input_ids": torch.ones(r, length, dtype=torch.long),
            "attention_mask": torch.ones(r, length, dtype=torch.long),
        }
        ways = [("bare module", bare, [batch]), ("BucketedModel", wrapped, [batch])]
        ways.append(("packed", packed, [batch]))
        if r > 1:
            fresh = _fresh_lengths(r, length, calls + warm)
            ways.append(("packed, fresh lengths", packed, fresh))
        ways.append(("graphs: emulated replay (CPU)", graphed, [batch]))
        with torch.inference_mode(), _emulated_graphs():
            for name, fn, batches in ways:
                t = _call_times_us(fn, batches, warm, calls)
                rows.append(
                    {
                        "call": f"{r} x {length}",
                        "what": name,
                        "median_us": statistics.median(t),
                        "p99_us": float(np.percentile(t, 99)),
                        "calls": calls,
                    }
                )
    return rows


@contextlib.contextmanager
def _emulated_graphs() -> Iterator[None]:
    """``graphs.capture`` replaced by ``graphs.emulated_capture`` for the block."""
    real = graphs.capture
    graphs.capture = graphs.emulated_capture
    try:
        yield
    finally:
        graphs.capture = real


# -- the plot ---------------------------------------------------------------------------


def plot(out: dict[str, Any], path: Any) -> None:
    """Per stream: useful tokens/s (median, min-max over the rounds) and the share of
    the tokens each strategy ran that were real, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(out["results"])
    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 3.6 * len(runs)), squeeze=False)
    for (speed, share), run in zip(axes, runs, strict=True):
        res = out["results"][run]
        names = list(res)
        med = [statistics.median(res[n]["tokens_per_s"]) for n in names]
        lo = [m - min(res[n]["tokens_per_s"]) for m, n in zip(med, names, strict=True)]
        hi = [max(res[n]["tokens_per_s"]) - m for m, n in zip(med, names, strict=True)]
        speed.bar(names, med, yerr=[lo, hi], capsize=4, color="#4c72b0")
        speed.set_title(f"{run}: useful tokens/s (median, min-max)")
        real = [100 * res[n]["tokens_real"] / res[n]["tokens_run"] for n in names]
        share.bar(names, real, color="#55a868")
        share.set_title(f"{run}: tokens run that were real (%)")
        for ax in (speed, share):
            ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
