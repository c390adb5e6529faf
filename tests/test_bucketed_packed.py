"""Packed calls: pack then unpack is the identity on real tokens, no token is lost or
duplicated, the bench GPT and a Hugging Face Llama give the padded call's outputs,
loss and gradients on a packed call, and the rule of ``packs`` says which models may."""

from __future__ import annotations

import copy
import pickle

import _bucketed_models as bm
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import BucketedModel, ShapeBucketError
from shapebucket.bucketed import packed as packing
from shapebucket.bucketed.packed import host_lengths, pack_into, packs, unpack
from shapebucket.bucketed.placement import Layouts, plan_layout


@st.composite
def calls(draw):
    rows = draw(st.integers(1, 6))
    L = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(1, L), min_size=rows, max_size=rows))
    row_length = draw(st.integers(max(lengths), max(lengths) + 10))
    buckets = draw(st.sampled_from([None, [1, 2, 4, 8], [8]]))
    return lengths, L, row_length, buckets


def pack_call(
    batch, keys, lengths, row_length, row_buckets, pad_values, *, shifted_labels, document_ids=False
):
    """A layout planned afresh for ``lengths``, and ``batch`` packed through it."""
    first = batch[keys[0]]
    layout = plan_layout(list(lengths), first.shape[1], row_length, row_buckets, document_ids,
                         first.device)  # fmt: skip
    return pack_into(batch, keys, layout, pad_values, shifted_labels=shifted_labels)


def real_lengths(mask):
    return torch.tensor(host_lengths(mask)[0])


def _right_padded(lengths: list[int], L: int) -> dict[str, torch.Tensor]:
    """Every real token unique (ids 1.., a float pair per token); pads 0."""
    rows = len(lengths)
    mask = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.arange(1, rows * L + 1).view(rows, L) * mask
    pair = torch.stack([ids.float(), -ids.float()], -1)
    return {"input_ids": ids, "labels": ids + 1000 * mask, "pair": pair, "attention_mask": mask}


@settings(max_examples=40, deadline=None)
@given(calls(), st.booleans())
def test_pack_then_unpack_is_the_identity_on_real_tokens_and_fill_on_pads(call, shifted):
    lengths, L, row_length, buckets = call
    batch = _right_padded(lengths, L)
    mask = batch["attention_mask"]
    assert real_lengths(mask).tolist() == lengths
    keys = ["input_ids", "labels", "pair"]
    packed, pc = pack_call(
        batch, keys, lengths, row_length, buckets, {}, shifted_labels=shifted, document_ids=True
    )
    P = pc.packed_rows
    assert packed["input_ids"].shape == (P, row_length) and packed["pair"].shape == (
        P,
        row_length,
        2,
    )
    used = int((packed["document_ids"] >= 0).any(1).sum())
    want_rows = max(used, 1) if buckets is None else min(b for b in buckets if b >= used)
    assert want_rows == P
    # no real token lost or duplicated
    real = packed["input_ids"][packed["input_ids"] > 0]
    assert sorted(real.tolist()) == sorted(batch["input_ids"][mask].tolist())
    for k in keys:
        back = unpack(packed[k], pc, fill=-7)
        want = batch[k].clone()
        if shifted and k == "labels":  # each sample's first label is the model's to skip
            want[:, 0] = -100
        assert torch.equal(back[mask], want[mask])
        assert (back[~mask] == -7).all()
    # the collator's convention: positions restart per sample, documents 0, 1, ... per row
    pos, doc = packed["position_ids"], packed["document_ids"]
    assert torch.equal(unpack(pos, pc)[mask], (torch.arange(L)[None, :].expand_as(mask))[mask])
    assert doc.dtype == torch.int32 and (pos[doc < 0] == 0).all()
    for r in range(P):
        d = doc[r][doc[r] >= 0]
        assert (
            d.tolist() == sorted(d.tolist()) and (d.unique() == torch.arange(len(d.unique()))).all()
        )
    starts = (pos == 0) & (doc >= 0)
    labels = packed["labels"]
    assert ((labels[starts] == -100) if shifted else (labels[starts] > 1000)).all()
    assert (labels[(doc >= 0) & ~starts] > 1000).all() and (labels[doc < 0] == -100).all()


# -- exact: the bench GPT and a Hugging Face Llama ------------------------------------------


def _call(rows: int, L: int, seed: int) -> tuple[dict[str, torch.Tensor], list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (rows,), generator=g)
    lengths[0] = L
    mask = torch.arange(L)[None, :] < lengths[:, None]
    ids = torch.randint(1, bm.VOCAB, (rows, L), generator=g)
    labels = ids.masked_fill(~mask, -100)
    labels[torch.rand(rows, L, generator=g) < 0.2] = -100
    labels[0, 1] = ids[0, 1]  # one label every model counts (a mean over none is NaN)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}, lengths.tolist()


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _runs(name: str, batch, packed):
    """(per-sample logits list, padded loss, packed logits, packed loss) of one model."""
    model = bm.model(name)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    lengths = mask.sum(1).tolist()
    if name == "gpt":
        alone = [
            model.logits(ids[i : i + 1, :n], attention_mask=torch.ones(1, n, dtype=torch.bool))
            for i, n in enumerate(lengths)
        ]
        padded = model(ids, labels, attention_mask=mask)
        pin = {k: packed[k] for k in ("position_ids", "document_ids")}
        logits = model.logits(packed["input_ids"], **pin)
        return alone, padded, logits, lambda: model(packed["input_ids"], packed["labels"], **pin)
    alone = [
        model(input_ids=ids[i : i + 1, :n], use_cache=False).logits for i, n in enumerate(lengths)
    ]
    padded = model(input_ids=ids, attention_mask=mask.long(), labels=labels, use_cache=False).loss
    out = model(**packed, use_cache=False)
    return alone, padded, out.logits, lambda: model(**packed, use_cache=False).loss


@pytest.mark.parametrize("name", ["gpt", "llama", "gpt2"])
@settings(max_examples=5, deadline=None)
@given(rows=st.integers(1, 6), length=st.integers(2, 16), seed=st.integers(0, 2**16))
def test_a_packed_call_is_exact(name, rows, length, seed):
    if name != "gpt":
        pytest.importorskip("transformers")
    batch, lengths = _call(rows, length, seed)
    assert packs(bm.model(name))
    # the bench GPT's loss does not shift: each of its labels already is the next token
    keys = ["input_ids", "labels"]
    shifted, documents = name != "gpt", name == "gpt"
    packed, pc = pack_call(
        batch, keys, lengths, 16, [1, 2, 4, 8], {}, shifted_labels=shifted, document_ids=documents
    )
    alone, padded_loss, logits, packed_loss = _runs(name, batch, packed)
    back = unpack(logits, pc)
    for i, n in enumerate(lengths):
        assert (back[i, :n] - alone[i][0]).abs().max().item() <= 1e-5
    model = bm.model(name)
    want = _grads(model, padded_loss)
    got_loss = packed_loss()
    assert abs(got_loss.item() - padded_loss.item()) <= 1e-5
    got = _grads(model, got_loss)
    assert got.keys() == want.keys()
    assert max((got[n] - g).abs().max().item() for n, g in want.items()) <= 1e-5


def test_a_hugging_face_decoder_with_a_cache_does_not_read_packed_samples():
    """Why ``packs`` says to call with ``use_cache=False``: with a cache, samples see each other."""
    pytest.importorskip("transformers")
    batch, _ = _call(2, 6, seed=1)
    packed, pc = pack_call(batch, ["input_ids"], [6, 6], 12, None, {}, shifted_labels=False)
    model = bm.model("llama")
    cached = unpack(model(**packed, use_cache=True).logits, pc)
    fresh = unpack(model(**packed, use_cache=False).logits, pc)
    assert (cached - fresh).abs().max().item() > 1e-3


# -- packs: the rule ------------------------------------------------------------------------


def test_packs_decoders_that_read_positions_or_documents_and_nothing_else():
    pytest.importorskip("transformers")
    from transformers import BertConfig, BertModel

    assert packs(bm.model("gpt")) and packs(bm.model("llama")) and packs(bm.model("gpt2"))
    assert packs(torch.compile(bm.model("llama"), backend="eager"))
    bert = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=32))  # fmt: skip
    assert not packs(bert)
    assert not packs(bm.model("t5")) and not packs(bm.model("masked"))
    assert not packs(torch.nn.Linear(2, 2)) and not packs(lambda input_ids, position_ids: 0)
    flash = copy.deepcopy(bm.model("llama"))
    flash.config._attn_implementation = "flash_attention_2"  # packed only for one flat row
    assert not packs(flash)
    eager = copy.deepcopy(bm.model("llama"))
    eager.config._attn_implementation = "eager"
    assert packs(eager)


def test_packs_judges_the_module_ddp_wraps_config_included(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    pytest.importorskip("transformers")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert packs(DDP(bm.model("gpt"))) and packs(DDP(bm.model("llama")))
        assert not packs(DDP(bm.model("masked")))
    finally:
        dist.destroy_process_group()


# -- bad input ------------------------------------------------------------------------------


def test_a_mask_that_is_not_right_padded_is_refused_naming_the_row():
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    with pytest.raises(ShapeBucketError, match=r"row 1 .*not right-padded.*padding_side='right'"):
        real_lengths(mask)
    with pytest.raises(ShapeBucketError, match="row 0 .*not right-padded"):
        real_lengths(torch.tensor([[1, 0, 1]]))


def test_best_fit_fills_rows_tighter_than_laying_samples_in_order():
    lengths = [5, 4, 3, 4, 5, 3]  # in order: 3 rows of 8; best fit decreasing: 5+3, 5+3, 4+4
    batch = _right_padded(lengths, 5)
    _, pc = pack_call(batch, ["input_ids"], lengths, 8, None, {}, shifted_labels=False)
    assert pc.packed_rows == 3
    batch = _right_padded([2, 6, 2, 6], 6)  # in order: 2|6, 2|6 -> 3 rows; best fit: 6+2, 6+2
    _, pc = pack_call(batch, ["input_ids"], [2, 6, 2, 6], 8, None, {}, shifted_labels=False)
    assert pc.packed_rows == 2 and int((~pc.pads).sum()) == 16


def test_gradients_flow_back_through_unpack():
    """A loss of the unpacked per-token outputs has the padded call's gradients."""
    batch, lengths = _call(4, 9, seed=5)
    mask = batch["attention_mask"]
    model = bm.model("gpt")
    packed, pc = pack_call(
        batch, ["input_ids"], lengths, 12, [2, 4], {}, shifted_labels=False, document_ids=True
    )
    padded = model.logits(batch["input_ids"], attention_mask=mask)[mask].square().mean()
    want = _grads(model, padded)
    pin = {k: packed[k] for k in ("position_ids", "document_ids")}
    back = unpack(model.logits(packed["input_ids"], **pin), pc, fill=float("nan"))
    got = _grads(model, back[mask].square().mean())
    assert back[~mask].isnan().all()
    assert max((got[n] - g).abs().max().item() for n, g in want.items()) <= 1e-5


def test_a_row_without_real_tokens_packs_nothing_and_comes_back_as_fill():
    batch = _right_padded([3, 0, 2], 4)
    assert real_lengths(batch["attention_mask"]).tolist() == [3, 0, 2]
    packed, pc = pack_call(batch, ["labels"], [3, 0, 2], 5, None, {}, shifted_labels=True)
    assert pc.packed_rows == 1 and packed["labels"].shape == (1, 5)
    back = unpack(packed["labels"], pc, fill=7)
    assert back[1].tolist() == [7] * 4 and back[0].tolist() == [-100, 1002, 1003, 7]
    empty = _right_padded([0], 2)
    packed, pc = pack_call(empty, ["input_ids"], [0], 4, [2], {}, shifted_labels=False)
    assert packed["input_ids"].tolist() == [[0] * 4] * 2 and unpack(
        packed["input_ids"], pc
    ).shape == (1, 2)


# -- kept layouts ---------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.lists(calls(), min_size=1, max_size=5), st.booleans(), st.integers(1, 64))
def test_a_kept_layout_packs_what_a_fresh_plan_packs(drawn, shifted, budget):
    """Layouts kept per lengths (hits, misses, and evictions under a small budget) give the
    batches, the packed call and the unpacked outputs of a layout planned afresh."""
    kept: dict = {}
    cpu = torch.device("cpu")
    for lengths, L, row_length, buckets in drawn + drawn[::-1]:  # the second pass hits
        batch = _right_padded(lengths, L)
        keys = ["input_ids", "labels", "pair"]
        fresh, fc = pack_call(
            batch, keys, lengths, row_length, buckets, {}, shifted_labels=shifted,
            document_ids=True,
        )  # fmt: skip
        layouts = kept.setdefault(str(buckets), Layouts(buckets, True, max_tokens=budget))
        layout = layouts.get(tuple(lengths), L, row_length, cpu)
        packed, pc = pack_into(batch, keys, layout, {}, shifted_labels=shifted)
        assert packed.keys() == fresh.keys()
        assert all(torch.equal(packed[k], fresh[k]) for k in fresh)
        assert (pc.rows, pc.length, pc.packed_rows) == (fc.rows, fc.length, fc.packed_rows)
        assert torch.equal(pc.back, fc.back) and torch.equal(pc.pads, fc.pads)
        for k in keys:
            assert torch.equal(unpack(packed[k], pc, fill=-3), unpack(fresh[k], fc, fill=-3))
        assert all(ls.tokens <= budget for ls in kept.values())


def test_a_packed_position_grid_is_the_callers_own_copy():
    """A model that writes into its position_ids changes no kept layout."""
    batch = _right_padded([3, 2], 4)
    layouts = Layouts(None, True)
    layout = layouts.get((3, 2), 4, 8, torch.device("cpu"))
    first, _ = pack_into(batch, ["input_ids"], layout, {}, shifted_labels=False)
    first["position_ids"].fill_(9)
    first["document_ids"].fill_(9)
    again, _ = pack_into(batch, ["input_ids"], layouts.get((3, 2), 4, 8, torch.device("cpu")),
                         {}, shifted_labels=False)  # fmt: skip
    assert again["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 0]]
    assert again["document_ids"].tolist() == [[0, 0, 0, 1, 1, -1, -1, -1]]


def test_a_layout_kept_under_inference_mode_serves_a_call_that_records_gradients():
    layouts = Layouts([2], False)
    with torch.inference_mode():
        layouts.get((3, 2), 4, 8, torch.device("cpu"))
    x = torch.randn(2, 4, 3, requires_grad=True)
    batch = {"x": x, "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])}
    packed, pc = pack_into(
        batch, ["x"], layouts.get((3, 2), 4, 8, torch.device("cpu")), {}, shifted_labels=False
    )
    unpack(packed["x"] * 2, pc).sum().backward()  # saves the kept index grids for backward
    assert len(layouts) == 1 and torch.equal(
        x.grad, 2 * batch["attention_mask"][..., None].expand_as(x).float()
    )


def test_a_packing_wrapper_keeps_one_layout_per_lengths_and_pickles_it_empty():
    gpt = bm.bench_gpt()
    batch = bm.call("gpt", 3, 9, seed=0)
    batch["labels"] = batch["labels"].masked_fill(~batch["attention_mask"], -100)
    wrapped = BucketedModel(gpt, bm.BUCKETS, row_buckets=bm.ROW_BUCKETS)
    want = gpt(**batch)
    assert torch.allclose(wrapped(**batch), want, atol=1e-6)
    assert torch.allclose(wrapped(**batch), want, atol=1e-6)  # the kept layout
    assert wrapped.stats.packed_calls == 2
    assert len(wrapped.route(batch).packer.layouts) == 1
    copied = pickle.loads(pickle.dumps(wrapped))  # a cache: pickled empty, rebuilt
    again = copied.route(batch).packer.layouts
    assert len(again) == 0 and torch.allclose(copied(**batch), want, atol=1e-6)
    assert len(again) == 1


def test_host_lengths_reads_lengths_and_labels_on_pads_in_one_pass():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert host_lengths(mask) == ((2, 3), False)
    assert host_lengths(mask.bool(), torch.tensor([[4, 5, -100], [1, 2, 3]])) == ((2, 3), False)
    assert host_lengths(mask, torch.tensor([[4, 5, 6], [1, 2, 3]])) == ((2, 3), True)
    with pytest.raises(ShapeBucketError, match="row 1 .*not right-padded"):
        host_lengths(torch.tensor([[1, 0], [0, 1]]), torch.zeros(2, 2, dtype=torch.long))
    # a device call's flags are worked out on its device and copied once: the same answer
    for m, labels in [(mask, None), (mask.bool(), torch.tensor([[4, 5, 6], [1, 2, 3]]))]:
        viewed, copied = packing._viewed(m, labels), packing._copied(m, labels)
        assert all(
            (a is None and b is None) or np.array_equal(a, b)
            for a, b in zip(viewed, copied, strict=True)
        )


def test_a_call_of_more_rows_than_the_row_buckets_that_packs_into_them_is_planned():
    """``fit_calls(packed_row_length=R)`` fits row buckets on the packed rows, fewer than
    a call's own: a 6-row call of short samples packs into 1 row of 16, inside row buckets
    [1, 2], and must run there, not be refused (or sent past the plan) for its 6 rows."""
    gpt = bm.bench_gpt()
    mask = torch.arange(8)[None, :] < torch.tensor([2, 3, 2, 1, 3, 2])[:, None]
    ids = torch.randint(1, 50, (6, 8), generator=torch.Generator().manual_seed(0)) * mask
    batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(~mask, -100)}
    wrapped = BucketedModel(gpt, [16], row_buckets=[1, 2])
    assert torch.allclose(wrapped(**batch), gpt(**batch), atol=1e-6)
    assert wrapped.stats.packed_calls == 1 and wrapped.stats.shapes == {(1, 16): 1}
    # one that packs into more rows than the largest row bucket is past the plan
    full = {k: torch.ones_like(v) if k == "attention_mask" else v for k, v in batch.items()}
    full["input_ids"] = full["labels"] = torch.ones_like(ids)
    with pytest.raises(ShapeBucketError, match="pack into 3 rows, past the largest row bucket 2"):
        wrapped(**full)
    dynamic = BucketedModel(gpt, [16], row_buckets=[1, 2], overflow="eager")
    with pytest.warns(UserWarning, match="pack into 3 rows"):
        assert torch.allclose(dynamic(**full), gpt(**full), atol=1e-6)
    assert dynamic.stats.eager_calls == 1 and dynamic.stats.packed_calls == 0
