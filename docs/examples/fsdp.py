"""shapebucket with FSDP2 (``fully_shard``), on CPU with gloo, and its single-process twin.

    torchrun --nproc-per-node 2 docs/examples/fsdp.py [--steps N] [--out DIR]
    python docs/examples/fsdp.py --single --world 2 [--steps N] [--out DIR]

Sharded: every rank takes its share of each step from the distributed
PackedBatchSampler (every rank packs rows of the same length, so every rank has
the same batch shape at every step), the GPT's blocks and root are sharded with
``fully_shard``, every shape is prewarmed, and training runs inside
``no_recompiles``. At every step the ranks all-gather their batch shape and
check that it is the same.

Single: one process trains the same model from the same initial weights on the
same global batch: at step t, the batches that ranks 0..world-1 get at step t,
concatenated along the rows. Both modes minimise the same loss, the mean
cross-entropy over the global batch's real tokens: in the sharded run each rank
divides its token-loss sum by the global token count (an all-reduce) and FSDP
sums the gradients (``set_gradient_divide_factor(1.0)``), so the sharded
gradient is the single-process one, summed in another order.

Each mode prints one JSON line (the loss and the gradient norm at every step,
the shapes, the graphs compiled while training, whether prewarm gave the weights
and the optimizer back) and writes it to DIR/fsdp_rank<N>.json or DIR/single.json.
``--backend``: the torch.compile backend (default ``eager``: dynamo traces and
guards every shape, and no C++ compiler runs; ``inductor`` works too).
``--compile``: ``blocks`` (default) or ``model`` (see ``compile_model``).
docs/sharded.md has what is checked and what was measured.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader

import shapebucket
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.compile import CompileCounter

BUCKETS = [32, 64]  # row lengths: 2 shapes per rank
TOKENS_PER_BATCH = 128  # per rank: 4 rows of 32 or 2 rows of 64
KEYS = ("input_ids", "labels", "position_ids", "document_ids")


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, lengths):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        ids = torch.randint(
            0, 64, (int(self.lengths[i]),), generator=torch.Generator().manual_seed(i)
        )
        # pre-shifted next-token labels; the last token has none (-100), so no
        # label wraps around to the sample's first token
        labels = torch.cat([ids[1:], torch.tensor([-100])])
        return {"input_ids": ids, "labels": labels}


class TokenLossSum(nn.Module):
    """The sum of the next-token losses over a packed batch's real tokens."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, labels, position_ids, document_ids):
        losses = self.gpt.token_losses(
            input_ids, labels, position_ids=position_ids, document_ids=document_ids
        )
        return losses.sum()


def lengths_of(n=600):
    """80% short samples (3..24 tokens), 20% long ones (33..60): both row lengths are used."""
    rng = np.random.default_rng(0)
    return np.where(rng.random(n) < 0.8, rng.integers(3, 25, n), rng.integers(33, 61, n))


def make_sampler(lengths, world, rank):
    return shapebucket.PackedBatchSampler.for_tokens(
        lengths, BUCKETS, TOKENS_PER_BATCH, seed=0, num_replicas=world, rank=rank
    )


def make_model():
    torch.manual_seed(0)  # the same initial weights in both modes
    return TokenLossSum(GPT(GPTConfig(vocab=64, dim=32, layers=2, heads=2, max_len=max(BUCKETS))))


def compile_model(model, args):
    """``--compile blocks``: compile each block (one graph per shape, shared by the blocks;
    the embeddings, head and loss run eagerly). ``--compile model``: compile the whole model;
    FSDP2's hooks are dynamo-disabled, so every sharded block is a graph break."""
    if args.compile == "model":
        return torch.compile(model, backend=args.backend, dynamic=False)
    for block in model.gpt.blocks:
        block.compile(backend=args.backend, dynamic=False)
    return model


def grad_norm(model, sharded):
    """The global gradient norm (a sharded gradient's squares summed over the ranks)."""
    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
             for p in model.parameters()]  # fmt: skip
    squares = torch.stack([g.pow(2).sum() for g in local]).sum()
    if sharded:
        dist.all_reduce(squares)
    return squares.sqrt()


def train_step_fn(model, compiled, opt, sharded):
    """A step on the global mean token loss; returns that loss and the gradient norm."""

    def train_step(batch):
        total = compiled(*(batch[k] for k in KEYS))
        tokens = (batch["labels"] != -100).sum().to(torch.float32)
        if sharded:
            dist.all_reduce(tokens)  # the global batch's real tokens
        loss = total / tokens
        loss.backward()
        norm = grad_norm(model, sharded)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = loss.detach()
        if sharded:
            dist.all_reduce(loss)  # the global mean token loss
        return loss, norm

    return train_step


def weights(model):
    """Every parameter, whole (a sharded one is all-gathered)."""
    return [p.full_tensor() if isinstance(p, DTensor) else p.detach().clone()
            for p in model.parameters()]  # fmt: skip


def prewarm(model, compiled, opt, plan, example, train_step):
    """Prewarm every shape; also report whether the weights and the optimizer came back."""
    before = weights(model)
    report = shapebucket.prewarm(
        compiled, plan, example, step=train_step, restore=[opt], progress=False
    )
    same = all(torch.equal(a, b) for a, b in zip(before, weights(model), strict=True))
    return {"prewarm_graphs": report.total_graphs, "restored": same and not opt.state,
            "plan": [list(s) for s in plan.shapes]}  # fmt: skip


def train(compiled, opt, plan, batches, train_step, steps, world):
    """Train ``steps`` steps; the losses, the shapes, and what compiled meanwhile."""
    losses, norms, shapes = [], [], []
    with CompileCounter() as cc, shapebucket.no_recompiles(plan):
        for batch in batches:
            shape = list(batch["input_ids"].shape)
            if world > 1:  # sharded: check every rank has the same shape
                seen = [None] * world
                dist.all_gather_object(seen, shape)
                if any(s != shape for s in seen):
                    raise RuntimeError(f"step {len(losses)}: ranks have shapes {seen}")
            shapes.append(shape)
            loss, norm = train_step(batch)
            losses.append(loss.item())
            norms.append(norm.item())
            if len(losses) == steps:
                break
    return {"losses": losses, "grad_norms": norms, "shapes": shapes, "train_graphs": cc.graphs,
            "recompiles": len(cc.recompiles)}  # fmt: skip


def run_sharded(args):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = lengths_of()
    sampler = make_sampler(lengths, world, rank)
    collate = shapebucket.PackedCollator(BUCKETS, rows=sampler.rows, label_shift="none")
    loader = DataLoader(RandomTokens(lengths), batch_sampler=sampler, collate_fn=collate)

    model = make_model()
    compiled = compile_model(model, args)  # before fully_shard, as torchtitan does
    for block in model.gpt.blocks:
        fully_shard(block)
    fully_shard(model)  # the root: its forward unshards the embeddings and the head
    for m in model.modules():  # sum the gradients (the loss is already the global mean),
        if isinstance(m, FSDPModule):  # with SUM only: gloo has no PREMUL_SUM
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step = train_step_fn(model, compiled, opt, sharded=True)

    plan = shapebucket.ShapePlan.of(collate, sampler)  # the same shapes on every rank
    warm = prewarm(model, compiled, opt, plan, next(iter(loader)), train_step)
    result = train(compiled, opt, plan, loader, train_step, args.steps, world)
    result.update(mode="fsdp", rank=rank, world=world, **warm)
    finish(result, args.out and Path(args.out, f"fsdp_rank{rank}.json"))
    dist.barrier()  # every rank reaches the teardown together (gloo's can hang otherwise)
    dist.destroy_process_group()


def global_batches(lengths, world):
    """At each step, the batches ranks 0..world-1 get, concatenated along the rows."""
    samplers = [make_sampler(lengths, world, r) for r in range(world)]
    collate = shapebucket.PackedCollator(BUCKETS, rows=samplers[0].rows, label_shift="none")
    ds = RandomTokens(lengths)
    for parts in zip(*samplers, strict=True):
        batches = [collate([ds[i] for i in part]) for part in parts]
        yield {k: torch.cat([b[k] for b in batches]) for k in KEYS}


def run_single(args):
    lengths = lengths_of()
    world = args.world
    model = make_model()
    compiled = compile_model(model, args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step = train_step_fn(model, compiled, opt, sharded=False)

    sampler = make_sampler(lengths, world, 0)
    collate = shapebucket.PackedCollator(BUCKETS, rows=sampler.rows, label_shift="none")
    rank_plan = shapebucket.ShapePlan.of(collate, sampler)
    example = next(global_batches(lengths, world))
    one = {k: v[: len(v) // world] for k, v in example.items()}  # one rank's batch

    def make_batch(shape):  # world copies of a rank's batch re-padded to the shape
        part = rank_plan.batch(one, (shape.rows // world, shape.length))
        return {k: torch.cat([part[k]] * world) for k in KEYS}

    plan = shapebucket.ShapePlan.from_function(
        [(s.rows * world, s.length) for s in rank_plan.shapes], make_batch
    )
    warm = prewarm(model, compiled, opt, plan, None, train_step)
    result = train(compiled, opt, plan, global_batches(lengths, world), train_step, args.steps, 1)
    result.update(mode="single", world=world, **warm)
    finish(result, args.out and Path(args.out, "single.json"))


def finish(result, path):
    line = json.dumps(result)
    print(line, flush=True)
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", default=None, help="a folder for the JSON result")
    parser.add_argument("--single", action="store_true", help="the one-process reference run")
    parser.add_argument("--world", type=int, default=2, help="--single: the world it stands for")
    parser.add_argument("--backend", default="eager", help="torch.compile backend")
    parser.add_argument("--compile", choices=("blocks", "model"), default="blocks")
    args = parser.parse_args()
    run_single(args) if args.single else run_sharded(args)


if __name__ == "__main__":
    main()
