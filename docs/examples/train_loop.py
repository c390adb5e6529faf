"""The whole shapebucket recipe in a plain PyTorch loop: a small GPT on real text.

The text is the paragraphs of the docstrings of Python's standard library (on
every machine, offline), as UTF-8 bytes. Run: python docs/examples/train_loop.py [STEPS]
"""

import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import shapebucket
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.bench.workloads import stdlib_docstring_paragraphs
from shapebucket.compile import CompileCounter

MAX_LEN = 128
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 40


class Paragraphs(Dataset):
    """Byte-level language modelling: predict each next byte of a paragraph."""

    def __init__(self, texts):  # paragraphs longer than MAX_LEN bytes are cut, on purpose
        self.data = [list(t.encode()[: MAX_LEN + 1]) for t in texts if len(t.encode()) >= 3]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        ids = self.data[i]
        return {"input_ids": ids[:-1], "labels": ids[1:]}


def main():
    torch.manual_seed(0)
    ds = Paragraphs(stdlib_docstring_paragraphs())
    lengths = np.array([len(ids) - 1 for ids in ds.data])
    # 1. buckets fitted to the data; 2. batches formed inside buckets; 3. padding to them
    buckets = shapebucket.fit_buckets(lengths, k=4, align=8)
    sampler = shapebucket.BucketBatchSampler(lengths, buckets, rows=16, seed=0)
    collate = shapebucket.BucketCollator(buckets, rows=sampler.rows)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=2)
    print(shapebucket.fit.padding_report(lengths, buckets))

    # 4. compile with static shapes; 5. prewarm every bucket before training
    model = GPT(GPTConfig(vocab=256, dim=64, layers=1, heads=4, max_len=MAX_LEN))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    compiled = torch.compile(model, dynamic=False, fullgraph=True)

    def train_step(batch):
        loss = compiled(batch["input_ids"], batch["labels"], batch["attention_mask"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    plan = shapebucket.ShapePlan.of(collate, sampler)  # every (rows, length) the loader makes
    example = next(iter(loader))
    print(shapebucket.prewarm(compiled, plan, example, step=train_step, restore=[opt]))

    # 6. train; any recompile would raise a ShapeBucketError naming the shape
    with CompileCounter() as cc, shapebucket.no_recompiles(plan):
        for step, batch in zip(range(STEPS), loader, strict=False):
            loss = train_step(batch)
            if step % 10 == 0 or step == STEPS - 1:
                print(
                    f"step {step:3d}  length {batch['input_ids'].shape[1]:3d}  loss {loss.item():.3f}"
                )
    print(f"training: {cc}")
    if cc.graphs:
        raise SystemExit("recompiled during training")


if __name__ == "__main__":
    main()
