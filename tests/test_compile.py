"""Compile helpers. The logic (guards, counters, prewarm bookkeeping, state restore)
runs in the fast suite with ``backend="eager"``: dynamo traces, guards and counts
graphs exactly as with inductor, without compiling C++. A few tests marked slow
compile with inductor for real."""

import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import compile_with_limit
from torch import nn

from shapebucket import BucketCollator, ShapeBucketError
from shapebucket import _torch as compat
from shapebucket.compile import (
    Cache,
    CompileCounter,
    RecompileLimit,
    Repeat,
    check_recompile_limit,
    compile_regions,
    load_compile_cache,
    mark_dynamic,
    no_recompiles,
    prewarm,
    save_compile_cache,
)
from shapebucket.compile.state import restore, snapshot
from shapebucket.fit.buckets import Buckets
from shapebucket.plan.shapes import Shape, ShapePlan

EAGER = {"backend": "eager", "dynamic": False}


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


def batch_of(lengths, seed=0, collate=COLLATE):
    g = torch.Generator().manual_seed(seed)
    return collate(
        [
            {"input_ids": (ids := torch.randint(0, 32, (n,), generator=g)), "labels": ids}
            for n in lengths
        ]
    )


pytestmark = pytest.mark.usefixtures("fresh_compiler")


def rows_of(collate, buckets=BUCKETS, rows=3):
    """The plan of a collator: its own rows when it pads rows, else ``rows`` per bucket."""
    if collate.rows is not None:
        return ShapePlan.of(collate)
    return ShapePlan([(rows, b) for b in buckets], collate)


PLAN = rows_of(COLLATE)


def check_prewarm_then_no_recompiles(cmodel):
    example = batch_of([5, 12, 3])  # bucket 16: the collator crops it to 8 and pads it to 24
    with CompileCounter() as outer:
        report = prewarm(cmodel, PLAN, example, progress=False)
    assert list(report.graphs) == [(3, 8), (3, 16), (3, 24)] == list(PLAN)
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


def test_prewarm_then_no_recompiles():
    torch.manual_seed(0)
    check_prewarm_then_no_recompiles(torch.compile(TinyLM(), fullgraph=True, **EAGER))


@pytest.mark.slow
def test_prewarm_then_no_recompiles_inductor():
    torch.manual_seed(0)
    check_prewarm_then_no_recompiles(torch.compile(TinyLM(), dynamic=False, fullgraph=True))


# -- prewarmed shapes are the real batches' shapes ------------------------------------


def signature(batch):
    """What dynamo guards on, per tensor: shape, dtype, strides."""
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    return {
        k: (tuple(v.shape), v.dtype, v.stride()) if isinstance(v, torch.Tensor) else type(v)
        for k, v in items
    }


def ids(n, g):
    return torch.randint(1, 30, (n,), generator=g)


def same(batch):
    return batch


def with_features(batch):
    """A [B, 8] tensor the user adds after collation: 8 is also the example's length."""
    return {**batch, "feat": torch.randn(batch["input_ids"].shape[0], 8)}


SHAPE_CASES = {
    # seq_dim=1: samples are [F, T]; batches [B, F, bucket] (the old prewarm made [B, bucket, T])
    "seq_dim=1": (
        BucketCollator(BUCKETS, seq_dim=1),
        lambda n, g: {"x": torch.randn(3, n, generator=g)},
        same,
    ),
    "left padding": (
        BucketCollator(BUCKETS, padding_side="left"),
        lambda n, g: {"input_ids": (t := ids(n, g)), "labels": t},
        same,
    ),
    "tuple": (
        BucketCollator(BUCKETS, pad_values={1: -100}),
        lambda n, g: (ids(n, g), ids(n, g)),
        same,
    ),
    # a [B, F] tensor whose F equals the example's length must keep its shape
    "features F == length": (
        BucketCollator(BUCKETS, sequence_keys=["input_ids"]),
        lambda n, g: {"input_ids": ids(n, g)},
        with_features,
    ),
    "features stacked by the collator": (
        BucketCollator(BUCKETS, sequence_keys=["input_ids"]),
        lambda n, g: {"input_ids": ids(n, g), "feat": torch.randn(8, generator=g)},
        same,
    ),
    "rows from rows": (
        BucketCollator(BUCKETS, rows={8: 4, 16: 3, 24: 3}),
        lambda n, g: {"input_ids": ids(n, g)},
        same,
    ),
}


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_prewarmed_batches_have_the_real_batches_shapes(case):
    collate, make, finish = SHAPE_CASES[case]
    g = torch.Generator().manual_seed(0)
    example = finish(collate([make(n, g) for n in (5, 8, 2)]))  # bucket 8: length 8
    seen = {}
    prewarm(
        None,
        rows_of(collate),
        example,
        step=lambda b: seen.setdefault(len(seen), signature(b)),
        verify=False,
        progress=False,
    )
    assert seen[0] == seen[1]  # prewarm's settle run: the smallest shape, compiler off
    for i, (lo, hi) in enumerate([(1, 8), (9, 16), (17, 24)]):
        lengths = [hi, lo, (lo + hi) // 2]
        real = finish(collate([make(n, g) for n in lengths]))
        assert signature(real) == seen[i + 1], (case, BUCKETS[i])


@pytest.mark.parametrize("case", list(SHAPE_CASES))
def test_real_batches_do_not_recompile_after_prewarm(case):
    """The end-to-end form of the test above: the verify pass and the loop agree."""
    collate, make, finish = SHAPE_CASES[case]

    def f(batch):
        tensors = batch.values() if isinstance(batch, dict) else batch
        return sum(t.float().sum() for t in tensors if isinstance(t, torch.Tensor))

    cf = torch.compile(f, **EAGER)
    g = torch.Generator().manual_seed(1)
    example = finish(collate([make(n, g) for n in (5, 8, 2)]))
    plan = rows_of(collate)
    prewarm(cf, plan, example, step=cf, progress=False)
    with CompileCounter() as cc, no_recompiles(plan):
        for lengths in ([8, 1, 3], [16, 9, 10], [24, 17, 20], [2, 2, 2]):
            cf(finish(collate([make(n, g) for n in lengths])))
    assert cc.graphs == 0


def test_plan_rows_pad_with_pad_rows_and_the_plans_rows_win():
    seen = []
    collate = BucketCollator([4, 16])
    prewarm(
        None,
        ShapePlan([(5, 4), (2, 16)], collate),
        batch_of([5, 7, 3], collate=collate),
        step=lambda b: seen.append({k: v.clone() for k, v in b.items()}),
        verify=False,
        progress=False,
    )
    settled, small, big = seen  # the settle run first: the smallest shape (5 x 4)
    assert settled["input_ids"].shape == small["input_ids"].shape == (5, 4)
    assert big["input_ids"].shape == (2, 16)
    assert (big["labels"][:, 8:] == -100).all() and not big["attention_mask"][:, 8:].any()
    # added rows are all-pad rows, as the collator makes them
    assert not small["attention_mask"][3:].any() and (small["labels"][3:] == -100).all()


def test_prewarm_pads_tuple_batches_with_the_collators_per_position_values():
    collate = BucketCollator(Buckets([4, 8]), pad_values={1: -100})
    example = collate([([1, 2, 3], [1, 2, 3]), ([4], [4])])
    seen = []
    prewarm(
        None,
        ShapePlan([(2, 4), (2, 8)], collate),
        example,
        step=seen.append,
        verify=False,
        progress=False,
    )
    ids_, labels, mask = seen[2]  # after the settle run and the first shape
    assert ids_.shape == labels.shape == mask.shape == (2, 8)
    assert (ids_[:, 4:] == 0).all() and (labels[:, 4:] == -100).all() and not mask[:, 4:].any()


def test_prewarm_without_a_collator_uses_make_batch():
    seen = []
    plan = ShapePlan.from_function([(2, 16), (2, 8)], lambda s: {"x": torch.ones(s), "shape": s})
    prewarm(None, plan, step=seen.append, verify=False, progress=False)
    # the settle run (the smallest shape), then every shape sorted by length
    assert [b["shape"] for b in seen] == [Shape(2, 8), Shape(2, 8), Shape(2, 16)]


def test_a_step_that_pops_its_batch_gets_a_whole_batch_each_run():
    # probe: Repeat(n) and CudaGraphs ran one batch n times: a step that pops a key got a raw KeyError
    model = torch.compile(TinyLM(), **EAGER)
    popped = []

    def step(batch):
        labels = batch.pop("labels")
        popped.append(labels.shape)
        model(batch.pop("input_ids"), labels, batch.pop("attention_mask")).backward()

    collate = BucketCollator([8, 16], rows=2)
    example = collate([{"input_ids": [1] * 8, "labels": [1] * 8}] * 2)  # at a bucket already
    report = prewarm(model, [8, 16], example=example, step=step, modes=[Repeat(2)], progress=False)
    # the settle run, each shape twice, then verify
    assert len(report.graphs) == 2 and len(popped) == 1 + 2 * 2 + 2
    assert set(example) == {"input_ids", "labels", "attention_mask"}  # the caller's batch kept


def test_prewarm_bad_arguments():
    with pytest.raises(ShapeBucketError, match="pass example=next"):
        prewarm(None, PLAN, step=lambda b: None)
    with pytest.raises(ShapeBucketError, match="prewarm takes a ShapePlan .or the buckets"):
        prewarm(None, "8,16", batch_of([3]), step=lambda b: None)  # type: ignore[arg-type]
    with pytest.raises(ShapeBucketError, match=r"prewarm\(model, buckets\) .* pass example="):
        prewarm(None, BUCKETS, step=lambda b: None)
    with pytest.raises(ShapeBucketError, match="implements the ShapedCollator protocol"):
        ShapePlan([(2, 8)], lambda s: s)
    with pytest.raises(ShapeBucketError, match=r"shapes\[0\] rows must be >= 1, got 0"):
        ShapePlan([(0, 8)], COLLATE)
    with pytest.raises(ShapeBucketError, match="modes must be shapebucket.compile modes"):
        prewarm(None, PLAN, batch_of([3]), step=lambda b: None, modes=["specialize"])  # type: ignore[list-item]
    with pytest.raises(ShapeBucketError, match="pass each mode once"):
        prewarm(
            None,
            PLAN,
            batch_of([3]),
            step=lambda b: None,
            modes=[RecompileLimit(), RecompileLimit(False)],
        )


def test_recompile_limit_raised_or_refused():
    compat.set_recompile_limit(2)
    fn = torch.compile(lambda x: (x * 2).sum(), **EAGER)
    three = Buckets([4, 6, 10])
    plan = ShapePlan.from_function([(2, b) for b in three], lambda s: (torch.ones(s),))
    with pytest.raises(
        ShapeBucketError, match="3 shapes exceed the compiler's recompile limit of 2"
    ):
        prewarm(fn, plan, modes=[RecompileLimit(raise_limit=False)], progress=False)
    report = prewarm(fn, plan, progress=False)
    assert report.limit_raised_from == 2 and report.limit == 3
    assert "raised from 2 to 3" in str(report)
    assert compat.get_recompile_limit() == 2  # put back: it caps new compiles only, so
    with CompileCounter() as cc, no_recompiles(plan):  # the 3 prewarmed graphs still serve
        for s in plan:
            fn(*plan.batch(None, s))
    assert cc.graphs == 0 and compat.recompile_limit_hits() == 0


def test_check_recompile_limit():
    check_recompile_limit(Buckets(range(2, 10)), 8)
    with pytest.raises(
        ShapeBucketError, match=r"9 buckets exceed .* limit of 8.*recompile_limit ?= ?9"
    ):
        check_recompile_limit(Buckets(range(2, 11)), 8)
    plan = ShapePlan.from_function([(2, 4), (4, 4), (2, 8)], lambda s: torch.ones(s))
    compat.set_recompile_limit(2)  # the default: the compiler's
    with pytest.raises(ShapeBucketError, match="3 shapes exceed .* limit of 2"):
        check_recompile_limit(plan)
    check_recompile_limit([8, 16])
    with pytest.raises(ShapeBucketError, match="limit must be >= 1, got 0"):
        check_recompile_limit([8], 0)


def test_the_recompile_limit_is_put_back_when_prewarm_fails():
    compat.set_recompile_limit(2)
    plan = ShapePlan.from_function([(2, n) for n in (4, 6, 10)], lambda s: (torch.ones(s),))

    def step(batch):
        if batch[0].shape[1] == 10:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        prewarm(None, plan, step=step, progress=False)
    assert compat.get_recompile_limit() == 2


# -- state: snapshot and restore -------------------------------------------------------


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


@pytest.mark.parametrize("given", [True, False], ids=["optimizer given", "optimizer found"])
@pytest.mark.parametrize("steps_before", [0, 1])
def test_prewarm_leaves_nothing_behind(steps_before, given):
    """Parameters, grads, batch-norm buffers, RNG and the optimizer's state come back
    bitwise, also when the step's optimizer was not passed (a global pre-hook finds it;
    AdamW's state is created lazily by its first step, or advanced)."""
    torch.manual_seed(1)
    model = TinyLM(batch_norm=True)
    cmodel = torch.compile(model, **EAGER)
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
    report = prewarm(
        cmodel,
        rows_of(COLLATE, [8, 16], rows=2),
        batch_of([5, 7]),
        step=step,
        restore=[opt] if given else [],
        progress=False,
    )
    after = state_of(model, opt)
    assert_same(before, after)
    assert model.norm.num_batches_tracked.item() == steps_before + 1
    assert len(opt.state) == (len(list(model.parameters())) if steps_before else 0)
    assert report.optimizers_found == (0 if given else 1)
    assert ("restored 1 optimizer" in str(report)) == (not given)
    # the hook is gone: stepping after prewarm is not intercepted
    step(batch_of([4, 6], seed=7))
    assert all(s["step"].item() == steps_before + 1 for s in opt.state.values())


def test_prewarm_warns_when_nothing_compiles():
    model = TinyLM()  # not compiled
    with pytest.warns(UserWarning, match="prewarm compiled 0 graphs"):
        report = prewarm(model, rows_of(COLLATE, rows=2), batch_of([5, 7]), progress=False)
    assert report.total_graphs == 0 and "nothing was compiled" in str(report)
    assert "verified" not in str(report)


def test_prewarm_refuses_a_function_that_hit_the_recompile_limit():
    cmodel = compile_with_limit(TinyLM(), 2, **EAGER)
    for n in (3, 5):  # two other shapes fill its limit before prewarm
        cmodel(**batch_of([n, n]))
    with pytest.raises(ShapeBucketError, match="hit the recompile limit"):
        prewarm(cmodel, rows_of(COLLATE, rows=2), batch_of([5, 7]), progress=False)


def test_no_recompiles_warns_about_functions_past_the_limit():
    f = compile_with_limit(lambda x: x * 2, 2, **EAGER)
    for n in (2, 3, 4):  # the third shape hits the limit: from then on f runs eagerly
        f(torch.ones(n))
    with (
        pytest.warns(UserWarning, match="1 compiled function.* hit the recompile limit"),
        no_recompiles(),
    ):
        f(torch.ones(5))  # a new shape, run eagerly: no recompile, so no error


def test_snapshot_and_restore_alone():
    """The state module on its own: a training step, eval mode and RNG draws, all undone."""
    torch.manual_seed(2)
    model = TinyLM(batch_norm=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(**batch_of([3, 5])).backward()
    opt.step()  # momentum buffers exist
    np.random.seed(4)
    random.seed(4)
    before = state_of(model, opt)
    snap = snapshot(model, opt)
    model.eval()
    model(**batch_of([7, 2], seed=1)).backward()
    opt.step()
    opt.param_groups[0]["lr"] = 0.5
    torch.rand(3), np.random.rand(), random.random()
    restore(snap)
    assert model.training and opt.param_groups[0]["lr"] == 0.1
    assert_same(before, state_of(model, opt))


# -- mark_dynamic and the compile counter ---------------------------------------------


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
        assert mark_dynamic(only, sequence_keys=["a"]) == ["a"]
    assert hasattr(only["a"], "_dynamo_weak_dynamic_indices") and not hasattr(
        only["b"], "_dynamo_weak_dynamic_indices"
    )
    with pytest.raises(ShapeBucketError, match="min must be >= 2, got 1"):
        mark_dynamic(only, strict=True, min=1)
    with pytest.raises(ShapeBucketError, match="need strict=True"):
        mark_dynamic(only, max=10)
    with pytest.raises(ShapeBucketError, match=r"sequence_keys \['c'\]"):
        mark_dynamic(only, sequence_keys=["c"], strict=True)
    with pytest.raises(ShapeBucketError, match=r"sequence_keys=\['a'\]"):
        mark_dynamic(only, sequence_keys="a", strict=True)  # a string is not a list of keys
    with pytest.raises(ShapeBucketError, match="found no tensor"):
        mark_dynamic([1, 2, 3], strict=True)


def specialising(x):
    if x.shape[1] == 6:  # a Python branch on the length pins it to a constant
        return x * 2
    return x + 1


def test_mark_dynamic_strict_raises_on_specialised_dim():
    fn = torch.compile(specialising, fullgraph=True, backend="eager")
    x = torch.ones(2, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        mark_dynamic(x, strict=False)  # maybe_mark_dynamic: compiles, specialised
    assert fn(x).sum() == 24
    compat.reset_compiler()
    y = torch.ones(2, 6)
    mark_dynamic(y, strict=True)
    with pytest.raises(Exception, match="ConstraintViolation|constant|specializ"):
        fn(y)


def test_compile_counter_counts_graphs_and_reasons():
    f = torch.compile(lambda x: x * 2, **EAGER)
    with CompileCounter() as cc:
        f(torch.ones(2))
        f(torch.ones(2))
        f(torch.ones(3))
    assert (
        cc.graphs == 2
        and len(cc.recompiles) == 1
        and repr(cc) == "CompileCounter(graphs=2, recompiles=1)"
    )


def test_no_recompiles_names_a_guard_other_than_size():
    f = torch.compile(lambda x: x + 1, **EAGER)
    f(torch.ones(2, 8))
    with pytest.raises(ShapeBucketError, match="guard other than its size"), no_recompiles():
        f(torch.ones(2, 8, dtype=torch.float64))


class TakesKeywords(nn.Module):
    def forward(self, **kwargs):  # a Hugging Face model's inputs: guarded as kwargs['...']
        return kwargs["input_ids"] * 2


def test_no_recompiles_names_the_size_of_a_keyword_input():
    """Issue #30 item 11: the size pattern missed ``tensor 'kwargs['input_ids']'`` (the
    nested quotes) and called a new size 'a guard other than its size'."""
    m = torch.compile(TakesKeywords(), **EAGER)
    m(input_ids=torch.ones(2, 8))
    with (
        pytest.raises(ShapeBucketError, match=r"input \"kwargs\['input_ids'\]\" has size 24"),
        no_recompiles([8]),
    ):
        m(input_ids=torch.ones(2, 24))


class SumsKeywords(nn.Module):
    def forward(self, **kwargs):  # reads every keyword: guarded on len(kwargs)
        return sum(v.sum() for v in kwargs.values())


class TakesLabels(nn.Module):
    def forward(self, input_ids, labels=None):
        return input_ids * 2 if labels is None else (input_ids - labels).sum()


@pytest.mark.parametrize("model", [SumsKeywords(), TakesLabels()], ids=["kwargs", "named"])
def test_no_recompiles_names_a_call_with_other_keys_than_the_example(model):
    """A new user prewarmed a BucketedModel with ``{"input_ids": ...}`` and called it with
    labels too: the guard (``len(kwargs) == 1``, ``labels is None``) was called 'a different
    stride, dtype or device'; it now says the keys differ from the example's."""
    m = torch.compile(model, **EAGER)
    x = torch.ones(2, 8)
    m(input_ids=x)
    with (
        pytest.raises(ShapeBucketError, match="other inputs than the prewarmed example did"),
        no_recompiles([8]),
    ):
        m(input_ids=x, labels=x)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda m, x: (m.eval(), m(x)), r"eval mode: .* was compiled \(or prewarmed\) in train mode"),
        (lambda m, x: torch.no_grad()(m)(x), "grad mode: the call runs with gradients on or off"),
        (lambda m, x: torch.inference_mode()(m)(x), r"modes=\[Inference\(\)\]"),
    ],
    ids=["eval", "no_grad", "inference_mode"],
)
def test_no_recompiles_names_grad_eval_and_inference_mode(change, needle):
    """Issue 39 item 17: a call in another grad, eval or inference mode than the prewarmed
    ones was said to have 'a different stride, dtype or device'."""
    m = torch.compile(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1)), **EAGER)
    x = torch.ones(2, 4)
    m(x)
    with pytest.raises(ShapeBucketError, match=needle) as info, no_recompiles([4]):
        change(m, x)
    assert "stride, dtype or device" not in str(info.value).split("compiler said")[0]
    assert "Pad every batch" not in str(info.value)


# -- the compile cache (inductor) ------------------------------------------------------


@pytest.mark.slow
def test_cache_save_and_load(tmp_path):
    f = torch.compile(lambda x: torch.relu(x) * 3, dynamic=False)
    with compat.fresh_inductor_cache(str(tmp_path / "live")):
        f(torch.ones(4))
        sizes = save_compile_cache(tmp_path / "cache")
    assert sizes["inductor_bytes"] > 0
    assert (tmp_path / "cache" / "inductor").is_dir()
    assert load_compile_cache(tmp_path / "cache") is True
    assert load_compile_cache(tmp_path / "empty") is False


def _fake_cache(tmp_path):
    """A saved cache of two made-up inductor files (no compile needed)."""
    live = tmp_path / "live"
    (live / "ab").mkdir(parents=True)
    (live / "ab" / "kernel.py").write_text("x = 1\n" * 100)
    (live / "graph.bin").write_bytes(bytes(range(256)) * 8)
    with compat.fresh_inductor_cache(str(live)):
        save_compile_cache(tmp_path / "cache")
    return tmp_path / "cache"


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda c: (c / "inductor" / "graph.bin").write_bytes(b"\0" * 100), "truncated"),
        (lambda c: (c / "inductor" / "ab" / "kernel.py").write_text("x = 2\n" * 100), "checksum"),
        (lambda c: (c / "inductor" / "ab" / "kernel.py").unlink(), "missing"),
        (lambda c: (c / "manifest.json").unlink(), "manifest.json is missing"),
        (lambda c: (c / "manifest.json").write_text("{not json"), "unreadable"),
        (
            lambda c: (c / "manifest.json").write_text(
                (c / "manifest.json").read_text().replace(torch.__version__, "1.0.0")
            ),
            "saved by torch 1.0.0",
        ),
    ],
)
def test_a_damaged_cache_is_refused_and_nothing_is_copied(tmp_path, damage, needle):
    cache = _fake_cache(tmp_path)
    damage(cache)
    target = tmp_path / "target"
    with compat.fresh_inductor_cache(str(target)), pytest.warns(UserWarning, match=needle):
        assert load_compile_cache(cache) is False
    assert not target.exists() or not any(target.rglob("*.bin"))


def test_an_intact_cache_is_copied(tmp_path):
    cache = _fake_cache(tmp_path)
    target = tmp_path / "target"
    with compat.fresh_inductor_cache(str(target)):
        assert load_compile_cache(cache) is True
    assert (target / "graph.bin").read_bytes() == bytes(range(256)) * 8


# -- 0.1 was never released: no old names, no shim module (CHANGELOG.md) ---------------


def test_no_old_names():
    import importlib

    import shapebucket

    assert not hasattr(shapebucket, "count_compiles")
    with pytest.raises(TypeError, match="batch_size"):
        prewarm(None, PLAN, batch_of([3]), step=print, batch_size=2)  # type: ignore[call-arg]
    for old in ("collator", "optimizer", "specialize", "cache_dir", "make_batch"):
        with pytest.raises(TypeError, match=old):
            prewarm(None, PLAN, batch_of([3]), **{old: None})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys"):
        mark_dynamic({"a": torch.zeros(2, 4)}, keys=["a"])  # type: ignore[call-arg]
    # shapebucket.compile is the compilation subpackage, not a module of re-exports
    assert importlib.import_module("shapebucket.compile").__file__.endswith("__init__.py")


# -- prewarm's own compile cache -------------------------------------------------------


def test_prewarm_cache_key_follows_the_job(tmp_path):
    cmodel = torch.compile(TinyLM(), **EAGER)
    p16, p24 = rows_of(COLLATE, [8, 16], rows=2), rows_of(COLLATE, [8, 24], rows=2)
    example = batch_of([5, 7])
    with compat.fresh_inductor_cache(str(tmp_path / "live")):
        a = prewarm(cmodel, p16, example, progress=False, modes=[Cache(tmp_path)])
        b = prewarm(cmodel, p24, example, progress=False, modes=[Cache(tmp_path)])
        c = prewarm(
            cmodel, p16, example, progress=False, modes=[Cache(tmp_path, "mode=max-autotune")]
        )
        d = prewarm(cmodel, p16, example, progress=False, modes=[Cache(tmp_path)])
    assert a.cache_path == d.cache_path and len({a.cache_path, b.cache_path, c.cache_path}) == 3
    assert a.how == {(2, 8): "compiled", (2, 16): "compiled"}
    assert d.how == {(2, 8): "none", (2, 16): "none"}
    assert not a.cache_saved  # the eager backend builds nothing inductor could cache
    assert "compile cache" in str(a)


@pytest.mark.slow
def test_prewarm_warm_start_from_its_cache(tmp_path):
    """Second run of the same job, in a fresh compiler with an empty inductor cache:
    every bucket comes from prewarm's cache_dir."""

    def run(live):
        compat.reset_compiler()
        torch.manual_seed(0)
        cmodel = torch.compile(TinyLM(), dynamic=False)
        with compat.fresh_inductor_cache(str(live)):
            return prewarm(
                cmodel,
                rows_of(COLLATE, [8, 16], rows=2),
                batch_of([5, 7]),
                progress=False,
                modes=[Cache(tmp_path / "cache")],
            )

    cold = run(tmp_path / "live1")
    assert set(cold.how.values()) == {"compiled"} and cold.cache_saved and not cold.cache_loaded
    warm = run(tmp_path / "live2")
    assert warm.cache_loaded and set(warm.how.values()) == {"cache"} and not warm.cache_saved
    assert warm.cache_path == cold.cache_path


# -- regional compilation -----------------------------------------------------------------


def _gpt():
    from shapebucket.bench.model import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(dim=32, layers=3))


def _gpt_batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (4, n), generator=g)
    return {"input_ids": ids, "labels": ids, "attention_mask": torch.ones(4, n, dtype=torch.bool)}


def test_repeated_blocks_are_the_outermost_repeats():
    from shapebucket.compile.regions import repeated_blocks

    model = _gpt()
    assert [n for n, _ in repeated_blocks(model)] == ["blocks.0", "blocks.1", "blocks.2"]
    block = type(model.blocks[0])
    assert [n for n, _ in repeated_blocks(model, (block,))] == ["blocks.0", "blocks.1", "blocks.2"]
    with pytest.raises(ShapeBucketError, match="has no repeated blocks"):
        compile_regions(nn.Linear(2, 2))
    with pytest.raises(ShapeBucketError, match="needs an nn.Module"):
        compile_regions(lambda x: x)
    with pytest.raises(ShapeBucketError, match="block_types must be a tuple"):
        compile_regions(model, block_types=block)


def test_regional_prewarm_compiles_one_block_graph_per_bucket():
    """Three blocks of one class share one graph per bucket: prewarm cost follows the
    number of distinct blocks, not of layers; the results equal the eager model's."""
    model, ref = _gpt(), _gpt()
    assert compile_regions(model, **EAGER) == ["blocks.0", "blocks.1", "blocks.2"]
    plan = ShapePlan.from_function([(4, 16), (4, 32)], lambda s: _gpt_batch(s.length))
    report = prewarm(model, plan, progress=False)
    assert report.graphs == {(4, 16): 1, (4, 32): 1}
    with CompileCounter() as cc, no_recompiles(plan):
        for n, seed in ((16, 1), (32, 2), (16, 3)):
            batch = _gpt_batch(n, seed)
            assert torch.equal(model(**batch), ref(**batch))
    assert cc.graphs == 0


@pytest.mark.parametrize(
    "bad",
    [{8: 2, 16: 2}, "abc", 5, None, BucketCollator([8, 16])],
    ids=["rows-dict", "str", "int", "none", "collator"],
)
def test_the_guard_and_the_limit_check_refuse_what_is_not_a_plan_or_buckets(bad):
    with pytest.raises(ShapeBucketError, match=r"check_recompile_limit takes the ShapePlan"):
        check_recompile_limit(bad)
    if bad is not None:  # no_recompiles() without a plan is fine
        with (
            pytest.raises(ShapeBucketError, match=r"no_recompiles takes the ShapePlan"),
            no_recompiles(bad),
        ):
            pass


def test_the_guard_does_not_iterate_a_sampler_passed_by_mistake():
    from shapebucket import BucketBatchSampler

    sampler = BucketBatchSampler([3, 9, 4], [8, 16], rows=1, shuffle=False)
    with (
        pytest.raises(ShapeBucketError, match=r"got BucketBatchSampler; pass ShapePlan.of"),
        no_recompiles(sampler),
    ):
        pass
    assert sampler.state_dict()["position"] == 0 and len(list(sampler)) == 3
