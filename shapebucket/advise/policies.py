"""The policy table: multiples, powers of two, quantiles and the fitted buckets side by side
(``compare_policies``, what ``python -m shapebucket suggest`` prints)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lengths import CheckedLengths, round_up
from .._validate import check_int
from ..fit.buckets import Buckets
from ..fit.optimal import DEFAULT_ALIGN, Cost, fit_buckets
from ..fit.padding import Batching, PaddingReport, check_batching, padding_report
from .kchoice import recompile_limit

__all__ = ["PolicyReport", "compare_policies", "quantile_buckets"]


@dataclass
class PolicyReport:
    """One :class:`PaddingReport` per policy (``policies``: ``(name, report)`` pairs),
    printable as one table; ``fitted`` is the last policy's buckets. A policy with more
    buckets than ``limit`` (default: the compiler's recompile limit, read live when the
    table is shown) is marked, with a note on what that costs and the fix.

    >>> table = compare_policies([5, 9, 17, 30, 64], k=2)
    >>> [name for name, _ in table.policies][:2], table.fitted
    (['multiples of 8', 'multiples of 32'], Buckets([32, 64]))
    """

    policies: list[tuple[str, PaddingReport]]
    limit: int | None = None  # None: the compiler's, read live when shown

    @property
    def num_samples(self) -> int:
        """The lengths every policy was measured on."""
        return self.policies[0][1].num_samples

    @property
    def fitted(self) -> Buckets:
        """The fitted buckets (the last policy)."""
        return self.policies[-1][1].buckets

    def __str__(self) -> str:
        first = self.policies[0][1]
        lines = [
            f"{first.num_samples:,} samples, mean length {first.mean_length:.1f}, "
            f"batching={first.batching!r}, batch_size={first.batch_size}",
            f"{'policy':<18s} {'buckets':>7s} {'shapes':>6s} {'tokens':>7s} {'attention':>9s}  boundaries",
        ]
        over, limit = False, recompile_limit(self.limit)
        for name, r in self.policies:
            mark = " (over recompile limit)" if len(r.buckets) > limit else ""
            over = over or bool(mark)
            shown = (
                list(r.buckets)
                if len(r.buckets) <= 10
                else [*list(r.buckets)[:4], "...", *list(r.buckets)[-2:]]
            )
            lines.append(
                f"{name:<18s} {len(r.buckets):>7d} {r.num_shapes:>6d} {r.token_efficiency:>7.1%} "
                f"{r.attention_efficiency:>9.1%}  {shown}{mark}"
            )
        if over:
            lines.append(
                f"over recompile limit: more than {limit} buckets, one compile each; past "
                "it torch.compile alone runs eagerly: shapebucket.prewarm raises the limit"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": recompile_limit(self.limit),
            "num_samples": self.num_samples,
            "policies": [{"policy": n, **r.to_dict()} for n, r in self.policies],
        }


def quantile_buckets(lengths: np.ndarray, k: int, align: int = DEFAULT_ALIGN) -> Buckets:
    """Boundaries at the ``i/k`` quantiles of checked ``lengths`` (rounded up to ``align``),
    as fairseq-style percentile bucketing does; the last one covers the longest length.
    (More quantiles than lengths add nothing, so at most ``len(lengths)`` are taken.)

    >>> quantile_buckets(np.array([3, 5, 9, 30]), 2)
    Buckets([16, 32])
    """
    k = min(k, len(lengths))
    qs = np.quantile(lengths, np.arange(1, k + 1) / k, method="higher").astype(np.int64)
    qs = np.maximum(round_up(qs, align), round_up(2, align))
    return Buckets(np.unique(qs).tolist())


def _used_multiples(lengths: np.ndarray, of: int) -> Buckets:
    """The multiples of ``of`` that some sample pads to: the shapes that policy compiles
    (not every multiple up to the longest: 12 million for one outlier of 10**8)."""
    return Buckets(np.unique(round_up(np.maximum(lengths, 2), of)).tolist())


def compare_policies(
    lengths: Sequence[int] | np.ndarray,
    k: int = 8,
    *,
    align: int = DEFAULT_ALIGN,
    batch_size: int = 1,
    batching: Batching = "bucketed",
    cost: Cost = "tokens",
    limit: int | None = None,
) -> PolicyReport:
    """One table: multiples of 8 and 32, powers of two, quantiles and the fitted buckets.

    The multiples policies list the multiples some sample pads to (the shapes they
    would compile), so the table costs the same whatever the longest length.

    >>> print(compare_policies([5, 9, 17, 30, 64], k=2).policies[-1][0])
    fitted (k=2)
    """
    mode, batch_size = check_batching(batching, batch_size)
    checked = CheckedLengths.of(lengths)
    arr = checked.array
    k = check_int("k", k, minimum=1)
    if limit is not None:
        limit = check_int("limit", limit, minimum=1)
    fitted = fit_buckets(checked, k, align=align, batch_size=batch_size, batching=mode, cost=cost)
    top = max(int(arr.max()), 2)
    policies: list[tuple[str, Buckets]] = [
        ("multiples of 8", _used_multiples(arr, 8)),
        ("multiples of 32", _used_multiples(arr, 32)),
        ("powers of two", Buckets.powers_of_two(top, min_len=min(8, top))),
        (f"quantiles (k={k})", quantile_buckets(arr, k, align)),
        (f"fitted (k={k})", fitted),
    ]
    return PolicyReport(
        policies=[
            (name, padding_report(checked, b, batch_size=batch_size, batching=mode))
            for name, b in policies
        ],
        limit=limit,
    )
