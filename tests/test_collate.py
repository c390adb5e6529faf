import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from shapebucket import BucketCollator, Buckets, ShapeBucketError

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
def test_every_real_token_kept_in_place_and_mask_exact(batch, side, batch_sizes):
    samples, lens, dtypes, container = batch
    pads = {"k0": 7, "k1": -3, "k2": 1}
    collate = BucketCollator(BUCKETS, padding_side=side, pad_values=pads, batch_sizes=batch_sizes)
    out = collate(samples)
    bucket = BUCKETS.bucket_for(max(lens))
    rows = batch_sizes or len(samples)
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
    if batch_sizes:
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
    c = BucketCollator(BUCKETS, batch_sizes={4: 3, 8: 2, 16: 2, 32: 1})
    assert c([[1, 2, 3]])[0].shape == (3, 4)
    assert c([[1] * 5])[0].shape == (2, 8)
    assert "Buckets([4, 8, 16, 32])" in repr(c) and "batch_sizes" in repr(c)
    c([[1, 2]])
    no_rows = BucketCollator(BUCKETS, batch_sizes=4, sample_mask_key=None)([{"input_ids": [1, 2]}])
    assert set(no_rows) == {"input_ids", "attention_mask"} and no_rows["input_ids"].shape == (4, 4)
    clone = pickle.loads(pickle.dumps(c))
    assert clone.stats.batches == 0 and c.stats.batches == 3
    assert clone.buckets == c.buckets and clone.batch_sizes == c.batch_sizes


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"padding_side": "middle"}, "'middle'"),
        ({"overflow": "drop"}, "'drop'"),
        ({"batch_sizes": 0}, "got 0"),
        ({"batch_sizes": {4: 2}}, r"buckets \[8, 16, 32\]"),
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
            {"batch_sizes": 1},
            "batch of 2 samples is larger than batch_sizes=1",
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
    collate = BucketCollator(Buckets([8, 16, 24]), batch_sizes=8 if with_rows else None, **settings)
    batch = collate(samples)
    reference = BucketCollator(
        Buckets([target]),
        overflow="truncate",
        batch_sizes=rows if (with_rows or rows > n) else None,
        **settings,
    )
    kept = samples[: min(rows, n)]
    want = reference(kept)
    got = collate.repad(batch, target, rows)
    if rows > n and not with_rows:
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
    big = collate.repad(batch, 16, rows=3)
    assert big["input_ids"].shape == (3, 16) and big["feat"].shape == (3, 4)
    assert big["name"] == ["a", "b", None] and not big["attention_mask"][2].any()
    with pytest.raises(ShapeBucketError, match="no sequence tensor"):
        collate.repad({"x": torch.ones(3)}, 8)
    with pytest.raises(ShapeBucketError, match="rows must be >= 1"):
        collate.repad(batch, 8, rows=0)
    with pytest.raises(ShapeBucketError, match="bucket must be >= 1"):
        collate.repad(batch, 0)
    with pytest.raises(ShapeBucketError, match="sample 1: 'feat' is not a sequence key"):
        collate([samples[0], {"input_ids": [4], "feat": torch.zeros(5), "name": "b"}])
