"""The collator protocol (shapebucket.plan.ShapedCollator): every collator lists its shapes
and re-pads its batches, the plan asks nothing else, and a collator of the user's own
joins the plan, prewarm and no_recompiles without a change to the package."""

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shapebucket
from shapebucket import (
    BucketBatchSampler,
    BucketCollator,
    PackedBatchSampler,
    PackedCollator,
    ShapeBucketError,
    ShapePlan,
    no_recompiles,
    prewarm,
)
from shapebucket.collate import CellCollator, KeyRoles, WithDocumentBlocks
from shapebucket.fit import Cells
from shapebucket.plan import Shape, ShapedCollator
from shapebucket.plan.coerce import as_plan
from shapebucket.sampling import CellBatchSampler

EAGER = {"dynamic": False, "backend": "eager", "fullgraph": True}
LENGTHS = [3, 5, 7, 9, 12, 15, 4, 6, 11, 2, 14, 8] * 3


def token_samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, 50, (n,), generator=g)} for n in lengths]


def test_every_collator_implements_the_protocol_and_the_plan_asks_only_it():
    bucket = BucketBatchSampler(LENGTHS, [8, 16], rows=4)
    packed = PackedBatchSampler(LENGTHS, [8, 16], rows=2)
    cells = CellBatchSampler(
        LENGTHS, [n // 2 + 1 for n in LENGTHS], [(8, 4), (16, 8)], rows=4
    )
    pairs = [
        (BucketCollator([8, 16]), bucket),
        (PackedCollator([8, 16], rows=packed.rows), packed),
        (CellCollator([(8, 4), (16, 8)]), cells),
    ]
    for collator, sampler in pairs:
        assert isinstance(collator, ShapedCollator)
        assert collator.packs == getattr(sampler, "packs", False)  # ShapedSampler.packs
        plan = ShapePlan.of(collator, sampler)
        assert set(plan.shapes) == collator.shapes(sampler)
        assert all(isinstance(s, Shape) for s in plan)
        assert pickle.loads(pickle.dumps(plan)) == plan  # DataLoader workers, spawn


def test_pairing_is_by_the_packs_attribute_not_by_class_name():
    class MyPacked(PackedCollator):  # a subclass: still packs
        pass

    packed = PackedBatchSampler(LENGTHS, [16], rows=2)
    assert len(ShapePlan.of(MyPacked([16], rows=packed.rows), packed)) == 1
    with pytest.raises(ShapeBucketError, match=r"do not make one loader.*packs=True.*packs=False"):
        ShapePlan.of(BucketCollator([16]), packed)


# -- issue 30, defect 2 ----------------------------------------------------------------------


def test_packed_seq_dim_1_with_a_token_mask_re_pads_its_own_batch():
    """Issue 30 (2): repad took the collator's own [rows, L] token mask for a foreign
    value, so ShapePlan.batch and prewarm could not run on audio features."""
    collate = PackedCollator([8, 16], rows={8: 2, 16: 1}, seq_dim=1, mask_key="token_mask")
    feats = [np.arange(3 * n, dtype=np.float32).reshape(3, n) for n in (5, 2, 6)]
    batch = collate([{"feat": f} for f in feats])
    assert batch["feat"].shape == (2, 3, 8) and batch["token_mask"].shape == (2, 8)
    plan = ShapePlan.of(collate)
    for shape in plan:
        big = plan.batch(batch, shape)
        assert big["feat"].shape == (shape.rows, 3, shape.length)
        assert big["token_mask"].shape == big["position_ids"].shape == tuple(shape)
    big = collate.repad(batch, Shape(2, 16))
    assert torch.equal(big["feat"][:, :, :8], batch["feat"]) and not big["feat"][:, :, 8:].any()
    assert torch.equal(big["token_mask"][:, :8], batch["token_mask"])
    assert torch.equal(collate.repad(big, Shape(2, 8))["feat"], batch["feat"])


# -- issue 30, defect 5 ----------------------------------------------------------------------


def test_cell_sampler_and_collator_with_other_weights_are_refused():
    """Issue 30 (5): a CellCollator built from the pairs alone put a batch of a weighted
    sampler in another cell; ShapePlan.of compared the pairs only."""
    src = [3, 5, 12, 14, 6, 15] * 4
    tgt = [8, 2, 3, 7, 2, 8] * 4
    cells = Cells([(8, 8), (16, 4), (16, 8)], weights=(1, 4))
    sampler = CellBatchSampler(src, tgt, cells, rows=2)
    with pytest.raises(
        ShapeBucketError, match=r"weights=\(1, 4\).*weights=\(1, 1\).*sampler\.cells"
    ):
        ShapePlan.of(CellCollator(cells.cells), sampler)
    with pytest.raises(ShapeBucketError, match=r"cells are Cells.*CellCollator\(sampler.cells"):
        ShapePlan.of(
            CellCollator([(8, 8), (16, 8)], rows=2),
            CellBatchSampler(src, tgt, [(16, 8)], rows=2),
        )
    assert len(ShapePlan.of(CellCollator(sampler.cells), sampler)) >= 1


# -- the design card: prewarm(model, buckets, example=batch) --------------------------------


def test_prewarm_takes_the_buckets_and_a_batch_of_a_plain_loader(fresh_compiler):
    buckets = [8, 16]
    loader = DataLoader(
        token_samples(LENGTHS), batch_size=4, collate_fn=BucketCollator(buckets=buckets)
    )
    emb = torch.nn.Embedding(64, 4)

    def model(input_ids, attention_mask):
        return (emb(input_ids) * attention_mask[..., None]).sum()

    compiled = torch.compile(model, **EAGER)
    batch = next(iter(loader))
    report = shapebucket.prewarm(compiled, buckets, example=batch, progress=False)
    assert report.total_graphs == 2 and report.num_shapes == 2
    with no_recompiles(as_plan(buckets, batch, BucketCollator)):
        for b in loader:
            compiled(**b).backward()


def test_prewarm_with_buckets_names_what_is_missing_or_wrong():
    with pytest.raises(
        ShapeBucketError, match=r"prewarm\(model, buckets\) has nothing .* pass example="
    ):
        prewarm(None, [8, 16])
    packed = PackedCollator([8, 16], rows=2, cu_seqlens_key="cu_seqlens")
    batch = packed(token_samples([3, 4]))
    with pytest.raises(ShapeBucketError, match=r"example\['cu_seqlens'\] has shape \(17,\)"):
        prewarm(None, [8, 16], example=batch)
    audio = BucketCollator([8, 16], seq_dim=1)([{"x": np.ones((3, 5), np.float32)}])
    with pytest.raises(ShapeBucketError, match=r"example\['x'\].*dim 1 \(3\) is not a bucket"):
        prewarm(None, [8, 16], example=audio)
    with pytest.raises(ShapeBucketError, match="takes a ShapePlan"):
        prewarm(None, {8: 2}, example=audio)


# -- a collator of the user's own -------------------------------------------------------------


class WeightedPacked:
    """A user's collator: PackedCollator's batch plus a per-token loss weight (1 / the
    length of the token's sample). It implements the protocol by delegating."""

    packs = True
    seq_dim = 0

    def __init__(self, buckets, rows):
        self.inner = PackedCollator(buckets, rows=rows)

    def __call__(self, samples):
        return self._weigh(self.inner(samples))

    def shapes(self, sampler=None):
        return self.inner.shapes(sampler)

    def repad(self, batch, shape):
        plain = {k: v for k, v in batch.items() if k != "weight"}
        return self._weigh(self.inner.repad(plain, shape))

    @staticmethod
    def _weigh(batch):
        docs = batch["document_ids"]
        weight = torch.zeros(docs.shape, dtype=torch.float32)
        for r in range(docs.shape[0]):
            ids, counts = torch.unique(docs[r][docs[r] >= 0], return_counts=True)
            for d, c in zip(ids.tolist(), counts.tolist(), strict=True):
                weight[r][docs[r] == d] = 1.0 / c
        return {**batch, "weight": weight}


def test_a_users_own_collator_is_planned_prewarmed_and_guarded(fresh_compiler):
    sampler = PackedBatchSampler(LENGTHS, [8, 16], rows={8: 3, 16: 2}, seed=3)
    collate = WeightedPacked([8, 16], rows=sampler.rows)
    loader = DataLoader(token_samples(LENGTHS), batch_sampler=sampler, collate_fn=collate)
    plan = ShapePlan.of(collate, sampler)
    assert plan.shapes == (Shape(3, 8), Shape(2, 16)) and plan.collator is collate
    emb = torch.nn.Embedding(64, 4)

    def model(input_ids, position_ids, document_ids, weight):
        return (
            emb(input_ids).sum(-1) * weight * (document_ids >= 0)
        ).sum() + position_ids.sum() * 0

    compiled = torch.compile(model, **EAGER)
    example = next(iter(loader))
    report = prewarm(compiled, plan, example=example, progress=False)
    assert report.total_graphs == len(plan) == 2
    with no_recompiles(plan):
        for batch in loader:
            compiled(**batch).backward()
    with pytest.raises(ShapeBucketError, match="the plan's shapes"), no_recompiles(plan):
        compiled(**collate.repad(example, Shape(1, 8)))


def test_an_object_without_the_protocol_is_refused_naming_what_it_lacks():
    class OnlyCalls:
        def __call__(self, samples):
            return samples

        def shapes(self, sampler=None):
            return frozenset({Shape(2, 8)})

    with pytest.raises(ShapeBucketError, match="OnlyCalls has no repad or packs or seq_dim"):
        ShapePlan.of(OnlyCalls())
    assert KeyRoles().labels == ("labels",)


def test_cell_target_mask_may_be_hugging_faces_decoder_attention_mask():
    """Issue 30 (low): CellCollator(target_mask_key="decoder_attention_mask") was refused
    with the default target_keys, although that is Hugging Face's name for it."""
    collate = CellCollator([(8, 4)], target_mask_key="decoder_attention_mask")
    made = collate([{"input_ids": [1, 2], "labels": [3, 4, 5]}, {"input_ids": [1], "labels": [6]}])
    assert made["decoder_attention_mask"].tolist() == [[True] * 3 + [False], [True] + [False] * 3]
    carried = collate([{"input_ids": [1], "labels": [3, 4], "decoder_attention_mask": [1, 0]}])
    assert carried["decoder_attention_mask"].tolist() == [[1, 0, 0, 0]]
    big = collate.repad(made, Shape(3, 8, 4))
    assert (
        big["decoder_attention_mask"].shape == (3, 4) and not big["decoder_attention_mask"][2].any()
    )
    with pytest.raises(
        ShapeBucketError, match="target_mask_key='labels' is one of the target keys"
    ):
        CellCollator([(8, 4)], target_mask_key="labels")


# -- bad input at the contract's edge (probe) -------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((0, 8), r"Shape rows must be >= 1, got 0"),
        ((-1, 8), r"Shape rows must be >= 1, got -1"),
        ((4, 0), r"Shape lengths\[0\] must be >= 1, got 0"),
        ((4.5, 8), r"Shape rows must be an int, got 4.5"),
        (("4", 8), r"Shape rows must be an int, got '4'"),
        ((True, 8), r"Shape rows must be an int, got True"),
        ((4, 8, None), r"Shape lengths\[1\] must be an int, got None"),
    ],
)
def test_shape_refuses_what_is_not_a_row_count_or_a_length(args, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        Shape(*args)


def test_shape_holds_python_ints():
    s = Shape(np.int64(4), np.int32(8))
    assert s == (4, 8) and all(type(v) is int for v in s)


def test_as_plan_takes_an_array_of_buckets_and_names_a_bad_bucket():
    batch = BucketCollator([8, 16])(token_samples([3, 5]))
    assert as_plan(np.array([8, 16]), batch, BucketCollator).shapes == ((2, 8), (2, 16))
    assert as_plan([np.int64(8), np.int64(16)], batch, BucketCollator).shapes == ((2, 8), (2, 16))
    for bad, needle in (
        ([8.0, 16.0], r"bucket 0 must be an int, got 8.0"),
        ([True, 16], r"bucket 0 must be an int, got True"),
        ([], r"at least one length"),
    ):
        with pytest.raises(ShapeBucketError, match=r"prewarm: the buckets .*" + needle):
            as_plan(bad, batch, BucketCollator)


def test_as_plan_refuses_an_example_of_zero_rows_naming_it():
    with pytest.raises(ShapeBucketError, match=r"example\['input_ids'\] has shape \(0, 8\).*0 rows"):
        as_plan([8, 16], {"input_ids": torch.ones(0, 8, dtype=torch.long)}, BucketCollator)


def test_a_sampler_whose_shapes_is_not_a_list_is_refused_naming_it():
    class Odd:
        packs = False

        def shapes(self):
            return 5

    with pytest.raises(ShapeBucketError, match=r"Odd.shapes\(\) returned 5"):
        ShapePlan.of(BucketCollator([8, 16]), Odd())


def test_with_document_blocks_forwards_the_wrapped_collators_seq_dim():
    """Issue 38: WithDocumentBlocks forwarded packs but not seq_dim, so its plan said 0."""
    inner = PackedCollator([8, 16], rows=1, seq_dim=1, label_shift="none")
    wrapped = WithDocumentBlocks(inner)
    assert ShapePlan.of(wrapped).seq_dim == 1 and wrapped.packs
    assert isinstance(wrapped, ShapedCollator)


def test_a_collator_without_packs_or_seq_dim_is_refused_naming_them():
    """Issue 38: the protocol declares every member the package reads (packs, seq_dim)."""

    class NoMarkers:
        def __call__(self, samples):
            return samples

        def shapes(self, sampler=None):
            return frozenset({Shape(2, 8)})

        def repad(self, batch, shape):
            return batch

    with pytest.raises(ShapeBucketError, match="NoMarkers has no packs or seq_dim"):
        ShapePlan.of(NoMarkers())
    with pytest.raises(ShapeBucketError, match="NoMarkers has no packs or seq_dim"):
        assert WithDocumentBlocks(NoMarkers()).seq_dim == 0


class Delegating:
    """A user's collator delegating to BucketCollator; ``repad`` may be broken on purpose."""

    packs = False
    seq_dim = 0

    def __init__(self, repad=None):
        self.inner = BucketCollator([8, 16], rows=2)
        self._repad = repad

    def __call__(self, samples):
        return self.inner(samples)

    def shapes(self, sampler=None):
        return self.inner.shapes(sampler)

    def repad(self, batch, shape):
        return self._repad(self.inner, batch, shape) if self._repad else self.inner.repad(batch, shape)


def _cut_to(length):
    return lambda inner, batch, shape: inner.repad(batch, Shape(shape.rows, length))


def test_a_users_repad_of_the_wrong_shape_is_refused_at_prewarm(fresh_compiler):
    """Issue 39 (14): a repad output of another shape was compiled and 'verified'."""
    collate = Delegating(repad=_cut_to(8))  # always length 8, whatever shape is asked
    example = collate(token_samples([3, 5]))
    compiled = torch.compile(lambda input_ids, attention_mask: input_ids.sum(), **EAGER)
    with pytest.raises(
        ShapeBucketError,
        match=r"Delegating.repad\(batch, \(2, 16\)\) returned a batch with tensor shapes "
        r"\[\(2, 8\), \(2, 8\)\]; none has 2 rows at dim 0 and length 16",
    ):
        prewarm(compiled, ShapePlan.of(collate), example=example, progress=False)


def test_a_users_repad_returning_none_is_refused_naming_it():
    """Issue 39 (15): repad returning None gave a raw TypeError later."""
    collate = Delegating(repad=lambda inner, batch, shape: None)
    plan = ShapePlan.of(collate)
    with pytest.raises(ShapeBucketError, match=r"Delegating.repad\(batch, \(2, 8\)\) returned None"):
        plan.batch(collate(token_samples([3])), Shape(2, 8))


def test_a_users_packing_collator_with_a_bucket_sampler_is_refused():
    """Issue 39 (14): a user collator with packs = True was accepted with a bucket sampler
    when its own shapes() did not check the pairing."""

    class Packs(Delegating):
        packs = True

    sampler = BucketBatchSampler(LENGTHS, [8, 16], rows=2)
    with pytest.raises(ShapeBucketError, match=r"do not make one loader.*packs=False.*packs=True"):
        ShapePlan.of(Packs(), sampler)


def test_a_users_shapes_without_the_sampler_parameter_is_refused_naming_the_fix():
    """Issue 39 (15): shapes() without the sampler parameter gave a raw TypeError."""

    class NoParam(Delegating):
        def shapes(self):
            return self.inner.shapes()

    with pytest.raises(ShapeBucketError, match=r"NoParam.shapes\(\) cannot be called with a "
                       r"sampler.*shapes\(self, sampler=None\)"):
        ShapePlan.of(NoParam())


def test_prewarm_with_a_tensor_example_for_a_dict_plan_names_the_batch_it_needs():
    """Issue 39 item 15 (already fixed on main, untested): a tensor as ``example`` for a
    plan whose collator makes dict batches gave a raw TypeError."""
    model = torch.nn.Linear(8, 8)
    packed = ShapePlan([(2, 8)], PackedCollator([8, 16], rows=2, label_shift="none"))
    cells = ShapePlan.of(CellCollator([(8, 8), (16, 16)], rows=2))
    for plan in (packed, cells):
        with pytest.raises(ShapeBucketError, match=r"repad needs a (dict )?batch this collator"):
            prewarm(model, plan, example=torch.ones(2, 8, dtype=torch.long), progress=False)
