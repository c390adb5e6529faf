"""ShapePlan: the (rows, length) shapes a loader produces, inferred from its collator and
sampler, and prewarming a plan leaves a real loader nothing to compile.

The samplers' ``shapes()`` is written on another branch; here a stand-in lists the
shapes found by iterating a real sampler over several epochs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shapebucket import BucketBatchSampler, BucketCollator, PackedCollator, ShapeBucketError
from shapebucket.compile import CompileCounter, no_recompiles, prewarm
from shapebucket.fit.buckets import Buckets
from shapebucket.plan.shapes import Shape, ShapePlan
from shapebucket.sampling import CellBatchSampler

LENGTHS = np.random.default_rng(0).integers(2, 40, 61)
BUCKETS = Buckets([8, 16, 32, 40])


class Listed:
    """A sampler stand-in: ``shapes()`` as the samplers expose it."""

    def __init__(self, shapes):
        self._shapes = frozenset(shapes)

    def shapes(self):
        return self._shapes


def iterated_shapes(make, epochs=3):
    """Every (rows, bucket) of a sampler's batches over ``epochs`` epochs."""
    out = set()
    for epoch in range(epochs):
        s = make()
        s.set_epoch(epoch)
        out |= {(len(b), s.buckets.bucket_for(int(LENGTHS[b].max()))) for b in s}
    return out


def make_sampler(**kwargs):
    return BucketBatchSampler(LENGTHS, BUCKETS, rows=5, seed=0, **kwargs)


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, i):
        return {"input_ids": torch.arange(int(LENGTHS[i])) % 7 + 1}


pytestmark = pytest.mark.usefixtures("fresh_compiler")


def test_a_collator_with_rows_gives_one_shape_per_bucket():
    collate = BucketCollator(BUCKETS, rows={8: 6, 16: 4, 32: 2, 40: 2})
    plan = ShapePlan.of(collate)
    assert plan.shapes == (Shape(6, 8), Shape(4, 16), Shape(2, 32), Shape(2, 40))
    assert plan.lengths == BUCKETS and len(plan) == 4 and list(plan) == list(plan.shapes)
    packed = PackedCollator([16, 32], rows={16: 4, 32: 2})
    assert ShapePlan.of(packed).shapes == ((4, 16), (2, 32))


def test_row_buckets_give_every_length_at_every_row_bucket():
    collate = BucketCollator.with_row_buckets([8, 16], [4, 1])
    assert ShapePlan.of(collate).shapes == ((1, 8), (4, 8), (1, 16), (4, 16))
    with pytest.warns(UserWarning, match=r"no shapes \[\(4, 16\)\]"):
        ShapePlan([(1, 8), (4, 8), (1, 16)], collate)  # serving would compile (4, 16) late
    with pytest.raises(
        ShapeBucketError, match=r"row_buckets=\[1, 4\]\) makes .* a batch of 3 rows"
    ):
        ShapePlan([(3, 8)], collate)


@pytest.mark.parametrize("drop_last", [False, True])
def test_without_row_padding_the_sampler_gives_the_shapes(drop_last):
    shapes = iterated_shapes(lambda: make_sampler(drop_last=drop_last))
    plan = ShapePlan.of(BucketCollator(BUCKETS), Listed(shapes))
    assert set(plan.shapes) == shapes
    assert plan.shapes == tuple(sorted(shapes, key=lambda s: (s[1], s[0])))
    if not drop_last:  # short last batches are shapes of their own
        assert len({length for _, length in shapes}) < len(shapes)


def test_with_row_padding_and_a_sampler_only_used_buckets():
    collate = BucketCollator(BUCKETS, rows=5)
    plan = ShapePlan.of(collate, Listed({(5, 8), (3, 8), (5, 32)}))
    assert plan.shapes == ((5, 8), (5, 32))
    with pytest.raises(ShapeBucketError, match="batches of 7 rows at bucket 8, more than"):
        ShapePlan.of(collate, Listed({(7, 8)}))
    with pytest.raises(ShapeBucketError, match=r"buckets \[12\], which the collator"):
        ShapePlan.of(collate, Listed({(5, 12)}))


def test_prewarmed_plan_leaves_a_real_loader_nothing_to_compile():
    """Short last batches have their own shape; the plan from the sampler covers them."""
    collate = BucketCollator(BUCKETS, mask_key=None)
    plan = ShapePlan.of(collate, Listed(iterated_shapes(make_sampler)))
    f = torch.compile(lambda input_ids: (input_ids * 2).sum(), dynamic=False, backend="eager")
    loader = DataLoader(Tokens(), batch_sampler=make_sampler(), collate_fn=collate)
    report = prewarm(f, plan, next(iter(loader)), progress=False)
    assert report.num_shapes == len(plan) == report.total_graphs
    sampler = loader.batch_sampler
    with CompileCounter() as cc, no_recompiles(plan):
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for batch in loader:
                f(**batch)
    assert cc.graphs == 0


def test_bad_plans_name_the_value_and_the_fix():
    collate = BucketCollator(BUCKETS)
    with pytest.raises(ShapeBucketError, match="pads no rows.*ShapePlan.of\\(collator, sampler\\)"):
        ShapePlan.of(collate)
    with pytest.raises(ShapeBucketError, match="implements the ShapedCollator protocol"):
        ShapePlan.of(lambda s: s)
    with pytest.raises(ShapeBucketError, match="needs a batch sampler that lists its shapes"):
        ShapePlan.of(collate, [[1, 2]])
    with pytest.raises(ShapeBucketError, match="exactly one of collator"):
        ShapePlan([(2, 8)])
    with pytest.raises(ShapeBucketError, match=r"lengths \[12\] are not buckets"):
        ShapePlan([(2, 12)], collate)
    with pytest.raises(ShapeBucketError, match=r"shapes\[1\] must be a \(rows, length\) pair"):
        ShapePlan([(2, 8), 8], collate)
    with pytest.raises(ShapeBucketError, match=r"shapes\[0\] length must be >= 2, got 1"):
        ShapePlan.from_function([(2, 1)], torch.ones)
    with pytest.raises(ShapeBucketError, match="shapes must be a list"):
        ShapePlan.from_function("2x8", torch.ones)  # type: ignore[arg-type]
    with pytest.raises(ShapeBucketError, match="at least one"):
        ShapePlan.from_function([], torch.ones)
    with pytest.raises(ShapeBucketError, match="make_batch must be a function"):
        ShapePlan.from_function([(2, 8)], 3)  # type: ignore[arg-type]
    with pytest.raises(
        ShapeBucketError, match=r"shape \(2, 8\) never occurs: BucketCollator\(.*rows=4"
    ):
        ShapePlan([(2, 8)], BucketCollator(BUCKETS, rows=4))
    with pytest.raises(ShapeBucketError, match="pass example=next"):
        ShapePlan([(2, 8)], collate).batch(None, (2, 8))


class _Triples:
    """A user's collator whose shapes() gives (rows, source, target) triples."""

    packs, seq_dim = False, 0

    def __init__(self, shapes):
        self._shapes = shapes

    def shapes(self, sampler=None):
        return self._shapes

    def repad(self, batch, shape):
        return {"x": torch.zeros(shape.rows, *shape.lengths)}


def test_a_user_collator_giving_triples_for_one_length_batches_is_refused():
    """The protocol: shapes() gives (rows, length) pairs for a one-length sampler's batches;
    triples would make a plan of shapes the loader never makes."""
    sampler = BucketBatchSampler([3, 5, 7], [8], rows=2)
    for triples in ([(2, 8, 4)], (s for s in [(2, 8), Shape(2, 8, 4)])):
        with pytest.raises(
            ShapeBucketError,
            match=r"_Triples.shapes\(sampler\) returned \(2, 8, 4\), a shape of 2 length\(s\), "
            r"for a BucketBatchSampler whose batches have 1 length\(s\).*\(rows, length\) pairs",
        ):
            ShapePlan.of(_Triples(triples), sampler)
    with pytest.raises(ShapeBucketError, match=r"returned \(2, 8, 4\), .* for a _Listed whose"):
        ShapePlan([(2, 8)], _Triples([(2, 8, 4)]))  # a plan from a list checks the same
    assert ShapePlan.of(_Triples([(2, 8)]), sampler).shapes == (Shape(2, 8),)
    cells = CellBatchSampler([3, 5], [2, 4], [(8, 4)], rows=2)
    assert ShapePlan.of(_Triples([(2, 8, 4)]), cells).shapes == (Shape(2, 8, 4),)
    with pytest.raises(ShapeBucketError, match=r"returned \(2, 8\), a shape of 1 length.*triples"):
        ShapePlan.of(_Triples([(2, 8)]), cells)


def test_from_function_plans_pickle_and_print():
    plan = ShapePlan.from_function([(2, 16), (2, 8), (2, 8)], torch.ones)
    assert plan.shapes == ((2, 8), (2, 16))  # sorted, duplicates once
    assert plan.batch(None, plan.shapes[0]).shape == (2, 8)
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert repr(plan) == "ShapePlan([(2, 8), (2, 16)], ones)"
    collated = ShapePlan.of(BucketCollator(BUCKETS, rows=3))
    assert pickle.loads(pickle.dumps(collated)).shapes == collated.shapes


@given(
    st.lists(st.integers(2, 64), min_size=1, max_size=5, unique=True),
    st.integers(1, 6),
    st.lists(st.integers(1, 30), min_size=1, max_size=4),
)
def test_every_planned_batch_has_its_shape(buckets, rows, lengths):
    collate = BucketCollator(sorted(buckets), rows=rows, overflow="truncate")
    example = collate([{"input_ids": [1] * n} for n in lengths][:rows])
    plan = ShapePlan.of(collate)
    assert [s.length for s in plan] == sorted(buckets)
    for shape in plan:
        batch = plan.batch(example, shape)
        assert batch["input_ids"].shape == shape == batch["attention_mask"].shape


def test_plan_batch_refuses_shapes_outside_the_plan_and_wrong_batches():
    """Probe: plan.batch(example, (4, 9)) padded to a length no bucket has, (4, 8, 1) raised a
    raw TypeError, and a make_batch ignoring its shape was prewarmed as if it were right."""
    collate = BucketCollator([8, 16], rows=4)
    plan = ShapePlan.of(collate)
    example = collate([{"input_ids": [1, 2]}])
    with pytest.raises(ShapeBucketError, match=r"shape \(4, 9\) is not in the plan"):
        plan.batch(example, (4, 9))
    with pytest.raises(ShapeBucketError, match=r"shape \(4, 8, 1\) is not in the plan"):
        plan.batch(example, (4, 8, 1))
    with pytest.raises(ShapeBucketError, match="must be a .rows, length. pair, got 8"):
        plan.batch(example, 8)
    wrong = ShapePlan.from_function([(2, 8), (2, 16)], lambda s: {"x": torch.ones(3, 5)})
    with pytest.raises(ShapeBucketError, match=r"make_batch\(\(2, 8\)\) returned .*\(3, 5\)"):
        prewarm(None, wrong, step=lambda b: None, progress=False)
    untyped = ShapePlan.from_function([(2, 8)], lambda s: {"shape": s})  # no tensors: the step's
    assert untyped.batch(None, (2, 8)) == {"shape": Shape(2, 8)}


def test_plan_shapes_refuse_unordered_pairs():
    """Probe: a {rows: length} dict pair was read as (rows, next key), a set in hash order."""
    for pair in ({2: 8}, {1: 2, 3: 4}, {2, 8}):
        with pytest.raises(ShapeBucketError, match=r"shapes\[0\] must be a \(rows, length\) pair"):
            ShapePlan.from_function([pair], torch.ones)


def test_of_refuses_a_bucket_sampler_with_a_packed_collator_and_back():
    """Probe: ShapePlan.of(BucketCollator, PackedBatchSampler) gave the packed sampler's
    rows as the plan, though a BucketCollator makes one row per sample of such a batch."""
    from shapebucket import PackedBatchSampler

    lengths = [3, 5, 7, 9, 12, 15, 4, 6] * 4
    packed = PackedBatchSampler(lengths, [16], rows=2)
    bucket = BucketBatchSampler(lengths, [16], rows=4)
    with pytest.raises(ShapeBucketError, match="PackedBatchSampler and a BucketCollator do not"):
        ShapePlan.of(BucketCollator([16]), packed)
    with pytest.raises(ShapeBucketError, match="BucketBatchSampler and a PackedCollator do not"):
        ShapePlan.of(PackedCollator([16], rows=2), bucket)
    assert ShapePlan.of(PackedCollator([16], rows=2), packed).shapes == (Shape(2, 16),)


def test_of_refuses_sampler_batches_larger_than_every_row_bucket():
    """Probe: row_buckets=[1, 2] with a rows=4 sampler planned (1|2, bucket) shapes;
    every batch of the loader then fails to collate."""
    lengths = [3, 5, 7, 9, 12, 15, 4, 6] * 4
    sampler = BucketBatchSampler(lengths, [8, 16], rows=4)
    with pytest.raises(ShapeBucketError, match=r"batches of 4 rows .* largest row bucket 2"):
        ShapePlan.of(BucketCollator.with_row_buckets([8, 16], [1, 2]), sampler)
    assert len(ShapePlan.of(BucketCollator.with_row_buckets([8, 16], [2, 4]), sampler)) == 4
