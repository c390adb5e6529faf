import itertools
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shapebucket.advise.kchoice import choose_k
from shapebucket.advise.policies import compare_policies
from shapebucket.data import mixture_lengths
from shapebucket.errors import ShapeBucketError
from shapebucket.fit.buckets import Buckets
from shapebucket.fit.optimal import fit_buckets
from shapebucket.fit.packing_fit import PackingTrial, fit_packing, packing_report
from shapebucket.fit.padding import efficiency, padding_report

COSTS = {
    "tokens": lambda b: float(b),
    "attention": lambda b: float(b) ** 2,
    "callable": lambda b: 3.0 * b + 100.0,
}


def objective(lengths, boundaries, sampler, batch_size, cost):
    """Reference objective, written independently of fit.py."""
    lengths = np.asarray(lengths)
    bs = sorted(boundaries)
    if sampler == "bucketed":
        return sum(cost(min(b for b in bs if b >= x)) for x in lengths)
    total, prev_f = 0.0, 0.0
    for b in bs:
        f = float(np.mean(lengths <= b))
        total += cost(b) * (f**batch_size - prev_f**batch_size)
        prev_f = f
    return total


def brute_force(lengths, k, align, sampler, batch_size, cost, max_len=None):
    top = -(-max(max(lengths), max_len or 0, 2) // align) * align
    first = -(-2 // align) * align
    grid = list(range(first, top, align))
    best = None
    for size in range(0, k):
        for combo in itertools.combinations(grid, size):
            value = objective(lengths, [*combo, top], sampler, batch_size, cost)
            best = value if best is None else min(best, value)
    return best


@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    k=st.integers(1, 4),
    align=st.sampled_from([1, 2, 4, 8]),
    sampler=st.sampled_from(["bucketed", "random"]),
    batch_size=st.integers(1, 5),
    cost_name=st.sampled_from(sorted(COSTS)),
)
def test_fit_reaches_brute_force_optimum(lengths, k, align, sampler, batch_size, cost_name):
    cost = COSTS[cost_name]
    arg = cost_name if cost_name != "callable" else cost
    got = fit_buckets(lengths, k, align=align, batching=sampler, batch_size=batch_size, cost=arg)
    assert len(got) <= k
    assert all(b % align == 0 and b >= 2 for b in got)
    assert got.max_len >= max(lengths) and got.max_len - max(max(lengths), 2) < align
    want = brute_force(lengths, k, align, sampler, batch_size, cost)
    assert objective(lengths, list(got), sampler, batch_size, cost) == pytest.approx(
        want, rel=1e-9, abs=1e-9
    )


@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=20),
    k=st.integers(1, 3),
    max_len=st.integers(30, 45),
)
def test_max_len_sets_the_top_bucket(lengths, k, max_len):
    got = fit_buckets(lengths, k, align=4, max_len=max_len)
    assert got.max_len == -(-max_len // 4) * 4
    want = brute_force(lengths, k, 4, "bucketed", 1, COSTS["tokens"], max_len=max_len)
    assert objective(lengths, list(got), "bucketed", 1, COSTS["tokens"]) == pytest.approx(want)


def test_mixture_efficiency_and_sampler_choice_matters():
    lengths = mixture_lengths(200_000, seed=0)
    bucketed = fit_buckets(lengths, 8, align=8, batching="bucketed")
    assert len(bucketed) == 8
    r = padding_report(lengths, bucketed, batch_size=64, batching="bucketed")
    assert r.token_efficiency >= 0.85
    random_fit = fit_buckets(lengths, 8, align=8, batching="random", batch_size=64)
    under_random = padding_report(
        lengths, random_fit, batch_size=64, batching="random"
    ).token_efficiency
    assert (
        padding_report(lengths, bucketed, batch_size=64, batching="random").token_efficiency
        < under_random
    )
    assert (
        padding_report(lengths, random_fit, batch_size=64, batching="bucketed").token_efficiency
        < r.token_efficiency
    )


def test_padding_report_numbers_and_dict():
    r = padding_report([4, 8, 12, 16], Buckets([8, 16]))
    assert r.token_efficiency == pytest.approx(40 / 48)
    assert r.attention_efficiency == pytest.approx((16 + 64 + 144 + 256) / (64 + 64 + 256 + 256))
    assert r.share == {8: 0.5, 16: 0.5} and r.num_shapes == 2 and r.expected_padded_length == 12
    rr = padding_report([4, 8, 12, 16], Buckets([8, 16, 32]), batch_size=2, batching="random")
    # P(max <= 8) = (1/2)^2, so a quarter of batches use bucket 8
    assert rr.share == {8: 0.25, 16: 0.75} and rr.num_shapes == 2
    assert rr.expected_padded_length == pytest.approx(0.25 * 8 + 0.75 * 16)
    json.dumps(r.to_dict())
    assert "token efficiency" in str(r) and "share of samples" in str(r)


def test_compare_policies_table():
    table = compare_policies(mixture_lengths(20_000), k=8, align=8, batch_size=64)
    names = [n for n, _ in table.policies]
    assert names == [
        "multiples of 8",
        "multiples of 32",
        "powers of two",
        "quantiles (k=8)",
        "fitted (k=8)",
    ]
    fitted_eff = table.policies[-1][1].token_efficiency
    assert all(fitted_eff >= r.token_efficiency for _, r in table.policies[1:])
    assert "over recompile limit" in str(table)  # 32 multiples of 8
    json.dumps(table.to_dict())


def test_the_tables_read_the_compilers_recompile_limit_live():
    """The limit was a constant 8 beside the one ``prewarm`` reads: a raised limit still
    marked 10 buckets as over it."""
    from shapebucket import _torch as compat

    lengths = list(range(8, 8 * 11, 8)) * 50  # 10 distinct lengths: 10 fitted buckets
    table = compare_policies(lengths, k=10, align=8)
    job = choose_k(lengths, compile_seconds=1e-9, job_samples=10**9, tokens_per_second=1e6)
    assert job.chosen.k == 10
    assert "over recompile limit" in str(table) and "above the recompile limit (8)" in str(job)
    with compat.raised_recompile_limit(12):
        assert "over recompile limit" not in str(table) and table.to_dict()["limit"] == 12
        assert "above the recompile limit" not in str(job)
    assert compare_policies(lengths, k=10, align=8, limit=20).to_dict()["limit"] == 20


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"lengths": []}, "empty"),
        ({"lengths": [3, -1]}, "sample 1 has length -1"),
        ({"lengths": [3.5]}, "index 0 is 3.5"),
        ({"lengths": [3], "k": 0}, "k must be >= 1, got 0"),
        ({"lengths": [3], "align": 0}, "align must be >= 1, got 0"),
        ({"lengths": [3, 50], "max_len": 40}, "sample 1 has length 50 > max_len 40"),
        ({"lengths": [3], "batching": "sorted"}, "'sorted'"),
        ({"lengths": [3], "batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"lengths": [3], "cost": "flops"}, "'flops'"),
        ({"lengths": [3, 9], "cost": lambda b: -b}, "must be a finite number >= 0"),
        ({"lengths": [3, 9], "cost": lambda b: 100 - b}, "must not decrease"),
    ],
)
def test_bad_input(kwargs, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        fit_buckets(**kwargs)


# -- every fitting parameter refuses a bad value with the one error type (issue 22) -------

LENGTHS = [3, 5, 9, 30, 31, 12]
HUGE = 10**30  # used to overflow numpy (OverflowError) or hang (Buckets.multiples)


def _packing(**kw):
    return fit_packing(LENGTHS, **{"tokens_per_batch": 64, **kw})


def _auto(**kw):
    job = {"compile_seconds": 1.0, "job_samples": 10, "tokens_per_second": 1e4}
    return choose_k(LENGTHS, **{**job, **kw})


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: _packing(tolerance="0.1"), r"tolerance must be a number in \[0, 1\), got '0.1'"),
        (lambda: _packing(tolerance=None), "tolerance must be a number"),
        (lambda: _packing(tolerance=True), "tolerance must be a number"),
        (lambda: _packing(tolerance=float("nan")), r"tolerance must be a finite number in \[0, 1\)"),
        (lambda: _packing(tolerance=1.0), r"tolerance must be a finite number in \[0, 1\)"),
        (lambda: _packing(trial=PackingTrial(seed=-1)), "seed must be >= 0, got -1"),
        (lambda: _packing(trial=PackingTrial(seed="0")), "seed must be an int"),
        (lambda: _packing(trial=PackingTrial(max_samples=0)), "max_samples must be >= 1, got 0"),
        (lambda: _packing(trial=PackingTrial(max_samples=2.5)), "max_samples must be an int"),
        # issue 30 (low): window=0 gave a raw ValueError, window=1.5 a raw TypeError
        (lambda: _packing(trial=PackingTrial(window=0)), "window must be >= 1, got 0"),
        (lambda: _packing(trial=PackingTrial(window=1.5)), "window must be an int"),
        (lambda: _packing(trial={"window": 8}), "trial must be a PackingTrial"),
        (lambda: _packing(align=HUGE), "align must be <= 2147483648"),
        (lambda: _packing(tokens_per_batch=HUGE), "tokens_per_batch must be <= 1099511627776"),
        (lambda: _packing(model_dim=0), "model_dim must be >= 1"),
        (lambda: _packing(model_dim="64"), r"model_dim must be an int \(the .* or a StepCost"),
        (lambda: _packing(max_len=HUGE), "max_len must be <= 2147483648"),
        (lambda: packing_report(LENGTHS, [32], rows=2, seed=-1), "seed must be >= 0"),
        (lambda: fit_buckets(LENGTHS, 2, align=HUGE), "align must be <= 2147483648"),
        (lambda: fit_buckets(LENGTHS, 2, max_len=HUGE), "max_len must be <= 2147483648"),
        (lambda: fit_buckets(LENGTHS, 2, cost=lambda b: "x"), r"cost\(8\) must be a number >= 0"),
        (lambda: fit_buckets(LENGTHS, 2, cost=lambda b: -1.0), r"cost\(8\) must be a finite"),
        (lambda: fit_buckets(LENGTHS, "auto"), "to choose k from the job use"),
        (lambda: fit_buckets(LENGTHS, 2, batching=["bucketed"]), "batching must be"),
        (lambda: compare_policies(LENGTHS, 2, align=HUGE), "align must be <= 2147483648"),
        (lambda: _auto(align=HUGE), "align must be <= 2147483648"),
        (lambda: _auto(max_k=0), "max_k must be >= 1"),
        (lambda: _auto(batching="sorted"), "batching must be"),
        (lambda: Buckets.multiples(8, max_len=HUGE), "max_len must be <= 2147483648"),
        (lambda: Buckets.multiples(1, max_len=2**31), "would make 2,147,483,647 buckets"),
    ],
)
def test_bad_fitting_arguments_raise_shapebucketerror(call, needle):
    with pytest.raises(ShapeBucketError, match=needle):
        call()


def test_more_quantiles_than_lengths_are_not_allocated():
    table = compare_policies(LENGTHS, HUGE)  # k above the lengths' count: one per length
    assert table.policies[3][1].buckets == Buckets([8, 16, 32])


def test_planning_records_share_field_names():
    lengths = [5, 9, 12, 30] * 20
    padding = padding_report(lengths, [16, 32])
    packing = fit_packing(lengths, 2, tokens_per_batch=64)
    choice = choose_k(lengths, compile_seconds=1.0, job_samples=10**4, tokens_per_second=1e4)
    table = compare_policies(lengths, 2)
    for record in (padding, packing, choice, table):
        assert record.num_samples == 80, type(record).__name__
    for record in (padding, packing, choice):
        assert 0 < record.token_efficiency <= 1, type(record).__name__
    assert packing.token_efficiency == packing.report.token_efficiency
    assert choice.token_efficiency == choice.chosen.token_efficiency
    assert padding.num_shapes == 2 and packing.num_shapes >= 1
    assert efficiency(0, 0) == 1.0 and efficiency(3, 4) == 0.75  # the empty-input rule
