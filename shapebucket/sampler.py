"""``BucketBatchSampler``: batches formed inside one bucket, distributed and resumable.

An epoch's plan is built with numpy from ``(seed, epoch)`` alone:

1. indices are shuffled (``shuffle=True``) and stably grouped by bucket, so each
   bucket's indices are contiguous and shuffled inside it (or sorted, unshuffled);
2. each bucket is cut into *global steps* of ``num_replicas * batch_size(bucket)``
   indices; rank ``r`` takes the ``r``-th slice of every step, so all ranks are
   in the same bucket at the same step and get disjoint samples;
3. what is left of a bucket is a *leftover*: dropped (``drop_last=True``),
   promoted into the next larger bucket (``leftovers="promote"``; the largest
   bucket's remainder stays), or kept as one short step. A short step is split
   evenly across ranks; when it does not divide, the first few of its indices
   are repeated so every rank gets the same count (counted in ``stats``);
4. steps are shuffled across buckets (``shuffle=True``) with the same generator.

Because the plan depends on nothing else, ``state_dict`` only needs the epoch
and the number of batches already yielded.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from torch.utils.data import Sampler

from .buckets import Buckets, _check_int, as_buckets
from .errors import ShapeBucketError

__all__ = ["BucketBatchSampler", "SamplerStats"]


@dataclass(frozen=True)
class SamplerStats:
    """What one epoch of a sampler does with the samples (identical every epoch).

    ``dropped`` samples are in no batch (``drop_last=True``); ``duplicated``
    counts index repeats added so every rank gets equally many samples in a
    short step; ``promotions`` counts leftover moves to the next bucket (a
    sample moved up two buckets counts twice). ``shapes`` is the number of
    distinct planned ``(batch size, bucket)`` pairs, before any ``pad_batch_to``
    in the collator (with ``leftovers="promote"`` a batch made only of promoted
    samples is collated at their smaller bucket; see ``docs/sampler.md``).

    >>> s = BucketBatchSampler([3, 5, 9, 12, 4], [8, 16], batch_size=2, drop_last=True)
    >>> s.stats.batches, s.stats.dropped, s.stats.shapes
    (2, 1, 2)
    """

    num_samples: int
    batches: int
    full_batches: int
    short_batches: int
    dropped: int
    duplicated: int
    promotions: int
    shapes: int


@dataclass(frozen=True)
class _Skeleton:
    """The epoch-independent part of the plan."""

    step_bucket: np.ndarray  # bucket index of each global step, in construction order
    step_size: np.ndarray  # per-rank batch size of each step
    seg_start: (
        np.ndarray
    )  # per bucket: first position of its effective segment in the grouped order
    seg_full: np.ndarray  # per bucket: indices covered by full steps
    seg_left: np.ndarray  # per bucket: leftover indices kept as a short step (0 if none)
    stats: SamplerStats


def _default_distributed() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class BucketBatchSampler(Sampler[list[int]]):
    """Yield batches of indices whose samples all fit one bucket.

    Use it as ``DataLoader(ds, batch_sampler=sampler, collate_fn=BucketCollator(buckets))``.

    Args:
        lengths: one length per dataset index (ints >= 1, <= ``buckets.max_len``).
        buckets: the bucket lengths.
        batch_size: samples per batch (per rank), the same for every bucket. Or:
        max_tokens: a token budget per batch: bucket ``b`` gets
            ``max_tokens // b`` samples, rounded down to a multiple of
            ``batch_multiple``. Exactly one of the two.
        shuffle: shuffle inside buckets and across batches from ``seed`` and the
            epoch; ``False`` yields buckets in ascending order, indices sorted.
        drop_last: drop each bucket's leftover samples (counted in ``stats``).
        leftovers: ``"keep"`` (each bucket's leftover is one short batch) or
            ``"promote"`` (leftovers join the next larger bucket's batches; only
            the largest bucket can end short).
        num_replicas, rank: distributed world size and rank; read from
            ``torch.distributed`` when it is initialised, else 1 and 0.

    >>> s = BucketBatchSampler([3, 5, 9, 12, 4], Buckets([8, 16]), batch_size=2, shuffle=False)
    >>> list(s), len(s), s.batch_sizes
    ([[0, 1], [4], [2, 3]], 3, {8: 2, 16: 2})
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        batch_multiple: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        leftovers: Literal["keep", "promote"] = "keep",
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        self.buckets = as_buckets(buckets)
        self.lengths = self._check_lengths(lengths)
        self.bucket_index = self.buckets.index_for_many(self.lengths).astype(np.int32)
        self.batch_sizes = self._batch_sizes(batch_size, max_tokens, batch_multiple)
        self.batch_size, self.max_tokens, self.batch_multiple = (
            batch_size,
            max_tokens,
            batch_multiple,
        )
        if leftovers not in ("keep", "promote"):
            raise ShapeBucketError(f"leftovers must be 'keep' or 'promote', got {leftovers!r}")
        self.leftovers = leftovers
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = _check_int("seed", seed)
        if num_replicas is None or rank is None:
            world, own = _default_distributed()
            num_replicas = world if num_replicas is None else num_replicas
            rank = own if rank is None else rank
        self.num_replicas = _check_int("num_replicas", num_replicas, minimum=1)
        self.rank = _check_int("rank", rank, minimum=0)
        if self.rank >= self.num_replicas:
            raise ShapeBucketError(
                f"rank {self.rank} is not < num_replicas {self.num_replicas}; ranks count from 0"
            )
        self.epoch = 0
        self._position = 0  # batches yielded in the current epoch
        self._resume_at = 0  # where the next __iter__ starts (set by load_state_dict)
        self._skeleton = self._build_skeleton()

    # -- validation ---------------------------------------------------------------

    def _check_lengths(self, lengths: Any) -> np.ndarray:
        arr = np.asarray(lengths)
        if arr.ndim != 1 or arr.size == 0:
            raise ShapeBucketError(
                f"lengths must be a non-empty 1-D sequence of ints, got shape {arr.shape}"
            )
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise ShapeBucketError(
                f"lengths must be ints, got dtype {arr.dtype} (index 0 is {arr[0]!r})"
            )
        arr = arr.astype(np.int64, copy=False)
        bad = np.flatnonzero(arr < 1)
        if bad.size:
            i = int(bad[0])
            raise ShapeBucketError(
                f"sample {i} has length {int(arr[i])}; lengths must be >= 1 (filter out empty samples first)"
            )
        over = np.flatnonzero(arr > self.buckets.max_len)
        if over.size:
            i = int(over[0])
            raise ShapeBucketError(
                f"sample {i} has length {int(arr[i])} > largest bucket {self.buckets.max_len} of "
                f"{self.buckets!r}; add a bucket >= {int(arr[i])}, or clip the lengths you pass here "
                "and collate with overflow='truncate'"
            )
        return arr

    def _batch_sizes(
        self, batch_size: int | None, max_tokens: int | None, batch_multiple: int
    ) -> dict[int, int]:
        if (batch_size is None) == (max_tokens is None):
            raise ShapeBucketError(
                f"pass exactly one of batch_size and max_tokens, got batch_size={batch_size!r}, max_tokens={max_tokens!r}"
            )
        multiple = _check_int("batch_multiple", batch_multiple, minimum=1)
        if batch_size is not None:
            size = _check_int("batch_size", batch_size, minimum=1)
            return {b: size for b in self.buckets}
        budget = _check_int("max_tokens", max_tokens, minimum=1)
        largest = self.buckets.max_len
        if budget // largest < multiple:
            raise ShapeBucketError(
                f"max_tokens={budget} gives the largest bucket {largest} fewer than batch_multiple={multiple} "
                f"samples; use max_tokens >= {largest * multiple}"
            )
        return {b: (budget // b) // multiple * multiple for b in self.buckets}

    def _fingerprint(self) -> str:
        h = hashlib.sha1(self.lengths.tobytes())
        h.update(
            repr(
                (
                    self.buckets.lengths,
                    sorted(self.batch_sizes.items()),
                    self.shuffle,
                    self.drop_last,
                    self.leftovers,
                    self.num_replicas,
                )
            ).encode()
        )
        return h.hexdigest()

    # -- the plan -------------------------------------------------------------------

    def _build_skeleton(self) -> _Skeleton:
        counts = np.bincount(self.bucket_index, minlength=len(self.buckets))
        R = self.num_replicas
        sizes = [self.batch_sizes[b] for b in self.buckets]
        step_bucket: list[np.ndarray] = []
        step_size: list[np.ndarray] = []
        seg_start = np.zeros(len(counts), dtype=np.int64)
        seg_full = np.zeros(len(counts), dtype=np.int64)
        seg_left = np.zeros(len(counts), dtype=np.int64)
        dropped = duplicated = promotions = short = 0
        pos, carry = 0, 0
        last = len(counts) - 1
        for j, (n, bs) in enumerate(zip(counts.tolist(), sizes, strict=True)):
            seg_start[j] = pos - carry
            total = n + carry
            g = R * bs
            full, rest = divmod(total, g)
            seg_full[j] = full * g
            step_bucket.append(np.full(full, j))
            step_size.append(np.full(full, bs))
            carry = 0
            if rest:
                if self.leftovers == "promote" and j < last:
                    carry = rest
                    promotions += rest
                elif self.drop_last:
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
        shapes = len({(int(a), int(b)) for a, b in zip(sb.tolist(), ss.tolist(), strict=True)})
        stats = SamplerStats(
            num_samples=len(self.lengths),
            batches=len(sb),
            full_batches=len(sb) - short,
            short_batches=short,
            dropped=dropped,
            duplicated=duplicated,
            promotions=promotions,
            shapes=shapes,
        )
        return _Skeleton(sb, ss, seg_start, seg_full, seg_left, stats)

    def _epoch_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(flat, offsets, sizes, buckets)``: step ``t`` is ``flat[offsets[t]:][: R * sizes[t]]``."""
        sk = self._skeleton
        R = self.num_replicas
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            perm = rng.permutation(len(self.lengths))
            grouped = perm[np.argsort(self.bucket_index[perm], kind="stable")]
        else:
            rng = None
            grouped = np.argsort(self.bucket_index, kind="stable")
        pieces = []
        for j in range(len(self.buckets)):
            start = int(sk.seg_start[j])
            pieces.append(grouped[start : start + int(sk.seg_full[j])])
            rest = int(sk.seg_left[j])
            if rest:
                left = grouped[start + int(sk.seg_full[j]) : start + int(sk.seg_full[j]) + rest]
                per_rank = -(-rest // R)
                pieces.append(np.resize(left, per_rank * R))  # repeats the first indices when short
        flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        widths = sk.step_size * R
        offsets = np.cumsum(widths) - widths
        order = rng.permutation(len(widths)) if rng is not None else np.arange(len(widths))
        return flat, offsets[order], sk.step_size[order], sk.step_bucket[order]

    # -- Sampler protocol ---------------------------------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        flat, offsets, sizes, _ = self._epoch_plan(self.epoch)
        r = self.rank
        # a new iteration starts the epoch afresh unless a state was just loaded, so an
        # abandoned iterator (e.g. next(iter(loader)) for an example) skips nothing
        start, self._resume_at = self._resume_at, 0
        self._position = start
        for t in range(start, len(offsets)):
            s = int(sizes[t])
            lo = int(offsets[t]) + r * s
            self._position = t + 1
            yield flat[lo : lo + s].tolist()
        # a full pass ends the epoch; set_epoch() overrides
        self.epoch += 1
        self._position = 0

    def __len__(self) -> int:
        return self._skeleton.stats.batches

    @property
    def stats(self) -> SamplerStats:
        """Counts for one epoch: batches, dropped and duplicated samples, shapes."""
        return self._skeleton.stats

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The bucket length of every batch of ``epoch`` (default: the current one), in order."""
        _, _, _, bidx = self._epoch_plan(self.epoch if epoch is None else epoch)
        return np.asarray(self.buckets.lengths)[bidx]

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (as ``DistributedSampler.set_epoch``); restarts the epoch."""
        self.epoch = _check_int("epoch", epoch, minimum=0)
        self._position = self._resume_at = 0

    def state_dict(self) -> dict[str, Any]:
        """Epoch, seed and the number of batches this sampler has yielded in the epoch.

        A DataLoader fetches ahead of the training loop (``prefetch_factor`` x
        ``num_workers`` batches), so with workers set ``state["position"]`` to the
        number of batches your loop actually consumed before saving.
        """
        return {
            "epoch": self.epoch,
            "position": self._position,
            "seed": self.seed,
            "num_batches": len(self),
            "fingerprint": self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next iteration yields exactly the batches not yet yielded.

        Only the next ``__iter__`` resumes; later ones start their epoch from the beginning.
        """
        for key in ("epoch", "position", "seed", "fingerprint"):
            if key not in state:
                raise ShapeBucketError(f"state has no {key!r}; pass what state_dict() returned")
        if state["fingerprint"] != self._fingerprint():
            raise ShapeBucketError(
                "state was saved by a sampler with other lengths, buckets, batch sizes or world size; "
                "resume with the same configuration (or start the epoch afresh with set_epoch)"
            )
        position = state["position"]
        if not isinstance(position, numbers.Integral) or not 0 <= int(position) <= len(self):
            raise ShapeBucketError(f"state position {position!r} is outside 0..{len(self)}")
        self.seed = _check_int("seed", state["seed"])
        self.epoch = _check_int("epoch", state["epoch"], minimum=0)
        self._position = self._resume_at = int(position)

    def __repr__(self) -> str:
        size = (
            f"batch_size={self.batch_size}"
            if self.batch_size is not None
            else f"max_tokens={self.max_tokens}"
        )
        return (
            f"BucketBatchSampler({len(self.lengths):,} samples, {self.buckets!r}, {size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, leftovers={self.leftovers!r}, rank {self.rank}/{self.num_replicas}, "
            f"{len(self)} batches)"
        )
