"""Packing: the plan (PackedBatchSampler, plan_packing, fit_packing). The collator, the
document masks and exactness are in test_collate_packed.py."""

from __future__ import annotations

import pytest

from shapebucket import ShapeBucketError, fit_packing
from shapebucket.data import mixture_lengths
from shapebucket.plan import packing_report, rows_for_tokens

# -- the plan ----------------------------------------------------------------------------------


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
