"""Where a cold prewarm's time goes: the bench GPT, the mixture's 8 fitted buckets.

Each way of compiling runs in a fresh process with an empty inductor cache:

* ``static``: ``torch.compile(model, dynamic=False)``, each bucket's first
  training step timed in three parts: the forward (dynamo trace + inductor
  compile + run), the backward (AOT backward compile + run), the AdamW step;
  then the same step again, already compiled, for comparison;
* ``regional``: ``compile_regions(model, dynamic=False)`` (the two blocks
  share one compiled graph per bucket; embeddings, head and loss stay eager),
  prewarmed with ``shapebucket.prewarm``;
* ``packed``: the mixture packed by ``fit_packing`` (4 row lengths),
  ``torch.compile(model, dynamic=False)``, prewarmed with ``shapebucket.prewarm``.

    python benchmarks/prewarm_breakdown.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(mode: str) -> None:
    import torch

    import shapebucket
    from shapebucket.bench.model import GPT, GPTConfig
    from shapebucket.compile import compile_regions
    from shapebucket.data import mixture_lengths
    from shapebucket.plan.shapes import Shape, ShapePlan

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=512, dim=128, layers=2, heads=4, max_len=256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lengths = mixture_lengths(200_000)
    out: dict = {"mode": mode}
    if mode == "packed":
        fit = shapebucket.fit_packing(lengths, 8, tokens_per_batch=1536, model_dim=128)
        collate = shapebucket.PackedCollator(
            fit.buckets, rows=fit.rows, label_shift="none", mask_key=None
        )
        buckets, rows = fit.buckets, fit.rows

        def make_batch(n: int) -> dict:
            ids = torch.randint(0, 512, (n,))
            batch = collate([{"input_ids": ids, "labels": ids}])
            return collate.repad(batch, Shape(rows[n], n))
    else:
        buckets = shapebucket.fit_buckets(lengths, 8, align=8, batching="bucketed", max_len=256)

        def make_batch(n: int) -> dict:
            ids = torch.randint(0, 512, (64, n))
            return {
                "input_ids": ids,
                "labels": ids,
                "attention_mask": torch.ones(64, n, dtype=torch.bool),
            }

    def step(run, batch):
        run(**batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out["buckets"] = list(buckets)
    start = time.perf_counter()
    if mode == "static":
        run = torch.compile(model, dynamic=False, fullgraph=True)
        parts = {}
        for n in buckets:
            batch = make_batch(n)
            t0 = time.perf_counter()
            loss = run(**batch)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            step(run, batch)
            t4 = time.perf_counter()
            parts[n] = [t1 - t0, t2 - t1, t3 - t2, t4 - t3]
        out["parts"] = parts
    else:
        if mode == "regional":
            compile_regions(model, dynamic=False, fullgraph=True)
            run = model
        else:
            run = torch.compile(model, dynamic=False, fullgraph=True)
        plan = ShapePlan.from_function([(64, n) for n in buckets], lambda s: make_batch(s.length))
        report = shapebucket.prewarm(
            run, plan, step=lambda b: step(run, b), restore=[opt], progress=False
        )
        out["seconds"] = {str(s.length): v for s, v in report.seconds.items()}
        out["verify_s"] = report.verify_seconds
        out["graphs"] = report.total_graphs
    out["total_s"] = time.perf_counter() - start
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("static", "regional", "packed"):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / mode)}
            got = subprocess.run(
                [sys.executable, __file__, "--child", mode],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[mode] = json.loads(got.strip().splitlines()[-1])
    s = results["static"]
    print(f"static graphs, buckets {s['buckets']}, batch 64, one training step each (cold):")
    print(f"  {'bucket':>6s} {'forward s':>9s} {'backward s':>10s} {'AdamW s':>8s} {'again s':>8s}")
    tot = [0.0, 0.0, 0.0, 0.0]
    for n, parts in s["parts"].items():
        tot = [a + b for a, b in zip(tot, parts, strict=True)]
        print(f"  {n:>6s} {parts[0]:>9.2f} {parts[1]:>10.2f} {parts[2]:>8.2f} {parts[3]:>8.3f}")
    print(
        f"  {'total':>6s} {tot[0]:>9.2f} {tot[1]:>10.2f} {tot[2]:>8.2f} {tot[3]:>8.3f}   (all {s['total_s']:.1f} s)"
    )
    for mode in ("regional", "packed"):
        r = results[mode]
        per = ", ".join(f"{k}: {v:.1f}" for k, v in r["seconds"].items())
        print(
            f"{mode}: prewarm {sum(r['seconds'].values()):.1f} s ({per}), verify {r['verify_s']:.1f} s, "
            f"{r['graphs']} graphs, buckets {r['buckets']}"
        )


if __name__ == "__main__":
    main()
