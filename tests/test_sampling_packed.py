"""PackedBatchSampler and its packing (pack_epoch, pack_rows): an epoch's batches are a
function of (seed, epoch), resume at every position, check their settings, and account
honestly.
(Moved from test_packing.py, whose collator and mask tests stay there.)"""

from __future__ import annotations

import collections
import itertools
import pickle

import numpy as np
import pytest
from _helpers import build, check_resume_at_every_position
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import PackedBatchSampler, PackedCollator, ShapeBucketError, fit_packing
from shapebucket._validate import rows_per_key
from shapebucket.data import mixture_lengths
from shapebucket.fit.buckets import Buckets
from shapebucket.fit.packing import pack_epoch, pack_rows


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 30), min_size=1, max_size=80),
    st.sampled_from([[32], [16, 32], [8, 16, 32]]),
    st.integers(1, 4),
)
def test_the_collator_rebuilds_the_packed_rows(lengths, buckets, rows):
    """The sampler's order is the layout: filling rows in order never needs more rows
    than the packing has, and the row length is the packing's."""
    packed = pack_epoch(lengths, buckets, rows, seed=1, window=17)
    for t in range(len(packed)):
        idx = packed.batch(t)
        L = int(packed.row_length[t])
        row, _ = pack_rows([lengths[i] for i in idx], L)
        assert row[-1] + 1 <= rows
        assert Buckets(buckets).bucket_for(max(lengths[i] for i in idx)) == L
    r = packed.report
    assert r.real_tokens == sum(lengths)
    assert r.computed_tokens == sum(int(L) * rows for L in packed.row_length)


def test_packing_is_a_function_of_seed_and_epoch():
    lengths = mixture_lengths(3000, seed=1)
    a = PackedBatchSampler.for_tokens(lengths, [64, 128, 256], 1024, seed=3)
    b = PackedBatchSampler.for_tokens(lengths, [64, 128, 256], 1024, seed=3)
    first = list(a)
    assert first == list(b)
    a.set_epoch(1)
    assert list(a) != first
    c = PackedBatchSampler.for_tokens(lengths, [64, 128, 256], 1024, seed=4)
    assert list(c) != first
    unshuffled = [
        list(PackedBatchSampler.for_tokens(lengths, [64, 128, 256], 1024, shuffle=False, seed=s))
        for s in (3, 4)
    ]
    assert unshuffled[0] == unshuffled[1] != first  # without shuffling the seed changes nothing


def test_mixture_packs_above_97_percent_in_at_most_8_shapes():
    lengths = mixture_lengths(200_000)
    fit = fit_packing(lengths, 8, tokens_per_batch=1536, model_dim=128)
    sampler = PackedBatchSampler(lengths, fit.buckets, rows=fit.rows)
    assert sampler.packing().report.token_efficiency >= 0.97
    assert sampler.stats.num_shapes == sampler.packing().report.num_shapes <= 8
    shapes = {(fit.rows[L], L) for L in sampler.batch_buckets().tolist()}
    assert len(shapes) == sampler.stats.num_shapes


def test_resume_at_every_position():
    lengths = mixture_lengths(400, seed=2)
    check_resume_at_every_position(
        lambda: PackedBatchSampler.for_tokens(lengths, [32, 64, 256], 512, window=100),
        epoch=1,
    )


def test_state_of_another_configuration_is_refused():
    lengths = mixture_lengths(100)
    s = PackedBatchSampler.for_tokens(lengths, [64, 256], 512)
    other = PackedBatchSampler.for_tokens(lengths, [64, 256], 1024)
    with pytest.raises(ShapeBucketError, match="other lengths"):
        other.load_state_dict(s.state_dict())


def test_sampler_pickles_without_its_packed_epochs():
    s = PackedBatchSampler.for_tokens(mixture_lengths(500), [64, 256], 512)
    first = list(s)
    s.set_epoch(0)
    clone = pickle.loads(pickle.dumps(s))
    assert clone._cache == {} and list(clone) == first


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rows": None}, "rows must be an int >= 1 or a mapping"),
        ({"tokens_per_batch": 16}, "tokens_per_batch=16 is less than 32, .* longest row length 32"),
        # issue 30 (low): a key that is no row length was dropped without a word
        ({"rows": {16: 2, 32: 1, 64: 1}}, r"rows names \[64\], which are not buckets of \[16, 32\]"),
        ({"rows": {16: 2}}, r"rows has no batch size for buckets \[32\]"),
        ({"rows": 0}, "rows"),
        ({"rows": 2, "rank": 2, "num_replicas": 2}, "rank 2 is not < num_replicas 2"),
    ],
)
def test_sampler_rejects_bad_settings(kwargs, match):
    with pytest.raises(ShapeBucketError, match=match):
        build(PackedBatchSampler, [3, 5, 9], [16, 32], **kwargs)


def test_a_sample_longer_than_every_row_is_an_error_naming_it():
    with pytest.raises(ShapeBucketError, match="sample 1 has length 40 > longest row length 32"):
        PackedBatchSampler([3, 40, 9], [16, 32], rows=2)


def test_rows_are_checked_once_by_check_batch_sizes():
    assert rows_per_key(3, [8, 16]) == {8: 3, 16: 3}
    with pytest.raises(ShapeBucketError, match=r"rows names \[99\]"):
        PackedBatchSampler([3], [8], rows={8: 2, 99: 1})
    for bad, match in [(True, "rows must be an int"), ({8: 0}, r"rows\[8\] must be >= 1")]:
        with pytest.raises(ShapeBucketError, match=match):
            pack_epoch([3], [8], bad)  # type: ignore[arg-type]


def test_real_tokens_count_each_sample_once_when_ranks_get_copies():
    """Issue 22: a rank left without a row in a short step gets a copy; the copy is
    computed, not real."""
    lengths = [5, 3]
    packed = pack_epoch(lengths, [8], rows=1, num_replicas=3, shuffle=False)
    r = packed.report
    assert r.duplicated > 0
    assert r.real_tokens == sum(lengths) == 8
    assert r.computed_tokens == 3 * 8
    assert r.token_efficiency == pytest.approx(8 / 24)
    assert r.attention_efficiency == pytest.approx((25 + 9) / (3 * 64))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=30), st.integers(1, 9))
def test_pack_rows_starts_are_indices_inside_their_row(lengths, row_length):
    lengths = [min(n, row_length) for n in lengths]
    row, start = pack_rows(lengths, row_length)
    assert (np.diff(row) >= 0).all()
    assert ((start >= 0) & (start < row_length)).all()
    ends = start + np.asarray(lengths)
    assert (ends <= row_length).all()
    for r in set(row.tolist()):  # the non-empty samples of a row do not overlap
        mine = [
            (s, e) for s, e, n, rr in zip(start, ends, lengths, row, strict=True) if rr == r and n
        ]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(mine))


def test_an_empty_sample_right_after_a_full_row_collates():
    """Issue 22: it raised IndexError (its start was the row length)."""
    batch = PackedCollator([8], rows=2, label_shift="model")(
        [{"input_ids": [1] * 8, "labels": [1] * 8}, {"input_ids": [], "labels": []}]
    )
    assert batch["input_ids"].shape == (2, 8)
    assert batch["labels"][0].tolist() == [-100] + [1] * 7


def test_shapes_are_exact_with_one_window_and_a_superset_with_several():
    # [10, 3, 3] into [4, 16]: the 3s always fill the 10's row, so rows of 4 are never opened
    one = PackedBatchSampler([10, 3, 3], [4, 16], rows={4: 3, 16: 1})
    assert one.shapes() == {(1, 16)}
    several = PackedBatchSampler([10, 3, 3], [4, 16], rows={4: 3, 16: 1}, window=1)
    seen = set()
    for epoch in range(20):
        several.set_epoch(epoch)
        seen |= {(several.rows[int(L)], int(L)) for L in several.batch_buckets()}
    assert seen == several.shapes() == {(1, 16), (3, 4)}  # some epochs open a row of 4


def test_settings_read_as_attributes_and_cannot_be_assigned():
    s = PackedBatchSampler([3, 5, 9], [16, 32], rows=2, window=7)
    assert (s.window, s.shuffle, s.num_replicas, s.rank, s.rows) == (7, True, 1, 0, {16: 2, 32: 2})
    for name in ("window", "buckets", "lengths", "shuffle", "rank"):
        with pytest.raises(AttributeError, match=f"PackedBatchSampler.{name} is fixed"):
            setattr(s, name, None)


def test_each_index_once_per_epoch_on_every_rank_together():
    lengths = mixture_lengths(300, seed=5)
    per_rank = [
        PackedBatchSampler.for_tokens(lengths, [64, 256], 512, window=50, num_replicas=3, rank=r)
        for r in range(3)
    ]
    for epoch in range(2):
        seen: collections.Counter[int] = collections.Counter()
        for s in per_rank:
            s.set_epoch(epoch)
            seen.update(i for b in s for i in b)
        assert set(seen) == set(range(len(lengths)))
        assert sum(seen.values()) - len(lengths) == per_rank[0].packing(epoch).report.duplicated
        assert per_rank[0].epoch == epoch + 1  # the epoch is over: stats are the next one's
