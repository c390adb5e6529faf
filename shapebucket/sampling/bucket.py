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
and the number of batches already consumed. Steps 1-3 are :func:`plan_steps` and
step 4 is :func:`plan_epoch`, plain functions that can be tested alone; the
sampler's settings are fixed when it builds its plan (they are read-only
attributes: make a new sampler to change one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from torch.utils.data import Sampler

from .._validate import check_int, check_lengths
from ..errors import ShapeBucketError
from ..plan.buckets import Buckets, as_buckets

__all__ = [
    "BucketBatchSampler",
    "EpochPlan",
    "ResumableBatchSampler",
    "SamplerReport",
    "StepPlan",
    "plan_epoch",
    "plan_steps",
]

Leftovers = Literal["keep", "promote"]


@dataclass(frozen=True)
class SamplerReport:
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
class StepPlan:
    """The epoch-independent part of a plan: which bucket each global step is in, and its size.

    Built by :func:`plan_steps`; the samples of each step are chosen per epoch
    by :func:`plan_epoch`.
    """

    step_bucket: np.ndarray  # bucket index of each global step, in construction order
    step_size: np.ndarray  # per-rank batch size of each step
    seg_start: np.ndarray  # per bucket: first position of its segment in the grouped order
    seg_full: np.ndarray  # per bucket: indices covered by full steps
    seg_left: np.ndarray  # per bucket: leftover indices kept as a short step (0 if none)
    stats: SamplerReport


@dataclass(frozen=True)
class EpochPlan:
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


def plan_steps(
    bucket_counts: Sequence[int] | np.ndarray,
    rows: Sequence[int],
    *,
    num_replicas: int = 1,
    drop_last: bool = False,
    leftovers: Leftovers = "keep",
) -> StepPlan:
    """Cut each bucket's samples into global steps (steps 2-3 of the module docstring).

    ``bucket_counts[j]`` samples fall in bucket ``j``, whose per-rank batch size
    is ``rows[j]``.

    >>> plan = plan_steps([5, 2], [2, 2])
    >>> plan.step_bucket.tolist(), plan.step_size.tolist(), plan.stats.short_batches
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
    shapes = len({(int(a), int(b)) for a, b in zip(sb.tolist(), ss.tolist(), strict=True)})
    stats = SamplerReport(
        num_samples=int(counts.sum()),
        batches=len(sb),
        full_batches=len(sb) - short,
        short_batches=short,
        dropped=dropped,
        duplicated=duplicated,
        promotions=promotions,
        shapes=shapes,
    )
    return StepPlan(sb, ss, seg_start, seg_full, seg_left, stats)


def plan_epoch(
    plan: StepPlan,
    bucket_index: np.ndarray,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    num_replicas: int = 1,
) -> EpochPlan:
    """The order of one epoch (steps 1 and 4 of the module docstring), from ``(seed, epoch)`` alone.

    >>> plan = plan_steps([3, 1], [2, 2])
    >>> plan_epoch(plan, np.array([0, 1, 0, 0]), seed=0, epoch=0, shuffle=False).flat.tolist()
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
    for j in range(len(plan.seg_start)):
        start, full, rest = int(plan.seg_start[j]), int(plan.seg_full[j]), int(plan.seg_left[j])
        pieces.append(grouped[start : start + full])
        if rest:
            left = grouped[start + full : start + full + rest]
            per_rank = -(-rest // R)
            pieces.append(np.resize(left, per_rank * R))  # repeats the first indices when short
    flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    widths = plan.step_size * R
    offsets = np.cumsum(widths) - widths
    order = rng.permutation(len(widths)) if rng is not None else np.arange(len(widths))
    return EpochPlan(flat, offsets[order], plan.step_size[order], plan.step_bucket[order])


def _default_distributed() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, checked; what is not given comes from ``torch.distributed``
    when it is initialised, else 1 and 0."""
    if num_replicas is None or rank is None:
        world, own = _default_distributed()
        num_replicas = world if num_replicas is None else num_replicas
        rank = own if rank is None else rank
    num_replicas = check_int("num_replicas", num_replicas, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= num_replicas:
        raise ShapeBucketError(
            f"rank {rank} is not < num_replicas {num_replicas}; ranks count from 0"
        )
    return num_replicas, rank


@dataclass(frozen=True)
class _Settings:
    buckets: Buckets
    lengths: np.ndarray
    batch_size: int | None
    tokens_per_batch: int | None
    batch_multiple: int
    rows: dict[int, int]
    shuffle: bool
    drop_last: bool
    leftovers: Leftovers
    num_replicas: int
    rank: int


class ResumableBatchSampler(Sampler[list[int]]):
    """What every shapebucket batch sampler shares: an epoch's batches are a pure function of
    ``(seed, epoch)`` and the settings, so the state is only the epoch and the number of
    batches consumed, and ``set_epoch``/``state_dict``/``load_state_dict`` behave the
    same for all of them (see :class:`BucketBatchSampler`).

    Subclasses set ``_SETTINGS`` (names that read as attributes but cannot be
    assigned) and implement :meth:`_rank_batches` and :meth:`_fingerprint`.
    """

    _SETTINGS: frozenset[str] = frozenset({"seed", "epoch"})
    _seed: int
    _epoch: int
    _position: int  # batches yielded in the current epoch
    _resume_at: int  # where the next __iter__ starts (set by load_state_dict)
    _loaded: bool  # a loaded state waits for the next __iter__
    _finished: bool  # the last pass completed ``_epoch``; the next one starts the epoch after

    def _init_state(self, seed: int) -> None:
        set_ = object.__setattr__
        set_(self, "_seed", check_int("seed", seed, minimum=0))
        set_(self, "_epoch", 0)
        set_(self, "_position", 0)
        set_(self, "_resume_at", 0)
        set_(self, "_loaded", False)
        set_(self, "_finished", False)

    def _rank_batches(self, epoch: int) -> Sequence[list[int]]:
        """This rank's batches of ``epoch``, in order (indexable; built lazily is fine)."""
        raise NotImplementedError

    def _fingerprint(self) -> str:
        raise NotImplementedError

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._SETTINGS:
            kind = type(self).__name__
            how = {
                "seed": "pass seed= to a new sampler, or load_state_dict() a saved state",
                "epoch": "call set_epoch()",
            }.get(name, f"make a new {kind}(..., {name}=...)")
            raise AttributeError(
                f"{kind}.{name} is fixed once the sampler has built its plan; {how}"
            )
        object.__setattr__(self, name, value)

    seed = property(lambda self: self._seed, doc="The seed of the order.")
    epoch = property(lambda self: self._epoch, doc="The current epoch (see :meth:`set_epoch`).")

    def __iter__(self) -> Iterator[list[int]]:
        # Nothing here runs before the first next(): a DataLoader (or StatefulDataLoader)
        # that creates an iterator and drops it unused changes no state.
        set_ = object.__setattr__
        if self._finished:  # the last pass completed this epoch: move to the next one
            set_(self, "_epoch", self._epoch + 1)
            set_(self, "_finished", False)
        batches = self._rank_batches(self._epoch)
        # a new pass starts the epoch afresh unless a state was just loaded, so an
        # abandoned iterator (e.g. next(iter(loader)) for an example) skips nothing
        start = self._resume_at
        set_(self, "_resume_at", 0)
        set_(self, "_loaded", False)
        set_(self, "_position", start)
        for t in range(start, len(batches)):
            set_(self, "_position", t + 1)
            yield batches[t]
        # The epoch is done, but the state keeps describing it (position == len) until
        # the next pass starts: a DataLoader's workers run this generator to its end
        # while the training loop is still consuming the last batches.
        set_(self, "_finished", True)

    def __len__(self) -> int:
        return len(self._rank_batches(self._epoch))

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (as ``DistributedSampler.set_epoch``); restarts the epoch.

        Right after :meth:`load_state_dict`, ``set_epoch`` with the loaded epoch keeps
        the loaded position, so the usual loop (``for epoch in range(start, n):
        sampler.set_epoch(epoch)``) resumes where the state was saved instead of
        replaying the epoch.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        set_ = object.__setattr__
        if self._loaded and epoch == self._epoch:
            return
        set_(self, "_epoch", epoch)
        set_(self, "_position", 0)
        set_(self, "_resume_at", 0)
        set_(self, "_loaded", False)
        set_(self, "_finished", False)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where this epoch stands: epoch, seed, batches done, and a configuration fingerprint.

        ``position`` is the number of this epoch's batches the sampler has
        yielded. That is what the training loop consumed when nothing fetches
        ahead: with ``num_workers=0``, and with torchdata's ``StatefulDataLoader``
        at any ``num_workers`` (it saves this state at the batch the loop is at).
        A plain ``DataLoader`` with workers pulls ``prefetch_factor x num_workers``
        batches ahead of the loop; pass ``consumed=`` the number of this epoch's
        batches your loop has finished instead (``0 <= consumed <=`` what was yielded).
        A state saved after the last batch (``position == len(sampler)``) resumes
        with the next epoch.

        >>> s = BucketBatchSampler([3, 5, 9, 12], [8, 16], batch_size=1, shuffle=False)
        >>> it = iter(s); _ = next(it); _ = next(it)
        >>> s.state_dict()["position"], s.state_dict(consumed=1)["position"]
        (2, 1)
        """
        position = self._position
        if consumed is not None:
            position = check_int("consumed", consumed, minimum=0, maximum=self._position)
        return {
            "epoch": self._epoch,
            "position": position,
            "seed": self._seed,
            "num_batches": len(self),
            "fingerprint": self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the next pass yields exactly the batches not yet consumed.

        Only the next ``__iter__`` resumes; later ones start their epoch from the
        beginning. ``set_epoch`` with the same epoch before that pass keeps the
        resume point; another epoch discards it.
        """
        seed, epoch, position = self._check_state(state)
        set_ = object.__setattr__
        set_(self, "_seed", seed)
        set_(self, "_epoch", epoch)
        set_(self, "_position", position)
        set_(self, "_resume_at", position)
        set_(self, "_loaded", True)
        set_(self, "_finished", False)

    def _check_state(self, state: Any) -> tuple[int, int, int]:
        """``(seed, epoch, position)`` of a saved state, after checking it fits this sampler."""
        if not isinstance(state, Mapping):
            raise ShapeBucketError(
                f"state must be the dict that state_dict() returned, got {type(state).__name__}"
            )
        for key in ("epoch", "position", "seed", "fingerprint"):
            if key not in state:
                raise ShapeBucketError(f"state has no {key!r}; pass what state_dict() returned")
        if state["fingerprint"] != self._fingerprint():
            raise ShapeBucketError(
                "state was saved by a sampler with other lengths, buckets, batch sizes or world size; "
                "resume with the same configuration (or start the epoch afresh with set_epoch)"
            )
        seed = check_int("state['seed']", state["seed"], minimum=0)
        epoch = check_int("state['epoch']", state["epoch"], minimum=0)
        # the number of batches of the saved epoch (a packed plan's count varies by epoch)
        total = self._count_for(seed, epoch)
        position = check_int("state['position']", state["position"], minimum=0, maximum=total)
        return seed, epoch, position

    def _count_for(self, seed: int, epoch: int) -> int:
        """Batches of ``epoch`` under ``seed``."""
        return len(self)


class BucketBatchSampler(ResumableBatchSampler):
    """Yield batches of indices whose samples all fit one bucket.

    Use it as ``DataLoader(ds, batch_sampler=sampler, collate_fn=BucketCollator(buckets))``.

    Args:
        lengths: one length per dataset index (ints >= 1, <= ``buckets.max_len``).
        buckets: the bucket lengths.
        batch_size: samples per batch (per rank), the same for every bucket. Or:
        tokens_per_batch: a token budget per batch: bucket ``b`` gets
            ``tokens_per_batch // b`` samples, rounded down to a multiple of
            ``batch_multiple``. Exactly one of the two.
        shuffle: shuffle inside buckets and across batches from ``seed`` and the
            epoch; ``False`` yields buckets in ascending order, indices sorted.
        drop_last: drop each bucket's leftover samples (counted in ``stats``).
        leftovers: ``"keep"`` (each bucket's leftover is one short batch) or
            ``"promote"`` (leftovers join the next larger bucket's batches; only
            the largest bucket can end short).
        num_replicas, rank: distributed world size and rank; read from
            ``torch.distributed`` when it is initialised, else 1 and 0.

    The settings are fixed once the plan is built: they read as attributes
    (``sampler.drop_last``) but cannot be assigned; make a new sampler instead.

    >>> s = BucketBatchSampler([3, 5, 9, 12, 4], Buckets([8, 16]), batch_size=2, shuffle=False)
    >>> list(s), len(s), s.rows
    ([[0, 1], [4], [2, 3]], 3, {8: 2, 16: 2})
    """

    _SETTINGS = frozenset(_Settings.__dataclass_fields__) | {"seed", "epoch", "bucket_index"}
    _cfg: _Settings
    _bucket_index: np.ndarray
    _plan: StepPlan

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        *,
        batch_size: int | None = None,
        tokens_per_batch: int | None = None,
        batch_multiple: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        leftovers: Leftovers = "keep",
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        table = as_buckets(buckets)
        arr = check_lengths(lengths)
        if int(arr.max()) > table.max_len:
            i = int(np.argmax(arr > table.max_len))
            raise ShapeBucketError(
                f"sample {i} has length {int(arr[i])} > largest bucket {table.max_len} of "
                f"{table!r}; add a bucket >= {int(arr[i])}, or clip the lengths you pass here "
                "and collate with overflow='truncate'"
            )
        arr = arr.copy()  # our own, read-only: the plan depends on it
        arr.flags.writeable = False
        if leftovers not in ("keep", "promote"):
            raise ShapeBucketError(f"leftovers must be 'keep' or 'promote', got {leftovers!r}")
        num_replicas, rank = resolve_world(num_replicas, rank)
        cfg = _Settings(
            buckets=table,
            lengths=arr,
            batch_size=batch_size,
            tokens_per_batch=tokens_per_batch,
            batch_multiple=batch_multiple,
            rows=_batch_sizes(table, batch_size, tokens_per_batch, batch_multiple),
            shuffle=bool(shuffle),
            drop_last=bool(drop_last),
            leftovers=leftovers,
            num_replicas=num_replicas,
            rank=rank,
        )
        index = table.index_for_many(arr).astype(np.int32)
        index.flags.writeable = False
        set_ = object.__setattr__
        set_(self, "_cfg", cfg)
        set_(self, "_bucket_index", index)
        self._init_state(seed)
        set_(
            self,
            "_plan",
            plan_steps(
                np.bincount(index, minlength=len(table)),
                [cfg.rows[b] for b in table],
                num_replicas=num_replicas,
                drop_last=cfg.drop_last,
                leftovers=leftovers,
            ),
        )

        if cfg.drop_last:
            _warn_unseen_buckets(
                self._plan, table, np.bincount(index, minlength=len(table)), leftovers
            )

    buckets = property(lambda self: self._cfg.buckets, doc="The bucket table.")
    lengths = property(lambda self: self._cfg.lengths, doc="The lengths (a read-only array).")
    batch_size = property(lambda self: self._cfg.batch_size, doc="``batch_size=`` as given.")
    tokens_per_batch = property(
        lambda self: self._cfg.tokens_per_batch, doc="``tokens_per_batch=`` as given."
    )
    batch_multiple = property(lambda self: self._cfg.batch_multiple, doc="``batch_multiple=``.")
    shuffle = property(lambda self: self._cfg.shuffle, doc="Whether batches are shuffled.")
    drop_last = property(lambda self: self._cfg.drop_last, doc="Whether leftovers are dropped.")
    leftovers = property(lambda self: self._cfg.leftovers, doc="``'keep'`` or ``'promote'``.")
    num_replicas = property(lambda self: self._cfg.num_replicas, doc="The world size.")
    rank = property(lambda self: self._cfg.rank, doc="This process's rank.")
    bucket_index = property(
        lambda self: self._bucket_index, doc="Each sample's bucket index (read-only)."
    )

    @property
    def rows(self) -> dict[int, int]:
        """Rows per bucket: ``{bucket length: per-rank batch size}`` (a copy).

        Pass it to ``BucketCollator(rows=...)`` and ``prewarm(rows=...)``
        so short batches get the same shape as full ones.
        """
        return dict(self._cfg.rows)

    def _fingerprint(self) -> str:
        cfg = self._cfg
        h = hashlib.sha1(cfg.lengths.tobytes())
        h.update(
            repr(
                (
                    cfg.buckets.lengths,
                    sorted(cfg.rows.items()),
                    cfg.shuffle,
                    cfg.drop_last,
                    cfg.leftovers,
                    cfg.num_replicas,
                )
            ).encode()
        )
        return h.hexdigest()

    # -- Sampler protocol ---------------------------------------------------------------

    def _epoch_plan(self, epoch: int) -> EpochPlan:
        return plan_epoch(
            self._plan,
            self._bucket_index,
            seed=self._seed,
            epoch=epoch,
            shuffle=self._cfg.shuffle,
            num_replicas=self._cfg.num_replicas,
        )

    def _rank_batches(self, epoch: int) -> Sequence[list[int]]:
        return RankBatches(self._epoch_plan(epoch), self._cfg.rank)

    def __len__(self) -> int:
        return self._plan.stats.batches

    @property
    def stats(self) -> SamplerReport:
        """Counts for one epoch: batches, dropped and duplicated samples, shapes."""
        return self._plan.stats

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The bucket length of every batch of ``epoch`` (default: the current one), in order."""
        plan = self._epoch_plan(self._epoch if epoch is None else epoch)
        return np.asarray(self.buckets.lengths)[plan.buckets]

    def __repr__(self) -> str:
        cfg = self._cfg
        size = (
            f"batch_size={cfg.batch_size}"
            if cfg.batch_size is not None
            else f"tokens_per_batch={cfg.tokens_per_batch}"
        )
        return (
            f"BucketBatchSampler({len(cfg.lengths):,} samples, {cfg.buckets!r}, {size}, shuffle={cfg.shuffle}, "
            f"drop_last={cfg.drop_last}, leftovers={cfg.leftovers!r}, rank {cfg.rank}/{cfg.num_replicas}, "
            f"{len(self)} batches)"
        )


class RankBatches(Sequence[list[int]]):
    """One rank's batches of an epoch plan (anything with ``len()`` and
    ``batch(step, rank)``: :class:`EpochPlan`, :class:`~shapebucket.plan.packing.PackedEpoch`),
    sliced when asked for."""

    def __init__(self, plan: Any, rank: int) -> None:
        self._plan, self._rank = plan, rank

    def __len__(self) -> int:
        return len(self._plan)

    def __getitem__(self, t: int) -> list[int]:  # type: ignore[override]
        return self._plan.batch(t, self._rank)


def _warn_unseen_buckets(
    plan: StepPlan, buckets: Buckets, counts: np.ndarray, leftovers: Leftovers
) -> None:
    """drop_last=True silently loses a whole bucket when it holds fewer samples than one
    (global) batch: often the longest samples of the dataset. Say so."""
    seen = np.bincount(plan.step_bucket, minlength=len(buckets)) > 0
    lost = [j for j in range(len(buckets)) if counts[j] and not seen[j]]
    if not lost:
        return
    import warnings

    names = [buckets.lengths[j] for j in lost]
    n = int(sum(counts[j] for j in lost))
    warnings.warn(
        f"drop_last=True drops every sample of bucket(s) {names} ({n} samples, "
        f"{plan.stats.dropped} dropped in all): each holds fewer samples than one batch, so "
        "they are never trained on. Pass "
        + (
            ""
            if leftovers == "promote"
            else "leftovers='promote' (leftovers join the next larger bucket) or "
        )
        + "drop_last=False (short batches, padded to full ones with the collator's rows)",
        stacklevel=3,
    )


def _batch_sizes(
    buckets: Buckets, batch_size: int | None, tokens_per_batch: int | None, batch_multiple: int
) -> dict[int, int]:
    if (batch_size is None) == (tokens_per_batch is None):
        raise ShapeBucketError(
            f"pass exactly one of batch_size and tokens_per_batch, got batch_size={batch_size!r}, tokens_per_batch={tokens_per_batch!r}"
        )
    multiple = check_int("batch_multiple", batch_multiple, minimum=1)
    if batch_size is not None:
        size = check_int("batch_size", batch_size, minimum=1)
        return {b: size for b in buckets}
    budget = check_int("tokens_per_batch", tokens_per_batch, minimum=1)
    largest = buckets.max_len
    if budget // largest < multiple:
        raise ShapeBucketError(
            f"tokens_per_batch={budget} gives the largest bucket {largest} fewer than batch_multiple={multiple} "
            f"samples; use tokens_per_batch >= {largest * multiple}"
        )
    return {b: (budget // b) // multiple * multiple for b in buckets}
