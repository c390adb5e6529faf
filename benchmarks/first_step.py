"""Time from process start to the first training step: eager, compiled cold (empty
caches) and compiled warm (the compile cache a cold run saved, loaded by prewarm's
Cache mode into an empty inductor cache), for 8 buckets and for packing on the bench
GPT (width 128, 2 blocks, vocab 512, max_len 256). ``aot-cold`` and ``aot-warm`` do
the same with ``AotCache`` (every call compiled ahead of time and loaded whole).

    python benchmarks/first_step.py --runs 3 --out /tmp/first_step

Each run is a fresh process; the time is from just before the process is started to
the end of its first training step (prewarm included), the median of ``--runs``;
``after_setup_s`` leaves out what every mode does before compiling (importing torch,
drawing the lengths, fitting the buckets or row lengths, building the model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import sys, time, torch
from shapebucket import prewarm
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.bench.workloads import load_workload
from shapebucket.collate.packed import PackedCollator
from shapebucket.compile import AotCache, Cache
from shapebucket.fit import fit_buckets, fit_packing
from shapebucket.plan import Shape, ShapePlan
how, layout, cache = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
lengths = load_workload("mixture", n=200_000, max_len=256, seed=0)[0]
if layout == "buckets":
    table = list(fit_buckets(lengths, 8, align=8, batching="bucketed", max_len=256))
    rows = {L: 2048 // L for L in table}
else:
    fit = fit_packing(lengths, 8, tokens_per_batch=2048, align=8, model_dim=128)
    table, rows = list(fit.buckets), fit.rows
def make_batch(shape):
    ids = torch.randint(0, 512, (shape.rows, shape.length))
    if layout == "buckets":
        return {"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool)}
    c = PackedCollator([shape.length], rows=shape.rows, mask_key=None, label_shift="none")
    return c([{"input_ids": ids[0], "labels": ids[0]}] * shape.rows)
model = GPT(GPTConfig(vocab=512, dim=128, layers=2, heads=4, max_len=256))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
fwd = model if how == "eager" else torch.compile(model, dynamic=False)
def step(batch):
    fwd(**batch).backward(); opt.step(); opt.zero_grad(set_to_none=True)
plan = ShapePlan.from_function([Shape(rows[L], L) for L in table], make_batch)
print("SETUP", time.time(), flush=True)  # imports, lengths, fit, model: the same in every mode
report = None
if how != "eager":
    mode = AotCache(cache) if how.startswith("aot") else Cache(cache)
    report = prewarm(fwd, plan, step=step, restore=[opt], modes=[mode], progress=False)
step(make_batch(Shape(rows[table[-1]], table[-1])))
print("DONE", time.time(), len(table), report.cache_loaded if report else None,
      sorted(set(report.how.values())) if report else None, flush=True)
"""


def once(how: str, layout: str, cache: str, live: str) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": live}
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, how, layout, cache],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("DONE"))
    setup = float(next(x for x in out.splitlines() if x.startswith("SETUP")).split()[1])
    _, done, shapes, loaded, kinds = line.split(" ", 4)
    return {
        "s": float(done) - t0,
        "after_setup_s": float(done) - setup,
        "shapes": int(shapes),
        "loaded": loaded,
        "how": kinds,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default="/tmp/first_step")
    p.add_argument(
        "--plan",
        default="packed:eager,packed:cold,packed:warm,buckets:eager,buckets:cold,buckets:warm",
        help="layout:how[:runs] items, how one of eager, cold, warm, aot-cold, aot-warm; "
        "warm runs load the cache cold run 0 of their kind saved",
    )
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for item in a.plan.split(","):
        layout, how, *n = item.split(":")
        runs = []
        for i in range(int(n[0]) if n else a.runs):
            kind = "aot-" if how.startswith("aot") else ""
            cache = str(out / f"cache-{kind}{layout}-{i if how.endswith('cold') else 0}")
            live = tempfile.mkdtemp(prefix="inductor-", dir=out)  # always empty
            r = once(how, layout, cache, live)
            runs.append(r)
            print(layout, how, i, r, flush=True)
        key = f"{layout}/{how}"
        results[key] = {
            "median_s": statistics.median(r["s"] for r in runs),
            "median_after_setup_s": statistics.median(r["after_setup_s"] for r in runs),
            "runs": runs,
        }
        print(
            layout,
            how,
            "median",
            results[key]["median_s"],
            results[key]["median_after_setup_s"],
            flush=True,
        )
    (out / "first_step.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
