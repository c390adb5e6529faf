"""shapebucket with DistributedDataParallel, on CPU with gloo.

    torchrun --nproc-per-node 2 docs/examples/ddp.py [STEPS] [OUT_DIR]

Every rank builds the same buckets, takes its share of each step from the
distributed BucketBatchSampler (all ranks in the same bucket at every step),
prewarms every bucket, then trains inside no_recompiles(). Each rank prints one
JSON line with its step count and the graphs compiled while training (and writes
it to OUT_DIR/rank<N>.json when OUT_DIR is given).
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

import shapebucket
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.compile import CompileCounter
from shapebucket.data import mixture_lengths

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 12


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        ids = torch.randint(
            0, 256, (int(self.lengths[i]),), generator=torch.Generator().manual_seed(i)
        )
        # pre-shifted next-token labels; the last token has none (-100), so no
        # label wraps around to the sample's first token
        labels = torch.cat([ids[1:], torch.tensor([-100])])
        return {"input_ids": ids, "labels": labels}


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts them)
    lengths = mixture_lengths(4000, seed=0)
    buckets = shapebucket.fit_buckets(lengths, k=3, align=8)
    sampler = shapebucket.BucketBatchSampler(
        lengths, buckets, rows=8, seed=0
    )  # world/rank from dist
    collate = shapebucket.BucketCollator(buckets, rows=sampler.rows)
    loader = DataLoader(RandomTokens(lengths), batch_sampler=sampler, collate_fn=collate)

    model = DDP(GPT(GPTConfig(vocab=256, dim=32, layers=1, heads=2, max_len=int(buckets.max_len))))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, dynamic=False)

    def train_step(batch):
        loss = compiled(batch["input_ids"], batch["labels"], batch["attention_mask"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    plan = shapebucket.ShapePlan.of(collate, sampler)  # this rank's shapes
    report = shapebucket.prewarm(
        compiled, plan, next(iter(loader)), step=train_step, restore=[opt], progress=rank == 0
    )
    steps = 0
    with CompileCounter() as cc, shapebucket.no_recompiles(plan):
        for batch in loader:
            train_step(batch)
            steps += 1
            if steps == STEPS:
                break
    line = json.dumps(
        {
            "rank": rank,
            "steps": steps,
            "train_graphs": cc.graphs,
            "recompiles": len(cc.recompiles),
            "prewarm_graphs": report.total_graphs,
        }
    )
    print(line, flush=True)
    if len(sys.argv) > 2:
        Path(sys.argv[2], f"rank{rank}.json").write_text(line)
    dist.barrier()  # every rank reaches the teardown together (gloo's can hang otherwise)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
