"""A stream of calls of random batch size and length through the bench GPT, five ways.

    python benchmarks/bucketed_calls.py [--calls 100] [--rounds 3] [--max-rows 16]

The stream is what a loop that owns its batches sends: each call holds 1 to
``--max-rows`` samples (the issue asks for 1 to 64; the default is scaled down to 16
so the run takes a few minutes on a 2-core CPU) of lengths drawn from the built-in
mixture (``shapebucket.data.mixture_lengths``), padded to the call's longest, with an
``attention_mask`` and ``labels`` (-100 on the pads). Each call goes through:

* ``eager``: the model as it is;
* ``compile``: ``torch.compile`` default (it turns dims dynamic after a recompile);
* ``dynamic``: ``torch.compile(dynamic=True)``;
* ``mark_dynamic``: ``torch.compile`` with the rows and the length of every call
  marked dynamic (``shapebucket.compile.mark_dynamic``);
* ``bucketed``: ``BucketedModel(torch.compile(model, dynamic=False), buckets,
  row_buckets)`` prewarmed on its plan: ``--k`` buckets fitted to the calls' lengths,
  row buckets ``--row-buckets`` and ``--max-rows`` (default 4 and 16: 6 shapes).

Each strategy has its own model copy and compiles its own code object (the compiled
strategies each compile a ``fresh_forward`` of its own; the bucketed one compiles the
module), so no compiled graph is shared. For ``--modes eval`` (forward under
``torch.inference_mode``) and ``train`` (forward, backward, SGD step): first the
cold pass (warm-up, i.e. prewarm, plus the whole stream once, its graphs counted),
then ``--rounds`` interleaved rounds of the whole stream (the order rotates each
round). Prints a markdown table per mode: calls/s and useful (real) tokens/s as
median and min-max over the rounds, p50 and p99 call latency over every timed call,
graphs compiled, warm-up seconds, and the whole stream's cold time (warm-up
included). Writes ``--out`` (JSON) and a plot next to it.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import shapebucket
from shapebucket import BucketedModel, fit_buckets
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.bench.runner import fresh_forward
from shapebucket.compile import CompileCounter, Inference, mark_dynamic
from shapebucket.data import mixture_lengths

STRATEGIES = ("eager", "compile", "dynamic", "mark_dynamic", "bucketed")


def make_stream(a: argparse.Namespace) -> list[dict[str, torch.Tensor]]:
    """``--calls`` calls: rows 1..max_rows, lengths from the mixture, padded to the longest."""
    rng = np.random.default_rng(a.seed)
    lengths = mixture_lengths(a.calls * a.max_rows, seed=a.seed)
    g = torch.Generator().manual_seed(a.seed)
    stream, at = [], 0
    for _ in range(a.calls):
        rows = int(rng.integers(1, a.max_rows + 1))
        real = torch.as_tensor(lengths[at : at + rows])
        at += rows
        longest = int(real.max())
        mask = torch.arange(longest)[None, :] < real[:, None]
        ids = torch.randint(0, a.vocab, (rows, longest), generator=g).masked_fill(~mask, 0)
        labels = ids.masked_fill(~mask, -100)
        stream.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return stream


def build(name: str, base: GPT, a: argparse.Namespace, stream: list[dict]) -> dict[str, Any]:
    """The strategy's callable ``run(batch) -> loss`` and its warm-up (prewarm) seconds."""
    model = copy.deepcopy(base)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    warm_up, graphs = 0.0, 0
    if name == "eager":
        call = model
    elif name == "bucketed":
        # fitted to the calls' own lengths (each its longest sample's), as a user would
        buckets = fit_buckets([b["input_ids"].shape[1] for b in stream], k=a.k, align=8)
        row_buckets = sorted({int(r) for r in a.row_buckets.split(",")} | {a.max_rows})
        wrapped = BucketedModel(
            torch.compile(model, dynamic=False), buckets, row_buckets=row_buckets
        )
        t0 = time.perf_counter()
        modes = [Inference()] if a.mode == "eval" else []
        with CompileCounter() as cc:
            shapebucket.prewarm(wrapped, wrapped.plan(stream[0]), modes=modes, progress=False)
        warm_up, graphs = time.perf_counter() - t0, cc.graphs
        call = wrapped
    else:
        forward = fresh_forward(f"{name}_{a.mode}")
        dynamic = {"compile": None, "dynamic": True, "mark_dynamic": None}[name]
        compiled = torch.compile(forward, dynamic=dynamic)

        def call(**batch: Any) -> Any:
            if name == "mark_dynamic":
                for dim in (0, 1):
                    mark_dynamic(batch, dim)
            return compiled(model, batch)

    def run(batch: dict[str, Any]) -> None:
        if a.mode == "eval":
            with torch.inference_mode():
                call(**batch)
            return
        loss = call(**batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"run": run, "warm_up_s": warm_up, "graphs": graphs}


def timed_pass(run: Any, stream: list[dict]) -> list[float]:
    seconds = []
    for batch in stream:
        t0 = time.perf_counter()
        run(batch)
        seconds.append(time.perf_counter() - t0)
    return seconds


def bench_mode(a: argparse.Namespace, stream: list[dict], bar: Any) -> dict[str, dict]:
    torch.manual_seed(a.seed)
    cfg = GPTConfig(vocab=a.vocab, dim=a.dim, layers=a.layers, heads=a.heads, max_len=256)
    base = GPT(cfg).train(a.mode == "train")
    useful = sum(int(b["attention_mask"].sum()) for b in stream)
    results: dict[str, dict] = {}
    runs = {}
    for name in a.strategies:
        bar.set_postfix_str(f"{a.mode}: {name} warm-up and cold pass")
        with CompileCounter() as cc:
            built = build(name, base, a, stream)
            cold = sum(timed_pass(built["run"], stream))
        runs[name] = built["run"]
        results[name] = {
            "warm_up_s": built["warm_up_s"],
            "stream_cold_s": built["warm_up_s"] + cold,
            "graphs": cc.graphs,
            "calls_per_s": [],
            "tokens_per_s": [],
            "latency_s": [],
        }
        bar.update(1)
    for r in range(a.rounds):
        order = list(a.strategies[r % len(a.strategies) :]) + list(
            a.strategies[: r % len(a.strategies)]
        )
        for name in order:
            bar.set_postfix_str(f"{a.mode}: round {r + 1}, {name}")
            with CompileCounter() as cc:
                seconds = timed_pass(runs[name], stream)
            res = results[name]
            res["graphs"] += cc.graphs
            res["calls_per_s"].append(len(stream) / sum(seconds))
            res["tokens_per_s"].append(useful / sum(seconds))
            res["latency_s"] += seconds
            bar.update(1)
    return results


def _fmt(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    med = statistics.median(values) * scale
    lo, hi = min(values) * scale, max(values) * scale
    return f"{med:,.{digits}f} ({lo:,.{digits}f}-{hi:,.{digits}f})"


def table(mode: str, results: dict[str, dict]) -> str:
    lines = [
        f"**{mode}**",
        "",
        "| strategy | calls/s | useful tokens/s | p50 ms | p99 ms | graphs | warm-up s | whole stream s (cold) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lat = np.array(r["latency_s"]) * 1000
        lines.append(
            f"| {name} | {_fmt(r['calls_per_s'], digits=1)} | {_fmt(r['tokens_per_s'])} | "
            f"{np.percentile(lat, 50):.1f} | {np.percentile(lat, 99):.1f} | {r['graphs']} | "
            f"{r['warm_up_s']:.1f} | {r['stream_cold_s']:.1f} |"
        )
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(out["results"])
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.6), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        res = out["results"][mode]
        names = list(res)
        med = [statistics.median(res[n]["tokens_per_s"]) for n in names]
        lo = [m - min(res[n]["tokens_per_s"]) for m, n in zip(med, names, strict=True)]
        hi = [max(res[n]["tokens_per_s"]) - m for m, n in zip(med, names, strict=True)]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color="#4c72b0")
        ax.set_title(f"{mode}: useful tokens/s (median, min-max)")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-rows", type=int, default=16)
    p.add_argument("--k", type=int, default=3, help="buckets for the bucketed strategy")
    p.add_argument("--row-buckets", default="4", help="row buckets (and --max-rows)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--modes", default="eval,train")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/bucketed_calls.json")
    a = p.parse_args()
    a.strategies = a.strategies.split(",")
    unknown = sorted(set(a.strategies) - set(STRATEGIES))
    if unknown:
        p.error(f"unknown strategies {unknown}; choose from {list(STRATEGIES)}")
    warnings.filterwarnings("ignore", message=".*maybe_mark_dynamic.*")
    from tqdm.auto import tqdm

    stream = make_stream(a)
    modes = a.modes.split(",")
    out: dict[str, Any] = {
        "args": vars(a),
        "results": {},
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    t0 = time.perf_counter()
    with tqdm(total=len(modes) * len(a.strategies) * (1 + a.rounds), unit="pass") as bar:
        for mode in modes:
            a.mode = mode
            torch.compiler.reset()  # eval's graphs would count against train's recompile limit
            out["results"][mode] = bench_mode(a, stream, bar)
    out["total_s"] = time.perf_counter() - t0
    useful = sum(int(b["attention_mask"].sum()) for b in stream)
    print(
        f"\n{len(stream)} calls, {useful:,} useful tokens; rows 1-{a.max_rows}, {out['total_s']:.0f} s in all\n"
    )
    for mode, res in out["results"].items():
        print(table(mode, res) + "\n")
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    plot(out, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")


if __name__ == "__main__":
    main()
