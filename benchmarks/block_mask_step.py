"""The flex_attention block mask of a packed batch: built on the step, or from the worker's tensors.

    python benchmarks/block_mask_step.py [--rows 4] [--length 1024] [--block-size 128]

Packed rows of ``--length`` tokens (samples from the built-in mixture, laid end to
end as ``PackedCollator`` does) go through a step that builds the document mask and
runs one ``flex_attention`` forward (``--heads`` heads of ``--head-dim``; forward
only: flex_attention has no backward on CPU). Two ways, interleaved over
``--rounds`` rounds of ``--steps`` steps (the order alternates):

* ``create_block_mask``: ``document_block_mask(document_ids)`` on the step (today);
* ``from_kv_blocks``: ``block_mask_from_blocks(blocks, document_ids)`` on the step,
  ``blocks = document_blocks(document_ids)`` made beforehand (in a DataLoader worker).

Prints, per way, the mask's and the whole step's milliseconds (median and min-max of
the rounds' medians), the step time saved, and the worker's cost per batch.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
from torch.nn.attention.flex_attention import flex_attention

from shapebucket import document_block_mask
from shapebucket.collate import block_mask_from_blocks, document_blocks
from shapebucket.data import mixture_lengths


def packed_documents(rows: int, length: int, seed: int) -> torch.Tensor:
    """``[rows, length]`` document ids: mixture samples end to end, -1 after the last."""
    lengths = iter(mixture_lengths(rows * length, seed=seed).tolist())
    out = []
    for _ in range(rows):
        row: list[int] = []
        doc = 0
        while True:
            n = next(lengths)
            if len(row) + n > length:
                break
            row += [doc] * n
            doc += 1
        out.append(row + [-1] * (length - len(row)))
    return torch.tensor(out)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    batches = [packed_documents(a.rows, a.length, a.seed + i) for i in range(a.steps)]
    q = torch.randn(a.rows, a.heads, a.length, a.head_dim)
    t0 = time.perf_counter()
    blocks = [document_blocks(d, block_size=a.block_size) for d in batches]
    worker_ms = (time.perf_counter() - t0) / len(batches) * 1000

    def on_step(i: int) -> object:
        return document_block_mask(batches[i], block_size=a.block_size)

    def from_worker(i: int) -> object:
        return block_mask_from_blocks(blocks[i], batches[i], block_size=a.block_size)

    ways = {"create_block_mask": on_step, "from_kv_blocks": from_worker}
    mask_ms: dict[str, list[float]] = {w: [] for w in ways}
    step_ms: dict[str, list[float]] = {w: [] for w in ways}
    for make in ways.values():  # warm-up: first calls pay one-off costs
        flex_attention(q, q, q, block_mask=make(0))
    for r in range(a.rounds):
        order = list(ways) if r % 2 == 0 else list(ways)[::-1]
        for w in order:
            masks, steps = [], []
            for i in range(a.steps):
                t0 = time.perf_counter()
                mask = ways[w](i)
                t1 = time.perf_counter()
                flex_attention(q, q, q, block_mask=mask)
                t2 = time.perf_counter()
                masks.append((t1 - t0) * 1000)
                steps.append((t2 - t0) * 1000)
            mask_ms[w].append(statistics.median(masks))
            step_ms[w].append(statistics.median(steps))

    def fmt(v: list[float]) -> str:
        return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"

    print(
        f"\n{a.rows} rows x {a.length} tokens, block {a.block_size}, {a.heads} heads x "
        f"{a.head_dim}; {a.rounds} rounds x {a.steps} steps\n"
    )
    print("| mask built | mask ms | step ms (mask + flex forward) |")
    print("|---|---|---|")
    for w in ways:
        print(f"| {w} | {fmt(mask_ms[w])} | {fmt(step_ms[w])} |")
    saved = [
        x - y for x, y in zip(step_ms["create_block_mask"], step_ms["from_kv_blocks"], strict=True)
    ]
    saved_mask = [
        x - y for x, y in zip(mask_ms["create_block_mask"], mask_ms["from_kv_blocks"], strict=True)
    ]
    print(f"\nstep time saved per step: {fmt(saved)} ms (mask alone: {fmt(saved_mask)} ms)")
    print(f"document_blocks in the worker: {worker_ms:.2f} ms per batch")


if __name__ == "__main__":
    main()
