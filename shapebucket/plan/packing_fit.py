"""Choosing packing row lengths: :func:`fit_packing`, :func:`packing_report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._validate import check_int, check_lengths, round_up
from ..errors import ShapeBucketError
from .buckets import Buckets
from .packing import PackingReport, plan_packing, rows_for_tokens


def packing_report(
    lengths: Sequence[int] | np.ndarray,
    buckets: Buckets | Sequence[int],
    *,
    rows: int | Mapping[int, int],
    seed: int = 0,
    num_replicas: int = 1,
    window: int = 16384,
) -> PackingReport:
    """Token and attention efficiency of packing ``lengths`` (epoch 0 of the plan).

    >>> packing_report([5, 3, 8, 2, 6], [8], rows=2, seed=0).shapes
    1
    """
    plan = plan_packing(lengths, buckets, rows, seed=seed, num_replicas=num_replicas, window=window)
    return plan.report


@dataclass(frozen=True)
class PackingFitReport:
    """What :func:`fit_packing` chose: row lengths, rows per row length, and why.

    ``candidates`` holds the report of every row-length set it tried, in the
    order tried; ``report`` is the chosen one's.

    >>> fit = fit_packing([5, 9, 12, 30] * 20, k=2, tokens_per_batch=64)
    >>> [list(rl) for rl, _ in fit.candidates], fit.rows
    ([[32], [16, 32]], {32: 2})
    """

    buckets: Buckets
    rows: dict[int, int]
    report: PackingReport
    candidates: list[tuple[Buckets, PackingReport]]
    tokens_per_batch: int
    model_dim: int | None = None

    def table(self) -> str:
        """The candidates as a table, the choice marked (with ``model_dim``: the estimated
        compute per real token too)."""
        cost = self.model_dim is not None
        lines = [
            f"  {'row lengths':<40s} {'tokens':>7s} {'attention':>9s} {'shapes':>6s}"
            + (f" {'cost/token':>10s}" if cost else "")
        ]
        for rl, rep in self.candidates:
            mark = "  <- chosen" if rl == self.buckets else ""
            extra = (
                f" {_relative_cost(rl, rep, self.tokens_per_batch, self.model_dim):>10.3f}"  # type: ignore[arg-type]
                if cost
                else ""
            )
            lines.append(
                f"  {list(rl)!s:<40s} {rep.token_efficiency:>7.1%} "
                f"{rep.attention_efficiency:>9.1%} {rep.shapes:>6d}{extra}{mark}"
            )
        return "\n".join(lines)


def fit_packing(
    lengths: Sequence[int] | np.ndarray,
    k: int = 8,
    *,
    tokens_per_batch: int,
    align: int = 8,
    tolerance: float = 0.01,
    model_dim: int | None = None,
    max_len: int | None = None,
    window: int = 16384,
    sample: int = 200_000,
    seed: int = 0,
) -> PackingFitReport:
    """Choose row lengths (at most ``k``) and rows per batch for packing ``lengths``.

    The candidates halve from the longest row (``max_len``, default the longest
    sample rounded up to ``align``): ``[M]``, ``[M/2, M]``, ``[M/4, M/2, M]``, ...
    up to ``k`` row lengths, each rounded up to ``align`` and at least ``2 * align``.
    Each is planned for real (epoch 0, at most ``sample`` lengths). Shorter rows
    cost less dense attention but pack less tightly. With ``model_dim`` (the
    model's width) the choice is the set with the least estimated compute per
    real token: a token of a row of length ``L`` costs ``1 + L / (6 * model_dim)``
    (a transformer block's linear layers do about ``24 * d**2`` multiply-adds
    per token, dense attention ``4 * L * d``), and among sets within 0.5% of the
    cheapest the one with the fewest row lengths (compiles). Without it, the choice is the set
    with the best attention efficiency whose token efficiency is within
    ``tolerance`` of the best candidate's. Rows per batch come from
    ``tokens_per_batch`` (:func:`rows_for_tokens`).

    >>> fit = fit_packing([5, 9, 12, 30, 7, 3] * 50, k=3, tokens_per_batch=64)
    >>> list(fit.buckets), fit.rows, f"{fit.report.token_efficiency:.1%}"
    ([32], {32: 2}, '95.5%')
    """
    arr = check_lengths(lengths)
    k = check_int("k", k, minimum=1)
    align = check_int("align", align, minimum=1)
    longest = round_up(int(arr.max()), align)
    top = longest if max_len is None else check_int("max_len", max_len, minimum=2)
    if top < int(arr.max()):
        raise ShapeBucketError(
            f"max_len={top} is shorter than the longest sample ({int(arr.max())}); packing never "
            "cuts a sample: pass max_len >= the longest length"
        )
    if not 0 <= tolerance < 1:
        raise ShapeBucketError(f"tolerance must be in [0, 1), got {tolerance!r}")
    sub = arr
    if len(arr) > sample:
        sub = np.random.default_rng(seed).choice(arr, size=sample, replace=False)
    candidates: list[tuple[Buckets, PackingReport]] = []
    floor = max(2, 2 * align)
    for m in range(1, k + 1):
        values = sorted({max(floor, round_up(-(-top // 2**i), align)) for i in range(m)} | {top})
        rl = Buckets(values)
        if candidates and rl == candidates[-1][0]:
            break
        rep = packing_report(
            sub, rl, rows=rows_for_tokens(rl, tokens_per_batch), seed=seed, window=window
        )
        candidates.append((rl, rep))
    if model_dim is not None:
        d = check_int("model_dim", model_dim, minimum=1)
        costs = [_relative_cost(rl, rep, tokens_per_batch, d) for rl, rep in candidates]
        # within 0.5% of the cheapest, fewer row lengths win: each is one more compile
        near = [c for c, x in zip(candidates, costs, strict=True) if x <= min(costs) * 1.005]
        chosen, report = min(near, key=lambda c: len(c[0]))
    else:
        best = max(rep.token_efficiency for _, rep in candidates)
        ok = [(rl, rep) for rl, rep in candidates if rep.token_efficiency >= best - tolerance]
        chosen, report = max(ok, key=lambda c: c[1].attention_efficiency)
    rows = rows_for_tokens(chosen, tokens_per_batch)
    return PackingFitReport(chosen, rows, report, candidates, tokens_per_batch, model_dim)


def _relative_cost(rl: Buckets, rep: PackingReport, tokens: int, model_dim: int) -> float:
    """Estimated compute per real token (1.0: every computed token real, no attention)."""
    rows = rows_for_tokens(rl, tokens)
    work = sum(
        n * rows[L] * L * (1 + L / (6 * model_dim)) for L, n in rep.batches_per_bucket.items()
    )
    return work / rep.real_tokens
