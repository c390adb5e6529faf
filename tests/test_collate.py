import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from shapebucket import BucketCollator, ShapeBucketError
from shapebucket.collate import KeyRoles
from shapebucket.fit import Buckets
from shapebucket.plan import Shape

BUCKETS = Buckets([4, 8, 16, 32])


@st.composite
def batches(draw):
    """A random batch: dict samples with 1-3 sequence keys of mixed container types."""
    n = draw(st.integers(1, 6))
    lens = draw(st.lists(st.integers(0, 32), min_size=n, max_size=n))
    n_keys = draw(st.integers(1, 3))
    dtypes = draw(
        st.lists(st.sampled_from(["int", "float", "bool"]), min_size=n_keys, max_size=n_keys)
    )
    container = draw(st.sampled_from(["list", "numpy", "torch"]))
    samples = []
    for length in lens:
        s = {}
        for k, dt in enumerate(dtypes):
            vals = draw(
                st.lists(
                    {
                        "int": st.integers(-1000, 1000),
                        "float": st.floats(-1e3, 1e3, width=32),
                        "bool": st.booleans(),
                    }[dt],
                    min_size=length,
                    max_size=length,
                )
            )
            if container == "numpy":
                vals = np.array(
                    vals, dtype={"int": np.int64, "float": np.float32, "bool": np.bool_}[dt]
                )
            elif container == "torch":
                vals = torch.tensor(
                    vals, dtype={"int": torch.int64, "float": torch.float32, "bool": torch.bool}[dt]
                )
            s[f"k{k}"] = vals
        samples.append(s)
    return samples, lens, dtypes, container


@given(batches(), st.sampled_from(["right", "left"]), st.one_of(st.none(), st.integers(6, 8)))
def test_every_real_token_kept_in_place_and_mask_exact(batch, side, pad_rows):
    samples, lens, dtypes, container = batch
    choices = {"int": [7, -3, 1], "float": [7, -3.5, 1e30], "bool": [True, False, True]}
    pads = {f"k{k}": choices[dt][k] for k, dt in enumerate(dtypes)}
    collate = BucketCollator(
        BUCKETS, padding_side=side, pad_values=pads, rows=pad_rows, sample_mask_key="sample_mask"
    )
    out = collate(samples)
    bucket = BUCKETS.bucket_for(max(lens))
    rows = pad_rows or len(samples)
    mask = out["attention_mask"]
    assert mask.shape == (rows, bucket) and mask.dtype == torch.bool
    for k, dt in enumerate(dtypes):
        key = f"k{k}"
        t = out[key]
        assert t.shape == (rows, bucket)
        if container != "list" or sum(lens):  # empty Python lists carry no dtype: int64
            assert t.dtype == {"int": torch.int64, "float": torch.float32, "bool": torch.bool}[dt]
        for i, (s, n) in enumerate(zip(samples, lens, strict=True)):
            real = slice(0, n) if side == "right" else slice(bucket - n, bucket)
            assert t[i, real].tolist() == torch.as_tensor(np.asarray(s[key])).tolist()
            pad_positions = ~mask[i]
            assert (t[i][pad_positions] == torch.tensor(pads[key]).to(t.dtype)).all()
            assert mask[i].sum() == n and mask[i, real].all()
        assert (t[len(samples) :] == torch.tensor(pads[key]).to(t.dtype)).all()
    assert not mask[len(samples) :].any()
    if pad_rows:
        assert out["sample_mask"].tolist() == [True] * len(samples) + [False] * (
            rows - len(samples)
        )
    else:
        assert "sample_mask" not in out
    st_ = collate.stats
    assert st_.real_tokens == sum(lens) and st_.real_tokens + st_.padded_tokens == rows * bucket


@given(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.sampled_from(["right", "left"]))
def test_truncate_counts_and_keeps_the_documented_side(lens, side):
    collate = BucketCollator(BUCKETS, overflow="truncate", padding_side=side)
    samples = [{"input_ids": list(range(n))} for n in lens]
    out = collate(samples)
    for i, n in enumerate(lens):
        kept = list(range(n))[:32] if side == "right" else list(range(n))[-32:]
        row = out["input_ids"][i][out["attention_mask"][i]].tolist()
        assert row == kept
    assert collate.stats.truncated_samples == sum(n > 32 for n in lens)
    assert collate.stats.truncated_tokens == sum(max(n - 32, 0) for n in lens)


def test_nd_sequences_and_seq_dim():
    feats = [torch.randn(5, 3), torch.randn(9, 3)]
    out = BucketCollator(BUCKETS)([{"x": f} for f in feats])
    assert out["x"].shape == (2, 16, 3)
    assert torch.equal(out["x"][1, :9], feats[1]) and (out["x"][0, 5:] == 0).all()
    chans = [torch.randn(2, 5), torch.randn(2, 9)]
    out = BucketCollator(BUCKETS, seq_dim=1)([{"x": c} for c in chans])
    assert out["x"].shape == (2, 2, 16)
    assert torch.equal(out["x"][0, :, :5], chans[0]) and (out["x"][0, :, 5:] == 0).all()
    assert out["attention_mask"].sum(1).tolist() == [5, 9]


def test_structures_scalars_and_objects():
    out = BucketCollator(BUCKETS)(
        [
            {"input_ids": [1, 2], "labels": [1, 2], "id": 3, "w": 0.5, "text": "a"},
            {"input_ids": [3], "labels": [3], "id": 4, "w": 1.5, "text": "b"},
        ]
    )
    assert out["labels"].tolist() == [[1, 2, -100, -100], [3, -100, -100, -100]]
    assert out["id"].tolist() == [3, 4] and out["id"].dtype == torch.int64
    assert out["w"].dtype == torch.float32 and out["text"] == ["a", "b"]
    ids, lab, mask = BucketCollator(BUCKETS)(
        [([1, 2, 3], np.array([1.0, 2.0, 3.0])), ([4], np.array([4.0]))]
    )
    assert ids.shape == (2, 4) and lab.dtype == torch.float64 and mask.sum() == 4
    bare = BucketCollator(BUCKETS, mask_key=None)([[1, 2, 3], [4]])
    assert isinstance(bare, torch.Tensor) and bare.tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]]
    # an existing mask key is padded with 0 like any other key and nothing is added
    out = BucketCollator(BUCKETS)(
        [{"input_ids": [1, 2], "attention_mask": [1, 1]}, {"input_ids": [3], "attention_mask": [1]}]
    )
    assert out["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]


def test_batch_sizes_mapping_and_repr_and_pickle():
    c = BucketCollator(BUCKETS, rows={4: 3, 8: 2, 16: 2, 32: 1})
    assert c([[1, 2, 3]])[0].shape == (3, 4)
    assert c([[1] * 5])[0].shape == (2, 8)
    assert "Buckets([4, 8, 16, 32])" in repr(c) and "rows" in repr(c)
    c([[1, 2]])
    no_rows = BucketCollator(BUCKETS, rows=4, sample_mask_key=None)([{"input_ids": [1, 2]}])
    assert set(no_rows) == {"input_ids", "attention_mask"} and no_rows["input_ids"].shape == (4, 4)
    clone = pickle.loads(pickle.dumps(c))
    assert clone.stats.batches == 0 and c.stats.batches == 3
    assert clone.buckets == c.buckets and clone.rows == c.rows


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"padding_side": "middle"}, "'middle'"),
        ({"overflow": "drop"}, "'drop'"),
        ({"rows": 0}, "got 0"),
        ({"rows": {4: 2}}, r"buckets \[8, 16, 32\]"),
        ({"seq_dim": -1}, "got -1"),
        ({"pad_values": {"input_ids": "x"}}, r"pad_values\['input_ids'\].*'x'"),
        ({"sequence_keys": []}, r"got \[\]"),
    ],
)
def test_bad_configuration(kwargs, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        BucketCollator(BUCKETS, **kwargs)


@pytest.mark.parametrize(
    "samples, kwargs, needle",
    [
        ([], {}, "non-empty"),
        (
            [{"input_ids": [1] * 40}],
            {},
            r"sample 0: 'input_ids' has length 40 > largest bucket 32.*overflow='truncate'",
        ),
        ([{"a": [1]}, {"a": [1] * 33}], {}, "sample 1: 'a' has length 33"),
        ([{"a": [1, 2], "b": [1]}], {}, r"sample 0: .*'a' has 2, 'b' has 1"),
        ([{"a": [1]}, {"a": 5}], {}, "sample 1: 'a' is a sequence key but holds int 5"),
        ([{"a": [1]}, {"a": "xyz"}], {}, "sample 1: 'a' is a sequence key but holds str"),
        ([{"a": [1]}, {"b": [1]}], {}, "sample 1 has no key 'a'"),
        ([{"x": torch.ones(2, 3)}, {"x": torch.ones(2, 4)}], {}, r"cannot batch 'x'.*\(2, 3\)"),
        (
            [{"a": [1]}, {"a": [1]}],
            {"rows": 1},
            "batch of 2 samples is larger than rows=1",
        ),
        ([{"a": [1]}], {"sequence_keys": ["b"]}, "sequence key 'b' is not in the samples"),
        ([{"a": 1}], {}, "no sequence value"),
        ([object()], {}, "sample 0 is object"),
    ],
)
def test_bad_input_names_sample_and_key(samples, kwargs, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        BucketCollator(BUCKETS, **kwargs)(samples)


class Ragged(Dataset):
    def __init__(self, n: int, bad_index: int | None = None):
        self.lens = np.random.default_rng(0).integers(1, 33, n)
        self.bad_index = bad_index

    def __len__(self):
        return len(self.lens)

    def __getitem__(self, i):
        n = 40 if i == self.bad_index else int(self.lens[i])
        return {"input_ids": list(range(i, i + n)), "labels": torch.arange(n)}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataloader_workers_match_single_process(method):
    collate = BucketCollator(buckets=BUCKETS)
    ds = Ragged(40)
    want = list(DataLoader(ds, batch_size=8, collate_fn=collate))
    got = list(
        DataLoader(
            ds, batch_size=8, collate_fn=collate, num_workers=2, multiprocessing_context=method
        )
    )
    assert len(got) == len(want) == 5
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_error_reaches_caller(method):
    loader = DataLoader(
        Ragged(16, bad_index=11),
        batch_size=8,
        collate_fn=BucketCollator(BUCKETS),
        num_workers=2,
        multiprocessing_context=method,
    )
    with pytest.raises(ShapeBucketError, match="sample 3: 'input_ids' has length 40"):
        list(loader)


@st.composite
def repad_cases(draw):
    """Samples (dicts or tuples, 1-D or with a feature dim on either side), collator
    settings, and a target bucket and row count to re-pad to."""
    n = draw(st.integers(1, 5))
    lens = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    seq_dim = draw(st.sampled_from([0, 1]))
    feat = draw(st.sampled_from([None, 3]))
    kind = draw(st.sampled_from(["dict", "tuple"]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    samples = []
    for length in lens:
        shape = (length,) if feat is None else ((feat, length) if seq_dim else (length, feat))
        ids = torch.randint(1, 50, shape, generator=g)
        labels = torch.randint(1, 50, shape, generator=g).float()
        samples.append(
            {"ids": ids, "labels": labels, "idx": length} if kind == "dict" else (ids, labels)
        )
    if feat is None:
        seq_dim = 0
    settings = dict(
        padding_side=draw(st.sampled_from(["right", "left"])),
        seq_dim=seq_dim,
        pad_values={"ids": 7, 0: 7, 1: -1.5},
        mask_key=draw(st.sampled_from(["attention_mask", None])),
        sample_mask_key=draw(st.sampled_from(["sample_mask", None])),
    )
    with_rows = draw(st.booleans())
    target = draw(st.integers(2, 40))
    rows = draw(st.integers(1, 8))
    return samples, settings, with_rows, target, rows


@given(repad_cases())
def test_repad_equals_collating_the_samples_at_that_bucket(case):
    """repad(collate(samples), b, rows) is exactly what a collator with the same settings
    makes of the same samples at bucket b (cut to b with overflow='truncate')."""
    samples, settings, with_rows, target, rows = case
    n = len(samples)
    collate = BucketCollator(Buckets([8, 16, 24]), rows=8 if with_rows else None, **settings)
    batch = collate(samples)
    reference = BucketCollator(
        Buckets([target]),
        overflow="truncate",
        rows=rows if (with_rows or rows > n) else None,
        **settings,
    )
    kept = samples[: min(rows, n)]
    want = reference(kept)
    got = collate.repad(batch, Shape(rows, target))
    if rows > n and not with_rows and settings["sample_mask_key"] is not None:
        # the reference adds a row mask when it pads rows; repad keeps the batch's keys
        want = _drop_row_mask(want)
    pairs = (
        zip(want.values(), got.values(), strict=True)
        if isinstance(want, dict)
        else zip(want, got, strict=True)
    )
    if isinstance(want, dict):
        assert list(want) == list(got)
    for w, g in pairs:
        if isinstance(w, torch.Tensor):
            assert w.dtype == g.dtype and w.shape == g.shape and g.is_contiguous()
            assert torch.equal(w, g)
        else:
            assert list(w) == list(g)


def _drop_row_mask(batch):
    if isinstance(batch, dict):
        return {k: v for k, v in batch.items() if k != "sample_mask"}
    return batch[:-1]


def test_repad_keeps_non_sequence_values_and_checks_its_input():
    collate = BucketCollator(BUCKETS, sequence_keys=["input_ids"])
    samples = [
        {"input_ids": [1, 2, 3], "feat": torch.ones(4), "name": "a"},
        {"input_ids": [4], "feat": torch.zeros(4), "name": "b"},
    ]
    batch = collate(samples)
    assert batch["feat"].shape == (
        2,
        4,
    )  # stacked, not padded: its 4 equals the bucket but is no sequence
    big = collate.repad(batch, Shape(3, 16))
    assert big["input_ids"].shape == (3, 16) and big["feat"].shape == (3, 4)
    assert big["name"] == ["a", "b", None] and not big["attention_mask"][2].any()
    with pytest.raises(ShapeBucketError, match="no sequence tensor"):
        collate.repad({"x": torch.ones(3)}, Shape(3, 8))
    with pytest.raises(ShapeBucketError, match="rows must be >= 1"):
        collate.repad(batch, (0, 8))
    with pytest.raises(ShapeBucketError, match="length must be >= 1"):
        collate.repad(batch, (2, 0))
    with pytest.raises(ShapeBucketError, match=r"must be a \(rows, length\) pair, got 16"):
        collate.repad(batch, 16)
    with pytest.raises(ShapeBucketError, match="sample 1: 'feat' is not a sequence key"):
        collate([samples[0], {"input_ids": [4], "feat": torch.zeros(5), "name": "b"}])


# -- dtypes: exact or refused ---------------------------------------------------------------

INT_DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.int32,
    torch.uint32,
    torch.int64,
    torch.uint64,
    torch.bool,
]


def _fits(value, dtype):
    if dtype == torch.bool:
        return value in (0, 1)
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


@st.composite
def int_batches(draw):
    """Samples of one key with any integer dtype each (tensor or numpy), values anywhere in
    their dtype's range, and any pad value (int64 range and beyond)."""
    n = draw(st.integers(1, 4))
    samples, values = [], []
    for _ in range(n):
        dtype = draw(st.sampled_from(INT_DTYPES))
        length = draw(st.integers(1, 9))
        if dtype == torch.bool:
            vals = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        else:
            info = torch.iinfo(dtype)
            vals = draw(st.lists(st.integers(info.min, info.max), min_size=length, max_size=length))
        t = torch.tensor(vals, dtype=dtype)
        values.append(vals)
        samples.append({"ids": t.numpy() if draw(st.booleans()) else t})
    pad = draw(st.one_of(st.integers(-(2**64), 2**64), st.sampled_from([0, -100, 255, 65535])))
    return samples, values, pad


@given(int_batches(), st.sampled_from(["right", "left"]))
def test_any_integer_dtype_and_pad_collates_exactly_or_refuses(batch, side):
    samples, values, pad = batch
    collate = BucketCollator(BUCKETS, pad_values={"ids": pad}, padding_side=side)
    try:
        out = collate(samples)
    except ShapeBucketError as e:
        dtypes = {torch.as_tensor(s["ids"]).dtype for s in samples}
        # refused only for a reason: mixed dtypes, or a pad that does not fit
        assert len(dtypes) > 1 or not _fits(pad, dtypes.pop()), str(e)
        assert "'ids'" in str(e)
        return
    t, mask = out["ids"], out["attention_mask"]
    dtypes = {torch.as_tensor(s["ids"]).dtype for s in samples}
    if len(dtypes) == 1:
        assert t.dtype == dtypes.pop()
    assert _fits(pad, t.dtype)
    bucket = t.shape[1]
    for i, vals in enumerate(values):
        n = len(vals)
        real = slice(0, n) if side == "right" else slice(bucket - n, bucket)
        got = t[i, real]
        # compare as Python ints: no wrap, no float rounding
        assert [int(v) for v in got.tolist()] == [int(v) for v in vals]
        assert all(int(v) == pad for v in t[i][~mask[i]].tolist())


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_wide_unsigned_tokens_pad_exactly(dtype):
    big = torch.iinfo(dtype).max
    out = BucketCollator([4, 8])(
        [torch.tensor([1, big], dtype=dtype), torch.tensor([3], dtype=dtype)]
    )
    ids, mask = out
    assert ids.dtype == dtype and ids.shape == (2, 4)
    assert [int(v) for v in ids[0].tolist()] == [1, big, 0, 0] and mask.sum() == 3


@pytest.mark.parametrize(
    ("samples", "pads", "needle"),
    [
        (
            [{"labels": np.array([1, 2], np.uint8)}],
            None,
            "pad value -100 for 'labels' does not fit its dtype uint8",
        ),
        ([{"x": [True, False]}], {"x": 5}, "pad value 5 for 'x' does not fit its dtype bool"),
        ([{"x": [1, 2]}], {"x": 0.5}, "pad value 0.5 for 'x' does not fit its dtype int64"),
        ([{"x": np.array([1.0], np.float16)}], {"x": 1e6}, "does not fit its dtype float16"),
        (
            [{"x": [1, 2**24 + 1]}, {"x": [0.5]}],
            None,
            "sample 0: 'x' mixes ints and floats, and the int 16777217",
        ),
        ([{"x": [2**63]}], None, "sample 0: 'x' holds 9223372036854775808, outside int64"),
        ([{"x": [1]}, {"x": [-(2**70)]}], None, "sample 1: 'x' holds -1180591620717411303424"),
        (
            [{"x": torch.tensor([2**24 + 1])}, {"x": torch.tensor([0.5])}],
            None,
            "sample 0: 'x' holds 16777217 as torch.int64, which torch.float32",
        ),
        (
            [{"x": torch.tensor([1], dtype=torch.uint16)}, {"x": torch.tensor([1])}],
            None,
            "sample 1: 'x' has dtype torch.int64 but sample 0 has torch.uint16",
        ),
        ([{"x": [1, "a"]}], None, "sample 0: 'x' holds 'a' \\(str\\)"),
        ([{"x": [1], "y": 2**24 + 1}, {"x": [2], "y": 0.5}], None, "'y' mixes ints and floats"),
    ],
)
def test_lossy_dtypes_and_pads_are_refused(samples, pads, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        BucketCollator([4], pad_values=pads)(samples)


def test_lossless_promotion_is_kept():
    out = BucketCollator([4])(
        [{"x": torch.tensor([200], dtype=torch.uint8)}, {"x": torch.tensor([-5], dtype=torch.int8)}]
    )
    assert out["x"].dtype == torch.int16 and out["x"][:, 0].tolist() == [200, -5]


def test_errors_name_the_dataset_index():
    collate = BucketCollator([4])
    with pytest.raises(ShapeBucketError, match=r"sample 1 of the batch \(dataset index 907\)"):
        collate([{"idx": 3, "x": [1]}, {"idx": 907, "x": [1, 2**63]}])
    named = BucketCollator([4], roles=KeyRoles(index="id"))
    with pytest.raises(ShapeBucketError, match=r"dataset index 'doc-9'\)"):
        named([{"id": "doc-1", "x": [1, 2]}, {"id": "doc-9", "x": [1, 2, 3, 4, 5]}])


# -- keys the collator adds ------------------------------------------------------------------


def test_user_sample_mask_key_is_not_overwritten():
    samples = [{"x": [1, 2], "sample_mask": 1}, {"x": [3], "sample_mask": 0}]
    with pytest.raises(ShapeBucketError, match="have a key 'sample_mask'"):
        BucketCollator([4], rows=4, sample_mask_key="sample_mask")(samples)
    out = BucketCollator([4], rows=4, sample_mask_key="rows")(samples)
    assert out["sample_mask"].tolist() == [1, 0, 0, 0] and out["rows"].sum() == 2
    # without rows nothing is added, so the key is the user's
    assert BucketCollator([4])(samples)["sample_mask"].tolist() == [1, 0]


def test_scalar_attention_mask_does_not_suppress_the_token_mask():
    samples = [{"x": [1, 2], "attention_mask": 1}, {"x": [3], "attention_mask": 1}]
    with pytest.raises(ShapeBucketError, match="key 'attention_mask' holding int 1"):
        BucketCollator([4])(samples)
    out = BucketCollator([4], mask_key="token_mask")(samples)
    assert out["token_mask"].sum() == 3 and out["attention_mask"].tolist() == [1, 1]
    # a per-token mask the samples carry is padded, as before
    out = BucketCollator([4])([{"x": [1, 2], "attention_mask": [1, 0]}])
    assert out["attention_mask"].tolist() == [[1, 0, 0, 0]]


# -- counters ---------------------------------------------------------------------------------


class _Long(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"x": list(range(1, 3 + i))}  # lengths 2..25, the longer ones cut to 16


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_counters_exact_with_workers(context):
    collate = BucketCollator([8, 16], overflow="truncate")
    loader = DataLoader(
        _Long(), batch_size=4, collate_fn=collate, num_workers=2, multiprocessing_context=context
    )
    batches = list(loader)
    lens = [2 + i for i in range(24)]
    st_ = collate.stats
    assert st_.batches == len(batches) == 6 and st_.num_samples == 24
    assert st_.truncated_samples == sum(n > 16 for n in lens)
    assert st_.truncated_tokens == sum(max(n - 16, 0) for n in lens)
    assert st_.real_tokens == sum(int(b["attention_mask"].sum()) for b in batches)
    assert sum(st_.batches_per_bucket.values()) == 6
    collate.reset_stats()
    assert collate.stats.batches == 0


def test_counters_exact_across_threads():
    from concurrent.futures import ThreadPoolExecutor

    collate = BucketCollator([4, 8])
    batch = [[1, 2, 3], [4] * 7]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: collate(batch), range(400)))
    assert collate.stats.batches == 400 and collate.stats.real_tokens == 400 * 10
    assert collate.stats.padded_tokens == 400 * 6


def test_a_pickled_copy_counts_from_zero():
    collate = BucketCollator([4])
    collate([[1, 2]])
    copy = pickle.loads(pickle.dumps(collate))
    assert copy.stats.batches == 0 and collate.stats.batches == 1
    copy([[1]])
    assert collate.stats.batches == 1 and copy.stats.batches == 1


def test_fixed_shape_tensors_next_to_sequences_are_stacked():
    """Encoder-decoder captioning: an image per sample next to variable-length text."""
    g = torch.Generator().manual_seed(0)
    images = [torch.rand(3, 4, 4, generator=g) for _ in range(3)]
    feats = [np.arange(5, dtype=np.float32) + i for i in range(3)]
    samples = [
        {
            "pixel_values": im,
            "features": f,
            "decoder_input_ids": [1] * n,
            "labels": [2] * n,
            "caption": f"c{n}",
        }
        for im, f, n in zip(images, feats, (5, 2, 7), strict=True)
    ]
    with pytest.raises(
        ShapeBucketError, match=r"pass sequence_keys=\['decoder_input_ids', 'labels'\]"
    ):
        BucketCollator([8])(samples)
    collate = BucketCollator([8], sequence_keys=["decoder_input_ids", "labels"], rows=4)
    out = collate(samples)
    assert out["pixel_values"].shape == (4, 3, 4, 4) and torch.equal(
        out["pixel_values"][:3], torch.stack(images)
    )
    assert (out["pixel_values"][3] == 0).all()  # the pad row
    assert out["features"].shape == (4, 5) and out["features"].dtype == torch.float32
    assert out["decoder_input_ids"].shape == (4, 8) and out["labels"][3].tolist() == [-100] * 8
    assert out["caption"] == ["c5", "c2", "c7", None]  # strings stay a list


def test_batch_buckets_pad_rows_to_the_smallest_size_that_holds_the_batch():
    collate = BucketCollator.with_row_buckets([8], [4, 1, 2], sample_mask_key="sample_mask")
    assert collate.row_buckets == [1, 2, 4]
    for n, rows in [(1, 1), (2, 2), (3, 4), (4, 4)]:
        batch = collate([{"input_ids": [1, 2]}] * n)
        assert batch["input_ids"].shape == (rows, 8)
        assert batch["sample_mask"].tolist() == [True] * n + [False] * (rows - n)
    with pytest.raises(ShapeBucketError, match="larger than the largest batch bucket 4"):
        collate([{"input_ids": [1]}] * 5)
    with pytest.raises(ShapeBucketError, match="not both"):
        BucketCollator.with_row_buckets([8], [1], rows=2)
    with pytest.raises(ShapeBucketError, match="at least one size"):
        BucketCollator.with_row_buckets([8], [])
    with pytest.raises(ShapeBucketError, match=r"row_buckets\[1\]"):
        BucketCollator.with_row_buckets([8], [1, 0])


# -- repad and rows: bad input (probe) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "dtype", "pad_values", "needle"),
    [
        ("labels", torch.uint8, None, r"pad value -100 for 'labels' does not fit its dtype uint8"),
        ("labels", torch.bool, None, r"pad value -100 for 'labels' does not fit its dtype bool"),
        ("input_ids", torch.int8, {"input_ids": 300}, r"pad value 300 .* dtype int8"),
    ],
)
def test_repad_refuses_a_pad_value_that_does_not_fit_the_dtype(key, dtype, pad_values, needle):
    collate = BucketCollator([8, 16], pad_values=pad_values)
    batch = {"input_ids": torch.ones(2, 8, dtype=torch.long), key: torch.ones(2, 8, dtype=dtype)}
    with pytest.raises(ShapeBucketError, match=needle):  # it wrapped -100 to 156 / True
        collate.repad(batch, Shape(2, 16))


def test_repad_refuses_a_per_row_pad_that_does_not_fit():
    collate = BucketCollator([8, 16])
    batch = {"input_ids": torch.ones(2, 8, dtype=torch.long), "labels": torch.ones(2, dtype=torch.uint8)}
    with pytest.raises(ShapeBucketError, match=r"-100 for 'labels' does not fit its dtype uint8"):
        collate.repad(batch, Shape(3, 8))


def test_rows_naming_a_bucket_the_collator_lacks_is_refused():
    with pytest.raises(ShapeBucketError, match=r"rows names \[32\], which are not buckets of \[8, 16\]"):
        BucketCollator([8, 16], rows={8: 2, 16: 2, 32: 1})


def test_rows_for_a_bucket_it_lacks_shows_the_value_as_given():
    """rows_for('8') said "no entry for bucket 8" beside "it has [8, 16]": the str was shown
    as the int it is not."""
    collate = BucketCollator([8, 16], rows={8: 2, 16: 1})
    with pytest.raises(ShapeBucketError, match=r"no entry for bucket '8'; it has \[8, 16\]"):
        collate.rows_for("8")  # type: ignore[arg-type]
    # a float equal to a bucket is refused as rows={8.0: 2} is; a list was a raw TypeError
    for bucket in (8.0, [8], True):
        with pytest.raises(ShapeBucketError, match=r"no entry for bucket .*; it has \[8, 16\]"):
            collate.rows_for(bucket)


@pytest.mark.parametrize(
    "samples, needle",
    [
        ([{"input_ids": np.array([1, None], dtype=object)}], r"sample 0: 'input_ids' is"),
        (
            [{"input_ids": np.array([1])}, {"input_ids": np.array(["a", "b"])}],
            r"sample 1: 'input_ids' is a numpy array of dtype <U1",
        ),
        ([{"input_ids": [1], "y": np.array(None, dtype=object)}], r"sample 0: 'y' is"),
        ([{"input_ids": [1], "y": np.array([None], dtype=object)}], r"sample 0: 'y' is"),
    ],
)
def test_a_numpy_array_of_objects_or_strings_is_refused_naming_the_sample(samples, needle):
    """They were blamed on "non-sequence dims disagree" (sequence keys) or reached the
    caller as torch's raw TypeError (stacked keys)."""
    with pytest.raises(ShapeBucketError, match="^" + needle + r".*dtype.*np\.asarray"):
        BucketCollator([8])(samples)


def test_row_buckets_may_be_an_array():
    collate = BucketCollator.with_row_buckets([8, 16], np.array([1, 4]))
    assert collate.row_buckets == [1, 4]
    assert collate([{"input_ids": [1]}] * 3)["input_ids"].shape == (4, 8)
