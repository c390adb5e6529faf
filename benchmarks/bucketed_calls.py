"""Streams of calls of random batch size and length through the bench GPT, several ways.

    python benchmarks/bucketed_calls.py [--stream small|large|large,small] [--model small|realistic]
        [--device cpu|cuda] [--calls 24] [--rounds 3] [--modes eval] [--json PATH]
    python benchmarks/bucketed_calls.py --host-time [--host-calls 2000]

The streams are what a loop that owns its batches sends (issue 36): each call holds
1 to 64 samples of lengths up to 1,024 (``--stream large``: compute-bound calls) or 1
to 8 samples of lengths up to 256 (``--stream small``: overhead-bound calls), drawn
from the built-in mixture (``shapebucket.data.mixture_lengths``, times 4 for the
large stream), padded by the caller to its longest, with an ``attention_mask`` and
``labels`` (-100 on the pads). Every round sends **fresh calls** (new random calls of
the same distribution, seeded per round), as a serving or evaluation loop does.

The strategies (``STRATEGY_BUILDERS`` in ``bucketed_calls_parts.py``, where more join;
``--strategies`` picks, ``eager`` too, the model as it is):

* ``dynamic``: ``torch.compile(dynamic=True)``;
* ``compile``: ``torch.compile`` default (it turns dims dynamic after a recompile);
* ``reduce-overhead``: ``torch.compile(mode="reduce-overhead")`` alone (CUDA graphs on
  CUDA; on a CPU it is the default compile);
* ``bucketed``: the padding wrapper, ``BucketedModel(torch.compile(model,
  dynamic=False), packing=False)`` (``mode="reduce-overhead"`` on CUDA), its buckets
  and row buckets from ``fit_calls`` on a separate warm-up sample of calls (``--k``,
  ``--row-k``) and one call at the stream's limits (rows and length: the plan must
  hold any fresh call), prewarmed on its plan;
* ``bucketed-packed``: the same shapes, ``packing=True``: each call's samples packed
  into rows of the bucket that holds its longest, rows padded to a row bucket;
* ``bucketed-packed-one``: ``packing=True`` on one row length (the stream's longest)
  and row buckets fitted on the calls' packed rows (``fit_calls(packed_row_length=)``).
* ``bucketed-graphs``, ``bucketed-packed-graphs``: ``bucketed`` and ``bucketed-packed``
  around ``torch.compile(model, dynamic=False)`` in the default mode, with
  ``graphs=True``: the wrapper's own CUDA graphs, one per planned shape, captured in the
  prewarm and replayed for the ``--modes eval`` calls. CUDA only: skipped, with the
  reason printed, on a CPU.

Each strategy has its own model copy and its own compiled code (no graph shared); it
first runs the ``--warm-calls`` warm-up calls (compiling what it compiles), then
``--rounds`` rounds of ``--calls`` fresh calls, interleaved (the order rotates each
round). ``--modes eval`` is a forward under ``torch.inference_mode``; ``train`` adds
backward and an SGD step. Reported per strategy: useful (real) tokens/s as the median
(min-max) over the rounds, p50 and p99 call latency over every timed call, graphs
compiled in the warm-up and **during the stream**, the warm-up seconds, and the share
of the tokens it ran that were real (the caller's padding for the compile modes; the
wrapper's own count, ``stats.padded_tokens``, for the wrappers). On CUDA the model is
bf16 and every call is synchronised before its time is taken. Writes ``--json`` and,
next to it, a plot (``.png``): useful tokens/s and the real token share per strategy.

``--host-time`` measures the wrapper's own work per call instead: ``BucketedModel``
around a module that returns its input, a 1-row call (1 x 8, padded to 2 x 16) and a
16-row call (16 x 24, padded to 16 x 32), median and p99 over ``--host-calls`` calls
after warm-up, against calling the bare module; and around one that takes
``document_ids``, whose calls it packs (the same call repeated, and 16 x 24 calls
whose real lengths change every call).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bucketed_calls_parts, also via runpy
import bucketed_calls_parts as parts

from shapebucket.compile import CompileCounter

DEFAULT_STRATEGIES = (
    "dynamic",
    "compile",
    "reduce-overhead",
    "bucketed",
    "bucketed-packed",
    "bucketed-packed-one",
    "bucketed-graphs",
    "bucketed-packed-graphs",
)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def runner(a: argparse.Namespace, strategy: parts.Strategy, model: torch.nn.Module) -> Any:
    """``run(batch)``: one call of the mode (eval: forward; train: forward, backward, SGD)."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def run(batch: dict[str, Any]) -> None:
        if a.mode == "eval":
            with torch.inference_mode():
                strategy.call(**batch)
            return
        loss = strategy.call(**batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run


def timed_pass(run: Any, calls: list[dict], device: str) -> list[float]:
    seconds = []
    for batch in calls:
        _sync(device)
        t0 = time.perf_counter()
        run(batch)
        _sync(device)
        seconds.append(time.perf_counter() - t0)
    return seconds


def warm_up(a: argparse.Namespace, name: str, base: torch.nn.Module, ctx: parts.Context) -> dict:
    """Build strategy ``name`` on a copy of ``base`` and run the warm-up calls through it."""
    model = copy.deepcopy(base)
    t0 = time.perf_counter()
    with CompileCounter() as cc:
        strategy = parts.STRATEGY_BUILDERS[name](model, ctx)
        run = runner(a, strategy, model)
        timed_pass(run, ctx.warm_calls, a.device)
    result = {
        "warm_up_s": time.perf_counter() - t0,
        "graphs_warm_up": cc.graphs,
        "graphs_stream": 0,
        "tokens_per_s": [],
        "latency_s": [],
        "tokens_run": 0,
        "tokens_real": 0,
        **(strategy.info or {}),
    }
    return {"run": run, "strategy": strategy, "result": result}


def bench_stream(a: argparse.Namespace, stream_name: str, base: torch.nn.Module) -> dict:
    """Every strategy on one stream: warm-up, then ``--rounds`` rounds of fresh calls."""
    stream = parts.STREAMS[stream_name]
    warm_lengths = parts.call_lengths(stream, a.warm_calls, seed=a.seed + 10_000)
    warm = parts.make_calls(warm_lengths, base.cfg.vocab, a.device, seed=a.seed + 10_000)
    ctx = parts.Context(a, stream, warm, warm_lengths)
    built = {}
    for name in a.strategies:
        _progress(f"{stream_name}/{a.mode}: {name} warm-up")
        built[name] = warm_up(a, name, base, ctx)
    for r in range(a.rounds):
        lengths = parts.call_lengths(stream, a.calls, seed=a.seed + 1 + r)
        calls = parts.make_calls(lengths, base.cfg.vocab, a.device, seed=a.seed + 1 + r)
        real = int(sum(x.sum() for x in lengths))
        caller = sum(len(x) * int(x.max()) for x in lengths)
        shift = r % len(a.strategies)
        for name in [*a.strategies[shift:], *a.strategies[:shift]]:
            _progress(f"{stream_name}/{a.mode}: round {r + 1}, {name}")
            b, res = built[name], built[name]["result"]
            counted = b["strategy"].tokens_run
            before = counted() if counted else 0
            with CompileCounter() as cc:
                seconds = timed_pass(b["run"], calls, a.device)
            res["graphs_stream"] += cc.graphs
            res["tokens_per_s"].append(real / sum(seconds))
            res["latency_s"] += seconds
            res["tokens_run"] += counted() - before if counted else caller
            res["tokens_real"] += real
    return {name: b["result"] for name, b in built.items()}


def _progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def _fmt(values: list[float]) -> str:
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{med:,.0f} ({lo:,.0f}-{hi:,.0f})"


def table(title: str, results: dict[str, dict]) -> str:
    lines = [
        f"**{title}**",
        "",
        "| strategy | useful tokens/s | p50 ms | p99 ms | graphs: warm-up / stream | "
        "tokens real / run | warm-up s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lat = np.array(r["latency_s"]) * 1000
        lines.append(
            f"| {name} | {_fmt(r['tokens_per_s'])} | {np.percentile(lat, 50):.2f} | "
            f"{np.percentile(lat, 99):.2f} | {r['graphs_warm_up']} / {r['graphs_stream']} | "
            f"{r['tokens_real'] / r['tokens_run']:.1%} | {r['warm_up_s']:.1f} |"
        )
    for name, r in results.items():
        if "fit" in r:
            lines += [
                "",
                f"{name}: fit_calls on the warm-up calls and one all-real call at the stream's "
                f"limits (counted in its efficiency): {r['fit']}",
            ]
    return "\n".join(lines)


def host_table(rows: list[dict]) -> str:
    lines = ["| call | what | median µs | p99 µs |", "|---|---|---|---|"]
    lines += [
        f"| {r['call']} | {r['what']} | {r['median_us']:.1f} | {r['p99_us']:.1f} |" for r in rows
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--stream", default="small", help="large, small, or both: large,small")
    p.add_argument("--model", choices=sorted(parts.MODELS), default="small")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--calls", type=int, default=24, help="fresh calls per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warm-calls", type=int, default=32, help="warm-up calls (and fit_calls')")
    p.add_argument("--k", type=int, default=3, help="length buckets of the bucketed strategy")
    p.add_argument("--row-k", type=int, default=3, help="row buckets of the bucketed strategy")
    p.add_argument("--modes", default="eval", help="eval, train, or both: eval,train")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="inductor", help="torch.compile backend (eager: tests)")
    p.add_argument("--host-time", action="store_true", help="the wrapper's host time per call")
    p.add_argument("--host-calls", type=int, default=2000)
    p.add_argument("--host-warm", type=int, default=200)
    p.add_argument("--json", default="results/bucketed_calls.json")
    a = p.parse_args(argv)
    a.streams = a.stream.split(",")
    a.strategies = a.strategies.split(",")
    for what, names, known in [
        ("streams", a.streams, parts.STREAMS),
        ("strategies", a.strategies, parts.STRATEGY_BUILDERS),
    ]:
        unknown = sorted(set(names) - set(known))
        if unknown:
            p.error(f"unknown {what} {unknown}; choose from {sorted(known)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but torch sees no CUDA device")
    skipped = [n for n in a.strategies if n in parts.CUDA_ONLY and a.device != "cuda"]
    if skipped:
        print(
            f"skipped {', '.join(skipped)}: CUDA graphs capture CUDA work only (--device cuda)",
            file=sys.stderr,
        )
        a.strategies = [n for n in a.strategies if n not in skipped]
    if not a.strategies:
        p.error("no strategy left to run on this device")
    if min(a.calls, a.rounds, a.warm_calls, a.host_calls) < 1:
        p.error("--calls, --rounds, --warm-calls and --host-calls must be >= 1")
    return a


def run_streams(a: argparse.Namespace, out: dict[str, Any], save: Any) -> None:
    """Every mode and stream; ``save()`` after each, so a run stopped by its time limit
    keeps the streams it finished."""
    warnings.filterwarnings("ignore", message=".*maybe_mark_dynamic.*")
    for mode in a.modes.split(","):
        a.mode = mode
        base = parts.build_model(a)
        for stream_name in a.streams:
            torch.compiler.reset()  # one stream's graphs would count against the next's limit
            out["results"][f"{stream_name}/{mode}"] = bench_stream(a, stream_name, base)
            save()


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    out: dict[str, Any] = {
        "args": dict(vars(a)),
        "machine": _machine(a.device),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "results": {},
    }
    path = Path(a.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def save() -> None:
        out["total_s"] = time.perf_counter() - t0
        path.write_text(json.dumps(out, indent=1, default=str))

    if a.host_time:
        out["host_time"] = parts.host_time(a.host_calls, a.host_warm)
        head = f"host time per call ({a.host_calls} calls after {a.host_warm} warm-up)"
        print(f"\n{head}, {out['machine']}\n\n" + host_table(out["host_time"]))
    else:
        run_streams(a, out, save)
        print(
            f"\n{out['machine']}; {a.model} model; {a.rounds} rounds of {a.calls} fresh "
            f"calls, {a.warm_calls} warm-up calls\n"
        )
        for key, res in out["results"].items():
            s = parts.STREAMS[key.split("/")[0]]
            print(table(f"{key}: 1-{s.max_rows} rows, lengths to {s.max_len}", res) + "\n")
    save()
    if out.get("results"):
        parts.plot(out, path.with_suffix(".png"))
    print(f"{out['total_s']:.0f} s in all; wrote {path}")


def _machine(device: str) -> str:
    import os

    if device == "cuda":
        where = torch.cuda.get_device_name(0)
    else:
        cpuinfo = Path("/proc/cpuinfo")
        names = [
            line.split(":", 1)[1].strip()
            for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
            if line.startswith("model name")
        ]
        where = names[0] if names else "cpu"
    return f"torch {torch.__version__}, {device} ({where}, {os.cpu_count()} CPUs)"


if __name__ == "__main__":
    main()
