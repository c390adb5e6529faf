"""Whole-model vs regional compilation: prewarm of a 12-layer Hugging Face decoder.

Two fresh processes, each with its own empty TORCHINDUCTOR_CACHE_DIR, prewarm
the same buckets (forward and backward) of a Llama decoder built from a config
(no download): one with ``torch.compile(model, dynamic=False)``, one with
``compile_regions(model, dynamic=False)`` (each of the 12 decoder
layers compiled in place; they share one compiled graph per bucket). Prints the
prewarm seconds, graphs, and the ratio.

    python benchmarks/regional_compile.py [--buckets 32,64] [--layers 12]
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


def child(mode: str, buckets: list[int], layers: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import shapebucket
    from shapebucket.compile import compile_regions
    from shapebucket.plan.shapes import ShapePlan

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=max(buckets),
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    if mode == "whole":
        run = torch.compile(model, dynamic=False)
    else:
        compile_regions(model, dynamic=False)
        run = model

    def make_batch(n: int) -> dict:
        ids = torch.randint(0, 256, (4, n))
        return {"input_ids": ids, "labels": ids}

    start = time.perf_counter()
    plan = ShapePlan.from_function([(4, n) for n in buckets], lambda s: make_batch(s.length))
    report = shapebucket.prewarm(run, plan, progress=False)
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "mode": mode,
                "prewarm_s": report.total_seconds,
                "with_verify_s": seconds,
                "graphs": report.total_graphs,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--buckets", default="32,64")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    buckets = [int(x) for x in args.buckets.split(",")]
    if args.child:
        child(args.child, buckets, args.layers)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("whole", "regional"):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / mode)}
            cmd = [
                sys.executable,
                __file__,
                "--buckets",
                args.buckets,
                "--layers",
                str(args.layers),
            ]
            out = subprocess.run(
                [*cmd, "--child", mode], env=env, check=True, capture_output=True, text=True
            ).stdout
            results[mode] = json.loads(out.strip().splitlines()[-1])
    whole, regional = results["whole"], results["regional"]
    print(
        f"prewarm of buckets {buckets} (batch 4, forward + backward), Llama decoder with "
        f"{args.layers} layers built from a config, each mode in a fresh process and empty cache"
    )
    print(f"{'':22s} {'prewarm s':>9s} {'+verify s':>9s} {'graphs':>6s}")
    for label, r in (("torch.compile(model)", whole), ("compile_regions(model)", regional)):
        print(f"{label:22s} {r['prewarm_s']:>9.2f} {r['with_verify_s']:>9.2f} {r['graphs']:>6d}")
    print(f"whole / regional prewarm: {whole['prewarm_s'] / regional['prewarm_s']:.1f}x")


if __name__ == "__main__":
    main()
