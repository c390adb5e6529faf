"""Two-length buckets for an encoder-decoder: a tiny T5 from a config, under ``no_recompiles``.

A translation-like toy task (the target is every second source token, reversed),
with source and target lengths that vary independently. The recipe:

1. ``fit_cells`` fits at most K ``(source, target)`` cells (K compiled shapes);
2. ``CellBatchSampler`` forms batches inside one cell (rows padded to the
   sampler's rows, so each cell is one shape);
3. ``CellCollator`` pads ``input_ids``/``attention_mask`` to the cell's source
   length and ``labels`` to its target length;
4. ``prewarm`` compiles every cell before step 1; training runs under
   ``no_recompiles`` and compiles nothing more.

Run: python docs/examples/seq2seq.py [STEPS] [--backend eager|inductor]
It prints one JSON line: cells used, graphs at prewarm and during training.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import shapebucket
from shapebucket.collate import CellCollator
from shapebucket.compile import CompileCounter
from shapebucket.fit import fit_cells
from shapebucket.sampling import CellBatchSampler

VOCAB = 64


class Reverse(Dataset):
    """Sources of 4..60 tokens; the target is every second token of the source, reversed,
    plus a noise tail of 0..8 tokens (so the two lengths are correlated, not tied)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        lengths = np.clip(rng.lognormal(3.0, 0.5, n).astype(int), 4, 60)
        self.data = []
        for s in lengths.tolist():
            src = rng.integers(2, VOCAB, s).tolist()
            tail = rng.integers(2, VOCAB, int(rng.integers(0, 9))).tolist()
            self.data.append({"input_ids": src, "labels": src[::-2] + tail + [1]})

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return self.data[i]


def build(steps: int, backend: str, cells_k: int = 4) -> dict:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    ds = Reverse(400)
    sources = np.array([len(d["input_ids"]) for d in ds.data])
    targets = np.array([len(d["labels"]) for d in ds.data])
    cells = fit_cells(sources, targets, k=cells_k)
    sampler = CellBatchSampler(sources, targets, cells, rows=16, seed=0)
    collate = CellCollator(cells, rows=sampler.rows)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate)
    plan = shapebucket.ShapePlan.of(collate, sampler)

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=1,
        num_decoder_layers=1, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1,
        dropout_rate=0.0,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    compiled = torch.compile(model, dynamic=False, fullgraph=True, backend=backend)

    def step(batch: dict) -> torch.Tensor:
        loss = compiled(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    report = shapebucket.prewarm(
        compiled, plan, example=next(iter(loader)), step=step, restore=[opt], progress=False
    )
    losses, seen = [], set()
    with CompileCounter() as training, shapebucket.no_recompiles(plan):
        while len(losses) < steps:
            for batch in loader:
                seen.add((tuple(batch["input_ids"].shape), tuple(batch["labels"].shape)))
                losses.append(float(step(batch)))
                if len(losses) == steps:
                    break
    return {
        "cells": [list(c) for c in cells],
        "plan_shapes": [list(s) for s in plan.shapes],
        "prewarm_graphs": report.total_graphs,
        "training_graphs": training.graphs,
        "recompiles": len(training.recompiles),
        "shapes_seen": len(seen),
        "steps": len(losses),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="?", type=int, default=60)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    print(json.dumps(build(args.steps, args.backend)))
