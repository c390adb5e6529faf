"""Packing: the plan (PackedBatchSampler, plan_packing, fit_packing). The collator, the
document masks and exactness are in test_collate_packed.py."""

from __future__ import annotations

import pickle

import pytest
from _helpers import check_resume_at_every_position
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import (
    Buckets,
    PackedBatchSampler,
    ShapeBucketError,
    fit_packing,
    packing_report,
    rows_for_tokens,
)
from shapebucket.data import mixture_lengths
from shapebucket.plan.packing import pack_rows, plan_packing

# -- the plan ----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 30), min_size=1, max_size=80),
    st.sampled_from([[32], [16, 32], [8, 16, 32]]),
    st.integers(1, 4),
)
def test_the_collator_rebuilds_the_planned_rows(lengths, buckets, rows):
    """The sampler's order is the layout: filling rows in order never needs more rows
    than the plan has, and the row length is the plan's."""
    plan = plan_packing(lengths, buckets, rows, seed=1, window=17)
    for t in range(len(plan)):
        idx = plan.batch(t)
        L = int(plan.row_length[t])
        row, _ = pack_rows([lengths[i] for i in idx], L)
        assert row[-1] + 1 <= rows
        assert Buckets(buckets).bucket_for(max(lengths[i] for i in idx)) == L
    r = plan.report
    assert r.real_tokens == sum(lengths)
    assert r.computed_tokens == sum(int(L) * rows for L in plan.row_length)


def test_plan_is_a_function_of_seed_and_epoch():
    lengths = mixture_lengths(3000, seed=1)
    a = PackedBatchSampler(lengths, [64, 128, 256], tokens_per_batch=1024, seed=3)
    b = PackedBatchSampler(lengths, [64, 128, 256], tokens_per_batch=1024, seed=3)
    first = list(a)
    assert first == list(b)
    a.set_epoch(1)
    assert list(a) != first
    c = PackedBatchSampler(lengths, [64, 128, 256], tokens_per_batch=1024, seed=4)
    assert list(c) != first
    unshuffled = [
        list(
            PackedBatchSampler(
                lengths, [64, 128, 256], tokens_per_batch=1024, shuffle=False, seed=s
            )
        )
        for s in (3, 4)
    ]
    assert unshuffled[0] == unshuffled[1] != first  # without shuffling the seed changes nothing


def test_mixture_packs_above_97_percent_in_at_most_8_shapes():
    lengths = mixture_lengths(200_000)
    fit = fit_packing(lengths, 8, tokens_per_batch=1536, model_dim=128)
    sampler = PackedBatchSampler(lengths, fit.buckets, rows=fit.rows)
    assert sampler.stats.token_efficiency >= 0.97
    assert sampler.stats.shapes <= 8
    shapes = {(fit.rows[L], L) for L in sampler.batch_buckets().tolist()}
    assert len(shapes) == sampler.stats.shapes


def test_resume_at_every_position():
    lengths = mixture_lengths(400, seed=2)
    check_resume_at_every_position(
        lambda: PackedBatchSampler(lengths, [32, 64, 256], tokens_per_batch=512, window=100),
        epoch=1,
    )


def test_state_of_another_configuration_is_refused():
    lengths = mixture_lengths(100)
    s = PackedBatchSampler(lengths, [64, 256], tokens_per_batch=512)
    other = PackedBatchSampler(lengths, [64, 256], tokens_per_batch=1024)
    with pytest.raises(ShapeBucketError, match="other lengths"):
        other.load_state_dict(s.state_dict())


def test_sampler_pickles_without_its_plan():
    s = PackedBatchSampler(mixture_lengths(500), [64, 256], tokens_per_batch=512)
    first = list(s)
    s.set_epoch(0)
    clone = pickle.loads(pickle.dumps(s))
    assert clone._cache is None and list(clone) == first


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rows": 2, "tokens_per_batch": 64}, "exactly one of rows and tokens_per_batch"),
        ({}, "exactly one of rows and tokens_per_batch"),
        ({"tokens_per_batch": 16}, "tokens_per_batch=16 is less than the longest row length 32"),
        ({"rows": {16: 2}}, r"rows has no entry for row length\(s\) \[32\]"),
        ({"rows": 0}, "rows"),
        ({"rows": 2, "rank": 2, "num_replicas": 2}, "rank 2 is not < num_replicas 2"),
    ],
)
def test_sampler_rejects_bad_settings(kwargs, match):
    with pytest.raises(ShapeBucketError, match=match):
        PackedBatchSampler([3, 5, 9], [16, 32], **kwargs)


def test_a_sample_longer_than_every_row_is_an_error_naming_it():
    with pytest.raises(ShapeBucketError, match="sample 1 has length 40 > longest row length 32"):
        PackedBatchSampler([3, 40, 9], [16, 32], rows=2)


def test_fit_packing_reports_every_candidate():
    lengths = mixture_lengths(20_000)
    fit = fit_packing(lengths, 4, tokens_per_batch=1024)
    assert [list(rl) for rl, _ in fit.candidates] == [
        [256],
        [128, 256],
        [64, 128, 256],
        [32, 64, 128, 256],
    ]
    assert "<- chosen" in fit.table()
    best = max(rep.token_efficiency for _, rep in fit.candidates)
    assert fit.report.token_efficiency >= best - 0.01
    assert fit.rows == rows_for_tokens(fit.buckets, 1024)
    with pytest.raises(ShapeBucketError, match="max_len=100 is shorter than the longest sample"):
        fit_packing(lengths, 4, tokens_per_batch=1024, max_len=100)


def test_packing_report_counts_attention():
    report = packing_report([4, 4, 8], [8], rows=1)
    # rows: [8], [4, 4]: real attention 16 + 16 + 64 of 2 * 64
    assert report.attention_efficiency == pytest.approx(96 / 128)
    assert report.token_efficiency == 1.0
