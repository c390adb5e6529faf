"""Samples/sec of BucketCollator vs the common recipe (per-sample F.pad + stack).

Both collate the same batches, in one process, interleaved round by round; the
ratio is the median over rounds, so machine noise hits both sides alike.

    python benchmarks/collate_throughput.py [--rounds 15] [--batches 50]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from shapebucket import BucketCollator, Buckets
from shapebucket.data import mixture_lengths


def common_recipe(samples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """What most training scripts do: pad each sample to the batch's longest length
    (rounded up to 8) with F.pad, then stack."""
    longest = max(len(s["input_ids"]) for s in samples)
    target = -(-longest // 8) * 8
    out = {}
    for key, pad in (("input_ids", 0), ("labels", -100)):
        out[key] = torch.stack(
            [F.pad(torch.as_tensor(s[key]), (0, target - len(s[key])), value=pad) for s in samples]
        )
    out["attention_mask"] = torch.stack(
        [
            F.pad(
                torch.ones(len(s["input_ids"]), dtype=torch.bool), (0, target - len(s["input_ids"]))
            )
            for s in samples
        ]
    )
    return out


def make_batches(
    n_batches: int, batch_size: int, as_tensors: bool, seed: int = 0
) -> list[list[dict[str, Any]]]:
    lengths = mixture_lengths(n_batches * batch_size, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(n_batches):
        batch = []
        for n in lengths[b * batch_size : (b + 1) * batch_size]:
            ids = torch.randint(0, 32_000, (int(n),), generator=gen)
            batch.append(
                {"input_ids": ids, "labels": ids.clone()}
                if as_tensors
                else {"input_ids": ids.tolist(), "labels": ids.tolist()}
            )
        batches.append(batch)
    return batches


def samples_per_sec(
    fn: Callable[[list[dict[str, Any]]], Any], batches: list[list[dict[str, Any]]]
) -> float:
    start = time.perf_counter()
    for batch in batches:
        fn(batch)
    return sum(len(b) for b in batches) / (time.perf_counter() - start)


def run(rounds: int, n_batches: int, batch_size: int) -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)
    collate = BucketCollator(buckets=Buckets.multiples(8, 256))
    results = {}
    for label, as_tensors in (("lists", False), ("tensors", True)):
        batches = make_batches(n_batches, batch_size, as_tensors)
        # correctness first: same real tokens and mask
        ours, theirs = collate(batches[0]), common_recipe(batches[0])
        if not torch.equal(ours["attention_mask"], theirs["attention_mask"]) or not torch.equal(
            ours["input_ids"], theirs["input_ids"]
        ):
            raise SystemExit("BucketCollator and the common recipe disagree; benchmark aborted")
        ratios, ours_sps, theirs_sps = [], [], []
        for _ in range(rounds):
            a = samples_per_sec(collate, batches)
            b = samples_per_sec(common_recipe, batches)
            ours_sps.append(a)
            theirs_sps.append(b)
            ratios.append(a / b)
        results[label] = {
            "bucket_collator_samples_per_sec": statistics.median(ours_sps),
            "common_recipe_samples_per_sec": statistics.median(theirs_sps),
            "ratio": statistics.median(ratios),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    results = run(args.rounds, args.batches, args.batch_size)
    print(
        f"torch {torch.__version__}, batch {args.batch_size}, mixture lengths, 1 thread, median of {args.rounds} interleaved rounds"
    )
    print(f"{'inputs':8s} {'BucketCollator':>16s} {'F.pad+stack':>14s} {'ratio':>7s}")
    for label, r in results.items():
        print(
            f"{label:8s} {r['bucket_collator_samples_per_sec']:14,.0f}/s {r['common_recipe_samples_per_sec']:12,.0f}/s {r['ratio']:6.1f}x"
        )


if __name__ == "__main__":
    main()
