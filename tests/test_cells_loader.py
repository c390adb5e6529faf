"""Two-length buckets in a loader: CellBatchSampler, CellCollator and their ShapePlan."""

from __future__ import annotations

import io
import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from _helpers import build, check_resume_at_every_position
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shapebucket import ShapePlan, no_recompiles, prewarm
from shapebucket.collate import BucketCollator, CellCollator
from shapebucket.compile import CompileCounter
from shapebucket.errors import ShapeBucketError
from shapebucket.fit import fit_cells
from shapebucket.plan import Shape
from shapebucket.sampling import BucketBatchSampler, CellBatchSampler

FAST = settings(max_examples=30, deadline=None, print_blob=True)

RNG = np.random.default_rng(3)
SRC = RNG.integers(1, 40, 37)
TGT = RNG.integers(1, 20, 37)
CELLS = fit_cells(SRC, TGT, 4)


def samples(src=SRC, tgt=TGT):
    return [
        {"input_ids": list(range(1, s + 1)), "labels": [7] * t, "idx": i}
        for i, (s, t) in enumerate(zip(src.tolist(), tgt.tolist(), strict=True))
    ]


# -- the sampler ---------------------------------------------------------------------------


@FAST
@given(
    pairs=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30)), min_size=1, max_size=50),
    k=st.integers(1, 5),
    size=st.one_of(st.integers(1, 6).map(lambda b: ("rows", b)), st.just(("tokens", 0))),
    world=st.sampled_from([1, 2, 3]),
    drop_last=st.booleans(),
    epoch=st.integers(0, 2),
)
def test_every_sample_once_per_epoch_each_batch_in_one_cell_shapes_exact(
    pairs, k, size, world, drop_last, epoch
):
    src, tgt = np.array(pairs).T
    cells = fit_cells(src, tgt, k)
    kind, b = size
    how = {"rows": b} if kind == "rows" else {"tokens_per_batch": 200}
    ranks = [
        build(
            CellBatchSampler,
            src,
            tgt,
            cells,
            **how,
            num_replicas=world,
            rank=r,
            drop_last=drop_last,
        )
        for r in range(world)
    ]
    for s in ranks:
        s.set_epoch(epoch)
    per_rank = [list(s) for s in ranks]
    assert len({len(b) for b in per_rank}) == 1  # every rank the same number of steps
    seen: Counter[int] = Counter()
    for r, s in enumerate(ranks):
        observed = set()
        for step, batch in enumerate(per_rank[r]):
            index = cells.index_for_many(src[batch], tgt[batch])
            assert len(set(index.tolist())) == 1  # one cell per batch ...
            cell = cells.cells[int(index[0])]
            assert tuple(s.batch_buckets(epoch)[step]) == cell  # ... the same on every rank
            assert len(batch) <= s.rows[cell]
            # the collator pads the batch to the sampler's cell
            assert cells.cell_for(int(src[batch].max()), int(tgt[batch].max())) == cell
            observed.add((len(batch), *cell))
            seen.update(batch)
        assert observed == s.shapes()  # exact: every shape occurs, none other
    stats = ranks[0].stats
    assert sum(seen.values()) == len(src) - stats.dropped + stats.duplicated
    if not drop_last:
        assert set(seen) == set(range(len(src)))  # every sample, repeats only to even out ranks
        assert all(n == 1 for i, n in seen.items()) or stats.duplicated > 0


def test_tokens_per_batch_counts_source_plus_target():
    s = CellBatchSampler.for_tokens([3, 30], [30, 3], [(8, 32), (32, 8)], 100, batch_multiple=2)
    assert s.rows == {(8, 32): 2, (32, 8): 2}
    with pytest.raises(ShapeBucketError, match="tokens_per_batch >= 80"):
        CellBatchSampler.for_tokens([3], [3], [(8, 32)], 79, batch_multiple=2)
    with pytest.raises(ShapeBucketError, match="rows must be an int"):
        CellBatchSampler([3], [3], [(8, 32)], rows=None)  # type: ignore[arg-type]
    with pytest.raises(ShapeBucketError, match=r"no batch size for cells \[\(32, 8\)\]"):
        CellBatchSampler([3], [3], [(8, 32), (32, 8)], rows={(8, 32): 2})


def test_sampler_refuses_samples_outside_the_cells_naming_them():
    with pytest.raises(
        ShapeBucketError, match=r"sample 1: source length 40 .* longest source of the cells is 8"
    ):
        CellBatchSampler([3, 40], [3, 3], [(8, 8)], rows=2)
    with pytest.raises(ShapeBucketError, match="sample 1: source length 3 and target length 9"):
        CellBatchSampler([3, 3], [3, 9], [(8, 8)], rows=2)
    with pytest.raises(ShapeBucketError, match="give both lengths"):
        CellBatchSampler([3, 3], [3], [(8, 8)], rows=2)


@pytest.mark.parametrize("world", [(1, 0), (2, 1)])
def test_resume_at_every_position(world):
    check_resume_at_every_position(
        lambda: CellBatchSampler(
            SRC, TGT, CELLS, rows=3, seed=5, num_replicas=world[0], rank=world[1]
        ),
        epoch=1,
    )


def test_state_of_other_lengths_is_refused():
    a = CellBatchSampler(SRC, TGT, CELLS, rows=3)
    b = CellBatchSampler(SRC, TGT[::-1].copy(), CELLS, rows=3)
    with pytest.raises(ShapeBucketError, match="other lengths"):
        b.load_state_dict(a.state_dict())


def test_stateful_dataloader_resume_mid_epoch_through_torch_save():
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        sampler = CellBatchSampler(SRC, TGT, CELLS, rows=4, seed=2)
        collate = CellCollator(CELLS, rows=sampler.rows)
        return sdl.StatefulDataLoader(samples(), batch_sampler=sampler, collate_fn=collate)

    def ids(batch):
        return batch["idx"].tolist()

    full = [ids(b) for b in loader()]
    first = loader()
    it = iter(first)
    head = [ids(next(it)) for _ in range(3)]
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = loader()
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    assert head + [ids(b) for b in resumed] == full


# -- the collator ---------------------------------------------------------------------------


def test_each_key_is_padded_to_its_own_length_with_safe_defaults():
    collate = CellCollator([(8, 8), (16, 4)], rows=3)
    batch = collate(
        [
            {"input_ids": [1, 2, 3], "labels": [4, 5], "decoder_attention_mask": [1, 1], "idx": 7},
            {
                "input_ids": [6],
                "labels": [8, 9, 10, 11, 12],
                "decoder_attention_mask": [1] * 5,
                "idx": 9,
            },
        ]
    )
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (3, 8)
    assert (
        batch["labels"].shape == batch["decoder_attention_mask"].shape == (3, 8)
    )  # (16, 4) is too short
    assert batch["input_ids"][0].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    assert batch["labels"][0].tolist() == [4, 5] + [-100] * 6
    assert batch["decoder_attention_mask"][1].tolist() == [1] * 5 + [0] * 3
    assert batch["attention_mask"].sum(1).tolist() == [3, 1, 0]
    assert batch["idx"].tolist() == [7, 9, 0]
    assert list(batch) == ["input_ids", "idx", "attention_mask", "labels", "decoder_attention_mask"]


def test_target_mask_and_custom_target_keys():
    collate = CellCollator([(4, 4)], target_keys=["tgt"], target_mask_key="tgt_mask")
    batch = collate([{"src": [1, 2], "tgt": [3]}])
    assert batch["src"].shape == (1, 4) and batch["tgt"].tolist() == [[3, 0, 0, 0]]
    assert batch["tgt_mask"].tolist() == [[True, False, False, False]]


def test_audio_features_pad_along_seq_dim_and_the_collator_pickles():
    collate = CellCollator([(16, 8), (32, 4)], rows=2, seq_dim=1)
    collate = pickle.loads(pickle.dumps(collate))  # DataLoader workers get a copy
    sample = {
        "input_features": np.ones((4, 10), np.float32),
        "labels": [1, 2, 3],
        "lang": 2,
    }
    batch = collate([sample])
    assert batch["input_features"].shape == (2, 4, 16) and batch["labels"].shape == (2, 8)
    assert batch["attention_mask"].sum().item() == 10 and batch["lang"].tolist() == [2, 0]
    assert collate.repad(batch, Shape(2, 32, 4))["input_features"].shape == (2, 4, 32)
    fixed = CellCollator([(16, 8)], sequence_keys=["input_features"])
    assert fixed([{"input_features": [1, 2], "labels": [3], "pos": np.zeros(3)}])["pos"].shape == (
        1,
        3,
    )


@pytest.mark.parametrize("mask", ["frame_mask", "attention_mask"])
def test_a_per_frame_mask_beside_seq_dim_1_features_is_refused_with_the_fix(mask):
    """A [frames] mask next to [n_mels, frames] features has no dim 1 to pad: refused naming
    the key and both fixes, and each fix gives a per-frame mask of the batch's frames."""
    collate = CellCollator([(16, 8), (32, 4)], rows=2, seq_dim=1)
    sample = {"input_features": np.ones((4, 10), np.float32), "labels": [1, 2, 3]}
    with pytest.raises(
        ShapeBucketError,
        match=rf"sample 0: '{mask}' has shape \(10,\) with no seq_dim=1; .*per-frame mask, leave "
        r"it out of the samples: the collator makes the mask itself .*\[1, 10\] for \[10\]",
    ):
        collate([{**sample, mask: np.ones(10, bool)}])
    made = collate([sample])["attention_mask"]  # left out: the collator's own
    assert made.shape == (2, 16) and made.sum(1).tolist() == [10, 0]
    if mask == "frame_mask":  # given the features' layout: padded along its frames
        kept = collate([{**sample, mask: np.ones((1, 10), bool)}])[mask]
        assert kept.shape == (2, 1, 16) and kept.sum().item() == 10


def test_collator_errors_name_key_sample_value_limit_and_fix():
    collate = CellCollator([(8, 4), (16, 2)])
    with pytest.raises(ShapeBucketError) as e:
        collate(
            [
                {"input_ids": [1] * 3, "labels": [1] * 2, "idx": 5},
                {"input_ids": [1] * 9, "labels": [1] * 3, "idx": 6},
            ]
        )
    msg = str(e.value)
    assert "6" in msg and "'input_ids' has length 9" in msg and "'labels' has length 3" in msg
    assert "longest target of the cells with source >= 9 is 2" in msg and "fit_cells" in msg
    with pytest.raises(ShapeBucketError, match="the batch mixes cells"):
        collate([{"input_ids": [1] * 9, "labels": [1]}, {"input_ids": [1], "labels": [1] * 4}])
    with pytest.raises(ShapeBucketError, match="none of the target keys"):
        collate([{"input_ids": [1]}])
    with pytest.raises(ShapeBucketError, match="only target keys.*no source key"):
        collate([{"labels": [1], "idx": 0}])
    with pytest.raises(ShapeBucketError, match="dict samples"):
        collate([[1, 2]])
    with pytest.raises(ShapeBucketError, match="larger than rows=1"):
        CellCollator([(8, 4)], rows=1)([{"input_ids": [1], "labels": [1]}] * 2)
    with pytest.raises(ShapeBucketError, match=r"no batch size for cells \[\(16, 2\)\]"):
        CellCollator([(8, 4), (16, 2)], rows={(8, 4): 2})
    with pytest.raises(ShapeBucketError, match="does not fit"):
        CellCollator([(8, 4)], pad_values={"labels": -100})(
            [{"input_ids": [1], "labels": np.array([1], dtype=np.uint8)}]
        )


@pytest.mark.parametrize(
    "rows, needle",
    [
        ({8: 2, (16, 2): 1}, r"no batch size for cells \[\(8, 4\)\] and names \[8\]"),
        ({None: 1}, r"names \[None\], which are not cells of \[\(8, 4\), \(16, 2\)\]"),
        ({(8.0, 4): 1, (16, 2): 1}, r"names \[\(8\.0, 4\)\]"),
    ],
)
def test_cell_collator_rows_mapping_is_checked_like_the_samplers(rows, needle):
    """A key that is not a cell (a bucket length, None) is named, as CellBatchSampler
    names it; it was a raw TypeError (``tuple(8)``)."""
    for make in (
        lambda: CellCollator([(8, 4), (16, 2)], rows=rows),
        lambda: CellBatchSampler([3], [1], [(8, 4), (16, 2)], rows=rows),
    ):
        with pytest.raises(ShapeBucketError, match=needle):
            make()


def test_cell_collator_rows_for_a_bucket_length_names_the_cells():
    collate = CellCollator([(8, 4), (16, 2)], rows={(8, 4): 2, (16, 2): 1})
    assert collate.rows_for((16, 2)) == collate.rows_for([16, 2]) == 1
    with pytest.raises(
        ShapeBucketError, match=r"no entry for cell 8; it has \[\(8, 4\), \(16, 2\)\]"
    ):
        collate.rows_for(8)


def test_repad_makes_each_cell_shape():
    collate = CellCollator(CELLS)
    batch = collate(samples()[:1])
    for S, T in CELLS:
        big = collate.repad(batch, Shape(5, S, T))
        assert big["input_ids"].shape == big["attention_mask"].shape == (5, S)
        assert big["labels"].shape == (5, T) and big["idx"].shape == (5,)
        assert (big["labels"][1:] == -100).all() and big["attention_mask"][1:].sum() == 0
    with pytest.raises(ShapeBucketError, match="not one of"):
        collate.repad(batch, Shape(1, 999, 8))
    with pytest.raises(
        ShapeBucketError, match=r"must be a \(rows, source, target\) triple, got 16"
    ):
        collate.repad(batch, 16)  # issue 30 (low): an int, as the one-length collators took


# -- the shape plan and the compiler -------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_stats_count_source_and_target_tokens_exactly_across_workers(workers):
    """CellCollator.stats has BucketCollator's contract: real tokens are source + target
    tokens, padded tokens the rest of rows x (source + target), per cell, exact with
    workers; reset_stats() zeroes them."""
    sampler = CellBatchSampler(SRC, TGT, CELLS, rows=4, seed=2)
    collate = CellCollator(CELLS, rows=sampler.rows)
    loader = DataLoader(samples(), batch_sampler=sampler, collate_fn=collate, num_workers=workers)
    batches = list(loader)
    st_ = collate.stats
    assert st_.batches == len(batches) == len(sampler) and st_.num_samples == len(SRC)
    assert st_.real_tokens == int(SRC.sum() + TGT.sum())
    assert st_.real_tokens == sum(
        int(b["attention_mask"].sum() + (b["labels"] != -100).sum()) for b in batches
    )
    computed = sum(b["input_ids"].numel() + b["labels"].numel() for b in batches)
    assert st_.padded_tokens == computed - st_.real_tokens
    assert st_.pad_rows == sum(int((b["attention_mask"].sum(1) == 0).sum()) for b in batches)
    assert st_.batches_per_bucket == dict(
        Counter((b["input_ids"].shape[1], b["labels"].shape[1]) for b in batches)
    )
    assert st_.truncated_samples == st_.truncated_tokens == 0
    assert 0 < st_.token_efficiency < 1
    collate.reset_stats()
    assert collate.stats.batches == collate.stats.real_tokens == 0
    assert pickle.loads(pickle.dumps(collate)).stats.batches == 0


def test_shape_plan_lists_every_rows_source_target_and_refuses_mismatches():
    sampler = CellBatchSampler(SRC, TGT, CELLS, rows=4)
    plan = ShapePlan.of(CellCollator(CELLS), sampler)
    assert {tuple(s) for s in plan} == sampler.shapes()
    assert all(isinstance(s, Shape) and len(s.lengths) == 2 for s in plan)
    padded = ShapePlan.of(CellCollator(CELLS, rows=sampler.rows), sampler)
    assert {tuple(s) for s in padded} == {(4, *c) for c in CELLS}
    assert ShapePlan.of(CellCollator(CELLS, rows=4)).shapes == padded.shapes
    assert all(str((4, *c)) in repr(padded) for c in CELLS)  # the target length shows
    with pytest.raises(ShapeBucketError, match="do not make one loader.*CellCollator"):
        ShapePlan.of(BucketCollator([64]), sampler)
    with pytest.raises(ShapeBucketError, match="do not make one loader.*CellBatchSampler"):
        ShapePlan.of(CellCollator(CELLS), BucketBatchSampler([3], [8], rows=1))
    with pytest.raises(ShapeBucketError, match="pads no rows"):
        ShapePlan.of(CellCollator(CELLS))
    with pytest.raises(ShapeBucketError, match=r"cells \[\(999, 8\)\], which the collator"):
        ShapePlan([(4, 999, 8)], CellCollator(CELLS))
    with pytest.raises(ShapeBucketError, match="mix"):
        ShapePlan.from_function([(4, 8), (4, 8, 8)], lambda s: None)


def test_prewarm_compiles_one_graph_per_cell_and_training_compiles_none(fresh_compiler):
    sampler = CellBatchSampler(SRC, TGT, CELLS, rows=4, seed=1)
    collate = CellCollator(CELLS, rows=sampler.rows)
    loader = DataLoader(samples(), batch_sampler=sampler, collate_fn=collate)
    plan = ShapePlan.of(collate, sampler)
    emb = torch.nn.Embedding(64, 4)

    def model(input_ids, attention_mask, labels, idx):
        src = (emb(input_ids) * attention_mask[..., None]).sum(1)
        tgt = emb(labels.clamp(min=0)).mean(1)
        return (src * tgt).sum()

    compiled = torch.compile(model, dynamic=False, fullgraph=True, backend="eager")
    report = prewarm(compiled, plan, example=next(iter(loader)), progress=False)
    assert report.total_graphs == len(plan) == len(CELLS)
    with CompileCounter() as cc, no_recompiles(plan):
        for batch in loader:
            compiled(**batch).backward()
    assert cc.graphs == 0 and cc.recompiles == []
    with (
        pytest.raises(ShapeBucketError, match="the plan's shapes"),
        no_recompiles(plan),
    ):
        compiled(**collate.repad(batch, Shape(3, *CELLS.cells[0])))


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"mask_key": "labels"}, "mask_key='labels' is one of the target keys"),
        ({"target_mask_key": "labels"}, "target_mask_key='labels' is one of the target keys"),
        ({"target_mask_key": "attention_mask"}, "mask_key and target_mask_key are both"),
        ({"target_mask_key": 3}, "target_mask_key must be a str or None, got 3"),
    ],
)
def test_collator_refuses_a_mask_named_like_another_key(settings, needle):
    # the source mask replaced the labels, or the target mask was dropped, silently
    with pytest.raises(ShapeBucketError, match=needle):
        CellCollator([(8, 4), (16, 8)], **settings)


def test_collator_refuses_a_target_mask_named_like_a_source_key():
    collate = CellCollator([(8, 4), (16, 8)], target_mask_key="input_ids")
    with pytest.raises(ShapeBucketError, match="target_mask_key='input_ids' is also a source key"):
        collate([{"input_ids": [1, 2, 3], "labels": [7, 8]}])


def test_collator_repr_shows_the_cells_and_the_settings_off_their_default():
    assert repr(CellCollator(CELLS, rows=2)) == f"CellCollator(cells={CELLS!r}, rows=2)"
    assert "target_mask_key='dm'" in repr(CellCollator(CELLS, target_mask_key="dm"))
