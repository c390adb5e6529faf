"""Packing against padding, per workload: real tokens, dense-attention efficiency, shapes.

For each workload (the mixture, the stdlib-docstring text, a lognormal) it prints
the token efficiency of length-grouped batches padded to the longest rounded to 8
(transformers' group_by_length), of BucketBatchSampler with 8 fitted buckets,
and of packing with fit_packing's row lengths (k=8), each with its number of
distinct batch shapes over one epoch; then fit_packing's candidate table. Last,
how long packing one epoch of 10 million lengths takes.

    python benchmarks/packing_efficiency.py [--batch-size 64] [--dim 128] [--plan-n 10000000]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from shapebucket import BucketBatchSampler, fit_buckets, fit_packing
from shapebucket._lengths import round_up
from shapebucket.bench.peers import length_grouped_indices
from shapebucket.bench.workloads import stdlib_docstring_lengths
from shapebucket.data import mixture_lengths
from shapebucket.fit.packing import pack_epoch


def workloads(max_len: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    lognormal = np.clip(np.round(rng.lognormal(mean=3.3, sigma=0.8, size=200_000)), 2, None)
    return {
        "mixture": mixture_lengths(200_000, seed=0),
        "text": np.minimum(stdlib_docstring_lengths(), max_len),
        "lognormal": np.minimum(lognormal.astype(np.int64), max_len),
    }


def grouped(lengths: np.ndarray, batch_size: int) -> tuple[float, int]:
    order = length_grouped_indices(lengths, batch_size, seed=0)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    shapes = [(len(b), round_up(int(lengths[b].max()), 8)) for b in batches]
    return float(lengths.sum()) / sum(r * n for r, n in shapes), len(set(shapes))


def bucketed(lengths: np.ndarray, batch_size: int, max_len: int) -> tuple[float, int]:
    buckets = fit_buckets(lengths, 8, align=8, batching="bucketed", max_len=max_len)
    sampler = BucketBatchSampler(lengths, buckets, rows=batch_size)
    rows = sampler.rows
    used = sampler.batch_buckets().tolist()
    computed = sum(rows[b] * b for b in used)  # short batches padded to full rows (rows)
    return float(lengths.sum()) / computed, len(set(used))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dim", type=int, default=128, help="model width for fit_packing's cost")
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--plan-n", type=int, default=10_000_000, help="0: skip the planning time")
    args = p.parse_args()
    for name, lengths in workloads(args.max_len).items():
        longest = round_up(int(lengths.max()), 8)
        tokens = round_up(math.ceil(args.batch_size * float(lengths.mean())), longest)
        fit = fit_packing(lengths, 8, tokens_per_batch=tokens, model_dim=args.dim)
        g_eff, g_shapes = grouped(lengths, args.batch_size)
        b_eff, b_shapes = bucketed(lengths, args.batch_size, args.max_len)
        r = fit.report
        print(
            f"\n{name}: {len(lengths):,} samples, mean {lengths.mean():.1f}, max {lengths.max()}; "
            f"packing budget {tokens} tokens per batch"
        )
        print(f"  {'strategy':<34s} {'real tokens':>11s} {'attention':>9s} {'shapes':>6s}")
        print(
            f"  {'length-grouped, pad to longest x8':<34s} {g_eff:>11.1%} {'':>9s} {g_shapes:>6d}"
        )
        print(f"  {'BucketBatchSampler, 8 buckets':<34s} {b_eff:>11.1%} {'':>9s} {b_shapes:>6d}")
        label = f"packed {list(fit.buckets)}"
        print(
            f"  {label:<34s} {r.token_efficiency:>11.1%} {r.attention_efficiency:>9.1%} {r.num_shapes:>6d}"
        )
        print(fit.table())
    if not args.plan_n:
        return
    lengths = mixture_lengths(args.plan_n, seed=1)
    for window in (16384, 262144):
        t0 = time.perf_counter()
        packed = pack_epoch(
            lengths, [32, 64, 128, 256], {32: 48, 64: 24, 128: 12, 256: 6}, window=window
        )
        dt = time.perf_counter() - t0
        print(
            f"\npacking one epoch of {args.plan_n:,} mixture lengths (window {window:,}): "
            f"{dt:.1f} s, {len(packed):,} batches, {packed.report.token_efficiency:.2%} real tokens"
        )


if __name__ == "__main__":
    main()
