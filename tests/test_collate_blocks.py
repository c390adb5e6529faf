"""document_blocks + block_mask_from_blocks build the BlockMask document_block_mask builds."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import PackedCollator, ShapeBucketError, document_block_mask
from shapebucket.collate.blocks import (
    WithDocumentBlocks,
    block_mask_from_blocks,
    document_blocks,
)

FIELDS = (
    "kv_num_blocks",
    "kv_indices",
    "full_kv_num_blocks",
    "full_kv_indices",
    "q_num_blocks",
    "q_indices",
    "full_q_num_blocks",
    "full_q_indices",
)


@st.composite
def packed_documents(draw):
    """[rows, length] document ids as PackedCollator lays them: 0, 1, ... then -1 pads."""
    rows, length = draw(st.integers(1, 3)), draw(st.integers(2, 80))
    out = []
    for _ in range(rows):
        row, doc = [], 0
        while len(row) < length and draw(st.booleans() | st.just(True)):
            n = draw(st.integers(1, length))
            row += [doc] * min(n, length - len(row))
            doc += 1
            if draw(st.integers(0, 4)) == 0:
                break
        out.append(row + [-1] * (length - len(row)))
    return torch.tensor(out)


@settings(max_examples=60, deadline=None)
@given(doc=packed_documents(), block_size=st.sampled_from([4, 8, 16, 128]), causal=st.booleans())
def test_the_block_mask_from_worker_tensors_equals_document_block_mask(doc, block_size, causal):
    want = document_block_mask(doc, causal=causal, block_size=block_size)
    blocks = document_blocks(doc, causal=causal, block_size=block_size)
    got = block_mask_from_blocks(blocks, doc, causal=causal, block_size=block_size)
    for name in FIELDS:
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.shape == want.shape and got.BLOCK_SIZE == want.BLOCK_SIZE
    assert torch.equal(got.to_dense(), want.to_dense())


def test_flex_attention_gives_the_same_output():
    """Forward only: flex_attention has no backward on CPU (torch 2.13)."""
    from torch.nn.attention.flex_attention import flex_attention

    doc = torch.tensor([[0] * 5 + [1] * 9 + [2] * 3 + [-1] * 7])
    torch.manual_seed(0)
    q = torch.randn(1, 2, 24, 8)
    want = flex_attention(q, q, q, block_mask=document_block_mask(doc, block_size=8))
    mask = block_mask_from_blocks(document_blocks(doc, block_size=8), doc, block_size=8)
    assert torch.equal(flex_attention(q, q, q, block_mask=mask), want)


def test_the_collate_function_adds_static_shape_blocks_and_pickles():
    collate = WithDocumentBlocks(PackedCollator([16], rows=2, label_shift="none"), block_size=8)
    collate = pickle.loads(pickle.dumps(collate))
    batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4] * 10}, {"input_ids": [5] * 6}])
    shapes = {k: tuple(v.shape) for k, v in batch["document_blocks"].items()}
    assert shapes == {
        "kv_num_blocks": (2, 1, 2),
        "kv_indices": (2, 1, 2, 2),
        "full_kv_num_blocks": (2, 1, 2),
        "full_kv_indices": (2, 1, 2, 2),
        "causal": (),
    }
    want = document_block_mask(batch["document_ids"], block_size=8)
    got = block_mask_from_blocks(batch["document_blocks"], batch["document_ids"], block_size=8)
    assert torch.equal(got.to_dense(), want.to_dense())


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ShapeBucketError, match=r"document_ids must be a \[rows, length\] tensor"):
        document_blocks(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ShapeBucketError, match="block_size"):
        document_blocks(torch.zeros(1, 5, dtype=torch.long), block_size=0)
    with pytest.raises(ShapeBucketError, match="lacks"):
        block_mask_from_blocks({}, torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ShapeBucketError, match="document_ids"):
        WithDocumentBlocks(lambda s: {"input_ids": torch.ones(1, 2)})([{}])


# -- bad input (probe) --------------------------------------------------------------------------

DOC = torch.tensor([[0, 0, 0, 0, 1, 1, -1, -1]])


@pytest.mark.parametrize(
    ("doc", "block_size", "needle"),
    [
        (DOC, 2, r"kv_num_blocks'\] has shape \(1, 1, 2\), but .* block_size=2 needs \(1, 1, 4\)"),
        (DOC, 128, r"block_size=128 needs \(1, 1, 1\)"),
        (torch.zeros(2, 8, dtype=torch.long), 4, r"needs \(2, 1, 2\)"),
        (torch.zeros(1, 16, dtype=torch.long), 4, r"needs \(1, 1, 4\)"),
        (DOC, 0, r"block_size must be >= 1"),
    ],
)
def test_blocks_of_another_batch_or_block_size_are_refused(doc, block_size, needle):
    blocks = document_blocks(DOC, block_size=4)  # it built a wrong BlockMask without a word
    with pytest.raises(ShapeBucketError, match=needle):
        block_mask_from_blocks(blocks, doc, block_size=block_size)


@pytest.mark.parametrize("made", [True, False])
def test_blocks_made_with_the_other_causal_rule_are_refused(made):
    # probe: blocks of the causal rule built a non-causal mask (or the other way), silently
    doc = torch.tensor([[0] * 12 + [1] * 4])
    blocks = document_blocks(doc, causal=made, block_size=4)
    with pytest.raises(ShapeBucketError, match=f"made with causal={made} .* got causal={not made}"):
        block_mask_from_blocks(blocks, doc, causal=not made, block_size=4)
    got = block_mask_from_blocks(blocks, doc, causal=made, block_size=4)
    want = document_block_mask(doc, causal=made, block_size=4)
    assert torch.equal(got.to_dense(), want.to_dense())
    # review: a Python bool was not checked at all; other values are refused
    with pytest.raises(ShapeBucketError, match=f"made with causal={made} .* got causal={not made}"):
        block_mask_from_blocks({**blocks, "causal": made}, doc, causal=not made, block_size=4)
    for bad in ("yes", None, torch.tensor([1.5]), torch.tensor([False, True])):
        with pytest.raises(ShapeBucketError, match="must be the bool"):
            block_mask_from_blocks({**blocks, "causal": bad}, doc, causal=made, block_size=4)


def test_flags_keys_and_empty_batches_are_checked():
    with pytest.raises(ShapeBucketError, match=r"causal must be True or False, got 'no'"):
        document_blocks(DOC, causal="no", block_size=4)
    with pytest.raises(ShapeBucketError, match=r"causal must be True or False"):
        block_mask_from_blocks(document_blocks(DOC, block_size=4), DOC, causal="yes", block_size=4)
    for doc in (torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 8, dtype=torch.long)):
        with pytest.raises(ShapeBucketError, match=r"no tokens to mask"):
            document_blocks(doc, block_size=4)
    packed = PackedCollator([8], rows=1)
    with pytest.raises(ShapeBucketError, match=r"causal must be True or False"):
        WithDocumentBlocks(packed, causal="no")
    with pytest.raises(ShapeBucketError, match=r"key must be a str, got 5"):
        WithDocumentBlocks(packed, key=5)
    with pytest.raises(ShapeBucketError, match=r"already has a key 'input_ids'"):
        WithDocumentBlocks(packed, key="input_ids", block_size=4)([{"input_ids": [1, 2]}])


def test_a_loader_with_document_blocks_is_planned_prewarmed_and_guarded(fresh_compiler):
    from torch.utils.data import DataLoader

    from shapebucket import PackedBatchSampler, ShapePlan, no_recompiles, prewarm

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 4)

        def forward(self, input_ids, position_ids, document_ids, document_blocks):
            mask = block_mask_from_blocks(document_blocks, document_ids, block_size=4)
            return self.embed(input_ids).sum() + mask.kv_num_blocks.sum()

    lengths = [3, 5, 2, 7, 9, 4]
    sampler = PackedBatchSampler(lengths, [8, 16], rows=2)
    collate = WithDocumentBlocks(PackedCollator([8, 16], rows=2), block_size=4)
    data = [{"input_ids": list(range(1, n + 1))} for n in lengths]
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=collate)
    plan = ShapePlan.of(collate, sampler)  # it had no shapes() or repad()
    model = torch.compile(Model(), backend="eager", dynamic=False)
    example = next(iter(loader))
    assert plan.batch(example, plan.shapes[1])["document_blocks"]["kv_num_blocks"].shape == (2, 1, 4)
    prewarm(model, plan, example=example, progress=False)
    with no_recompiles(plan):
        for batch in loader:
            model(**batch)
