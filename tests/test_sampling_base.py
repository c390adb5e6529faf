"""The shared base of both samplers: read-only settings, the checks they share, state keys,
and ``shapes()``: every (rows, bucket) a rank's batches have, exact over epochs."""

from __future__ import annotations

import json
import pickle
import re

import numpy as np
import pytest
from _helpers import build
from hypothesis import given, settings
from hypothesis import strategies as st

import shapebucket.sampling as sampling
from shapebucket import ShapeBucketError
from shapebucket.fit.buckets import Buckets
from shapebucket.plan.shapes import Shape
from shapebucket.sampling import (
    BucketBatchSampler,
    CellBatchSampler,
    PackedBatchSampler,
    ResumableBatchSampler,
)
from shapebucket.sampling.common import resolve_world
from shapebucket.sampling.state import (
    EPOCH_KEY,
    FINGERPRINT_KEY,
    NUM_BATCHES_KEY,
    POSITION_KEY,
    SEED_KEY,
)

BUCKETS = Buckets([4, 8, 16, 32])


def test_subpackage_exports():
    assert sampling.__all__ == sorted(sampling.__all__)
    assert set(sampling.__all__) == {
        "BucketBatchSampler",
        "CellBatchSampler",
        "PackedBatchSampler",
        "ResumableBatchSampler",
    }
    assert issubclass(BucketBatchSampler, ResumableBatchSampler)
    assert issubclass(PackedBatchSampler, ResumableBatchSampler)
    assert issubclass(CellBatchSampler, ResumableBatchSampler)


@pytest.mark.parametrize(
    "make",
    [
        lambda: BucketBatchSampler([3, 5, 9], BUCKETS, rows=2, seed=4),
        lambda: PackedBatchSampler([3, 5, 9], [16, 32], rows=2, seed=4),
    ],
)
def test_state_keys_are_the_module_constants(make):
    s = make()
    state = s.state_dict()
    assert list(state) == [EPOCH_KEY, POSITION_KEY, SEED_KEY, NUM_BATCHES_KEY, FINGERPRINT_KEY]
    assert state[SEED_KEY] == s.seed == 4 and state[NUM_BATCHES_KEY] == len(s)
    for key in (EPOCH_KEY, POSITION_KEY, SEED_KEY, FINGERPRINT_KEY):
        with pytest.raises(ShapeBucketError, match=f"state has no '{key}'"):
            s.load_state_dict({k: v for k, v in state.items() if k != key})
    with pytest.raises(ShapeBucketError, match="state must be the dict"):
        s.load_state_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ShapeBucketError, match=r"state\['position'\] must be <= "):
        s.load_state_dict({**state, POSITION_KEY: len(s) + 1})


def test_the_two_samplers_never_accept_each_others_state():
    bucket = BucketBatchSampler([3, 5, 9], [16, 32], rows=2)
    packed = PackedBatchSampler([3, 5, 9], [16, 32], rows=2)
    with pytest.raises(ShapeBucketError, match="other lengths"):
        packed.load_state_dict(bucket.state_dict())


def test_resolve_world():
    assert resolve_world(None, None) == (1, 0)
    assert resolve_world(3, 2) == (3, 2)
    with pytest.raises(ShapeBucketError, match="rank 3 is not < num_replicas 3"):
        resolve_world(3, 3)
    with pytest.raises(ShapeBucketError, match="num_replicas must be >= 1"):
        resolve_world(0, 0)


def test_settings_have_docs_and_name_the_fix():
    assert "world size" in (BucketBatchSampler.num_replicas.__doc__ or "")
    s = BucketBatchSampler([3, 5, 9], BUCKETS, rows=2)
    with pytest.raises(AttributeError, match=r"epoch is fixed .*call set_epoch\(\)"):
        s.epoch = 3  # type: ignore[misc]
    with pytest.raises(
        AttributeError, match=r"make a new BucketBatchSampler\(\.\.\., leftovers=\.\.\.\)"
    ):
        s.leftovers = "promote"  # type: ignore[misc]
    s.note = "free"  # other attributes are the user's
    assert s.note == "free"


# -- shapes() ------------------------------------------------------------------------------------


@st.composite
def bucket_configs(draw):
    lengths = np.array(draw(st.lists(st.integers(1, 32), min_size=1, max_size=90)))
    kwargs = dict(
        shuffle=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        drop_last=draw(st.booleans()),
        leftovers=draw(st.sampled_from(["keep", "promote"])),
    )
    if draw(st.booleans()):
        kwargs["tokens_per_batch"] = draw(st.integers(32, 200))
    else:
        kwargs["rows"] = draw(st.integers(1, 9))
    return lengths, kwargs


def seen_shapes(sampler, lengths, table, epochs, rows=None):
    """(rows, bucket) of every batch of ``epochs``: the sample count (or the sampler's rows
    for packed batches) and the smallest bucket that holds the batch's longest sample."""
    seen = set()
    for epoch in epochs:
        sampler.set_epoch(epoch)
        for batch in sampler:
            bucket = table.bucket_for(int(lengths[batch].max()))
            seen.add((len(batch) if rows is None else rows[bucket], bucket))
    return seen


@settings(max_examples=60, deadline=None)
@given(bucket_configs(), st.integers(1, 3))
def test_bucket_shapes_equal_what_every_rank_sees_over_epochs(cfg, replicas):
    lengths, kwargs = cfg
    for rank in range(replicas):
        s = build(BucketBatchSampler, lengths, BUCKETS, num_replicas=replicas, rank=rank, **kwargs)
        seen = seen_shapes(s, lengths, BUCKETS, range(3))
        assert s.shapes() == seen, (rank, replicas)
        if kwargs["leftovers"] == "keep":  # then the steps' buckets are the collated ones
            s.set_epoch(1)
            keyed = {(len(b), int(k)) for b, k in zip(s, s.batch_buckets(1), strict=True)}
            assert keyed == seen


@st.composite
def packed_configs(draw):
    buckets = sorted(draw(st.sets(st.integers(2, 40), min_size=1, max_size=3)))
    lengths = np.array(draw(st.lists(st.integers(1, buckets[-1]), min_size=1, max_size=60)))
    rows = {L: draw(st.integers(1, 4)) for L in buckets}
    by_tokens = draw(st.booleans())
    sizes = (
        {"tokens_per_batch": draw(st.integers(buckets[-1], 4 * buckets[-1]))}
        if by_tokens
        else {"rows": rows}
    )
    window = draw(st.sampled_from([len(lengths), 10**6, 1, 7]))
    return buckets, lengths, sizes, window, draw(st.booleans())


@settings(max_examples=60, deadline=None)
@given(packed_configs(), st.integers(1, 3))
def test_packed_shapes_cover_every_epoch_and_equal_them_with_one_window(cfg, replicas):
    buckets, lengths, sizes, window, shuffle = cfg
    table = Buckets(buckets)
    for rank in range(replicas):
        s = build(
            PackedBatchSampler, lengths, buckets, window=window, shuffle=shuffle,
            num_replicas=replicas, rank=rank, **sizes,
        )  # fmt: skip
        seen = seen_shapes(s, lengths, table, range(4), rows=s.rows)
        shapes = s.shapes()
        assert seen <= shapes
        assert all(s.rows[L] == n for n, L in shapes)
        longest = table.bucket_for(int(lengths.max()))
        assert (s.rows[longest], longest) in shapes
        if window >= len(lengths):
            assert shapes == seen
        else:  # every row length some sample needs as its smallest fit
            assert {L for _, L in shapes} == set(table.bucket_for_many(lengths).tolist())


@pytest.mark.parametrize(
    "make",
    [
        lambda lengths: BucketBatchSampler(lengths, BUCKETS, rows=2),
        lambda lengths: PackedBatchSampler(lengths, [16, 32], rows=2),
    ],
)
def test_a_bool_among_the_lengths_is_refused_naming_it(make):
    """Issue 22: ``True`` in a list of lengths was read as a length of 1."""
    for lengths, i, value in [([3, True, 4], 1, "True"), ((3, 4, np.False_), 2, "np.False_")]:
        with pytest.raises(ShapeBucketError, match=f"sample {i} has length {value}, a bool"):
            make(lengths)


@pytest.mark.parametrize(
    "make",
    [
        lambda: BucketBatchSampler(np.arange(1, 21), BUCKETS, rows=2, seed=1),
        lambda: PackedBatchSampler(np.arange(1, 21), [16, 32], rows=2, seed=1),
    ],
)
def test_passes_and_epochs(make):
    s = make()
    with pytest.raises(ShapeBucketError, match="epoch must be >= 0, got -1"):
        s.batch_buckets(-1)  # issue 22: a raw error before
    epochs = []
    for epoch in range(3):
        ref = make()
        ref.set_epoch(epoch)
        epochs.append(list(ref))
    # iter() begins a pass: the state describes it before its first batch
    assert list(s) == epochs[0]
    it = iter(s)
    assert (s.state_dict()["epoch"], s.state_dict()["position"]) == (1, 0)
    # a newer pass owns the state: the superseded one still yields, but moves nothing
    first = next(it)
    newer = iter(s)
    assert next(newer) == first == epochs[1][0]
    rest_of_old = list(it)
    assert s.state_dict()["position"] == 1 and rest_of_old == epochs[1][1:]
    assert list(newer) == epochs[1][1:]
    assert list(s) == epochs[2]


@pytest.mark.parametrize(
    "make",
    [
        lambda: BucketBatchSampler([3, 5, 9, 12, 4, 30], BUCKETS, rows=2, seed=4),
        lambda: BucketBatchSampler.for_tokens([3, 5, 9, 12, 4, 30], BUCKETS, 64, seed=4),
        lambda: CellBatchSampler([3, 5, 9, 12], [4, 2, 9, 3], [(8, 4), (16, 16)], rows=1),
        lambda: PackedBatchSampler([3, 5, 9, 12, 4, 30], [16, 32], rows=1, seed=4, window=3),
    ],
)
def test_every_sampler_pickles_with_its_state_and_keeps_the_shape_protocol(make):
    s = make()
    it = iter(s)
    head = next(it)
    clone = pickle.loads(pickle.dumps(s))
    assert clone.state_dict() == s.state_dict()
    assert clone.shapes() == s.shapes() and all(isinstance(x, Shape) for x in s.shapes())
    assert type(s).packs is isinstance(s, PackedBatchSampler)
    rest = list(it)
    # the copy has no iterator: its pass is an abandoned one, restarting where it started
    assert list(clone) == [head, *rest]
    fresh = make()
    fresh.load_state_dict(pickle.loads(pickle.dumps(s)).state_dict())
    assert list(fresh) == list(s)  # both the next epoch


@pytest.mark.parametrize("fingerprint", [np.array(["a", "b"]), [1, 2], None, "58c25c79", "x" * 40])
def test_a_corrupt_fingerprint_is_refused_as_damaged(fingerprint):
    s = BucketBatchSampler([3, 5, 9], BUCKETS, rows=2)
    with pytest.raises(ShapeBucketError, match=r"state\['fingerprint'\] is .*state is damaged"):
        s.check_state({**s.state_dict(), FINGERPRINT_KEY: fingerprint})
    other = BucketBatchSampler([3, 5, 9, 9], BUCKETS, rows=2).state_dict()
    with pytest.raises(ShapeBucketError, match="saved by a sampler with other lengths"):
        s.check_state(other)  # a whole fingerprint of another sampler: not damage


@pytest.mark.parametrize(
    "make",
    [
        lambda: BucketBatchSampler([3, 5, 9], BUCKETS, rows=2, seed=4),
        lambda: PackedBatchSampler([3, 5, 9], [16, 32], rows=2, seed=4),
        lambda: CellBatchSampler([3, 5], [4, 9], [(8, 8), (8, 16)], rows=2, seed=4),
    ],
)
@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        (EPOCH_KEY, "0", "'0' (str)"),  # a JSON round trip through the wrong type
        (EPOCH_KEY, 0.0, "0.0 (float)"),
        (SEED_KEY, None, "None (NoneType)"),
        (SEED_KEY, -4, "got -4"),
        (POSITION_KEY, [1], "[1] (list)"),
        (POSITION_KEY, 10**6, "got 1000000"),
    ],
)
def test_a_damaged_state_names_the_key_the_value_and_the_fix(make, key, value, shown):
    """Every corrupted field is a ShapeBucketError saying which key, what it holds and what
    to do, for every sampler (they share the base's check)."""
    s = make()
    state = s.state_dict()
    with pytest.raises(ShapeBucketError, match=rf"state\['{key}'\].*{re.escape(shown)}.*damaged"):
        s.load_state_dict({**state, key: value})
    with pytest.raises(ShapeBucketError, match=r"state has no 'seed' \(its keys: .*damaged"):
        s.load_state_dict({k: v for k, v in state.items() if k != SEED_KEY})
    with pytest.raises(ShapeBucketError, match=r"got str '\{\"epoch.*damaged"):
        s.load_state_dict(json.dumps(state)[:30])  # type: ignore[arg-type]
    assert s.state_dict() == state  # nothing was loaded


@pytest.mark.parametrize(
    "make",
    [
        lambda: BucketBatchSampler.for_tokens([3, 9], [8, 16], 64, rows=2),
        lambda: PackedBatchSampler.for_tokens([3, 9], [8, 16], 64, rows=2),
        lambda: CellBatchSampler.for_tokens([3], [1], [(8, 4)], 96, rows=1),
    ],
)
def test_for_tokens_refuses_the_rows_it_computes(make):
    with pytest.raises(ShapeBucketError, match=r"for_tokens computes rows from tokens_per_batch"):
        make()
