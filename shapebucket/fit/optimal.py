"""The exact optimal buckets for a given K: :func:`fit_buckets` (K from the job is
:func:`shapebucket.advise.choose_k`), solved by a
divide-and-conquer dynamic programme over the distinct aligned lengths, exact because the
cost of a bucket range is Monge (``docs/fit.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

from .._lengths import MAX_BUCKET, check_lengths, round_up
from .._validate import check_int, check_number
from ..errors import ShapeBucketError
from .buckets import Buckets
from .padding import Batching, check_batching, group_weights, histogram

__all__ = ["DEFAULT_ALIGN", "Cost", "fit_buckets", "optimal_boundaries", "weighted_fit"]

#: The one default alignment of fitted buckets (``fit_buckets``, ``choose_k``,
#: ``compare_policies`` and the CLI): multiples of 8 suit tensor cores and
#: vectorised CPU kernels.
DEFAULT_ALIGN = 8
Cost = Literal["tokens", "attention"] | Callable[[int], float]


def _cost_values(cost: Cost, boundaries: np.ndarray) -> np.ndarray:
    b = boundaries.astype(np.float64)
    if isinstance(cost, str) and cost == "tokens":
        return b
    if isinstance(cost, str) and cost == "attention":
        return b * b
    if not callable(cost):
        raise ShapeBucketError(
            f"cost must be 'tokens', 'attention' or a callable length -> float, got {cost!r}"
        )
    hint = "; cost must return a finite number >= 0 for every length"
    values = np.array(
        [check_number(f"cost({int(x)})", cost(int(x)), at_least=0, hint=hint) for x in boundaries],
        dtype=np.float64,
    )
    drops = np.flatnonzero(np.diff(values) < 0)
    if drops.size:
        i = int(drops[0])
        raise ShapeBucketError(
            f"cost must not decrease with length: cost({int(boundaries[i])}) = {values[i]} > "
            f"cost({int(boundaries[i + 1])}) = {values[i + 1]}"
        )
    return values


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


def optimal_boundaries(
    cands: np.ndarray, weights: np.ndarray, costs: np.ndarray, k: int
) -> list[int]:
    """The at-most-``k`` boundaries among ``cands`` (ascending, the last always kept)
    with the least ``sum cost(boundary) * weight(lengths it covers)``: the solver
    itself, on candidates, weights and costs already checked (:func:`fit_buckets`
    prepares them from lengths; :func:`~shapebucket.fit.fit_cells` from each column).

    >>> optimal_boundaries(np.array([8, 16, 32]), np.array([5.0, 1.0, 1.0]), np.array([8.0, 16.0, 32.0]), 2)
    [8, 32]
    """
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
    k: int = 8,
    *,
    align: int = DEFAULT_ALIGN,
    max_len: int | None = None,
    batch_size: int = 1,
    batching: Batching = "bucketed",
    cost: Cost = "tokens",
) -> Buckets:
    """The at-most-``k`` aligned buckets that minimise the expected padded cost.

    Args:
        lengths: sample lengths, ints >= 1 (a sequence or 1-D array, up to tens of millions).
        k: the most buckets to return (keep it <= the recompile limit, 8; to choose it
            from the job, :func:`shapebucket.advise.choose_k`).
        align: every bucket is a multiple of this (default 8, which suits tensor
            cores; 1 fits the lengths exactly).
        max_len: the largest bucket covers ``max_len`` instead of ``max(lengths)``;
            lengths above it raise.
        batch_size: batch size, used by ``batching="random"`` only.
        batching: ``"bucketed"`` (default) if batches are formed inside a bucket
            (:class:`BucketBatchSampler`), ``"random"`` for plain shuffled batches.
        cost: ``"tokens"`` (padded length), ``"attention"`` (its square) or a
            non-decreasing callable ``length -> cost``.

    The result is exact: no aligned set of at most ``k`` boundaries covering the
    longest length has a lower objective.

    >>> fit_buckets([3, 3, 5, 9, 30], k=2)
    Buckets([8, 32])
    >>> fit_buckets([4, 4, 5, 9, 30], k=3, align=1)
    Buckets([5, 9, 30])
    """
    if isinstance(k, str):
        raise ShapeBucketError(
            f"k must be an int >= 1, got {k!r}; to choose k from the job use "
            "shapebucket.advise.choose_k(lengths, compile_seconds=, job_samples=, "
            "tokens_per_second=).chosen.k"
        )
    mode, batch_size = check_batching(batching, batch_size)
    k = check_int("k", k, minimum=1)
    align = check_int("align", align, minimum=1, maximum=MAX_BUCKET)
    arr = check_lengths(lengths)
    values, counts = histogram(arr)
    if max_len is not None:  # the largest bucket covers max_len: a candidate no sample weighs
        max_len = check_int("max_len", max_len, minimum=2, maximum=MAX_BUCKET)
        if int(values[-1]) > max_len:
            i = int(np.argmax(arr > max_len))
            raise ShapeBucketError(
                f"sample {i} has length {int(arr[i])} > max_len {max_len}; such samples would be "
                "truncated or rejected later: raise max_len, or drop/truncate them before fitting"
            )
        values, counts = np.append(values, max_len), np.append(counts, 0.0)
    return Buckets(weighted_fit(values, counts, k, align, cost=cost, batching=(mode, batch_size)))


def weighted_fit(
    values: np.ndarray,
    weights: np.ndarray,
    k: int,
    align: int,
    *,
    least: int = 2,
    cost: Cost = "tokens",
    batching: tuple[Batching, int] = ("bucketed", 1),
) -> list[int]:
    """The at-most-``k`` boundaries, multiples of ``align`` and >= ``least``, with the
    least ``sum cost(boundary) * weight`` over ``values`` (the solver's candidates and
    weights, as ``batching`` weighs them); arguments already checked."""
    rounded = np.maximum(round_up(values, align), round_up(least, align))
    cands, group = np.unique(rounded, return_inverse=True)
    grouped = group_weights(np.bincount(group, weights=weights), *batching)
    return optimal_boundaries(cands, grouped, _cost_values(cost, cands), k)
