"""Collation counters: what a :class:`~shapebucket.BucketCollator` (or a
:class:`~shapebucket.collate.CellCollator`) did, exact across DataLoader workers and
threads (shared memory, one lock per batch update)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.context
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BucketKey", "CollateReport", "SharedCounters"]

#: What a batch is counted under: its bucket length, or a ``(source, target)`` cell.
BucketKey = int | tuple[int, ...]


@dataclass
class CollateReport:
    """A snapshot of one collator's counters (``collator.stats``).

    The counters are exact with DataLoader workers: every worker's copy of the
    collator adds to the same shared counters (fork and spawn alike), and each
    batch's update is atomic, also when several threads share one collator.
    Only a copy made outside a DataLoader (``pickle.dumps``, ``copy.deepcopy``)
    starts from zero. A :class:`~shapebucket.collate.CellCollator` counts both lengths:
    its tokens are source plus target tokens, and ``batches_per_bucket`` is keyed by
    the ``(source, target)`` cell.

    >>> from shapebucket import BucketCollator
    >>> collate = BucketCollator([8])
    >>> _ = collate([[1, 2, 3], [4]])
    >>> collate.stats.real_tokens, collate.stats.padded_tokens, collate.stats.batches_per_bucket
    (4, 12, {8: 1})
    """

    batches: int = 0
    num_samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    pad_rows: int = 0
    truncated_samples: int = 0
    truncated_tokens: int = 0
    batches_per_bucket: dict[BucketKey, int] = field(default_factory=dict)

    @property
    def token_efficiency(self) -> float:
        """Real tokens / computed tokens (real + padding). With no tokens counted (before
        any batch, or batches of empty samples only) it is 1.0: nothing computed, nothing
        wasted."""
        total = self.real_tokens + self.padded_tokens
        return self.real_tokens / total if total else 1.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["token_efficiency"] = self.token_efficiency
        return out


#: the counters, in the shared array's order (``batches_per_bucket`` follows them)
_COUNTERS = tuple(f.name for f in dataclasses.fields(CollateReport))[:-1]


class SharedCounters:
    """A collator's counters in shared memory, one int64 per counter and per bucket (or cell).

    DataLoader workers get the same memory: forked workers inherit it, and
    spawned ones receive it while the DataLoader starts them (multiprocessing
    passes shared memory to a process it is starting). Any other pickle (a
    checkpoint, ``copy.deepcopy``) carries settings only and starts at zero.
    The array's lock makes each batch's update atomic across threads and processes.
    """

    def __init__(self, buckets: tuple[BucketKey, ...]) -> None:
        self.buckets = buckets
        self.array: Any = _new_array(len(_COUNTERS) + len(buckets))

    def add(self, bucket: BucketKey, **counts: int) -> None:
        """Count one batch at ``bucket``, atomically: ``counts`` by the report's names
        (``batches`` is 1, a counter not named 0)."""
        values = [1, *(counts.get(name, 0) for name in _COUNTERS[1:])]
        with self.array.get_lock():
            a = self.array.get_obj()
            for i, v in enumerate(values):
                a[i] += v
            a[len(_COUNTERS) + self.buckets.index(bucket)] += 1

    def snapshot(self) -> CollateReport:
        with self.array.get_lock():
            a = list(self.array.get_obj())
        n = len(_COUNTERS)
        per_bucket = {b: c for b, c in zip(self.buckets, a[n:], strict=True) if c}
        return CollateReport(
            **dict(zip(_COUNTERS, a[:n], strict=True)), batches_per_bucket=per_bucket
        )

    def reset(self) -> None:
        with self.array.get_lock():
            self.array.get_obj()[:] = [0] * len(self.array)

    def __getstate__(self) -> dict[str, Any]:
        spawning = multiprocessing.context.get_spawning_popen() is not None
        return {"buckets": self.buckets, "array": self.array if spawning else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.buckets = state["buckets"]
        array = state["array"]
        self.array = array if array is not None else _new_array(len(_COUNTERS) + len(self.buckets))


def _new_array(n: int) -> Any:
    # A lock made in the spawn context can go to spawned and forkserver workers (a
    # fork-context lock refuses to) and is inherited by forked ones like any other.
    return multiprocessing.get_context("spawn").Array("q", n)
