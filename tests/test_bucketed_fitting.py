"""``fit_calls``: a wrapper's shapes fitted from recorded calls, for padding and packing."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shapebucket import ShapeBucketError, fit_buckets
from shapebucket.bucketed import BucketedModel, fit_calls
from shapebucket.bucketed.fitting import CallShapes
from shapebucket.bucketed.placement import rows_used
from shapebucket.fit import Buckets

CHECKS = settings(max_examples=60, deadline=None)

#: a call: its real sample lengths (one per row); padded by the caller to its longest
calls_st = st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=20), min_size=1, max_size=12)


def as_call(real: list[int]) -> dict[str, torch.Tensor]:
    """The call a loop that pads to its longest sends: ids, mask and labels."""
    longest = max(real)
    mask = torch.arange(longest)[None, :] < torch.tensor(real)[:, None]
    ids = torch.ones(len(real), longest, dtype=torch.long).masked_fill(~mask, 0)
    return {"input_ids": ids, "attention_mask": mask.long(), "labels": ids.masked_fill(~mask, -100)}


def run_tokens(calls: list[list[int]], buckets, row_buckets) -> int:
    """Tokens the wrapper runs on the calls: each padded to (row bucket, bucket of its longest)."""
    rb = np.asarray(row_buckets)
    return sum(int(rb[np.searchsorted(rb, len(c))]) * buckets.bucket_for(max(c)) for c in calls)


@CHECKS
@given(calls=calls_st, k=st.integers(1, 4), row_k=st.integers(1, 3), align=st.sampled_from([1, 8]))
def test_every_recorded_call_fits_a_planned_shape_and_the_efficiency_is_what_runs(
    calls, k, row_k, align
):
    shapes = fit_calls([as_call(c) for c in calls], k=k, row_k=row_k, align=align)
    assert len(shapes.buckets) <= k and len(shapes.row_buckets) <= row_k
    assert shapes.buckets.max_len >= max(max(c) for c in calls)
    assert shapes.row_buckets[-1] >= max(len(c) for c in calls)
    assert all(b % align == 0 and b >= 2 for b in shapes.buckets)
    assert min(shapes.row_buckets) >= 1
    assert shapes.shapes == len(shapes.buckets) * len(shapes.row_buckets)
    real = sum(sum(c) for c in calls)
    run = run_tokens(calls, shapes.buckets, shapes.row_buckets)
    assert shapes.token_efficiency == pytest.approx(real / run)
    assert 0 < shapes.token_efficiency <= 1


@CHECKS
@given(calls=calls_st, k=st.integers(1, 4), row_k=st.integers(1, 3))
def test_fitting_the_calls_longest_never_runs_more_than_fitting_the_sample_lengths(calls, k, row_k):
    """With the same row buckets, ``k`` buckets fitted on the per-sample lengths (the
    loader's fit) run at least as many tokens on the calls as ``fit_calls``' own."""
    shapes = fit_calls([as_call(c) for c in calls], k=k, row_k=row_k)
    per_sample = fit_buckets([x for c in calls for x in c], k=k)
    ours = run_tokens(calls, shapes.buckets, shapes.row_buckets)
    theirs = run_tokens(calls, per_sample, shapes.row_buckets)
    assert ours <= theirs


@CHECKS
@given(
    calls=st.lists(st.lists(st.integers(1, 64), min_size=1, max_size=9), min_size=1, max_size=8),
    k=st.integers(1, 3),
)
def test_given_the_row_buckets_the_length_buckets_run_the_fewest_tokens(calls, k):
    """Against every set of at most ``k`` multiples of 8 that holds the longest call."""
    shapes = fit_calls([as_call(c) for c in calls], k=k, row_k=2)
    top = -(-max(max(c) for c in calls) // 8) * 8
    below = range(8, top, 8)
    best = min(
        run_tokens(calls, Buckets([*rest, top]), shapes.row_buckets)
        for n in range(k)
        for rest in itertools.combinations(below, n)
    )
    assert run_tokens(calls, shapes.buckets, shapes.row_buckets) == best


@CHECKS
@given(calls=calls_st, R=st.integers(300, 1024), row_k=st.integers(1, 3))
def test_packing_every_call_fits_its_rows_and_counts_at_least_the_token_bound(calls, R, row_k):
    shapes = fit_calls([as_call(c) for c in calls], row_k=row_k, packed_row_length=R)
    assert list(shapes.buckets) == [R] and shapes.packed_row_length == R
    assert shapes.shapes == len(shapes.row_buckets) <= row_k
    for c in calls:
        rows = rows_used(c, R)
        assert math.ceil(sum(c) / R) <= rows <= len(c)
        assert rows <= shapes.row_buckets[-1]
    assert 0 < shapes.token_efficiency <= 1


def test_best_fit_decreasing_fills_rows_exactly():
    assert rows_used([6, 2, 4, 4], 8) == 2  # 6+2, 4+4; in order (6 | 2+4 | 4) takes 3
    assert rows_used([8, 8, 1], 8) == 3
    assert rows_used([0, 0], 8) == 1  # an empty call still runs one row


def test_pairs_and_dicts_read_the_same_and_the_first_2d_tensor_stands_in_for_input_ids():
    pairs = fit_calls([(3, 40), (9, 100), (1, 7)], k=2, row_k=2)
    dicts = fit_calls(
        [{"x": torch.zeros(r, n), "scale": torch.ones(())} for r, n in [(3, 40), (9, 100), (1, 7)]],
        k=2,
        row_k=2,
    )
    assert pairs == dicts
    assert str(pairs).startswith("CallShapes: buckets ")


def test_the_wrapper_runs_the_fitted_shapes_at_the_fitted_efficiency():
    """Calls with no mask: every token is the caller's, so the wrapper's own count agrees."""
    calls = [{"input": torch.ones(r, n, dtype=torch.long)} for r, n in [(1, 5), (3, 20), (7, 33)]]
    shapes = fit_calls(calls, k=2, row_k=2)
    model = BucketedModel(
        torch.nn.Embedding(4, 2),
        shapes.buckets,
        row_buckets=list(shapes.row_buckets),
        sequence_keys=["input"],
    )
    for call in calls:
        assert model(**call).shape[:2] == call["input"].shape
    assert model.stats.token_efficiency == pytest.approx(shapes.token_efficiency)
    assert len(model.stats.shapes) <= shapes.shapes


def test_a_sample_longer_than_the_packed_row_is_refused_with_the_fix():
    with pytest.raises(
        ShapeBucketError, match=r"call 1 .* 300 real tokens > packed_row_length 256.*>= 300"
    ):
        fit_calls([(2, 10), (1, 300)], packed_row_length=256)


@pytest.mark.parametrize(
    "calls, kwargs, message",
    [
        ([], {}, "no calls"),
        ({"input_ids": torch.ones(2, 3)}, {}, "iterable of recorded calls.*pass \\[call\\]"),
        ("calls", {}, "iterable of recorded calls"),
        ([(0, 8)], {}, "call 0 rows must be >= 1, got 0"),
        ([(2, 0)], {}, "call 0 length must be >= 1, got 0"),
        ([(2, 8.0)], {}, "call 0 length must be an int"),
        ([(2, 8), "x"], {}, "call 1 is str"),
        ([{"input_ids": torch.ones(0, 8)}], {}, r"call 0: 'input_ids' has shape \(0, 8\)"),
        (
            [{"input_ids": torch.ones(8)}],
            {},
            r"call 0 has no \[rows, length, \.\.\.\] tensor .*'input_ids' a tensor of shape",
        ),
        ([{"labels": [1, 2]}], {}, r"call 0 has no \[rows, length"),
        (
            [{"input_ids": torch.ones(2, 8), "attention_mask": torch.ones(2, 7)}],
            {},
            r"'attention_mask' is a tensor of shape \(2, 7\), expected .* \(2, 8\)",
        ),
        (
            [{"input_ids": torch.ones(2, 8), "attention_mask": torch.zeros(2, 8)}],
            {},
            "marks no real token",
        ),
        ([(2, 8)], {"k": 0}, "k must be >= 1, got 0"),
        ([(2, 8)], {"row_k": 0}, "row_k must be >= 1, got 0"),
        ([(2, 8)], {"k": "3"}, "k must be an int"),
        ([(2, 8)], {"align": 0}, "align must be >= 1"),
        ([(2, 8)], {"packed_row_length": 1}, "packed_row_length must be >= 2, got 1"),
        ([(2, 8)], {"packed_row_length": 0}, "packed_row_length must be >= 2, got 0"),
    ],
)
def test_bad_input_names_the_call_the_value_and_the_fix(calls, kwargs, message):
    with pytest.raises(ShapeBucketError, match=message):
        fit_calls(calls, **kwargs)


def test_call_shapes_is_frozen():
    shapes = fit_calls([(2, 8)])
    assert isinstance(shapes, CallShapes)
    with pytest.raises(AttributeError):
        shapes.shapes = 3  # type: ignore[misc]
