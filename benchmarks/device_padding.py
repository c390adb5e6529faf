"""Host padding vs device-side padding: host time and bytes per batch.

For batches of the mixture workload (batch 64, 8 fitted buckets, input_ids and
labels as int64), it times on the host, in interleaved rounds, what a DataLoader
worker does per batch: ``collate(samples)`` (pads on the host) against
``collate.flat(samples)`` (no padding), and the bytes each sends; then, on
``--device``, the time to move the batch there and, for the flat form, to
finish it (``FlatBatch.finish``: triton on CUDA, torch indexing on CPU).

    python benchmarks/device_padding.py [--device cuda] [--batches 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from shapebucket import BucketBatchSampler, BucketCollator, fit_buckets
from shapebucket.data import mixture_lengths


def nbytes(x) -> int:
    if isinstance(x, dict):
        return sum(nbytes(v) for v in x.values())
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if hasattr(x, "values") and hasattr(x, "lengths"):
        return nbytes(x.values) + nbytes(x.lengths) + nbytes(x.stacked)
    return 0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    lengths = mixture_lengths(50_000)
    buckets = fit_buckets(lengths, 8, align=8, batching="bucketed", max_len=256)
    sampler = BucketBatchSampler(lengths, buckets, rows=64)
    collate = BucketCollator(buckets, rows=sampler.rows)
    rng = np.random.default_rng(0)
    batches = []
    for idx in list(sampler)[: args.batches]:
        samples = []
        for i in idx:
            ids = torch.from_numpy(rng.integers(0, 32000, int(lengths[i])))
            samples.append({"input_ids": ids, "labels": ids.clone()})
        batches.append(samples)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {
        k: [] for k in ("host pad", "host flat", "move padded", "move + finish flat")
    }
    sizes = {"padded": 0, "flat": 0}
    for r in range(args.rounds):
        t0 = time.perf_counter()
        padded = [collate(b) for b in batches]
        t1 = time.perf_counter()
        flats = [collate.flat(b) for b in batches]
        t2 = time.perf_counter()
        for b in padded:
            {k: v.to(device, non_blocking=True) for k, v in b.items()}
        sync()
        t3 = time.perf_counter()
        for f in flats:
            f.to(device, non_blocking=True).finish()
        sync()
        t4 = time.perf_counter()
        for key, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            times[key].append(dt / len(batches) * 1000)
        if r == 0:
            sizes["padded"] = sum(nbytes(b) for b in padded) // len(batches)
            sizes["flat"] = sum(nbytes(f) for f in flats) // len(batches)
    print(
        f"{len(batches)} mixture batches of 64, buckets {list(buckets)}, device {device}, {args.rounds} rounds"
    )
    for key, t in times.items():
        print(
            f"  {key:<20s} {statistics.median(t):7.3f} ms/batch (min {min(t):.3f}, max {max(t):.3f})"
        )
    print(
        f"  bytes per batch: padded {sizes['padded']:,}, flat {sizes['flat']:,} "
        f"({sizes['flat'] / sizes['padded']:.0%})"
    )


if __name__ == "__main__":
    main()
