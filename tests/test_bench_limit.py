"""The benchmark's physical limit: measured in the timed rounds, a reference row in the
table, each strategy's share of it and where the rest of its time goes."""

import numpy as np
import pytest
import torch

from shapebucket.bench import batching, cli, harness
from shapebucket.bench.limit import LIMIT, add_limit, gap, limit_grid, limit_rate, limit_runners
from shapebucket.bench.report import format_table
from shapebucket.bench.runner import time_round
from shapebucket.bench.strategies import StrategyResult


def quick_setup():
    args = cli._parser().parse_args(["--quick", "--samples", "400", "--epoch-samples", "40"])
    cli._resolve(args)
    return harness._setup(args)


def test_the_limit_row_is_computed_and_printed():
    s = quick_setup()
    families = {"packed": batching.build_family("packed", s)}
    ours = StrategyResult("shapebucket-packed", family="packed", useful_tokens_per_sec=1.0)
    ours.round_tokens_per_sec = [1.0]
    runners = limit_runners(s, hows=("eager",))  # compiled: the same code with torch.compile
    for r in runners:  # one timed round
        time_round(r, s.device)
    results = [ours]
    add_limit(s, families, results, runners)
    row = results[-1]
    assert row.name == LIMIT and row.error is None and not row.peer
    grid = row.limit["grid"]
    assert grid == limit_grid(s.lengths[s.timed_ids], 3) and set(row.limit["cost"]) == set(grid)
    # the rate at each length's median cost, the costs the gap uses: share and gap agree
    assert row.useful_tokens_per_sec == limit_rate(s.lengths[s.timed_ids], row.limit["cost"])
    assert row.tokens_per_sec_min <= row.tokens_per_sec_max  # the round's own rates
    assert ours.of_limit == pytest.approx(1.0 / row.useful_tokens_per_sec)
    assert ours.limit_gap["limit"] == pytest.approx(ours.of_limit)
    assert sum(ours.limit_gap.values()) == pytest.approx(1.0)
    assert ours.limit_gap["padding"] >= 0 and ours.limit_gap["limit"] > 0
    text = format_table(results)
    assert "limit (reference)" in text and "of limit" in text
    assert f"full batches at lengths {grid}" in text
    assert "limit: shapebucket-packed reaches" in text and "padding" in text


def test_every_grid_length_gets_full_batches_of_the_token_budget():
    s = quick_setup()
    (runner,) = limit_runners(s, hows=("eager",))
    T = s.args.packed_tokens_per_batch
    lengths = {int(b["input_ids"].shape[1]) for b in runner.family.timed}
    assert lengths == set(runner.result.limit["grid"])
    for b in runner.family.timed:
        rows, L = b["input_ids"].shape
        assert rows == max(1, T // L) and bool(b["attention_mask"].all())  # no padding


def test_the_gap_splits_a_strategys_time():
    lengths = np.array([8, 8, 16])
    cost = {8: 1.0, 16: 2.0}  # seconds per token
    ideal = 8 + 8 + 32
    # one bucket batch of 3 rows x 16: 16 pad tokens, 16 real tokens costed at 16's price
    g = gap(lengths, cost, [(3, 16, 32)], rate=32 / 120)
    assert g["limit"] == pytest.approx(ideal / 120)
    assert g["padding"] == pytest.approx(16 * 2.0 / 120)
    assert g["longer rows"] == pytest.approx((32 * 2.0 - ideal) / 120)
    assert sum(g.values()) == pytest.approx(1.0)


def test_captioning_gets_an_error_row_not_a_limit():
    s = quick_setup()
    s.args.workload = "captioning"
    assert limit_runners(s) == []
    results: list[StrategyResult] = []
    add_limit(s, {}, results, [])
    assert results[0].name == LIMIT and "skipped" in results[0].error
    assert "limit (reference)" in format_table(results)
    torch.manual_seed(0)


@pytest.mark.slow  # calibrates the quick GPT at two row lengths through the profiler: ~30 s
def test_the_calibrated_strategy_packs_at_least_the_token_budgets_rows():
    s = quick_setup()
    fam = batching.build_family("calibrated", s)
    fit, report = s.packing, s.calibrated
    assert fam.collate.rows == report.rows and set(report.rows) == set(fit.buckets)
    longest = max(fit.buckets)
    # the budget is the token budget's own peak at its longest row length: that fits
    assert report.rows[longest] >= fit.rows[longest]
    assert all(report.peak[L] <= report.limit for L in report.rows)
    assert {r for r, _ in fam.shapes} <= set(report.rows.values())
