"""Cold vs warm prewarm: does a saved compile cache make a fresh process start fast?

Runs three fresh processes, each with its own empty TORCHINDUCTOR_CACHE_DIR:

1. cold: prewarm 4 buckets of the benchmark GPT, then ``save_compile_cache``;
2. warm: ``load_compile_cache`` (artifacts + inductor directory), then prewarm;
3. artifacts only: load just ``torch.compiler``'s cache artifacts, then prewarm;
4. and 5. the same job twice with ``prewarm(cache_dir=...)``: the first run
   compiles and saves, the second (same job, fresh process, empty inductor
   directory) loads by itself;

and prints the prewarm seconds of each, the cold/warm ratios, and how prewarm
says each bucket was compiled.

    python benchmarks/compile_cache.py [--buckets 32,64,128,256]
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


def child(mode: str, cache: str, buckets: list[int]) -> None:
    import torch

    import shapebucket
    from shapebucket.bench.model import GPT, GPTConfig
    from shapebucket.compile import Cache, load_compile_cache, save_compile_cache
    from shapebucket.plan.shapes import ShapePlan

    if mode == "warm":
        load_compile_cache(cache)
    elif mode == "artifacts":
        data = (Path(cache) / "artifacts.bin").read_bytes()
        torch.compiler.load_cache_artifacts(data)
    torch.manual_seed(0)
    model = GPT(GPTConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model, dynamic=False, fullgraph=True)

    def step(batch: dict[str, torch.Tensor]) -> None:
        fwd(**batch).backward()
        opt.step()
        opt.zero_grad()

    def make_batch(n: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 512, (16, n))
        return {
            "input_ids": ids,
            "labels": ids,
            "attention_mask": torch.ones(16, n, dtype=torch.bool),
        }

    start = time.perf_counter()
    plan = ShapePlan.from_function([(16, n) for n in buckets], lambda s: make_batch(s.length))
    jobs = Path(cache).parent / "jobs"
    report = shapebucket.prewarm(
        fwd,
        plan,
        step=step,
        restore=[opt],
        modes=[Cache(jobs, "dynamic=False fullgraph=True")] if mode.startswith("job") else [],
        verify=False,
        progress=False,
    )
    seconds = time.perf_counter() - start
    saved = save_compile_cache(cache) if mode == "cold" else {}
    how = sorted(set(report.how.values()))
    print(
        json.dumps(
            {"mode": mode, "prewarm_s": seconds, "graphs": report.total_graphs, "how": how, **saved}
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--buckets", default="32,64,128,256")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    buckets = [int(x) for x in args.buckets.split(",")]
    if args.child:
        child(args.child[0], args.child[1], buckets)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "saved")
        for mode in ("cold", "warm", "artifacts", "job-first", "job-second"):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / f"inductor-{mode}")}
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, __file__, "--buckets", args.buckets, "--child", mode, cache],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[mode] = json.loads(out.strip().splitlines()[-1])
            results[mode]["process_s"] = time.perf_counter() - t0
    cold, warm, art = results["cold"], results["warm"], results["artifacts"]
    first, second = results["job-first"], results["job-second"]
    print(
        f"prewarm of {len(buckets)} buckets {buckets}, benchmark GPT (fwd + bwd + AdamW), each in a fresh process"
    )
    print(f"{'':30s} {'prewarm s':>9s} {'process s':>9s} {'graphs':>6s}  how")
    for label, r in (
        ("cold (empty cache)", cold),
        ("warm (load_compile_cache)", warm),
        ("artifacts only", art),
        ("prewarm(cache_dir), 1st run", first),
        ("prewarm(cache_dir), 2nd run", second),
    ):
        print(
            f"{label:30s} {r['prewarm_s']:>9.2f} {r['process_s']:>9.2f} {r['graphs']:>6d}  "
            f"{'/'.join(r['how'])}"
        )
    print(
        f"saved cache: {cold['artifacts_bytes'] / 1e6:.1f} MB artifacts, {cold['inductor_bytes'] / 1e6:.1f} MB inductor directory"
    )
    print(
        f"cold / warm prewarm: {cold['prewarm_s'] / warm['prewarm_s']:.1f}x; cold / artifacts-only: {cold['prewarm_s'] / art['prewarm_s']:.1f}x; "
        f"cache_dir 1st / 2nd run: {first['prewarm_s'] / second['prewarm_s']:.1f}x "
        f"(process: {first['process_s'] / second['process_s']:.1f}x)"
    )


if __name__ == "__main__":
    main()
