"""PackedCollator: the layout of a packed batch, its document masks, and exactness: a
packed batch computes what its samples compute one by one."""

from __future__ import annotations

import collections
import warnings

import numpy as np
import pytest
import torch
from _collate_models import tiny_llama
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shapebucket import (
    PackedBatchSampler,
    PackedCollator,
    ShapeBucketError,
    ShapePlan,
    document_block_mask,
    document_causal_mask,
    fit_packing,
    no_recompiles,
    prewarm,
)
from shapebucket.bench.model import GPT, GPTConfig
from shapebucket.compile import CompileCounter
from shapebucket.data import mixture_lengths
from shapebucket.fit import Buckets
from shapebucket.fit.packing import pack_epoch, pack_rows


def samples_for(lengths, seed=0, vocab=50):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(1, vocab, (int(n),), generator=g)
        out.append({"input_ids": ids, "labels": torch.roll(ids, -1), "idx": i})
    return out


# -- the layout --------------------------------------------------------------------------------


@st.composite
def packing_setups(draw):
    buckets = sorted(draw(st.sets(st.integers(2, 40), min_size=1, max_size=3)))
    lengths = draw(st.lists(st.integers(1, buckets[-1]), min_size=1, max_size=60))
    rows = {L: draw(st.integers(1, 4)) for L in buckets}
    replicas = draw(st.integers(1, 3))
    window = draw(st.integers(1, 70))
    pad = draw(st.sampled_from([0, -1, 7, -100]))
    return buckets, lengths, rows, replicas, window, pad


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(packing_setups(), st.integers(0, 3))
def test_every_token_of_every_sample_sits_in_one_row_and_the_mask_admits_only_its_document(
    setup, seed
):
    buckets, lengths, rows, replicas, window, pad = setup
    samples = samples_for(lengths, seed)
    collate = PackedCollator(
        buckets, rows=rows, pad_values={"input_ids": pad}, label_shift="none", mask_key="token_mask"
    )
    per_rank = [
        list(
            PackedBatchSampler(
                lengths, buckets, rows=rows, seed=seed, window=window,
                num_replicas=replicas, rank=r,
            )
        )
        for r in range(replicas)
    ]  # fmt: skip
    packed = pack_epoch(lengths, buckets, rows, seed=seed, num_replicas=replicas, window=window)
    seen: collections.Counter[int] = collections.Counter()
    as_lists = [(s["input_ids"].tolist(), s["labels"].tolist()) for s in samples]
    for step in range(len(per_rank[0])):
        shapes = set()
        for r in range(replicas):
            idx = per_rank[r][step]
            batch = collate([samples[i] for i in idx])
            ids, pos, doc = batch["input_ids"], batch["position_ids"], batch["document_ids"]
            R, L = ids.shape
            shapes.add((R, L))
            assert L in buckets and rows[L] == R
            assert Buckets(buckets).bucket_for(max(lengths[i] for i in idx)) == L
            # the layout read as Python lists: one conversion per batch, not a tensor op per
            # candidate place of every sample
            ids_l, pos_l, doc_l = ids.tolist(), pos.tolist(), doc.tolist()
            labels_l = batch["labels"].tolist()
            starts = [
                [c for c in range(L) if pos_l[row][c] == 0 and doc_l[row][c] >= 0]
                for row in range(R)
            ]
            covered = torch.zeros(R, L, dtype=torch.bool)
            taken = set()
            for i in idx:  # find each sample: one row, contiguous, positions 0..n-1
                seen[i] += 1
                n = lengths[i]
                sample_ids, sample_labels = as_lists[i]
                hits = [
                    (row, start)
                    for row in range(R)
                    for start in starts[row]
                    if start + n <= L
                    and ids_l[row][start : start + n] == sample_ids
                    and (row, start) not in taken
                ]
                assert hits, f"sample {i} is not laid out whole"
                row, start = hits[0]
                span = slice(start, start + n)
                assert pos_l[row][span] == list(range(n))
                assert len(set(doc_l[row][span])) == 1
                assert labels_l[row][span] == sample_labels
                covered[row, span] = True
                taken.add((row, start))
            assert torch.equal(covered, doc >= 0)  # every real token belongs to a sample
            assert torch.equal(covered, batch["token_mask"])
            assert (ids[~covered] == pad).all() and (batch["labels"][~covered] == -100).all()
            # the mask: a real query sees exactly the earlier tokens of its own document
            mask = document_causal_mask(doc)[:, 0]
            q, k = torch.meshgrid(torch.arange(L), torch.arange(L), indexing="ij")
            want = (doc[:, :, None] == doc[:, None, :]) & (doc[:, :, None] >= 0) & (k <= q)
            want |= q == k
            assert torch.equal(mask, want)
        assert len(shapes) == 1, f"step {step}: ranks have different shapes {shapes}"
    assert set(seen) == set(range(len(lengths)))
    assert sum(seen.values()) - len(lengths) == packed.report.duplicated
    if replicas == 1:
        assert packed.report.duplicated == 0


# -- the collator ------------------------------------------------------------------------------


def test_model_label_shift_masks_the_first_label_of_every_sample():
    collate = PackedCollator([8], rows=1, label_shift="model")
    batch = collate(
        [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
    )
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, -100, -100]]
    kept = PackedCollator([8], rows=1, label_shift="none")(
        [{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
    )
    assert kept["labels"].tolist() == [[1, 2, 3, 4, 5, -100, -100, -100]]


def test_cu_seqlens_mark_every_sample_and_row_tail_with_a_static_shape():
    collate = PackedCollator([8], rows=2, cu_seqlens_key="cu_seqlens")
    batch = collate([{"input_ids": [1] * 3}, {"input_ids": [2] * 4}, {"input_ids": [3] * 6}])
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.shape == (2 * 8 + 1,)
    assert cu.tolist()[:6] == [0, 3, 7, 8, 14, 16] and set(cu.tolist()[6:]) == {16}


def test_nd_values_and_seq_dim_pack_like_bucket_collator():
    feats = [torch.randn(3, 4), torch.randn(2, 4)]
    batch = PackedCollator([8], rows=1)([{"x": feats[0]}, {"x": feats[1]}])
    assert batch["x"].shape == (1, 8, 4)
    assert torch.equal(batch["x"][0, :3], feats[0]) and torch.equal(batch["x"][0, 3:5], feats[1])
    channels = PackedCollator([8], rows=1, seq_dim=1)([{"x": feats[0].T}, {"x": feats[1].T}])
    assert channels["x"].shape == (1, 4, 8)
    assert torch.equal(channels["x"][0, :, 3:5], feats[1].T)


@pytest.mark.parametrize(
    ("samples", "kwargs", "match"),
    [
        ([[1, 2]], {}, "needs dict samples"),
        ([{"input_ids": [1, 2], "image": 3}], {}, r"per-sample values under \['image'\]"),
        ([{"input_ids": [1] * 9}], {}, "length 9 > longest row length 8"),
        ([{"input_ids": [1] * 5}, {"input_ids": [2] * 5}], {}, "fill 2 rows of 8 .* rows\\[8\\]=1"),
        ([{"input_ids": [1, 2], "position_ids": [0, 1]}], {}, "key 'position_ids'"),
        ([{"input_ids": [1, 2]}], {"pad_values": {"input_ids": 300}}, None),
        ([{"input_ids": np.array([1, 2], np.uint8)}], {"pad_values": {"input_ids": 300}}, "300"),
    ],
)
def test_collator_errors_name_the_problem(samples, kwargs, match):
    collate = PackedCollator([8], rows=1, **kwargs)
    if match is None:
        assert collate(samples)["input_ids"][0, 2] == 300
        return
    with pytest.raises(ShapeBucketError, match=match):
        collate(samples)


def test_collator_settings_are_checked():
    with pytest.raises(ShapeBucketError, match="label_shift"):
        PackedCollator([8], rows=1, label_shift="left")  # type: ignore[arg-type]
    with pytest.raises(ShapeBucketError, match="position_key and document_key are both"):
        PackedCollator([8], rows=1, position_key="x", document_key="x")
    with pytest.raises(ShapeBucketError, match="no batch size for buckets"):
        PackedCollator([8, 16], rows={8: 1})


def test_index_key_comes_back_as_a_list_in_packing_order():
    batch = PackedCollator([8], rows=3, label_shift="none")(samples_for([3, 6, 4]))
    assert batch["idx"] == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_collate_packed_batches_and_count_them(context):
    lengths = mixture_lengths(300, seed=4)
    samples = samples_for(lengths)
    sampler = PackedBatchSampler.for_tokens(lengths, [64, 256], 512, seed=1)
    collate = PackedCollator([64, 256], rows=sampler.rows, label_shift="none")
    loader = DataLoader(
        samples,
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=2,
        multiprocessing_context=context,
    )
    batches = list(loader)
    assert len(batches) == len(sampler)
    assert collate.stats.num_samples == len(lengths)
    assert collate.stats.real_tokens == int(lengths.sum())
    assert {tuple(b["input_ids"].shape) for b in batches} <= {(8, 64), (2, 256)}


# -- exactness ---------------------------------------------------------------------------------


def test_flex_block_mask_matches_the_dense_mask():
    from torch.nn.attention.flex_attention import flex_attention

    doc = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1] * 2, [0] * 10 + [1] * 6])
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    dense = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=document_causal_mask(doc)
    )
    with warnings.catch_warnings():  # torch warns once per process that flex is uncompiled
        warnings.simplefilter("ignore", UserWarning)
        flex = flex_attention(q, k, v, block_mask=document_block_mask(doc, block_size=8))
    assert torch.allclose(dense, flex, atol=1e-5)


def _gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab=50, dim=32, layers=2, heads=4, max_len=64))


def test_gpt_packed_losses_and_gradients_equal_one_by_one():
    lengths = [5, 17, 3, 9, 30, 1, 12]
    samples = samples_for(lengths)
    collate = PackedCollator([32, 64], rows={32: 4, 64: 1}, label_shift="none", mask_key=None)
    batch = collate(samples)
    model = _gpt()
    packed = model.token_losses(batch["input_ids"], batch["labels"], **{
        k: batch[k] for k in ("position_ids", "document_ids")
    })  # fmt: skip
    packed.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    doc, pos = batch["document_ids"], batch["position_ids"]
    total = 0
    starts = torch.nonzero((pos == 0) & (doc >= 0))
    laid = [(int(r), int(c)) for r, c in starts]
    for s in samples:
        n = len(s["input_ids"])
        ids = s["input_ids"][None]
        alone = model.token_losses(ids, s["labels"][None], attention_mask=torch.ones_like(ids))
        row, col = next(
            (r, c) for r, c in laid
            if c + n <= batch["input_ids"].shape[1]
            and torch.equal(batch["input_ids"][r, c : c + n], s["input_ids"])
        )  # fmt: skip
        laid.remove((row, col))
        assert (packed[row, col : col + n] - alone[0]).abs().max() <= 1e-5
        total = total + alone.sum()
    total.backward()
    for p, g in zip(model.parameters(), grads, strict=True):
        assert (p.grad - g).abs().max() <= 1e-5


def test_prewarm_covers_every_packed_shape_and_training_never_recompiles():
    # 300 samples: 28 batches over 3 shapes of different rows (6 x 40, 1 x 208, 1 x 216); 600
    # made 75 batches of 3 shapes of 1 row each: more steps, no other path
    lengths = mixture_lengths(300, seed=3)
    samples = samples_for(lengths, vocab=50)
    for s in samples:
        del s["idx"]
    fit = fit_packing(lengths, 3, tokens_per_batch=256)
    sampler = PackedBatchSampler(lengths, fit.buckets, rows=fit.rows)
    collate = PackedCollator(fit.buckets, rows=fit.rows, label_shift="none", mask_key=None)
    model = GPT(GPTConfig(vocab=50, dim=16, layers=1, heads=2, max_len=256))
    compiled = torch.compile(model, dynamic=False, backend="eager", fullgraph=True)
    batches = [collate([samples[i] for i in b]) for b in sampler]
    plan = ShapePlan.of(collate, sampler)
    assert {(s.rows, s.length) for s in plan.shapes} == sampler.shapes()
    report = prewarm(compiled, plan, example=batches[0], progress=False)
    assert report.total_graphs == len(plan) == len({tuple(b["input_ids"].shape) for b in batches})
    with CompileCounter() as cc, no_recompiles(plan):
        for b in batches:
            compiled(**b).backward()
    assert cc.graphs == 0


def _hf_token_losses(model, input_ids, labels, **inputs):
    """Per-token losses with the Hugging Face shift: logits[t] predicts labels[t + 1]."""
    logits = model(input_ids=input_ids, **inputs).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="none"
    ).view(labels.shape[0], -1)


@pytest.mark.slow  # traces a Llama: 4 s
def test_hf_decoder_packed_under_static_compile_equals_one_by_one():
    """transformers finds the packed samples from position_ids (no attention_mask, no
    cache): the per-token losses and gradients of a packed batch under
    torch.compile(dynamic=False) equal those of each sample alone, and a second layout
    of the same shape reuses the graph."""
    model = tiny_llama()
    collate = PackedCollator([32], rows=2, label_shift="model")
    compiled = torch.compile(model, dynamic=False, fullgraph=True, backend="aot_eager")
    for lengths in ([5, 17, 3, 9, 20, 1], [30, 2, 12, 14]):
        samples = [
            {"input_ids": s["input_ids"], "labels": s["input_ids"].clone()}
            for s in samples_for(lengths)
        ]
        batch = collate(samples)
        model.zero_grad()
        with CompileCounter() as cc:
            packed = _hf_token_losses(
                compiled,
                batch["input_ids"],
                batch["labels"],
                position_ids=batch["position_ids"],
                use_cache=False,
            )
        packed.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        row, start = pack_rows(lengths, 32)
        total = 0
        for s, r, c in zip(samples, row.tolist(), start.tolist(), strict=True):
            n = len(s["input_ids"])
            alone = _hf_token_losses(model, s["input_ids"][None], s["labels"][None])
            # packed[r, c + t] is the loss of predicting token c + t + 1 of the row
            got = packed[r, c : c + n - 1]
            assert (got - alone[0]).abs().max() <= 1e-5 if n > 1 else got.numel() == 0
            total = total + alone.sum()
        total.backward()
        for p, g in zip(model.parameters(), grads, strict=True):
            assert (p.grad - g).abs().max() <= 1e-5
        assert cc.graphs == (1 if lengths[0] == 5 else 0)


def test_hf_decoder_with_its_default_cache_attends_across_samples():
    """The pitfall docs/packing.md warns about: with use_cache left at its default (True)
    transformers makes a cache, skips its packed-sequence detection, and the second
    sample of a row attends to the first."""
    model = tiny_llama()
    lengths = [5, 17]
    samples = [
        {"input_ids": s["input_ids"], "labels": s["input_ids"].clone()}
        for s in samples_for(lengths)
    ]
    batch = PackedCollator([32], rows=1, label_shift="model")(samples)
    alone = _hf_token_losses(model, samples[1]["input_ids"][None], samples[1]["labels"][None])
    with torch.no_grad():
        leaky = _hf_token_losses(
            model, batch["input_ids"], batch["labels"], position_ids=batch["position_ids"]
        )
        exact = _hf_token_losses(
            model,
            batch["input_ids"],
            batch["labels"],
            position_ids=batch["position_ids"],
            use_cache=False,
        )
    assert (exact[0, 5:21] - alone[0]).abs().max() <= 1e-5
    assert (leaky[0, 5:21] - alone[0]).abs().max() > 1e-3
