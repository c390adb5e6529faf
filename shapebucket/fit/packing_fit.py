"""Choosing packing's buckets (the row lengths samples are packed into) and rows per
batch: :func:`fit_packing`, :class:`PackingFitReport`, :func:`packing_report`."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._validate import MAX_BUCKET, check_int, check_lengths, round_up
from ..errors import ShapeBucketError
from .buckets import Buckets
from .packing import PackingReport, plan_packing, rows_for_tokens
from .packing_search import halving_sets, row_cost, search_row_lengths
from .step_cost import StepCost

__all__ = ["MAX_TOKENS_PER_BATCH", "PackingFitReport", "fit_packing", "packing_report"]

#: The largest token budget :func:`fit_packing` plans for: 2**40 tokens, far beyond
#: any batch that fits in memory (a larger one is a unit or overflow mistake).
MAX_TOKENS_PER_BATCH = 2**40
#: how many of the search's best sets are planned on all the lengths, next to the halving sets
FINALISTS = 3


def packing_report(
    lengths: Sequence[int] | np.ndarray,
    buckets: Buckets | Sequence[int],
    *,
    rows: int | Mapping[int, int],
    seed: int = 0,
    num_replicas: int = 1,
    window: int = 16384,
) -> PackingReport:
    """Token and attention efficiency of packing ``lengths`` into ``buckets`` (the row
    lengths) with ``rows`` rows per batch (epoch 0 of the plan).

    >>> packing_report([5, 3, 8, 2, 6], [8], rows=2, seed=0).num_shapes
    1
    """
    seed = check_int("seed", seed, minimum=0)
    plan = plan_packing(lengths, buckets, rows, seed=seed, num_replicas=num_replicas, window=window)
    return plan.report


@dataclass(frozen=True)
class PackingFitReport:
    """What :func:`fit_packing` chose: ``buckets`` (the row lengths samples are packed
    into), ``rows`` per bucket, and why.

    ``candidates`` holds the report of every bucket set it tried, in the order
    tried; ``report`` is the chosen one's, and ``num_samples``, ``num_shapes``,
    ``token_efficiency`` and ``attention_efficiency`` are read from it (measured
    on at most ``max_samples`` of the lengths; an efficiency is 1.0 when nothing
    is counted).

    >>> fit = fit_packing([5, 9, 12, 30] * 20, k=2, tokens_per_batch=64)
    >>> [list(b) for b, _ in fit.candidates], fit.rows
    ([[32]], {32: 2})
    """

    buckets: Buckets
    rows: dict[int, int]
    report: PackingReport
    candidates: list[tuple[Buckets, PackingReport]]
    tokens_per_batch: int
    model_dim: int | StepCost | None = None

    @property
    def cost_model(self) -> str:
        """What chose among the candidates: ``"measured step times"`` (a
        :class:`~shapebucket.fit.step_cost.StepCost`), ``"formula 1 + L/(6*d)"`` (an int
        ``model_dim``) or ``"token efficiency"``."""
        if isinstance(self.model_dim, StepCost):
            return self.model_dim.source
        return (
            "token efficiency" if self.model_dim is None else f"formula 1 + L/(6*{self.model_dim})"
        )

    @property
    def num_samples(self) -> int:
        """The lengths the chosen set was measured on."""
        return self.report.num_samples

    @property
    def num_shapes(self) -> int:
        """Distinct ``(rows, bucket)`` batch shapes of the chosen set's epoch."""
        return self.report.num_shapes

    @property
    def token_efficiency(self) -> float:
        """Real over computed tokens of the chosen set."""
        return self.report.token_efficiency

    @property
    def attention_efficiency(self) -> float:
        """Real over dense attention work of the chosen set."""
        return self.report.attention_efficiency

    def table(self) -> str:
        """The candidates as a table, the choice marked (with ``model_dim``: the estimated
        compute per real token too)."""
        cost = self.model_dim is not None
        lines = [
            f"  {'buckets (row lengths)':<40s} {'tokens':>7s} {'attention':>9s} {'shapes':>6s}"
            + (f" {'cost/token':>10s}" if cost else "")
        ]
        for buckets, rep in self.candidates:
            mark = "  <- chosen" if buckets == self.buckets else ""
            extra = (
                f" {_relative_cost(buckets, rep, self.tokens_per_batch, self.model_dim):>10.3f}"  # type: ignore[arg-type]
                if cost
                else ""
            )
            lines.append(
                f"  {list(buckets)!s:<40s} {rep.token_efficiency:>7.1%} "
                f"{rep.attention_efficiency:>9.1%} {rep.num_shapes:>6d}{extra}{mark}"
            )
        return "\n".join(lines)


def _check_tolerance(tolerance: Any) -> float:
    if isinstance(tolerance, bool) or not isinstance(tolerance, numbers.Real):
        raise ShapeBucketError(
            f"tolerance must be a number in [0, 1), got {tolerance!r} ({type(tolerance).__name__}); "
            "for example tolerance=0.01 (one percentage point of token efficiency)"
        )
    value = float(tolerance)
    if not (math.isfinite(value) and 0 <= value < 1):
        raise ShapeBucketError(f"tolerance must be in [0, 1), got {tolerance!r}")
    return value


def _choose(
    candidates: list[tuple[Buckets, PackingReport]],
    tokens_per_batch: int,
    model_dim: int | StepCost | None,
    tolerance: float,
) -> tuple[Buckets, PackingReport]:
    if model_dim is not None:
        costs = [_relative_cost(b, rep, tokens_per_batch, model_dim) for b, rep in candidates]
        # within 0.5% of the cheapest, fewer buckets win: each is one more compile
        near = [c for c, x in zip(candidates, costs, strict=True) if x <= min(costs) * 1.005]
        return min(near, key=lambda c: len(c[0]))
    best = max(rep.token_efficiency for _, rep in candidates)
    ok = [(b, rep) for b, rep in candidates if rep.token_efficiency >= best - tolerance]
    return max(ok, key=lambda c: c[1].attention_efficiency)


def fit_packing(
    lengths: Sequence[int] | np.ndarray,
    k: int = 8,
    *,
    tokens_per_batch: int,
    align: int = 8,
    tolerance: float = 0.01,
    model_dim: int | StepCost | None = None,
    max_len: int | None = None,
    window: int = 16384,
    max_samples: int = 200_000,
    seed: int = 0,
) -> PackingFitReport:
    """Choose the buckets (row lengths, at most ``k``) and rows per batch for packing ``lengths``.

    The space searched: every set of at most ``k`` row lengths, multiples of ``align``,
    whose largest is ``max_len`` (default the longest sample rounded up to ``align``).
    :mod:`.packing_search` searches it on at most 8,192 of the lengths: every set when
    the space is small (exact), otherwise alternating exact refits of the set to the
    packed rows' contents with re-packing, from several seeds (the sets halving from
    the longest row, ``[M]``, ``[M/2, M]``, ...; the exact bucket sets of the lengths),
    then a short hill climb. The single row length ``[M]`` (the reference) and the
    search's best sets (the best, then the best of each smaller size within 2% of
    it, fewest row lengths first; three in all) are then planned
    for real (epoch 0, at most ``max_samples`` lengths drawn with ``seed``): those are
    ``candidates``. Shorter rows cost less dense attention but pack less tightly. With
    ``model_dim`` (the model's width) the choice is the set with the least
    estimated compute per real token: a token of a row of length ``L`` costs
    ``1 + L / (6 * model_dim)`` (a transformer block's linear layers do about
    ``24 * d**2`` multiply-adds per token, dense attention ``4 * L * d``), and among
    sets within 0.5% of the cheapest the one with the fewest buckets (compiles).
    ``model_dim`` can instead be a :class:`~shapebucket.fit.step_cost.StepCost`: the
    seconds per token measured at some lengths replace the formula
    (``report.cost_model`` says which was used).
    Without it, the choice is the set with the best attention efficiency whose
    token efficiency is within ``tolerance`` (a number in [0, 1)) of the best
    candidate's. Rows per batch come from ``tokens_per_batch`` (:func:`rows_for_tokens`).

    >>> fit = fit_packing([5, 9, 12, 30, 7, 3] * 50, k=3, tokens_per_batch=64)
    >>> list(fit.buckets), fit.rows, f"{fit.report.token_efficiency:.1%}"
    ([32], {32: 2}, '95.5%')
    """
    arr = check_lengths(lengths)
    k = check_int("k", k, minimum=1)
    align = check_int("align", align, minimum=1, maximum=MAX_BUCKET)
    tokens_per_batch = check_int(
        "tokens_per_batch", tokens_per_batch, minimum=1, maximum=MAX_TOKENS_PER_BATCH
    )
    tolerance = _check_tolerance(tolerance)
    if model_dim is not None and not isinstance(model_dim, StepCost):
        model_dim = check_int("model_dim", model_dim, minimum=1)
    max_samples = check_int("max_samples", max_samples, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    longest = int(arr.max())
    top = (
        round_up(max(longest, 2), align)  # a row holds at least 2 tokens (Buckets)
        if max_len is None
        else check_int("max_len", max_len, minimum=2, maximum=MAX_BUCKET)
    )
    if top < longest:
        raise ShapeBucketError(
            f"max_len={top} is shorter than the longest sample ({longest}); packing never "
            "cuts a sample: pass max_len >= the longest length"
        )
    sub = arr
    if len(arr) > max_samples:
        sub = np.random.default_rng(seed).choice(arr, size=max_samples, replace=False)
    candidates = [
        (
            b,
            packing_report(
                sub, b, rows=rows_for_tokens(b, tokens_per_batch), seed=seed, window=window
            ),
        )
        for b in _finalists(sub, k, top, align, tokens_per_batch, model_dim, seed, window)
    ]
    chosen, report = _choose(candidates, tokens_per_batch, model_dim, tolerance)
    rows = rows_for_tokens(chosen, tokens_per_batch)
    return PackingFitReport(chosen, rows, report, candidates, tokens_per_batch, model_dim)


def _finalists(
    sub: np.ndarray,
    k: int,
    top: int,
    align: int,
    tokens_per_batch: int,
    model_dim: int | StepCost | None,
    seed: int,
    window: int,
) -> list[Buckets]:
    """The sets planned on all of ``sub``: one row length of ``top`` (the reference), then
    the search's best (:mod:`.packing_search`), in that order."""
    if tokens_per_batch < top:
        rows_for_tokens([top], tokens_per_batch)  # raises, naming the fix
    found = search_row_lengths(
        sub,
        k=k,
        top=top,
        align=align,
        tokens_per_batch=tokens_per_batch,
        model_dim=model_dim,
        seed=seed,
        window=window,
    )
    out = halving_sets(top, k, align)[:1]  # one row length: the reference
    out += [b for b in found.best(FINALISTS) if b not in out]
    return out


def _relative_cost(
    buckets: Buckets, rep: PackingReport, tokens: int, model_dim: int | StepCost
) -> float:
    """Estimated compute per real token (1.0: every computed token real, no attention)."""
    rows, cost = rows_for_tokens(buckets, tokens), row_cost(model_dim)
    work = sum(n * rows[L] * cost(L) for L, n in rep.batches_per_bucket.items())
    return work / rep.real_tokens
