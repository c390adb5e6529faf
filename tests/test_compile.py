"""Compile helpers on tiny models. Each compiled module is shared within this file."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapebucket import (
    BucketCollator,
    Buckets,
    CompileCounter,
    ShapeBucketError,
    load_compile_cache,
    mark_dynamic,
    no_recompiles,
    prewarm,
    save_compile_cache,
)
from shapebucket import _torch_compat as compat

pytestmark = pytest.mark.slow


class TinyLM(nn.Module):
    def __init__(self, vocab=32, dim=16, batch_norm=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.norm = nn.BatchNorm1d(dim) if batch_norm else nn.Identity()
        self.out = nn.Linear(dim, vocab)

    def forward(self, input_ids, labels, attention_mask):
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        logits = self.out(torch.relu(h))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


BUCKETS = Buckets([8, 16, 24])
COLLATE = BucketCollator(BUCKETS)


def batch_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return COLLATE(
        [
            {"input_ids": (ids := torch.randint(0, 32, (n,), generator=g)), "labels": ids}
            for n in lengths
        ]
    )


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    model = TinyLM()
    return model, torch.compile(model, dynamic=False, fullgraph=True)


@pytest.fixture()
def restore_limit():
    old = compat.get_recompile_limit()
    yield
    compat.set_recompile_limit(old)


def test_prewarm_then_no_recompiles(compiled):
    _, cmodel = compiled
    example = batch_of([5, 12, 3])  # bucket 16: prewarm crops it to 8 and pads it to 24
    with CompileCounter() as outer:
        report = prewarm(cmodel, BUCKETS, example=example, collator=COLLATE, progress=False)
    assert list(report.graphs) == [8, 16, 24]
    assert (
        report.total_graphs == outer.graphs >= 3
    )  # forward graphs (backward graphs are not dynamo's)
    assert all(g >= 1 for g in report.graphs.values()) and report.verify_seconds > 0
    assert "total" in str(report)
    with CompileCounter() as cc, no_recompiles(BUCKETS):
        for lengths in ([3, 8, 2], [9, 16, 12], [17, 20, 1], [5, 6, 7]):
            loss = cmodel(**batch_of(lengths))
            loss.backward()
    assert cc.graphs == 0 and cc.recompiles == []
    with (
        pytest.raises(ShapeBucketError, match=r"size 40 at dim 1.*Buckets\(\[8, 16, 24\]\)"),
        no_recompiles(BUCKETS),
    ):
        cmodel(**BucketCollator([40])([{"input_ids": [1] * 33, "labels": [1] * 33}] * 3))
    # the stance is restored after the error: a new shape compiles again, and is counted with its reason
    with CompileCounter() as cc:
        cmodel(**BucketCollator([48])([{"input_ids": [1] * 40, "labels": [1] * 40}] * 3))
    assert cc.graphs == 1 and len(cc.recompiles) == 1 and "48" in cc.recompiles[0]
    assert "1 graphs compiled, 1 recompiles" in str(cc)


def state_of(model, opt):
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    opt_state = {
        k: {kk: (vv.clone() if torch.is_tensor(vv) else vv) for kk, vv in v.items()}
        for k, v in opt.state_dict()["state"].items()
    }
    return (
        params,
        grads,
        buffers,
        opt_state,
        torch.get_rng_state(),
        np.random.get_state()[1].copy(),
        random.getstate(),
    )


def assert_same(a, b):
    for x, y in zip(a[:4], b[:4], strict=True):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], dict):
                assert x[k].keys() == y[k].keys()
                assert all(
                    torch.equal(torch.as_tensor(x[k][kk]), torch.as_tensor(y[k][kk])) for kk in x[k]
                )
            elif x[k] is None or y[k] is None:
                assert x[k] is None and y[k] is None, k
            else:
                assert torch.equal(x[k], y[k]), k
    assert torch.equal(a[4], b[4]) and (a[5] == b[5]).all() and a[6] == b[6]


@pytest.mark.parametrize("steps_before", [0, 1])
def test_prewarm_leaves_nothing_behind(steps_before):
    torch.manual_seed(1)
    model = TinyLM(batch_norm=True)
    cmodel = torch.compile(model, dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(batch):
        cmodel(**batch).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(steps_before):
        step(batch_of([4, 6], seed=5))
    cmodel(**batch_of([4, 6], seed=6)).backward()  # leave grads behind: they must survive prewarm
    np.random.seed(3)
    random.seed(3)
    before = state_of(model, opt)
    prewarm(
        cmodel, Buckets([8, 16]), example=batch_of([5, 7]), step=step, optimizer=opt, progress=False
    )
    after = state_of(model, opt)
    assert_same(before, after)
    assert model.norm.num_batches_tracked.item() == steps_before + 1


def test_recompile_limit_raised_or_refused(restore_limit):
    compat.set_recompile_limit(2)
    fn = torch.compile(lambda x: (x * 2).sum(), dynamic=False)
    three = Buckets([4, 6, 10])
    with pytest.raises(
        ShapeBucketError, match="3 buckets exceed the compiler's recompile limit of 2"
    ):
        prewarm(
            fn, three, make_batch=lambda n: (torch.ones(2, n),), raise_limit=False, progress=False
        )
    report = prewarm(fn, three, make_batch=lambda n: (torch.ones(2, n),), progress=False)
    assert report.limit_raised_from == 2 and report.limit == 3 == compat.get_recompile_limit()
    assert "raised from 2 to 3" in str(report)


def test_prewarm_batch_from_example_resizes_rows_and_pads():
    seen = []
    prewarm(
        None,
        Buckets([4, 16]),
        example=batch_of([5, 7, 3]),
        step=lambda b: seen.append({k: v.clone() for k, v in b.items()}),
        batch_size={4: 5, 16: 2},
        collator=COLLATE,
        verify=False,
        progress=False,
    )
    small, big = seen
    assert small["input_ids"].shape == (5, 4) and big["input_ids"].shape == (2, 16)
    assert (big["labels"][:, 8:] == -100).all() and not big["attention_mask"][:, 8:].any()
    assert torch.equal(small["attention_mask"][3], small["attention_mask"][0])  # rows repeat


def test_prewarm_pads_tuple_batches_with_the_collators_per_position_values():
    collate = BucketCollator(Buckets([4, 8]), pad_values={1: -100})
    example = collate([([1, 2, 3], [1, 2, 3]), ([4], [4])])
    seen = []
    prewarm(
        None,
        Buckets([4, 8]),
        example=example,
        step=seen.append,
        collator=collate,
        verify=False,
        progress=False,
    )
    ids, labels, mask = seen[1]
    assert ids.shape == labels.shape == mask.shape == (2, 8)
    assert (ids[:, 4:] == 0).all() and (labels[:, 4:] == -100).all() and not mask[:, 4:].any()


def test_prewarm_bad_arguments():
    with pytest.raises(ShapeBucketError, match="exactly one of example"):
        prewarm(None, BUCKETS, step=lambda b: None)
    with pytest.raises(ShapeBucketError, match=r"no entry for buckets \[24\]"):
        prewarm(None, BUCKETS, example=batch_of([3]), step=lambda b: None, batch_size={8: 2, 16: 2})


def test_mark_dynamic_marks_exactly_the_intended_tensors():
    batch = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "lengths": torch.tensor([5, 3]),
        "meta": "text",
        "pair": (torch.zeros(2, 5, 3), 7, [torch.zeros(2, 5)]),
    }
    assert mark_dynamic(batch, strict=True, min=2, max=64) == ["input_ids", "pair[0]", "pair[2][0]"]
    assert 1 in batch["input_ids"]._dynamo_dynamic_indices
    assert not hasattr(batch["lengths"], "_dynamo_dynamic_indices")
    only = {"a": torch.zeros(2, 5), "b": torch.zeros(2, 5)}
    with pytest.warns(UserWarning, match="'a' dim 1 is marked with maybe_mark_dynamic"):
        assert mark_dynamic(only, keys=["a"]) == ["a"]
    assert hasattr(only["a"], "_dynamo_weak_dynamic_indices") and not hasattr(
        only["b"], "_dynamo_weak_dynamic_indices"
    )
    with pytest.raises(ShapeBucketError, match="min must be >= 2, got 1"):
        mark_dynamic(only, strict=True, min=1)
    with pytest.raises(ShapeBucketError, match="need strict=True"):
        mark_dynamic(only, max=10)
    with pytest.raises(ShapeBucketError, match=r"keys \['c'\]"):
        mark_dynamic(only, keys=["c"], strict=True)


def specialising(x):
    if x.shape[1] == 6:  # a Python branch on the length pins it to a constant
        return x * 2
    return x + 1


def test_mark_dynamic_strict_raises_on_specialised_dim():
    fn = torch.compile(specialising, fullgraph=True)
    x = torch.ones(2, 6)
    mark_dynamic(x, strict=False)  # maybe_mark_dynamic: compiles, specialised
    assert fn(x).sum() == 24
    torch._dynamo.reset()
    y = torch.ones(2, 6)
    mark_dynamic(y, strict=True)
    with pytest.raises(Exception, match="ConstraintViolation|constant|specializ"):
        fn(y)


def test_cache_save_and_load(tmp_path, compiled):
    sizes = save_compile_cache(tmp_path / "cache")
    assert sizes["inductor_bytes"] > 0
    assert (tmp_path / "cache" / "inductor").is_dir()
    assert load_compile_cache(tmp_path / "cache") is True
    assert load_compile_cache(tmp_path / "empty") is False
