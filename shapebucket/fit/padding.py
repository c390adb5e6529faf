"""How much a bucket set pads a length distribution: :class:`PaddingReport`, :func:`padding_report`,
and the weight of each length under the two ways batches are formed (:data:`Batching`;
``docs/fit.md``), which the bucket fit and the K choice share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

import numpy as np

from .._lengths import CheckedLengths, check_lengths
from .._validate import check_int
from ..errors import ShapeBucketError
from .buckets import Buckets, as_buckets

__all__ = ["Batching", "PaddingReport", "check_batching", "efficiency", "padding_report"]

Batching = Literal["bucketed", "random"]


def check_batching(batching: Any, batch_size: Any) -> tuple[Batching, int]:
    """``(batching, batch_size)`` checked: one of ``"bucketed"``/``"random"`` and an int >= 1."""
    if not isinstance(batching, str) or batching not in ("bucketed", "random"):
        raise ShapeBucketError(f"batching must be 'bucketed' or 'random', got {batching!r}")
    return cast(Batching, batching), check_int("batch_size", batch_size, minimum=1)


def efficiency(real: float, computed: float) -> float:
    """``real / computed``, and 1.0 when nothing is computed: the package's one rule for
    empty input ("nothing computed, nothing wasted").

    >>> efficiency(3, 4), efficiency(0, 0)
    (0.75, 1.0)
    """
    return 1.0 if computed == 0 else real / computed


def histogram(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct lengths (ascending) and their counts, of lengths already checked."""
    if int(lengths.max()) <= 1 << 26:
        counts = np.bincount(lengths)
        values = np.flatnonzero(counts)
        return values.astype(np.int64), counts[values].astype(np.float64)
    values, counts = np.unique(lengths, return_counts=True)
    return values.astype(np.int64), counts.astype(np.float64)


def group_weights(counts: np.ndarray, batching: Batching, batch_size: int) -> np.ndarray:
    """Weight of each length group (ascending): its sample count (``"bucketed"``), or
    (``"random"``) the probability that a random batch's longest sample falls in it:
    ``F(j)**B - F(j-1)**B`` for ``B`` samples drawn with replacement, ``F`` the cumulative share.

    >>> group_weights(np.array([1.0, 1.0]), "random", 2).tolist()
    [0.25, 0.75]
    """
    if batching == "bucketed":
        return counts
    cdf = np.cumsum(counts, dtype=np.float64) / float(np.sum(counts))
    cdf[-1] = 1.0
    return np.diff(cdf**batch_size, prepend=0.0)


@dataclass
class PaddingReport:
    """How much compute a bucket set spends on padding for a length distribution.

    ``token_efficiency`` is real tokens over computed (padded) tokens and
    ``attention_efficiency`` the sum of real ``length**2`` over padded
    ``bucket**2``; both are 1.0 when nothing is counted (the package's empty-input
    rule; :func:`padding_report` refuses empty lengths, so only a report built by
    hand can show it). ``num_samples`` counts the lengths, ``num_shapes`` the
    buckets some sample (``"bucketed"``) or batch (``"random"``) pads to. For
    ``batching="bucketed"`` ``share`` is the share of samples per bucket; for
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
        share = {str(b): s for b, s in self.share.items()}
        return {**asdict(self), "buckets": list(self.buckets), "share": share}

    def __str__(self) -> str:
        per = "samples" if self.batching == "bucketed" else "batches"
        lines = [
            f"{self.buckets!r}, batching={self.batching!r}, batch_size={self.batch_size}, "
            f"{self.num_samples:,} samples",
            f"token efficiency {self.token_efficiency:.1%}, attention efficiency "
            f"{self.attention_efficiency:.1%}, {self.num_shapes} shapes, mean length "
            f"{self.mean_length:.1f}, expected padded length {self.expected_padded_length:.1f}",
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
    mode, batch_size = check_batching(batching, batch_size)
    buckets = as_buckets(buckets)
    values, counts = histogram(check_lengths(lengths))
    idx = buckets.index_for_many(CheckedLengths(values))  # checked above
    bl = np.asarray(buckets.lengths, dtype=np.float64)
    n = float(counts.sum())
    real1 = float((values * counts).sum())
    real2 = float((values.astype(np.float64) ** 2 * counts).sum())
    per_bucket = group_weights(
        np.bincount(idx, weights=counts, minlength=len(buckets)), mode, batch_size
    )
    if mode == "bucketed":
        per_bucket = per_bucket / n
    exp_len = float((per_bucket * bl).sum())
    exp_len2 = float((per_bucket * bl * bl).sum())
    return PaddingReport(
        buckets=buckets,
        batching=mode,
        batch_size=batch_size,
        num_samples=int(n),
        token_efficiency=efficiency(real1 / n, exp_len),
        attention_efficiency=efficiency(real2 / n, exp_len2),
        num_shapes=int(np.count_nonzero(per_bucket > 0)),
        expected_padded_length=exp_len,
        mean_length=real1 / n,
        share={int(b): float(s) for b, s in zip(buckets.lengths, per_bucket, strict=True) if s > 0},
    )
