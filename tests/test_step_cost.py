"""fit_packing with measured step times (StepCost) in place of the 1 + L/(6d) formula."""

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
