"""Bucketed batch composition: pure functions that cut each group's samples into batches.

A group is a bucket (:class:`~shapebucket.sampling.BucketBatchSampler`) or a ``(source,
target)`` cell (:class:`~shapebucket.sampling.CellBatchSampler`). An epoch is planned from
``(seed, epoch)`` alone in four steps (``docs/sampler.md``, "How an epoch is planned"):
:func:`cut_steps` does steps 2-3 (the same every epoch: global steps of ``num_replicas *
rows`` indices, and the leftovers), :func:`epoch_batches` steps 1 and 4 (the shuffles).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..errors import ShapeBucketError
from .buckets import Buckets

__all__ = [
    "EpochBatches",
    "GlobalSteps",
    "Leftovers",
    "SamplerReport",
    "check_longest",
    "cut_steps",
    "epoch_batches",
]

Leftovers = Literal["keep", "promote"]


@dataclass(frozen=True)
class SamplerReport:
    """What one epoch of a sampler does with the samples (this rank's batches; the same
    every epoch for bucket and cell samplers, the current epoch's for the packed one).

    ``dropped`` samples are in no batch (``drop_last=True``); ``duplicated``
    counts index repeats added so every rank gets equally many samples in a
    short step; ``promotions`` counts leftover moves to the next bucket (a
    sample moved up two buckets counts twice). ``num_shapes`` is the number of
    distinct ``(rows, bucket)`` pairs of the steps, before the collator pads rows
    (with ``leftovers="promote"`` a batch made only of promoted samples is
    collated at their smaller bucket: ``sampler.shapes()`` lists those).

    >>> from shapebucket.sampling import BucketBatchSampler
    >>> s = BucketBatchSampler([3, 5, 9, 12, 4], [8, 16], rows=2, drop_last=True)
    >>> s.stats.batches, s.stats.dropped, s.stats.num_shapes
    (2, 1, 2)
    """

    num_samples: int
    batches: int
    full_batches: int
    short_batches: int
    dropped: int
    duplicated: int
    promotions: int
    num_shapes: int


@dataclass(frozen=True)
class GlobalSteps:
    """The epoch-independent part of batching: which bucket each global step is in, and its size.

    Built by :func:`cut_steps`; the samples of each step are chosen per epoch
    by :func:`epoch_batches`.
    """

    step_bucket: np.ndarray  # bucket index of each global step, in construction order
    step_size: np.ndarray  # per-rank rows of each step
    seg_start: np.ndarray  # per bucket: first position of its segment in the grouped order
    seg_full: np.ndarray  # per bucket: indices covered by full steps
    seg_left: np.ndarray  # per bucket: leftover indices kept as a short step (0 if none)
    stats: SamplerReport


@dataclass(frozen=True)
class EpochBatches:
    """One epoch's order: global step ``t`` is ``flat[offsets[t]:][: num_replicas * sizes[t]]``,
    rank ``r`` taking the ``r``-th slice of ``sizes[t]`` indices; ``buckets[t]`` is its bucket index."""

    flat: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    buckets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)

    def batch(self, step: int, rank: int = 0) -> list[int]:
        """Rank ``rank``'s indices of global step ``step``."""
        s = int(self.sizes[step])
        lo = int(self.offsets[step]) + rank * s
        return self.flat[lo : lo + s].tolist()


def check_longest(lengths: np.ndarray, table: Buckets, *, limit: str, fix: str) -> None:
    """Refuse a sample longer than ``table.max_len``, naming it: ``limit`` is what the message
    calls the longest bucket, ``fix`` how to repair it (``{length}`` is filled in).

    >>> check_longest(np.array([3, 40]), Buckets([8, 32]), limit="largest bucket", fix="add a bucket >= {length}")
    Traceback (most recent call last):
    ...
    shapebucket.errors.ShapeBucketError: sample 1 has length 40 > largest bucket 32 of Buckets([8, 32]); add a bucket >= 40
    """
    if int(lengths.max()) > table.max_len:
        i = int(np.argmax(lengths > table.max_len))
        n = int(lengths[i])
        raise ShapeBucketError(
            f"sample {i} has length {n} > {limit} {table.max_len} of {table!r}; "
            + fix.format(length=n)
        )


def cut_steps(
    bucket_counts: Sequence[int] | np.ndarray,
    rows: Sequence[int],
    *,
    num_replicas: int = 1,
    drop_last: bool = False,
    leftovers: Leftovers = "keep",
) -> GlobalSteps:
    """Cut each bucket's samples into global steps (steps 2-3 of ``docs/sampler.md``).

    ``bucket_counts[j]`` samples fall in bucket ``j``, whose per-rank batch has
    ``rows[j]`` rows.

    >>> steps = cut_steps([5, 2], [2, 2])
    >>> steps.step_bucket.tolist(), steps.step_size.tolist(), steps.stats.short_batches
    ([0, 0, 0, 1], [2, 2, 1, 2], 1)
    """
    counts = np.asarray(bucket_counts, dtype=np.int64)
    R = num_replicas
    step_bucket: list[np.ndarray] = []
    step_size: list[np.ndarray] = []
    seg_start = np.zeros(len(counts), dtype=np.int64)
    seg_full = np.zeros(len(counts), dtype=np.int64)
    seg_left = np.zeros(len(counts), dtype=np.int64)
    dropped = duplicated = promotions = short = 0
    pos, carry = 0, 0
    last = len(counts) - 1
    for j, (n, bs) in enumerate(zip(counts.tolist(), rows, strict=True)):
        seg_start[j] = pos - carry
        total = n + carry
        g = R * bs
        full, rest = divmod(total, g)
        seg_full[j] = full * g
        step_bucket.append(np.full(full, j))
        step_size.append(np.full(full, bs))
        carry = 0
        if rest:
            if leftovers == "promote" and j < last:
                carry = rest
                promotions += rest
            elif drop_last:
                dropped += rest
            else:
                per_rank = -(-rest // R)
                duplicated += per_rank * R - rest
                seg_left[j] = rest
                step_bucket.append(np.array([j]))
                step_size.append(np.array([per_rank]))
                short += 1
        pos += n
    sb = np.concatenate(step_bucket).astype(np.int64)
    ss = np.concatenate(step_size).astype(np.int64)
    stats = _report(
        counts, sb, ss, short=short, dropped=dropped, duplicated=duplicated, promotions=promotions
    )
    return GlobalSteps(sb, ss, seg_start, seg_full, seg_left, stats)


def _report(
    counts: np.ndarray,
    step_bucket: np.ndarray,
    step_size: np.ndarray,
    *,
    short: int,
    dropped: int,
    duplicated: int,
    promotions: int,
) -> SamplerReport:
    """What a cut does with the samples: its steps, their distinct shapes, and what became
    of the leftovers (``short`` of the steps are short ones)."""
    pairs = zip(step_bucket.tolist(), step_size.tolist(), strict=True)
    return SamplerReport(
        num_samples=int(counts.sum()),
        batches=len(step_bucket),
        full_batches=len(step_bucket) - short,
        short_batches=short,
        dropped=dropped,
        duplicated=duplicated,
        promotions=promotions,
        num_shapes=len({(int(a), int(b)) for a, b in pairs}),
    )


def epoch_batches(
    steps: GlobalSteps,
    bucket_index: np.ndarray,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    num_replicas: int = 1,
) -> EpochBatches:
    """The order of one epoch (steps 1 and 4 of ``docs/sampler.md``), from ``(seed, epoch)`` alone.

    >>> steps = cut_steps([3, 1], [2, 2])
    >>> epoch_batches(steps, np.array([0, 1, 0, 0]), seed=0, epoch=0, shuffle=False).flat.tolist()
    [0, 2, 3, 1]
    """
    R = num_replicas
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(len(bucket_index))
        grouped = perm[np.argsort(bucket_index[perm], kind="stable")]
    else:
        rng = None
        grouped = np.argsort(bucket_index, kind="stable")
    pieces = []
    for j in range(len(steps.seg_start)):
        start, full, rest = int(steps.seg_start[j]), int(steps.seg_full[j]), int(steps.seg_left[j])
        pieces.append(grouped[start : start + full])
        if rest:
            left = grouped[start + full : start + full + rest]
            per_rank = -(-rest // R)
            pieces.append(np.resize(left, per_rank * R))  # repeats the first indices when short
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    widths = steps.step_size * R
    offsets = np.cumsum(widths) - widths
    order = rng.permutation(len(widths)) if rng is not None else np.arange(len(widths))
    return EpochBatches(flat, offsets[order], steps.step_size[order], steps.step_bucket[order])
