"""``ResumableBatchSampler``: what every shapebucket batch sampler shares.

An epoch's batches are a pure function of the settings and ``(seed, epoch)``,
so a sampler's state is only where it stands: the epoch, the batches of it
already yielded, the seed, and a fingerprint of the settings the order depends
on. The base owns that state and everything else the two samplers have in
common: the read-only settings, the lengths check, the world size and rank, and
the ``state_dict`` keys (the module constants below).

Passes and epochs. ``iter(sampler)`` begins a *pass*: it starts where the state
points (the start of the current epoch, or a loaded resume point) and yields
the rest of that epoch. A pass that runs to its end completes the epoch: the
next pass starts the epoch after it (``set_epoch`` chooses one instead). A pass
abandoned before its end completes nothing: the next pass starts where it
started, so an example batch taken with ``next(iter(loader))`` skips nothing.

Two limits follow from what a sampler can see:

- it sees what is *fetched*, not what a training loop uses. A ``DataLoader``
  with workers fetches ``prefetch_factor x num_workers`` batches ahead, so an
  iterator dropped after ``next(iter(loader))`` has completed an epoch short
  enough to be fetched whole, and the next pass is the epoch after it. Call
  ``set_epoch(epoch)`` at the start of every epoch (as with
  ``DistributedSampler``) and what was fetched before never matters;
- until the next pass begins, ``state_dict()`` counts the batches of the last
  pass, abandoned or not (after ``break``, that is what the loop consumed). A
  state saved right after taking an example batch counts it: pass
  ``consumed=0`` (or save once the next epoch's pass has begun).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, NoReturn, TypeVar, overload

import numpy as np
from torch.utils.data import Sampler

from .._validate import check_flag, check_int, check_lengths
from ..errors import ShapeBucketError
from ..fit.batches import check_longest
from ..fit.buckets import Buckets, as_buckets

__all__ = [
    "EPOCH_KEY",
    "FINGERPRINT_KEY",
    "NUM_BATCHES_KEY",
    "POSITION_KEY",
    "SEED_KEY",
    "RankBatches",
    "ResumableBatchSampler",
    "Setting",
    "check_one_of",
    "resolve_world",
]

#: ``state_dict()`` keys: the epoch the state is in, the batches of it consumed, the seed,
#: the number of batches of that epoch (informative), and the settings' fingerprint.
EPOCH_KEY = "epoch"
POSITION_KEY = "position"
SEED_KEY = "seed"
NUM_BATCHES_KEY = "num_batches"
FINGERPRINT_KEY = "fingerprint"
_REQUIRED_KEYS = (EPOCH_KEY, POSITION_KEY, SEED_KEY, FINGERPRINT_KEY)

T = TypeVar("T")


class Setting(Generic[T]):
    """A sampler setting: reads as an attribute (stored as ``_<name>``), cannot be assigned.

    The plan is built from the settings once; assigning one afterwards would
    silently leave the plan stale, so it raises an ``AttributeError`` that says
    how to change it (``how``; default: make a new sampler).
    """

    def __init__(self, doc: str, *, how: str | None = None) -> None:
        self.__doc__ = doc
        self._how = how
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Setting[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> T | Setting[T]:
        if obj is None:
            return self
        value: T = obj.__dict__["_" + self.name]
        return value

    def __set__(self, obj: object, value: Any) -> NoReturn:
        kind = type(obj).__name__
        how = self._how or f"make a new {kind}(..., {self.name}=...)"
        raise AttributeError(
            f"{kind}.{self.name} is fixed once the sampler has built its plan; {how}"
        )


def check_one_of(**given: Any) -> None:
    """Refuse unless exactly one of the keyword arguments is not ``None``.

    >>> check_one_of(rows=None, tokens_per_batch=None)
    Traceback (most recent call last):
    ...
    shapebucket.errors.ShapeBucketError: pass exactly one of rows and tokens_per_batch, got rows=None, tokens_per_batch=None
    """
    if sum(v is not None for v in given.values()) != 1:
        got = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise ShapeBucketError(f"pass exactly one of {' and '.join(given)}, got {got}")


def _default_distributed() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def resolve_world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``, checked; what is not given comes from ``torch.distributed``
    when it is initialised, else 1 and 0.

    >>> resolve_world(4, 1)
    (4, 1)
    """
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


class RankBatches(Sequence[list[int]]):
    """One rank's batches of an epoch plan (anything with ``len()`` and
    ``batch(step, rank)``: :class:`~shapebucket.fit.batches.EpochPlan`,
    :class:`~shapebucket.fit.packing.PackedEpoch`), sliced when asked for."""

    def __init__(self, plan: Any, rank: int) -> None:
        self._plan, self._rank = plan, rank

    def __len__(self) -> int:
        return len(self._plan)

    def __getitem__(self, t: int) -> list[int]:  # type: ignore[override]
        return self._plan.batch(t, self._rank)


class ResumableBatchSampler(Sampler[list[int]]):
    """The shared base of :class:`~shapebucket.sampling.BucketBatchSampler` and
    :class:`~shapebucket.sampling.PackedBatchSampler` (see the module docstring for
    passes and epochs).

    Subclasses call ``super().__init__`` with the common arguments, set ``_rows``,
    and implement :meth:`_rank_batches`, :meth:`shapes` and :meth:`batch_buckets`;
    ``_FINGERPRINT`` names the settings besides lengths, buckets, rows, shuffle and
    world size that a saved state must match.
    """

    _LIMIT: ClassVar[str] = "largest bucket"  # what the over-length error calls buckets.max_len
    _TOO_LONG: ClassVar[str] = "add a bucket >= {length}"  # its fix
    _FINGERPRINT: ClassVar[tuple[str, ...]] = ()

    buckets = Setting[Buckets]("The bucket table.")
    lengths = Setting[np.ndarray]("The lengths (a read-only array).")
    shuffle = Setting[bool]("Whether the order is shuffled.")
    num_replicas = Setting[int]("The world size.")
    rank = Setting[int]("This process's rank.")
    seed = Setting[int](
        "The seed of the order.",
        how="pass seed= to a new sampler, or load_state_dict() a saved state",
    )
    epoch = Setting[int](
        "The epoch of the current pass (see :meth:`set_epoch`).", how="call set_epoch()"
    )

    _rows: dict[int, int]
    _epoch: int  # the current pass's epoch
    _position: int  # batches of it yielded
    _next: tuple[int, int]  # (epoch, position) where the next pass starts
    _done: bool  # the current pass ran to its end
    _loaded: bool  # _next is a loaded resume point no pass has completed yet
    _pass: int  # the current pass's number: a superseded pass no longer moves the state

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        buckets: Buckets | Sequence[int],
        *,
        shuffle: bool,
        seed: int,
        num_replicas: int | None,
        rank: int | None,
    ) -> None:
        table = as_buckets(buckets)
        arr = check_lengths(lengths)
        check_longest(arr, table, limit=self._LIMIT, fix=self._TOO_LONG)
        arr = arr.copy()  # our own, read-only: the plan depends on it
        arr.flags.writeable = False
        self._buckets = table
        self._lengths = arr
        self._shuffle = check_flag("shuffle", shuffle)
        self._num_replicas, self._rank = resolve_world(num_replicas, rank)
        self._seed = check_int("seed", seed, minimum=0)
        self._pass = 0
        self._start_at(0, 0)

    # -- what subclasses provide ------------------------------------------------------------

    def _rank_batches(self, epoch: int) -> Sequence[list[int]]:
        """This rank's batches of ``epoch``, in order (indexable; built lazily is fine)."""
        raise NotImplementedError

    def _count_for(self, seed: int, epoch: int) -> int:
        """Batches of ``epoch`` under ``seed`` (the same every epoch unless overridden)."""
        return len(self)

    def shapes(self) -> frozenset[tuple[int, int]]:
        """Every ``(rows, bucket)`` this rank's batches can have, before the collator pads rows."""
        raise NotImplementedError

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The bucket of every batch of ``epoch`` (default: the current one), in order."""
        raise NotImplementedError

    # -- settings ---------------------------------------------------------------------------

    @property
    def rows(self) -> dict[int, int]:
        """Rows per batch at each bucket: ``{bucket: rows}`` (a copy). Pass it to the
        collator (``rows=``) so short batches get the same shape as full ones."""
        return dict(self._rows)

    def _fingerprint(self) -> str:
        # the settings never change, and StatefulDataLoader asks for the state at every batch
        cached: str | None = self.__dict__.get("_fingerprint_value")
        if cached is None:
            cached = self._fingerprint_value = self._compute_fingerprint()
        return cached

    def _compute_fingerprint(self) -> str:
        h = hashlib.sha1(self._lengths.tobytes())
        extra = tuple(getattr(self, name) for name in self._FINGERPRINT)
        settings = (
            type(self).__name__,
            self._buckets.lengths,
            sorted(self._rows.items()),
            self._shuffle,
            self._num_replicas,
            *extra,
        )
        h.update(repr(settings).encode())
        return h.hexdigest()

    # -- passes -----------------------------------------------------------------------------

    def _start_at(self, epoch: int, position: int, *, loaded: bool = False) -> None:
        self._pass += 1
        self._epoch, self._position = epoch, position
        self._next = (epoch, position)
        self._done = False
        self._loaded = loaded

    def __iter__(self) -> Iterator[list[int]]:
        # A pass begins here, not at the first next(): a state saved between iter(loader)
        # and the first batch then already describes the new pass.
        self._pass += 1
        epoch, start = self._next
        self._epoch, self._position, self._done = epoch, start, False
        return self._run(self._pass, epoch, start)

    def _run(self, token: int, epoch: int, start: int) -> Iterator[list[int]]:
        batches = self._rank_batches(epoch)
        for t in range(start, len(batches)):
            if token == self._pass:
                self._position = t + 1
            yield batches[t]
        if token == self._pass:  # ran to its end: the next pass starts the next epoch
            self._done = True
            self._next = (epoch + 1, 0)
            self._loaded = False

    def __len__(self) -> int:
        return len(self._rank_batches(self._epoch))

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (as ``DistributedSampler.set_epoch``); the next pass
        starts it from its first batch.

        Right after :meth:`load_state_dict`, ``set_epoch`` with the loaded epoch keeps
        the loaded position, so the usual loop (``for epoch in range(start, n):
        sampler.set_epoch(epoch)``) resumes where the state was saved instead of
        replaying the epoch.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        if self._loaded and epoch == self._next[0]:
            return
        self._start_at(epoch, 0)

    # -- state ------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the sampler stands: epoch, batches of it consumed, seed, and a fingerprint
        of the settings (keys: this module's ``*_KEY`` constants).

        ``position`` is the number of this epoch's batches the sampler has yielded.
        That is what the training loop consumed when nothing fetches ahead: with
        ``num_workers=0``, and with torchdata's ``StatefulDataLoader`` at any
        ``num_workers`` (it saves this state at the batch the loop is at). A plain
        ``DataLoader`` with workers pulls ``prefetch_factor x num_workers`` batches
        ahead of the loop; pass ``consumed=`` the number of this epoch's batches your
        loop has finished instead (``0 <= consumed <=`` what was yielded).

        Once a pass has run to its end (the loop over the epoch is over) and no new
        pass has begun, the state (without ``consumed=``) is the start of the next
        epoch. A state saved inside the loop after its last batch (``position ==
        len(sampler)``) resumes with a pass that yields nothing, then the next epoch.

        >>> from shapebucket.sampling import BucketBatchSampler
        >>> s = BucketBatchSampler([3, 5, 9, 12], [8, 16], batch_size=1, shuffle=False)
        >>> it = iter(s); _ = next(it); _ = next(it)
        >>> s.state_dict()["position"], s.state_dict(consumed=1)["position"]
        (2, 1)
        """
        if consumed is not None:
            epoch = self._epoch
            position = check_int("consumed", consumed, minimum=0, maximum=self._position)
        elif self._done:
            epoch, position = self._next
        else:
            epoch, position = self._epoch, self._position
        return {
            EPOCH_KEY: epoch,
            POSITION_KEY: position,
            SEED_KEY: self._seed,
            NUM_BATCHES_KEY: self._count_for(self._seed, epoch),
            FINGERPRINT_KEY: self._fingerprint(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next pass yields exactly the batches not yet consumed.

        A pass abandoned before its end leaves the resume point in place;
        ``set_epoch`` with the loaded epoch keeps it, another epoch discards it.
        """
        seed, epoch, position = self._check_state(state)
        self._seed = seed
        self._start_at(epoch, position, loaded=True)

    def _check_state(self, state: Any) -> tuple[int, int, int]:
        """``(seed, epoch, position)`` of a saved state, after checking it fits this sampler."""
        if not isinstance(state, Mapping):
            raise ShapeBucketError(
                f"state must be the dict that state_dict() returned, got {type(state).__name__}"
            )
        for key in _REQUIRED_KEYS:
            if key not in state:
                raise ShapeBucketError(f"state has no {key!r}; pass what state_dict() returned")
        if state[FINGERPRINT_KEY] != self._fingerprint():
            raise ShapeBucketError(
                "state was saved by a sampler with other lengths, buckets, rows or world size; "
                "resume with the same configuration (or start the epoch afresh with set_epoch)"
            )
        seed = check_int(f"state[{SEED_KEY!r}]", state[SEED_KEY], minimum=0)
        epoch = check_int(f"state[{EPOCH_KEY!r}]", state[EPOCH_KEY], minimum=0)
        # the number of batches of the saved epoch (a packed plan's count varies by epoch)
        total = self._count_for(seed, epoch)
        position = check_int(
            f"state[{POSITION_KEY!r}]", state[POSITION_KEY], minimum=0, maximum=total
        )
        return seed, epoch, position
