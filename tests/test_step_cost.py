"""fit_packing with measured step times (StepCost) in place of the 1 + L/(6d) formula."""

import itertools

import numpy as np
import pytest

from shapebucket import ShapeBucketError, fit_packing
from shapebucket.fit.step_cost import StepCost

rng = np.random.default_rng(0)
LENGTHS = np.concatenate([rng.integers(4, 40, 3000), rng.integers(200, 256, 150)])


def test_the_formula_as_measurements_gives_the_formulas_choice():
    d = 64
    formula = fit_packing(LENGTHS, k=4, tokens_per_batch=2048, model_dim=d)
    cost = StepCost({L: 1 + L / (6 * d) for L in range(8, 257, 8)}, source="the formula, tabled")
    measured = fit_packing(LENGTHS, k=4, tokens_per_batch=2048, model_dim=cost)
    assert list(measured.buckets) == list(formula.buckets)
    assert formula.cost_model == "formula 1 + L/(6*64)"
    assert measured.cost_model == "the formula, tabled"
    assert "cost/token" in measured.table()


def test_measured_costs_steer_the_row_lengths():
    flat = StepCost({8: 1e-6, 256: 1e-6})  # attention free: a token costs the same anywhere
    steep = StepCost({8: 1e-6, 256: 40e-6})  # long rows 40x dearer per token
    a = fit_packing(LENGTHS, k=4, tokens_per_batch=2048, model_dim=flat)
    b = fit_packing(LENGTHS, k=4, tokens_per_batch=2048, model_dim=steep)
    assert a.cost_model == b.cost_model == "measured step times"
    # dear long rows: more row lengths, and more of the tokens in the short ones
    share = lambda fit: sum(  # noqa: E731
        n * fit.rows[L] * L for L, n in fit.report.batches_per_bucket.items() if L < 256
    )
    assert len(b.buckets) >= len(a.buckets) and share(b) > share(a)


def test_without_model_dim_the_report_says_token_efficiency():
    assert fit_packing(LENGTHS, k=2, tokens_per_batch=2048).cost_model == "token efficiency"


def test_from_steps_and_interpolation():
    cost = StepCost.from_steps({(32, 64): 0.004, (16, 64): 0.001, (8, 256): 0.006})
    assert cost.seconds_per_token == {64: 0.001 / (16 * 64), 256: 0.006 / (8 * 256)}
    mid = cost.per_token(160)
    assert cost.per_token(64) < mid < cost.per_token(256) and cost.per_token(
        1000
    ) == cost.per_token(256)


@pytest.mark.parametrize(
    "bad, match",
    [
        ({}, "at least one length"),
        ({64: 0.0}, "positive, finite"),
        ({0: 1.0}, "length must be >= 1"),
        ({64: float("nan")}, "positive, finite"),
        ({64: True}, "positive, finite"),
    ],
)
def test_bad_step_costs_are_refused(bad, match):
    with pytest.raises(ShapeBucketError, match=match):
        StepCost(bad)


def test_numpy_seconds_are_numbers():
    """Probe 2: ``np.float32`` (a median of float32 timings) was refused as not "positive,
    finite", and ``np.int64`` too, while a Python int passed."""
    assert StepCost({64: np.float32(2e-6), 128: np.int64(1)}).seconds_per_token[128] == 1.0


@pytest.mark.parametrize(
    "steps, match",
    [
        ([((4, 64), 1.0)], "from_steps needs"),  # not a mapping: was AttributeError
        (None, "from_steps needs"),
        ({64: 1.0}, r"key 64 .* \(rows, length\)"),  # was TypeError
        ({(4,): 1.0}, r"\(rows, length\)"),  # was ValueError
        ({(4, 64, 32): 1.0}, r"\(rows, length\)"),  # a cell shape: silently used 64 alone
        ({(4, 0): 1.0}, "length must be >= 1"),  # was named rows
        ({(4, 64): "1"}, "seconds"),  # a string: silently float()ed
        ({(4, 64): True}, "seconds"),  # a bool: silently 1 s
        ({(2**600, 2**600): 1.0}, "rows must be <="),  # was OverflowError
    ],
)
def test_bad_steps_are_refused_by_name(steps, match):
    with pytest.raises(ShapeBucketError, match=match):
        StepCost.from_steps(steps)


def test_lengths_source_and_spread_are_checked():
    with pytest.raises(ShapeBucketError, match="length must be <="):
        StepCost({2**70: 1e-6})
    with pytest.raises(ShapeBucketError, match="source must be a str"):
        StepCost({64: 1e-6}, source=3)  # type: ignore[arg-type]
    # was refused later by the bucket solver, as "cost(8) must be a finite number"
    with pytest.raises(ShapeBucketError, match="span more than a float"):
        StepCost({1: 1e-300, 2**30: 1e300})


def test_a_step_cost_hashes_and_pickles():
    import pickle

    cost = StepCost({64: 2e-6, 256: 3e-6})
    assert hash(cost) == hash(StepCost({256: 3e-6, 64: 2e-6}))  # was TypeError (a dict field)
    assert pickle.loads(pickle.dumps(cost)) == cost


def test_a_row_never_costs_less_than_a_shorter_one():
    """Probe 2: step times dominated by a fixed overhead (32 x 64 in 10 ms, 32 x 512 in
    12 ms) make the per-token cost fall steeply, and its linear interpolation made a row of
    296 dearer than one of 304: the bucket solver then failed with "cost must not
    decrease with length", naming a ``cost`` the caller never passed."""
    cost = StepCost.from_steps({(32, 64): 0.010, (32, 512): 0.012})
    rows = [cost.row(L) for L in range(1, 700)]
    assert all(a <= b for a, b in itertools.pairwise(rows))
    assert cost.row(64) == 64 and cost.row(512) == pytest.approx(512 * 0.012 / 0.010 / 8)
    assert cost.row(288) == pytest.approx(64 + (76.8 - 64) / 2)  # a row's seconds linear
    lengths = list(range(20, 500, 7)) * 4  # the bucket solver takes the cost as it is
    assert fit_packing(lengths, k=3, tokens_per_batch=2048, model_dim=cost).model_dim == cost
    with pytest.raises(ShapeBucketError, match="a row of 16 is measured cheaper than a row of 8"):
        StepCost({8: 4e-6, 16: 1e-6})


def test_from_steps_takes_the_plans_shapes():
    from shapebucket.plan import Shape

    assert StepCost.from_steps({Shape(4, 64): 0.001}).seconds_per_token == {64: 0.001 / 256}


@pytest.mark.parametrize("length", [float("nan"), float("inf"), -1, "64"])
def test_a_length_that_is_not_a_finite_number_is_refused(length):
    """``per_token(nan)`` used to pass the check (``nan < 0`` is false) and interpolate
    garbage; every length goes through the one number check now."""
    with pytest.raises(ShapeBucketError, match=r"length must be a .*number >= 0"):
        StepCost({64: 2e-6, 256: 3e-6}).per_token(length)
