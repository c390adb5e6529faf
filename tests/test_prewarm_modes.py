"""No recompile after prewarm, in every way of compiling, and the model state put back
bitwise: static graphs per bucket, regional compilation, packed batches; each mode also
alone."""

from __future__ import annotations

import pytest
import torch

from shapebucket import BucketCollator, PackedCollator
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.compile import (
    CompileCounter,
    CudaGraphs,
    Inference,
    Repeat,
    compile_regions,
    no_recompiles,
    prewarm,
)
from shapebucket.fit.buckets import Buckets
from shapebucket.plan.shapes import ShapePlan

BUCKETS = Buckets([8, 16, 32])


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Dynamo caches graphs (and counts the recompile limit) per code object, and every
    test here compiles GPT.forward or Block.forward: start each from an empty cache."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab=32, dim=16, layers=2, heads=2, max_len=64))


def padded(collate, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    samples = []
    for n in lengths:
        ids = torch.randint(0, 32, (n,), generator=g)
        samples.append({"input_ids": ids, "labels": torch.roll(ids, -1)})
    return collate(samples)


def state_of(model, opt):
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    moments = {
        i: {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)}
        for i, s in enumerate(opt.state.values())
    }
    return params, moments, torch.get_rng_state()


def assert_same_state(before, after):
    for k in before[0]:
        assert torch.equal(before[0][k], after[0][k]), f"parameter {k} changed"
    assert before[1].keys() == after[1].keys()
    for i in before[1]:
        for k in before[1][i]:
            assert torch.equal(before[1][i][k], after[1][i][k]), f"optimizer state {i}.{k} changed"
    assert torch.equal(before[2], after[2])


def train_step(fwd, model, opt):
    def step(batch):
        fwd(**batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


MODES = ["static", "regional", "packed"]


@pytest.mark.parametrize("mode", MODES)
def test_no_recompile_after_prewarm_and_state_restored_bitwise(mode):
    model = tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if mode == "packed":
        collate = PackedCollator(BUCKETS, rows=2, label_shift="none", mask_key=None)
        lengths_per_batch = [[3, 5, 7], [9, 2, 4], [30, 1], [16, 8, 8]]
    else:
        collate = BucketCollator(BUCKETS, sequence_keys=["input_ids", "labels"], rows=2)
        lengths_per_batch = [[3, 5], [9, 2], [30, 1], [16, 8]]
    if mode == "regional":
        compile_regions(model, dynamic=False, backend="eager", fullgraph=True)
        fwd = model
    else:
        # prewarm raises dynamo's limit to the plan's shapes (torch < 2.13 takes no
        # torch.compile(..., recompile_limit=))
        fwd = torch.compile(model, dynamic=False, backend="eager", fullgraph=True)
    step = train_step(fwd, model, opt)
    step(padded(collate, lengths_per_batch[0], seed=9))  # the optimizer has state to restore
    before = state_of(model, opt)
    plan = ShapePlan.of(collate)
    report = prewarm(
        fwd,
        plan,
        padded(collate, lengths_per_batch[0]),
        step=step,
        restore=[opt],
        progress=False,
    )
    assert_same_state(before, state_of(model, opt))
    assert report.total_graphs >= 1
    with CompileCounter() as cc, no_recompiles(plan):
        for i, lengths in enumerate(lengths_per_batch * 2):
            step(padded(collate, lengths, seed=i))
    assert cc.graphs == 0


@pytest.mark.slow  # prewarms 9 shapes: 3 s
def test_inference_prewarm_covers_every_length_and_batch_bucket():
    model = tiny_gpt().eval()

    def serve(input_ids, attention_mask):
        return model.logits(input_ids, attention_mask=attention_mask).sum(-1)

    compiled = torch.compile(serve, dynamic=False, backend="eager", fullgraph=True)
    collate = BucketCollator.with_row_buckets(BUCKETS, [1, 4], sequence_keys=["input_ids"])
    example = collate([{"input_ids": [1, 2, 3]}])
    plan = ShapePlan.of(collate)  # every length at every row bucket
    assert len(plan) == len(BUCKETS) * 2
    report = prewarm(compiled, plan, example, modes=[Inference()], progress=False)
    assert report.total_graphs == len(BUCKETS) * 2 == report.num_shapes
    assert report.limit >= 6
    assert all(p.grad is None for p in model.parameters())  # forward only: nothing ran backward
    with CompileCounter() as cc, no_recompiles():
        for n, length in [(1, 3), (2, 30), (4, 9), (3, 16), (1, 31)]:
            batch = collate([{"input_ids": [5] * length} for _ in range(n)])
            assert batch["input_ids"].shape[0] in (1, 4)
            with torch.inference_mode():
                compiled(**batch)
    assert cc.graphs == 0


def test_repeat_runs_every_prewarm_batch_that_many_times():
    calls = []
    plan = ShapePlan.from_function([(2, 4), (2, 8)], torch.ones)
    prewarm(
        lambda x: calls.append(tuple(x.shape)),
        plan,
        modes=[Repeat(3)],
        verify=False,
        progress=False,
    )
    assert calls == [(2, 4)] + [(2, 4)] * 3 + [(2, 8)] * 3  # once to settle, then 3 times


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_reduce_overhead_prewarm_records_every_bucket_and_training_never_recompiles():
    model = tiny_gpt().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fwd = torch.compile(model, mode="reduce-overhead", dynamic=False)
    collate = BucketCollator(BUCKETS, sequence_keys=["input_ids", "labels"], rows=2)

    def on_gpu(batch):
        return {k: v.cuda() for k, v in batch.items()}

    step = train_step(fwd, model, opt)
    plan = ShapePlan.from_function(
        [(2, b) for b in BUCKETS], lambda s: on_gpu(padded(collate, [s.length, 1]))
    )
    report = prewarm(fwd, plan, step=step, restore=[opt], modes=[CudaGraphs()], progress=False)
    assert set(report.memory_mb) == set(plan.shapes)
    with CompileCounter() as cc, no_recompiles(BUCKETS):
        for i, n in enumerate([3, 9, 30, 16, 5]):
            step(on_gpu(padded(collate, [n, 2], seed=i)))
    assert cc.graphs == 0
