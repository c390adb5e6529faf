"""Token efficiency over one epoch: BucketBatchSampler vs random batches.

Counts real tokens / computed tokens (batch rows x padded length) over an epoch
of the project's length mixture, for random batches padded to their longest
sample, random batches padded to fitted buckets, and BucketBatchSampler with
fitted buckets (with and without pad rows from ``rows``).

    python benchmarks/sampler_efficiency.py [--n 200000] [--batch-size 64]
"""

from __future__ import annotations

import argparse

import numpy as np

from shapebucket import BucketBatchSampler, fit_buckets
from shapebucket.data import mixture_lengths


def efficiency(lengths: np.ndarray, batches: list[np.ndarray], padded_len, rows=None) -> float:
    real = sum(int(lengths[b].sum()) for b in batches)
    computed = sum((rows(b) if rows else len(b)) * padded_len(b) for b in batches)
    return real / computed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--align", type=int, default=8)
    args = parser.parse_args()
    lengths = mixture_lengths(args.n, seed=0)
    B = args.batch_size
    perm = np.random.default_rng(0).permutation(args.n)
    random_batches = [perm[i : i + B] for i in range(0, args.n, B)]
    fitted_random = fit_buckets(lengths, args.k, align=args.align, batching="random", batch_size=B)
    fitted = fit_buckets(lengths, args.k, align=args.align, batching="bucketed")
    sampler = BucketBatchSampler(lengths, fitted, rows=B, seed=0)
    bucket_batches = [np.asarray(b) for b in sampler]
    promoted = [
        np.asarray(b)
        for b in BucketBatchSampler(lengths, fitted, rows=B, seed=0, leftovers="promote")
    ]

    def longest(b: np.ndarray) -> int:
        return int(lengths[b].max())

    def fitted_len(b: np.ndarray) -> int:
        return fitted.bucket_for(longest(b))

    def full_rows(b: np.ndarray) -> int:
        return B

    rows = [
        ("random batches, pad to longest", efficiency(lengths, random_batches, longest)),
        (
            f"random batches, fitted-for-random {fitted_random!r}",
            efficiency(lengths, random_batches, lambda b: fitted_random.bucket_for(longest(b))),
        ),
        (f"BucketBatchSampler, {fitted!r}", efficiency(lengths, bucket_batches, fitted_len)),
        (
            "  same, short batches padded with rows",
            efficiency(lengths, bucket_batches, fitted_len, rows=full_rows),
        ),
        (
            '  leftovers="promote", rows',
            efficiency(lengths, promoted, fitted_len, rows=full_rows),
        ),
    ]
    print(
        f"{args.n:,} samples of the mixture, batch {B}, k={args.k}, align={args.align}; {sampler.stats}"
    )
    for name, eff in rows:
        print(f"{eff:7.1%}  {name}")


if __name__ == "__main__":
    main()
