"""Where a packed step's time goes, per row length, on the bench GPT (eager, CPU).

For each packed shape of the mixture's plan (rows x row length, 1,536 tokens)
it times a whole training step (forward, backward, AdamW) with the document
mask of a packed batch and with a plain causal padding mask of the same shape,
and a grouped batch of the peers' typical shape (64 rows x 32). Shapes are
timed in interleaved rounds; the table gives the median ms per step and the
ms per 1,000 computed tokens, then the epoch's mix of packed shapes.

    python benchmarks/packing_breakdown.py [--rounds 7] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from shapebucket import PackedBatchSampler, fit_packing
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.data import mixture_lengths


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab=512, dim=128, layers=2, heads=4, max_len=256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lengths = mixture_lengths(200_000)
    fit = fit_packing(lengths, 8, tokens_per_batch=1536, model_dim=128)
    mix = (
        PackedBatchSampler(lengths, fit.buckets, rows=fit.rows).packing().report.batches_per_bucket
    )

    def batch(rows: int, L: int, packed: bool) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 512, (rows, L))
        if not packed:
            return {
                "input_ids": ids,
                "labels": ids,
                "attention_mask": torch.ones(rows, L, dtype=torch.bool),
            }
        doc_len = 16  # documents of 16 tokens; the mask's cost does not depend on where they end
        pos = (torch.arange(L) % doc_len).expand(rows, L).contiguous()
        doc = (torch.arange(L) // doc_len).to(torch.int32).expand(rows, L).contiguous()
        return {"input_ids": ids, "labels": ids, "position_ids": pos, "document_ids": doc}

    cases = {}
    for L, rows in fit.rows.items():
        cases[f"packed {rows}x{L}"] = batch(rows, L, True)
        cases[f"padded {rows}x{L}"] = batch(rows, L, False)
    cases["grouped 64x32"] = batch(64, 32, False)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for b in cases.values():  # warm up every shape once
        model(**b).backward()
    opt.zero_grad()
    for _ in range(args.rounds):
        for name, b in cases.items():
            t0 = time.perf_counter()
            for _ in range(args.reps):
                model(**b).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            times[name].append((time.perf_counter() - t0) / args.reps * 1000)
    print(f"{'shape':<18s} {'ms/step':>8s} {'min-max':>13s} {'ms/1k tokens':>12s}")
    for name, b in cases.items():
        t = times[name]
        tokens = b["input_ids"].numel()
        med = statistics.median(t)
        print(f"{name:<18s} {med:>8.1f} {min(t):>6.1f}-{max(t):<6.1f} {med / tokens * 1000:>12.2f}")
    total = sum(mix.values())
    est = (
        sum(n * statistics.median(times[f"packed {fit.rows[L]}x{L}"]) for L, n in mix.items())
        / total
    )
    print(f"\nmixture epoch: packed batches per row length {mix}")
    print(f"epoch-weighted packed step: {est:.1f} ms for 1,536 computed tokens")


if __name__ == "__main__":
    main()
