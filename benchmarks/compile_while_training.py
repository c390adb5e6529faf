"""Compile while training against compile-first (prewarm) and eager, on the bench GPT.

    python benchmarks/compile_while_training.py --steps 400 --repeats 2

Each strategy runs in a fresh interpreter with an empty inductor cache (its own cold
compile), on the same fixed batches (the first ``--steps`` batches of one epoch of
the bench mixture, bucketed with ``fit_buckets(k)`` and ``BucketBatchSampler``,
collated before the clock starts). The clock starts when the strategy starts (before
``prewarm`` or ``compile_in_background``); it records the time to the end of the
first step, the time until every shape is compiled (prewarm's end; the background's
last shape loaded), the whole job (``--steps`` steps, warm-up included) and each
step's seconds. The background process is pinned to one core; the training process
uses torch's default thread count. Prints a markdown table (median and min-max over
``--repeats``) and writes the records to ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

from shapebucket import BucketBatchSampler, BucketCollator, ShapePlan, fit_buckets, no_recompiles
from shapebucket.bench.batching import make_samples
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.compile import compile_in_background, prewarm
from shapebucket.data import mixture_lengths

STRATEGIES = ("eager", "compile-first", "compile-while-training")
KEYS = ["input_ids", "labels"]


def _setup(a: argparse.Namespace) -> tuple[Any, ShapePlan, BucketBatchSampler, list[dict]]:
    lengths = np.minimum(mixture_lengths(a.samples, seed=a.seed), a.max_len)
    buckets = fit_buckets(lengths, a.k, align=8, batching="bucketed", max_len=a.max_len)
    sampler = BucketBatchSampler(lengths, buckets, rows=a.batch_size, seed=a.seed)
    collate = BucketCollator(buckets, sequence_keys=KEYS, rows=sampler.rows)
    get = make_samples(lengths, a.vocab, a.seed, None)
    batches = [collate(get(b)) for b, _ in zip(sampler, range(a.steps), strict=False)]
    cfg = GPTConfig(vocab=a.vocab, dim=a.dim, layers=a.layers, heads=a.heads, max_len=a.max_len)
    return functools.partial(GPT, cfg), ShapePlan.of(collate, sampler), sampler, batches


def _train(model: torch.nn.Module, batches: list[dict], t0: float) -> tuple[list, list]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, ends = [], []
    for batch in batches:
        loss = model(**batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        ends.append(time.perf_counter() - t0)
    return losses, ends


def run_one(a: argparse.Namespace) -> dict[str, Any]:
    """One strategy in this process (its own fresh inductor cache, set by the caller)."""
    build, plan, sampler, batches = _setup(a)
    torch.manual_seed(a.seed)
    model = build()
    out: dict[str, Any] = {
        "strategy": a.run,
        "threads": torch.get_num_threads(),
        "shapes": len(plan),
    }
    t0 = time.perf_counter()
    if a.run == "eager":
        losses, ends = _train(model, batches, t0)
        out["all_compiled_s"] = 0.0
    elif a.run == "compile-first":
        compiled = torch.compile(model, dynamic=False)
        prewarm(compiled, plan, batches[0], progress=False)
        out["all_compiled_s"] = time.perf_counter() - t0
        with no_recompiles(plan):
            losses, ends = _train(compiled, batches, t0)
    else:
        with compile_in_background(build, plan, batches[0], model=model, sampler=sampler) as bg:
            losses, ends = _train(bg.model, batches, t0)
            job = ends[-1]
            bg.wait()  # for the record only: the job ended at `job`
            out["all_compiled_s"] = bg.report.all_ready_seconds
            out["report"] = bg.report.to_dict()
            out["switched"] = bg.report.num_switched
        ends[-1] = job
    out.update(first_step_s=ends[0], job_s=ends[-1], step_ends=ends, losses=losses)
    return out


def _summary(runs: list[dict[str, Any]]) -> list[str]:
    def cell(key: str, rs: list[dict[str, Any]], scale: float = 1.0) -> str:
        xs = [r[key] * scale for r in rs if r.get(key) is not None]
        if not xs:
            return "-"
        return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"

    lines = [
        "| strategy | first step s | every shape compiled s | whole job s | steady step ms |",
        "|---|---|---|---|---|",
    ]
    for name in STRATEGIES:
        rs = [r for r in runs if r["strategy"] == name]
        if not rs:
            continue
        for r in rs:  # the median step of the last quarter: compiled (or eager) steady state
            steps = np.diff(np.asarray(r["step_ends"]))
            r["steady_step_s"] = float(np.median(steps[-max(1, len(steps) // 4) :]))
        lines.append(
            f"| {name} | {cell('first_step_s', rs)} | {cell('all_compiled_s', rs)} | "
            f"{cell('job_s', rs)} | {cell('steady_step_s', rs, 1e3)} |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", choices=STRATEGIES, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--out", default="compile_while_training.json")
    a = p.parse_args()
    if a.run is not None:
        record = run_one(a)
        with open(f"{a.out}.{a.run}.json", "w") as f:  # each run's record as soon as it ends
            json.dump(record, f)
        print(json.dumps(record))
        return
    runs = []
    for r in range(a.repeats):
        for name in a.strategies.split(","):
            with tempfile.TemporaryDirectory(prefix="cwt-inductor-") as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                args = [sys.executable, __file__, *sys.argv[1:], "--run", name]
                done = subprocess.run(args, env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    print(done.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{name} failed")
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(f"repeat {r} {name}: job {runs[-1]['job_s']:.1f} s", file=sys.stderr)
    eager = [r for r in runs if r["strategy"] == "eager"]
    for r in runs:
        if eager:
            r["max_loss_diff_vs_eager"] = float(
                np.max(np.abs(np.asarray(r["losses"]) - np.asarray(eager[0]["losses"])))
            )
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "cpus": os.cpu_count(), "runs": runs}, f)
    print("\n".join(_summary(runs)))


if __name__ == "__main__":
    main()
