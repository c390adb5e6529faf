"""``fit_buckets``: the optimal K bucket boundaries for a dataset, and padding reports.

The objective depends on how batches are formed, so it is an explicit choice:

* ``batching="bucketed"`` (the library's :class:`BucketBatchSampler`): each
  sample is padded to its own bucket. Minimise ``sum_i cost(bucket_for(len_i))``.
* ``batching="random"`` (plain shuffled batches of ``batch_size``): a batch is
  padded to the bucket of its longest member, whose distribution is
  ``P(max <= m) = F(m) ** batch_size``. Minimise the expected cost of that bucket.

Both are sums over buckets of ``cost(b_j) * weight(b_{j-1} < x <= b_j)`` with an
increasing cost, so the cost of a bucket range is Monge and a divide-and-conquer
dynamic programme over the distinct aligned lengths finds the exact optimum in
``O(k n log n)`` (vectorised with numpy, one level of the recursion at a time).

K itself can come from the job (``k="auto"``, :func:`choose_k`): each bucket costs
one compile before training (``compile_seconds``) and more buckets pad less, so
for ``K`` fitted buckets::

    prewarm(K) = K * compile_seconds
    train(K)   = samples * mean_length / token_efficiency(K) / tokens_per_second
    job(K)     = prewarm(K) + train(K)

and the ``K`` with the shortest job wins. ``tokens_per_second`` counts computed
tokens (real and padding) of the training step. With ``K`` above the recompile
limit (8), :func:`~shapebucket.prewarm` raises the limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np

from .._validate import (
    batch_max_distribution,
    check_int,
    check_lengths,
    round_up,
)
from ..errors import ShapeBucketError
from .buckets import Buckets, as_buckets

__all__ = [
    "DEFAULT_ALIGN",
    "KChoiceReport",
    "KRow",
    "PaddingReport",
    "choose_k",
    "fit_buckets",
    "padding_report",
]

Batching = Literal["bucketed", "random"]
#: The one default alignment of fitted buckets (``fit_buckets``, ``compare_policies``
#: and the CLI): multiples of 8 suit tensor cores and vectorised CPU kernels.
DEFAULT_ALIGN = 8
Cost = Literal["tokens", "attention"] | Callable[[int], float]


def _histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct lengths (ascending) and their counts, of lengths already checked."""
    if int(lengths.max()) <= 1 << 26:
        counts = np.bincount(lengths)
        values = np.flatnonzero(counts)
        return values.astype(np.int64), counts[values].astype(np.float64)
    values, counts = np.unique(lengths, return_counts=True)
    return values.astype(np.int64), counts.astype(np.float64)


def _check_batching(batching: str, batch_size: int) -> tuple[Batching, int]:
    if batching not in ("bucketed", "random"):
        raise ShapeBucketError(f"batching must be 'bucketed' or 'random', got {batching!r}")
    return cast(Batching, batching), check_int("batch_size", batch_size, minimum=1)


def _cost_values(cost: Cost, boundaries: np.ndarray) -> np.ndarray:
    b = boundaries.astype(np.float64)
    if cost == "tokens":
        return b
    if cost == "attention":
        return b * b
    if not callable(cost):
        raise ShapeBucketError(
            f"cost must be 'tokens', 'attention' or a callable length -> float, got {cost!r}"
        )
    values = np.array([float(cost(int(x))) for x in boundaries], dtype=np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        i = int(np.flatnonzero(~np.isfinite(values) | (values < 0))[0])
        raise ShapeBucketError(
            f"cost({int(boundaries[i])}) = {values[i]!r}; costs must be finite and >= 0"
        )
    drops = np.flatnonzero(np.diff(values) < 0)
    if drops.size:
        i = int(drops[0])
        raise ShapeBucketError(
            f"cost must not decrease with length: cost({int(boundaries[i])}) = {values[i]} > "
            f"cost({int(boundaries[i + 1])}) = {values[i + 1]}"
        )
    return values


def _weights(counts: np.ndarray, batching: str, batch_size: int) -> np.ndarray:
    """Weight of each candidate boundary's group: sample counts, or batch-max probabilities."""
    return counts if batching == "bucketed" else batch_max_distribution(counts, batch_size)


def _min_plus_layer(
    prev: np.ndarray, c: np.ndarray, W: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``cur[j] = min_{0 <= i < j} prev[i] + c[j] * (W[j] - W[i])`` for j = 1..n, with the
    leftmost argmin. Divide and conquer over j (the argmin is monotone because the
    range cost is Monge), vectorised across all segments of one recursion level."""
    n = len(W) - 1
    cur = np.full(n + 1, np.inf)
    cur[0] = 0.0
    opt = np.zeros(n + 1, dtype=np.int64)
    jl, jr = np.array([1]), np.array([n])
    ol, orr = np.array([0]), np.array([n - 1])
    while jl.size:
        mid = (jl + jr) // 2
        lo, hi = ol, np.minimum(orr, mid - 1)
        cnt = hi - lo + 1
        starts = np.cumsum(cnt) - cnt
        seg = np.repeat(np.arange(len(mid)), cnt)
        i = np.repeat(lo - starts, cnt) + np.arange(int(cnt.sum()))
        j = mid[seg]
        val = prev[i] + c[j] * (W[j] - W[i])
        mins = np.minimum.reduceat(val, starts)
        hits = np.flatnonzero(val == mins[seg])
        first = hits[np.r_[True, seg[hits][1:] != seg[hits][:-1]]]
        best = i[first]
        cur[mid], opt[mid] = mins, best
        left, right = jl <= mid - 1, mid + 1 <= jr
        jl, jr, ol, orr = (
            np.concatenate([jl[left], mid[right] + 1]),
            np.concatenate([mid[left] - 1, jr[right]]),
            np.concatenate([ol[left], best[right]]),
            np.concatenate([best[left], orr[right]]),
        )
    return cur, opt


def _optimal_boundaries(
    cands: np.ndarray, weights: np.ndarray, costs: np.ndarray, k: int
) -> list[int]:
    n = len(cands)
    W = np.concatenate([[0.0], np.cumsum(weights)])
    c = np.concatenate([[0.0], costs])  # c[j] is the cost of boundary cands[j - 1]
    prev = np.full(n + 1, np.inf)
    prev[0] = 0.0
    choices = []
    for _ in range(min(k, n)):
        prev, opt = _min_plus_layer(prev, c, W)
        choices.append(opt)
    out, j = [], n
    for opt in reversed(choices):
        if j == 0:
            break
        out.append(int(cands[j - 1]))
        j = int(opt[j])
    return sorted(out)


def fit_buckets(
    lengths: Sequence[int] | np.ndarray,
    k: int | Literal["auto"] = 8,
    *,
    align: int = DEFAULT_ALIGN,
    max_len: int | None = None,
    batch_size: int = 1,
    batching: Batching = "bucketed",
    cost: Cost = "tokens",
    compile_seconds: float | None = None,
    samples: int | None = None,
    tokens_per_second: float | None = None,
) -> Buckets:
    """The at-most-``k`` aligned buckets that minimise the expected padded cost.

    Args:
        lengths: sample lengths, ints >= 1 (a sequence or 1-D array, up to tens of millions).
        k: the most buckets to return (keep it <= the recompile limit, 8).
        align: every bucket is a multiple of this (default 8, which suits tensor
            cores; 1 fits the lengths exactly).
        max_len: the largest bucket covers ``max_len`` instead of ``max(lengths)``;
            lengths above it raise.
        batch_size: batch size, used by ``batching="random"`` only.
        batching: ``"bucketed"`` (default) if batches are formed inside a bucket
            (:class:`BucketBatchSampler`), ``"random"`` for plain shuffled batches.
        cost: ``"tokens"`` (padded length), ``"attention"`` (its square) or a
            non-decreasing callable ``length -> cost``.
        compile_seconds, samples, tokens_per_second: with ``k="auto"``, the
            job that decides K: seconds to compile one bucket, samples to train
            on, and computed tokens per second of the step. ``k="auto"`` picks
            the K with the shortest prewarm plus training
            (:func:`choose_k`, which also gives the table).

    The result is exact: no aligned set of at most ``k`` boundaries covering the
    longest length has a lower objective.

    >>> fit_buckets([3, 3, 5, 9, 30], k=2)
    Buckets([8, 32])
    >>> fit_buckets([4, 4, 5, 9, 30], k=3, align=1)
    Buckets([5, 9, 30])
    """
    mode, batch_size = _check_batching(batching, batch_size)
    job = {
        "compile_seconds": compile_seconds,
        "samples": samples,
        "tokens_per_second": tokens_per_second,
    }
    if isinstance(k, str) and k == "auto":
        missing = [name for name, value in job.items() if value is None]
        if missing or max_len is not None or cost != "tokens":
            raise ShapeBucketError(
                "k='auto' needs compile_seconds=, samples= and tokens_per_second= (missing: "
                f"{missing}) and fits by tokens without max_len"
            )
        return choose_k(
            lengths,
            align=align,
            batch_size=batch_size,
            batching=mode,
            **job,  # type: ignore[arg-type]
        ).buckets
    if any(value is not None for value in job.values()):
        raise ShapeBucketError(
            "compile_seconds=, samples= and tokens_per_second= describe the job for k='auto'; "
            f"with k={k!r} they would be ignored: pass k='auto' or leave them out"
        )
    if isinstance(k, str):
        raise ShapeBucketError(f"k must be an int >= 1 or 'auto', got {k!r}")
    k = check_int("k", k, minimum=1)
    align = check_int("align", align, minimum=1)
    arr = check_lengths(lengths)
    values, counts = _histogram(arr)
    longest = int(values[-1])
    if max_len is not None:
        max_len = check_int("max_len", max_len, minimum=2)
        if longest > max_len:
            i = int(np.argmax(arr > max_len))
            raise ShapeBucketError(
                f"sample {i} has length {int(arr[i])} > max_len {max_len}; such samples would be "
                "truncated or rejected later: raise max_len, or drop/truncate them before fitting"
            )
    floor = round_up(2, align)
    rounded = np.maximum(round_up(values, align), floor)
    cands, group = np.unique(rounded, return_inverse=True)
    group_counts = np.bincount(group, weights=counts)
    top = round_up(max(longest, max_len or 0, 2), align)
    if cands[-1] != top:
        cands = np.append(cands, top)
        group_counts = np.append(group_counts, 0.0)
    weights = _weights(group_counts, mode, batch_size)
    costs = _cost_values(cost, cands)
    return Buckets(_optimal_boundaries(cands, weights, costs, k))


@dataclass
class PaddingReport:
    """How much compute a bucket set spends on padding for a length distribution.

    For ``batching="bucketed"`` ``share`` is the share of samples per bucket; for
    ``"random"`` it is the share of batches.

    >>> report = padding_report([4, 8, 12, 16], [8, 16])
    >>> report.share, report.expected_padded_length
    ({8: 0.5, 16: 0.5}, 12.0)
    """

    buckets: Buckets
    batching: str
    batch_size: int
    num_samples: int
    token_efficiency: float
    attention_efficiency: float
    num_shapes: int
    expected_padded_length: float
    mean_length: float
    share: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": list(self.buckets),
            "batching": self.batching,
            "batch_size": self.batch_size,
            "num_samples": self.num_samples,
            "token_efficiency": self.token_efficiency,
            "attention_efficiency": self.attention_efficiency,
            "num_shapes": self.num_shapes,
            "expected_padded_length": self.expected_padded_length,
            "mean_length": self.mean_length,
            "share": {str(b): s for b, s in self.share.items()},
        }

    def __str__(self) -> str:
        per = "samples" if self.batching == "bucketed" else "batches"
        lines = [
            f"{self.buckets!r}, batching={self.batching!r}, batch_size={self.batch_size}, {self.num_samples:,} samples",
            f"token efficiency {self.token_efficiency:.1%}, attention efficiency {self.attention_efficiency:.1%}, "
            f"{self.num_shapes} shapes, mean length {self.mean_length:.1f}, expected padded length {self.expected_padded_length:.1f}",
            f"{'bucket':>8s} {'share of ' + per:>18s}",
        ]
        lines += [f"{b:>8d} {s:>18.2%}" for b, s in self.share.items()]
        return "\n".join(lines)


def padding_report(
    lengths: Sequence[int] | np.ndarray,
    buckets: Buckets | Sequence[int],
    *,
    batch_size: int = 1,
    batching: Batching = "bucketed",
) -> PaddingReport:
    """Token and attention efficiency of ``buckets`` on ``lengths``.

    >>> r = padding_report([4, 8, 12], Buckets([8, 16]))
    >>> round(r.token_efficiency, 3), r.num_shapes
    (0.75, 2)
    """
    mode, batch_size = _check_batching(batching, batch_size)
    buckets = as_buckets(buckets)
    values, counts = _histogram(check_lengths(lengths))
    idx = buckets.index_for_many(values)
    bl = np.asarray(buckets.lengths, dtype=np.float64)
    n = float(counts.sum())
    real1, real2 = (
        float((values * counts).sum()),
        float((values.astype(np.float64) ** 2 * counts).sum()),
    )
    per_bucket_counts = np.bincount(idx, weights=counts, minlength=len(buckets))
    per_bucket = _weights(per_bucket_counts, mode, batch_size)
    if mode == "bucketed":
        per_bucket = per_bucket / n
    exp_len = float((per_bucket * bl).sum())
    exp_len2 = float((per_bucket * bl * bl).sum())
    return PaddingReport(
        buckets=buckets,
        batching=mode,
        batch_size=batch_size,
        num_samples=int(n),
        token_efficiency=(real1 / n) / exp_len,
        attention_efficiency=(real2 / n) / exp_len2,
        num_shapes=int(np.count_nonzero(per_bucket > 0)),
        expected_padded_length=exp_len,
        mean_length=real1 / n,
        share={int(b): float(s) for b, s in zip(buckets.lengths, per_bucket, strict=True) if s > 0},
    )


# -- K from the job ---------------------------------------------------------------


@dataclass(frozen=True)
class KRow:
    """The estimate for one bucket count."""

    k: int
    buckets: Buckets
    token_efficiency: float
    prewarm_seconds: float
    train_seconds: float

    @property
    def job_seconds(self) -> float:
        return self.prewarm_seconds + self.train_seconds


@dataclass
class KChoiceReport:
    """Every ``K`` tried and the one with the shortest estimated job (``chosen``).

    >>> lengths = [5] * 900 + [60] * 100
    >>> short = choose_k(lengths, compile_seconds=10, samples=1_000, tokens_per_second=40_000)
    >>> long = choose_k(lengths, compile_seconds=10, samples=10**8, tokens_per_second=40_000)
    >>> short.chosen.k, long.chosen.k
    (1, 2)
    """

    rows: list[KRow]
    chosen: KRow
    compile_seconds: float
    samples: int
    tokens_per_second: float
    limit: int = 8  # dynamo's default recompile limit; prewarm raises it for more buckets

    @property
    def buckets(self) -> Buckets:
        return self.chosen.buckets

    def __str__(self) -> str:
        lines = [
            f"K from the job: {self.samples:,} samples, {self.compile_seconds:g} s to compile a "
            f"bucket, {self.tokens_per_second:,.0f} computed tokens/s",
            f"{'K':>3s} {'tokens':>7s} {'prewarm s':>10s} {'train s':>10s} {'job s':>10s}",
        ]
        for r in self.rows:
            mark = "  <- chosen" if r is self.chosen else ""
            over = " (raises the recompile limit)" if r.k > self.limit and r is self.chosen else ""
            lines.append(
                f"{r.k:>3d} {r.token_efficiency:>7.1%} {r.prewarm_seconds:>10.0f} "
                f"{r.train_seconds:>10.0f} {r.job_seconds:>10.0f}{mark}{over}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen_k": self.chosen.k,
            "buckets": list(self.chosen.buckets),
            "rows": [
                {
                    "k": r.k,
                    "buckets": list(r.buckets),
                    "token_efficiency": r.token_efficiency,
                    "prewarm_seconds": r.prewarm_seconds,
                    "train_seconds": r.train_seconds,
                    "job_seconds": r.job_seconds,
                }
                for r in self.rows
            ],
        }


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ShapeBucketError(f"{name} must be a number > 0, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ShapeBucketError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def choose_k(
    lengths: Sequence[int] | np.ndarray,
    *,
    compile_seconds: float,
    samples: int,
    tokens_per_second: float,
    max_k: int = 32,
    align: int = DEFAULT_ALIGN,
    batch_size: int = 1,
    batching: Batching = "bucketed",
) -> KChoiceReport:
    """The bucket count with the shortest estimated job (module docstring), with the table.

    Args:
        lengths: the dataset's sample lengths.
        compile_seconds: seconds to compile one bucket (forward and backward);
            ``PrewarmReport.total_seconds / len(buckets)`` of an earlier run.
        samples: samples the job trains on (epochs x dataset size).
        tokens_per_second: computed tokens (real + padding) per second of the step.
        max_k: the largest K tried (each K is fitted exactly, so the table stops
            growing once K covers every distinct aligned length).
        align, batch_size, batching: as for :func:`~shapebucket.fit_buckets`.

    >>> choice = choose_k([5] * 90 + [60] * 10, compile_seconds=10, samples=10**6,
    ...                   tokens_per_second=4e4)
    >>> choice.buckets, choice.chosen.k
    (Buckets([8, 64]), 2)
    """
    arr = check_lengths(lengths)
    compile_s = _positive("compile_seconds", compile_seconds)
    rate = _positive("tokens_per_second", tokens_per_second)
    samples = check_int("samples", samples, minimum=1)
    max_k = check_int("max_k", max_k, minimum=1)
    mean = float(arr.mean())
    rows: list[KRow] = []
    for k in range(1, max_k + 1):
        buckets = fit_buckets(arr, k, align=align, batch_size=batch_size, batching=batching)
        if rows and buckets == rows[-1].buckets:
            break  # every distinct aligned length has its bucket: more K changes nothing
        eff = padding_report(arr, buckets, batch_size=batch_size, batching=batching)
        efficiency = eff.token_efficiency
        rows.append(
            KRow(
                k=len(buckets),
                buckets=buckets,
                token_efficiency=efficiency,
                prewarm_seconds=len(buckets) * compile_s,
                train_seconds=samples * mean / efficiency / rate,
            )
        )
    chosen = min(rows, key=lambda r: (r.job_seconds, r.k))
    return KChoiceReport(rows, chosen, compile_s, samples, rate)
