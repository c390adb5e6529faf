"""K from the job (:func:`choose_k`, :class:`KChoiceReport`): every bucket compiled
before training, each computed token at the step's rate (``docs/fit.md``, "K from the job")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import _torch as compat
from .._lengths import CheckedLengths
from .._validate import check_int, check_number
from ..fit.buckets import Buckets
from ..fit.optimal import DEFAULT_ALIGN, fit_buckets
from ..fit.padding import Batching, check_batching, padding_report

__all__ = ["KChoiceReport", "KEstimate", "choose_k", "recompile_limit"]


def recompile_limit(limit: int | None = None) -> int:
    """``limit``, or (``None``) the compiler's recompile limit read live (loading it then,
    never on ``import shapebucket``), as :func:`~shapebucket.prewarm` reads it.

    >>> recompile_limit(4), recompile_limit() >= 1
    (4, True)
    """
    return compat.get_recompile_limit() if limit is None else limit


@dataclass(frozen=True)
class KEstimate:
    """The estimated job for one bucket count ``k``: its fitted buckets, their token
    efficiency, the prewarm and training seconds."""

    k: int
    buckets: Buckets
    token_efficiency: float
    prewarm_seconds: float
    train_seconds: float

    @property
    def job_seconds(self) -> float:
        """Prewarm plus training."""
        return self.prewarm_seconds + self.train_seconds


@dataclass
class KChoiceReport:
    """Every ``K`` tried (``candidates``) and the one with the shortest estimated job
    (``chosen``).

    ``num_samples`` counts the dataset's lengths, ``job_samples`` the samples the
    job trains on; ``token_efficiency`` is the chosen K's. ``capped`` is true when
    the chosen K is ``max_k``, the largest tried, while a larger K would still
    change the buckets: a longer search may find a shorter job.

    >>> lengths = [5] * 900 + [60] * 100
    >>> short = choose_k(lengths, compile_seconds=10, job_samples=1_000, tokens_per_second=40_000)
    >>> long = choose_k(lengths, compile_seconds=10, job_samples=10**8, tokens_per_second=40_000)
    >>> short.chosen.k, long.chosen.k
    (1, 2)
    """

    candidates: list[KEstimate]
    chosen: KEstimate
    num_samples: int
    compile_seconds: float
    job_samples: int
    tokens_per_second: float
    max_k: int = 32
    capped: bool = False

    @property
    def buckets(self) -> Buckets:
        """The chosen K's buckets."""
        return self.chosen.buckets

    @property
    def token_efficiency(self) -> float:
        """The chosen K's token efficiency."""
        return self.chosen.token_efficiency

    def notes(self) -> list[str]:
        """What a reader of the table must know about the choice (empty when nothing)."""
        out = []
        limit = recompile_limit()
        if self.chosen.k > limit:
            out.append(
                f"K={self.chosen.k} is above the recompile limit ({limit}): shapebucket.prewarm "
                f"raises the limit for you; with torch.compile alone use "
                f"{compat.recompile_limit_fix(self.chosen.k)}"
            )
        if self.capped:
            out.append(
                f"K={self.chosen.k} is max_k, the largest K tried, and more buckets would still "
                "pad less: a larger max_k may give a shorter job"
            )
        return out

    def __str__(self) -> str:
        lines = [
            f"K from the job: {self.job_samples:,} samples to train on ({self.num_samples:,} "
            f"lengths), {self.compile_seconds:g} s to compile a bucket, "
            f"{self.tokens_per_second:,.0f} computed tokens/s",
            f"{'K':>3s} {'tokens':>7s} {'prewarm s':>10s} {'train s':>10s} {'job s':>10s}",
        ]
        for r in self.candidates:
            mark = "  <- chosen" if r is self.chosen else ""
            lines.append(
                f"{r.k:>3d} {r.token_efficiency:>7.1%} {r.prewarm_seconds:>10.0f} "
                f"{r.train_seconds:>10.0f} {r.job_seconds:>10.0f}{mark}"
            )
        lines += [f"note: {note}" for note in self.notes()]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen_k": self.chosen.k,
            "buckets": list(self.chosen.buckets),
            "num_samples": self.num_samples,
            "job_samples": self.job_samples,
            "compile_seconds": self.compile_seconds,
            "tokens_per_second": self.tokens_per_second,
            "token_efficiency": self.token_efficiency,
            "max_k": self.max_k,
            "capped": self.capped,
            "candidates": [
                {**asdict(r), "buckets": list(r.buckets), "job_seconds": r.job_seconds}
                for r in self.candidates
            ],
        }


def choose_k(
    lengths: Sequence[int] | np.ndarray,
    *,
    compile_seconds: float,
    job_samples: int,
    tokens_per_second: float,
    max_k: int = 32,
    align: int = DEFAULT_ALIGN,
    batch_size: int = 1,
    batching: Batching = "bucketed",
) -> KChoiceReport:
    """The bucket count with the shortest estimated job (``docs/fit.md``), with the table.

    Args:
        lengths: the dataset's sample lengths.
        compile_seconds: seconds to compile one bucket (forward and backward);
            ``PrewarmReport.total_seconds / len(buckets)`` of an earlier run.
        job_samples: samples the job trains on (epochs x dataset size).
        tokens_per_second: computed tokens (real + padding) per second of the step.
        max_k: the largest K tried (each K is fitted exactly, so the table stops
            growing once K covers every distinct aligned length).
        align, batch_size, batching: as for :func:`~shapebucket.fit_buckets`.

    >>> choice = choose_k([5] * 90 + [60] * 10, compile_seconds=10, job_samples=10**6,
    ...                   tokens_per_second=4e4)
    >>> choice.buckets, choice.chosen.k
    (Buckets([8, 64]), 2)
    """
    checked = CheckedLengths.of(lengths)
    compile_s = check_number("compile_seconds", compile_seconds, above=0)
    rate = check_number("tokens_per_second", tokens_per_second, above=0)
    job_samples = check_int(
        "job_samples", job_samples, minimum=1, maximum=2**53
    )  # exact as a float
    max_k = check_int("max_k", max_k, minimum=1)
    mode, batch_size = check_batching(batching, batch_size)

    def fit(k: int) -> Buckets:
        return fit_buckets(checked, k, align=align, batch_size=batch_size, batching=mode)

    per_token = 1.0 / rate  # seconds per computed token
    candidates: list[KEstimate] = []
    for k in range(1, max_k + 1):
        buckets = fit(k)
        if candidates and buckets == candidates[-1].buckets:
            break  # one more bucket changes nothing: every distinct aligned length has one
        report = padding_report(checked, buckets, batch_size=batch_size, batching=mode)
        # one row of each bucket per sample (or per batch's longest, batching="random")
        train_s = sum(job_samples * report.share.get(b, 0.0) * b * per_token for b in buckets)
        n = len(buckets)  # prewarm: one compile per bucket
        candidates.append(KEstimate(n, buckets, report.token_efficiency, n * compile_s, train_s))
    chosen = min(candidates, key=lambda r: (r.job_seconds, r.k))
    # the search stopped at max_k: would one more bucket still change the set?
    last = len(candidates) == max_k and chosen is candidates[-1]
    capped = last and fit(max_k + 1) != chosen.buckets
    return KChoiceReport(
        candidates, chosen, len(checked), compile_s, job_samples, rate, max_k=max_k, capped=capped
    )
