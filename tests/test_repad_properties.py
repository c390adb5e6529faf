"""repad round-trips (issue 30): for any batch a collator made and any shape of its plan,
``repad`` gives a batch of exactly that shape whose real values are the original's where
they fit, padding everywhere else; re-padding to a larger shape and back gives the
original batch bit for bit. Every collator, every documented option combination:
seq_dim 0-2, token and row masks, left and right padding, stacked keys, tuple samples,
packing (positions, documents, varlen boundaries, shifted labels), two-length cells.

The checks look only at the tensors (which dims changed, the overlap, the pad values the
test chose), not at the rules the collators give repad."""

import itertools

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import BucketCollator, PackedCollator, ShapePlan
from shapebucket.collate import CellCollator
from shapebucket.fit.packing import pack_rows
from shapebucket.plan import Shape

FEAT = 3  # a feature dim, never equal to a length (lengths are buckets >= 8)
CHECKS = settings(max_examples=40, deadline=None)  # x3 properties: ~3 s on one core


def overlap(a: torch.Tensor, b: torch.Tensor, left_dims: set[int]) -> tuple:
    """The index of the region two values share: the start of each dim, or its end for a
    left-padded sequence dim."""
    idx = []
    for d in range(a.ndim):
        n = min(a.shape[d], b.shape[d])
        idx.append(slice(a.shape[d] - n, None) if d in left_dims else slice(0, n))
    return tuple(idx)


def check_repadded(batch, out, shape, pads, *, left=False, skip=()):
    """``out`` (``batch`` re-padded to ``shape``) agrees with ``batch`` on their overlap and
    holds each key's pad value everywhere else; its rows and padded lengths are ``shape``'s."""
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    outs = dict(out.items()) if isinstance(out, dict) else dict(enumerate(out))
    assert outs.keys() == dict(items).keys() if isinstance(batch, dict) else len(outs) == len(batch)
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    for k, v in items:
        got = outs[k]
        if k in skip:
            continue
        if isinstance(v, list):
            assert got[: len(v)] == v[: len(got)] and all(x is None for x in got[len(v) :])
            continue
        assert got.dtype == v.dtype and got.is_contiguous() and got.shape[0] == shape.rows
        changed = {d for d in range(1, v.ndim) if got.shape[d] != v.shape[d]}
        assert all(got.shape[d] in shape.lengths for d in changed)
        idx = overlap(v, got, changed if left else set())
        src = overlap(got, v, changed if left else set())
        assert torch.equal(got[src], v[idx])
        rest = torch.ones(got.shape, dtype=torch.bool)
        rest[src] = False
        assert (got[rest] == pads[k]).all(), (k, got, pads[k])


def round_trip(collate, batch, small, big, equal_lists=True):
    back = collate.repad(collate.repad(batch, big), small)
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    backs = back if isinstance(back, dict) else dict(enumerate(back))
    for k, v in items:
        if isinstance(v, torch.Tensor):
            assert torch.equal(backs[k], v), k
        elif equal_lists:
            assert backs[k] == v


# -- BucketCollator -------------------------------------------------------------------------


@st.composite
def bucket_cases(draw):
    n = draw(st.integers(1, 4))
    lens = draw(st.lists(st.integers(1, 16), min_size=n, max_size=n))
    seq_dim = draw(st.sampled_from([0, 1, 2]))
    kind = draw(st.sampled_from(["dict", "tuple"]))
    stacked = kind == "dict" and draw(st.booleans())
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    samples = []
    for i, length in enumerate(lens):
        dims = [FEAT] * seq_dim
        dims.insert(seq_dim, length)
        ids = torch.randint(1, 50, dims, generator=g)
        labels = torch.randint(1, 50, (length,) if seq_dim == 0 else dims, generator=g)
        if kind == "dict":
            sample = {"ids": ids, "labels": labels, "idx": i}
            if stacked:
                sample["image"] = torch.rand(2, 2, generator=g)
            samples.append(sample)
        else:
            samples.append((ids, labels))
    options = dict(
        padding_side=draw(st.sampled_from(["right", "left"])),
        seq_dim=seq_dim,
        pad_values={"ids": 7, 0: 7},
        mask_key=draw(st.sampled_from(["attention_mask", None])),
        sample_mask_key=draw(st.sampled_from(["sample_mask", None])),
        sequence_keys=["ids", "labels"] if stacked else None,
        rows=draw(st.sampled_from([None, 4])),
    )
    return samples, options, draw(st.integers(0, 3)), draw(st.integers(0, 2))


@CHECKS
@given(bucket_cases())
def test_bucket_repad_keeps_real_values_for_every_shape_of_its_plan(case):
    samples, options, extra_rows, bucket_index = case
    collate = BucketCollator([8, 16, 24], **options)
    batch = collate(samples)
    first = batch["ids"] if isinstance(batch, dict) else batch[0]
    rows, length = first.shape[0], first.shape[options["seq_dim"] + 1]
    plan = ShapePlan(
        [(rows if options["rows"] else len(samples) + extra_rows, b) for b in (8, 16, 24)], collate
    )
    shape = plan.shapes[bucket_index]
    pads = {"ids": 7, 0: 7, "labels": -100, 1: 0, "attention_mask": False, "idx": 0}
    pads |= {"sample_mask": False, "image": 0, len(samples[0]): False, len(samples[0]) + 1: False}
    out = plan.batch(batch, shape)
    check_repadded(batch, out, shape, pads, left=options["padding_side"] == "left")
    big = Shape(max(rows, shape.rows), max(length, shape.length))
    if big in plan.shapes or options["rows"] is None:
        round_trip(collate, batch, Shape(rows, length), big)


# -- PackedCollator -------------------------------------------------------------------------


@st.composite
def packed_cases(draw):
    lens = draw(st.lists(st.integers(1, 8), min_size=1, max_size=6))
    seq_dim = draw(st.sampled_from([0, 1]))
    labels = draw(st.booleans())
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    samples = []
    for i, n in enumerate(lens):
        ids = torch.randint(1, 50, (n,) if seq_dim == 0 else (FEAT, n), generator=g)
        sample = {"ids": ids, "idx": i}
        if labels:
            sample["labels"] = torch.randint(1, 50, ids.shape, generator=g)
        samples.append(sample)
    options = dict(
        seq_dim=seq_dim,
        pad_values={"ids": 7},
        mask_key=draw(st.sampled_from(["token_mask", None])),
        position_key=draw(st.sampled_from(["position_ids", None])),
        document_key=draw(st.sampled_from(["document_ids", None])),
        cu_seqlens_key=draw(st.sampled_from(["cu_seqlens", None])),
        label_shift=draw(st.sampled_from(["model", "none"])) if labels else None,
    )
    return samples, options, draw(st.integers(0, 2))


@CHECKS
@given(packed_cases())
def test_packed_repad_keeps_every_row_and_round_trips(case):
    samples, options, bucket_index = case
    length = 8
    used = int(pack_rows(np.array([s["ids"].shape[-1] for s in samples]), length)[0][-1]) + 1
    collate = PackedCollator([8, 16, 24], rows=used + 1, **options)
    batch = collate(samples)
    plan = ShapePlan.of(collate)
    shape = plan.shapes[bucket_index]
    pads = {"ids": 7, "labels": -100, "token_mask": False, "position_ids": 0, "document_ids": -1}
    out = plan.batch(batch, shape)
    check_repadded(batch, out, shape, pads, skip={"cu_seqlens"})
    if "cu_seqlens" in out:
        cu = out["cu_seqlens"]
        assert cu.shape == (shape.rows * shape.length + 1,) and cu.dtype == torch.int32
        assert (cu.diff() >= 0).all() and cu[-1] == shape.rows * shape.length
        if "document_ids" in out:  # each segment is one sample, or padding, inside one row
            docs, bounds = out["document_ids"].flatten(), torch.unique(cu).tolist()
            for a, b in itertools.pairwise(bounds):
                assert (
                    len(set(docs[a:b].tolist())) == 1
                    and a // shape.length == (b - 1) // shape.length
                )
    round_trip(collate, batch, Shape(used + 1, length), Shape(used + 1, 24))


# -- CellCollator ---------------------------------------------------------------------------


@st.composite
def cell_cases(draw):
    n = draw(st.integers(1, 4))
    seq_dim = draw(st.sampled_from([0, 1]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    samples = []
    for i in range(n):
        s, t = draw(st.integers(1, 16)), draw(st.integers(1, 8))
        src = torch.rand((s,) if seq_dim == 0 else (FEAT, s), generator=g)
        samples.append(
            {"src": src, "labels": torch.randint(1, 50, (t,), generator=g), "lang": i, "idx": i}
        )
    options = dict(
        seq_dim=seq_dim,
        mask_key=draw(st.sampled_from(["attention_mask", None])),
        target_mask_key=draw(st.sampled_from(["decoder_mask", None])),
        rows=draw(st.sampled_from([None, 4])),
        sequence_keys=["src"],
    )
    return samples, options, draw(st.integers(0, 3)), draw(st.integers(0, 2))


@CHECKS
@given(cell_cases())
def test_cell_repad_pads_source_and_target_to_their_own_lengths(case):
    samples, options, cell_index, extra_rows = case
    cells = [(8, 4), (8, 8), (16, 8), (24, 8)]
    collate = CellCollator(cells, **options)
    batch = collate(samples)
    rows = batch["labels"].shape[0]
    src_len, tgt_len = batch["src"].shape[-1], batch["labels"].shape[1]
    r = rows if options["rows"] else len(samples) + extra_rows
    plan = ShapePlan([(r, *c) for c in cells], collate)
    shape = plan.shapes[cell_index]
    pads = {"src": 0, "labels": -100, "attention_mask": False, "decoder_mask": False}
    out = plan.batch(batch, shape)
    check_repadded(batch, out, shape, pads | {"lang": 0, "idx": 0})
    assert out["labels"].shape == (shape.rows, shape.lengths[1])
    assert out["src"].shape[-1] == shape.lengths[0]
    big = Shape(max(rows, r), 24, 8)
    round_trip(collate, batch, Shape(rows, src_len, tgt_len), big)
