"""The shape sets :func:`~shapebucket.advise.strategy.choose_strategy` weighs, each with
its loads for the job-time model (:mod:`.jobtime`): fitted buckets (:func:`bucket_sets`)
and packed row lengths (:func:`packing_sets`)."""

from __future__ import annotations

import numpy as np

from .._lengths import CheckedLengths, round_up
from ..fit.buckets import Buckets
from ..fit.optimal import fit_buckets
from ..fit.packing_fit import fit_packing
from ..fit.padding import padding_report
from .jobtime import Rates, ShapeLoad, fitted_sets, unit_cost

__all__ = ["ShapeSet", "bucket_sets", "default_tokens", "packing_sets"]

#: One shape set: its buckets (or packed row lengths), rows per batch of each, the token
#: efficiency of one epoch's plan, and each shape's load over the whole job.
ShapeSet = tuple[Buckets, dict[int, int], float, list[ShapeLoad]]


def bucket_sets(
    lengths: CheckedLengths, k: int, align: int, batch_size: int, job_samples: int, rates: Rates
) -> list[ShapeSet]:
    """Bucketed batches of ``batch_size`` rows for the exact fitted buckets, K = 1..k."""
    out: list[ShapeSet] = []

    def cost(b: int) -> float:  # one row of length b
        return unit_cost(1, b, rates.model_dim)

    sets, _ = fitted_sets(lambda K: fit_buckets(lengths, K, align=align, cost=cost), k)
    for buckets in sets:
        report = padding_report(lengths, buckets)  # share: of samples, per bucket
        loads = [
            rates.load(batch_size, b, job_samples * s / batch_size) for b, s in report.share.items()
        ]
        out.append((buckets, {int(b): batch_size for b in buckets}, report.token_efficiency, loads))
    return out


def packing_sets(
    lengths: CheckedLengths, k: int, align: int, tokens: int, job_samples: int, rates: Rates
) -> list[ShapeSet]:
    """Packed rows for every row-length set :func:`~shapebucket.fit.fit_packing` planned
    for real."""
    fit = fit_packing(lengths, k, tokens_per_batch=tokens, align=align, model_dim=rates.model_dim)
    out: list[ShapeSet] = []
    for buckets, report in fit.candidates:
        rows = {int(L): tokens // int(L) for L in buckets}
        scale = job_samples / report.num_samples
        loads = [
            rates.load(rows[L], L, scale * n) for L, n in report.batches_per_bucket.items() if n
        ]
        out.append((buckets, rows, report.token_efficiency, loads))
    return out


def default_tokens(lengths: CheckedLengths, batch_size: int, align: int) -> int:
    """A packed batch's default tokens: ``batch_size`` mean-length samples, rounded up to
    whole rows of the longest row length."""
    top = round_up(int(lengths.array.max()), align)
    return max(top, round_up(int(np.ceil(batch_size * float(lengths.array.mean()))), top))
