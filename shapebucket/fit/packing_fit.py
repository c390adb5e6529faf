"""Choosing packing's buckets (the row lengths samples are packed into) and rows per
batch: :func:`fit_packing`, :class:`PackingFitReport`, :func:`packing_report`."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lengths import MAX_BUCKET, CheckedLengths, round_up
from .._validate import check_int, check_number
from ..errors import ShapeBucketError
from .buckets import Buckets
from .packing import PackingReport, pack_epoch, rows_for_tokens
from .packing_search import halving_sets, search_row_lengths
from .step_cost import StepCost, row_cost

__all__ = [
    "MAX_TOKENS_PER_BATCH",
    "PackingFitReport",
    "PackingTrial",
    "fit_packing",
    "packing_report",
]

#: The largest token budget :func:`fit_packing` plans for: 2**40 tokens, far beyond
#: any batch that fits in memory (a larger one is a unit or overflow mistake).
MAX_TOKENS_PER_BATCH = 2**40


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
    plan = pack_epoch(lengths, buckets, rows, seed=seed, num_replicas=num_replicas, window=window)
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


@dataclass(frozen=True)
class PackingTrial:
    """How :func:`fit_packing` tries each candidate set for real: packed like the
    sampler packs an epoch (``window`` samples at a time, epoch 0 with ``seed``), on at
    most ``max_samples`` of the lengths (drawn with ``seed`` when there are more).

    >>> PackingTrial(max_samples=50_000)
    PackingTrial(window=16384, max_samples=50000, seed=0)
    """

    window: int = 16384
    max_samples: int = 200_000
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", check_int("window", self.window, minimum=1))
        max_samples = check_int("max_samples", self.max_samples, minimum=1)
        object.__setattr__(self, "max_samples", max_samples)
        object.__setattr__(self, "seed", check_int("seed", self.seed, minimum=0))


_TOLERANCE_HINT = "; for example tolerance=0.01 (one percentage point of token efficiency)"


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
    trial: PackingTrial = PackingTrial(),
) -> PackingFitReport:
    """Choose the buckets (row lengths, at most ``k``) and rows per batch for packing ``lengths``.

    Args:
        lengths: sample lengths, ints >= 1.
        k: the most row lengths (each one compiled shape).
        tokens_per_batch: a row length ``L`` gets ``tokens_per_batch // L`` rows per batch
            (:func:`~shapebucket.fit.packing.rows_for_tokens`).
        align: every row length is a multiple of this.
        tolerance: without ``model_dim``, the choice is the candidate with the best attention
            efficiency whose token efficiency is within ``tolerance`` (in [0, 1)) of the best.
        model_dim: the model's width: the choice is then the least estimated compute per
            real token (a token of a row of length ``L`` costs ``1 + L / (6 * model_dim)``:
            :func:`~shapebucket.fit.step_cost.row_cost`), and within 0.5% of the cheapest
            the fewest row lengths (compiles); or a
            :class:`~shapebucket.fit.step_cost.StepCost`, seconds per token measured at some
            lengths, in place of the formula (``report.cost_model`` says which).
        max_len: the longest row length (default the longest sample rounded up to ``align``).
        trial: how each candidate is planned for real (:class:`PackingTrial`: epoch 0, at
            most 200,000 lengths drawn with seed 0 by default).

    The sets of at most ``k`` multiples of ``align`` topped by ``max_len`` are searched on
    at most 8,192 of the lengths (exactly when the space is small; how: ``docs/fit.md``).
    The single row length (the reference) and the search's best sets (the best, then the
    best of each smaller size within 2% of it; three in all) are the ``candidates``,
    planned for real.

    >>> fit = fit_packing([5, 9, 12, 30, 7, 3] * 50, k=3, tokens_per_batch=64)
    >>> list(fit.buckets), fit.rows, f"{fit.report.token_efficiency:.1%}"
    ([32], {32: 2}, '95.5%')
    """
    checked = CheckedLengths.of(lengths)
    arr = checked.array
    k = check_int("k", k, minimum=1)
    align = check_int("align", align, minimum=1, maximum=MAX_BUCKET)
    tokens_per_batch = check_int(
        "tokens_per_batch", tokens_per_batch, minimum=1, maximum=MAX_TOKENS_PER_BATCH
    )
    tolerance = check_number("tolerance", tolerance, at_least=0, below=1, hint=_TOLERANCE_HINT)
    model_dim = _check_model_dim(model_dim)
    if not isinstance(trial, PackingTrial):
        raise ShapeBucketError(
            f"trial must be a PackingTrial(window=, max_samples=, seed=), got {trial!r}"
        )
    top = _longest_row(int(arr.max()), max_len, align)
    sub = _trial_lengths(checked, trial)
    if tokens_per_batch < top:
        rows_for_tokens([top], tokens_per_batch)  # raises, naming the fix
    candidates = _candidates(sub, k, top, align, tokens_per_batch, model_dim, trial)
    chosen, report = _choose(candidates, tokens_per_batch, model_dim, tolerance)
    rows = rows_for_tokens(chosen, tokens_per_batch)
    return PackingFitReport(chosen, rows, report, candidates, tokens_per_batch, model_dim)


def _check_model_dim(value: Any) -> int | StepCost | None:
    """``model_dim``: ``None``, an int width >= 1 or a :class:`StepCost`."""
    if value is None or isinstance(value, StepCost):
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ShapeBucketError(
            "model_dim must be an int (the model's width, its hidden size) or a StepCost (step "
            f"times measured per length), got {value!r} ({type(value).__name__})"
        )
    return check_int("model_dim", value, minimum=1)


def _longest_row(longest: int, max_len: int | None, align: int) -> int:
    """The longest row length: ``max_len``, or the longest sample rounded up to ``align``
    (a row holds at least 2 tokens, as a bucket does); never shorter than a sample."""
    if max_len is None:
        return round_up(max(longest, 2), align)
    top = check_int("max_len", max_len, minimum=2, maximum=MAX_BUCKET)
    if top < longest:
        raise ShapeBucketError(
            f"max_len={top} is shorter than the longest sample ({longest}); packing never "
            "cuts a sample: pass max_len >= the longest length"
        )
    return top


def _trial_lengths(checked: CheckedLengths, trial: PackingTrial) -> CheckedLengths:
    """The lengths the trial plans on: all of them, or ``trial.max_samples`` drawn without
    replacement with ``trial.seed``."""
    arr = checked.array
    if len(arr) <= trial.max_samples:
        return checked
    drawn = np.random.default_rng(trial.seed).choice(arr, size=trial.max_samples, replace=False)
    return CheckedLengths(drawn)  # a sample of checked lengths: passed on checked


def _candidates(
    sub: CheckedLengths,
    k: int,
    top: int,
    align: int,
    tokens_per_batch: int,
    model_dim: int | StepCost | None,
    trial: PackingTrial,
) -> list[tuple[Buckets, PackingReport]]:
    """The row-length search on ``sub`` (:mod:`.packing_search`), then one row length of
    ``top`` (the reference) and the search's best sets, each with its :func:`packing_report`
    on ``sub``: the candidates :func:`fit_packing` chooses from."""
    best = search_row_lengths(
        sub.array,
        k=k,
        top=top,
        align=align,
        tokens_per_batch=tokens_per_batch,
        model_dim=model_dim,
        seed=trial.seed,
        window=trial.window,
    )
    sets = halving_sets(top, k, align)[:1]
    sets += [b for b in best if b not in sets]
    return [
        (
            b,
            packing_report(
                sub,
                b,
                rows=rows_for_tokens(b, tokens_per_batch),
                seed=trial.seed,
                window=trial.window,
            ),
        )
        for b in sets
    ]


def _relative_cost(
    buckets: Buckets, rep: PackingReport, tokens: int, model_dim: int | StepCost
) -> float:
    """Estimated compute per real token (1.0: every computed token real, no attention)."""
    rows, cost = rows_for_tokens(buckets, tokens), row_cost(model_dim)
    work = sum(n * rows[L] * cost(L) for L, n in rep.batches_per_bucket.items())
    return work / rep.real_tokens
