"""``ResumableBatchSampler``: what every batch sampler shares, passes, epochs and the
``state_dict`` included (the rules: ``docs/sampler.md``)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

import numpy as np
from torch.utils.data import Sampler

from .._lengths import check_lengths
from .._validate import check_flag, check_int
from ..fit.batches import check_longest
from ..fit.buckets import Buckets, as_buckets
from ..plan.shapes import Shape
from .common import Setting, resolve_world
from .state import fingerprint, read_state, saved_state

__all__ = ["ResumableBatchSampler"]

#: What a batch is keyed by: a bucket length (``int``), or a ``(source, target)`` cell.
K = TypeVar("K", bound=Hashable)


class ResumableBatchSampler(Sampler[list[int]], Generic[K]):
    """The shared base of :class:`~shapebucket.sampling.BucketBatchSampler`,
    :class:`~shapebucket.sampling.CellBatchSampler` and
    :class:`~shapebucket.sampling.PackedBatchSampler`, generic over what a batch is keyed
    by (``K``: a bucket length, or a ``(source, target)`` cell): :attr:`rows` is
    ``{K: rows}``. Passes, epochs and resume: ``docs/sampler.md``.

    Subclasses call ``super().__init__`` with the common arguments, set ``_rows``,
    and implement :meth:`_batches`, :meth:`_count_for`, :meth:`shapes` and
    :meth:`batch_buckets`; ``_FINGERPRINT`` names the settings besides lengths,
    buckets, rows, shuffle and world size that a saved state must match.
    """

    #: Whether the batches are packed (several samples per row): a collator whose
    #: ``packs`` differs refuses this sampler.
    packs: ClassVar[bool] = False
    _LIMIT: ClassVar[str] = "largest bucket"  # what the over-length error calls buckets.max_len
    _TOO_LONG: ClassVar[str] = "add a bucket >= {length}"  # its fix
    _FINGERPRINT: ClassVar[tuple[str, ...]] = ()
    _TABLE: ClassVar[str] = "buckets"  # the setting repr() shows as the table

    buckets = Setting[Buckets]("The bucket table.")
    lengths = Setting[np.ndarray]("The lengths (a read-only array).")
    shuffle = Setting[bool]("Whether the order is shuffled.")
    num_replicas = Setting[int]("The world size.")
    rank = Setting[int]("This process's rank.")
    seed = Setting[int](
        "The seed of the order.",
        how="pass seed= to a new sampler, or load_state_dict() a saved state",
    )

    _rows: dict[K, int]
    _epoch: int  # the epoch of the current pass (or of the point set)
    _position: int  # batches of it handed out
    _next: tuple[int, int]  # where the current pass started (an abandoned pass restarts there)
    _begun: bool  # a pass has begun since the point was set
    _loaded: bool  # the point is a loaded resume point
    _pass: int  # the current pass's number: a superseded pass no longer moves the state
    _pinned: int | None  # the epoch set_epoch named: every pass is of it until changed

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
        arr = arr.copy()  # our own, read-only: the batches depend on it
        arr.flags.writeable = False
        self._buckets = table
        self._lengths = arr
        self._shuffle = check_flag("shuffle", shuffle)
        self._num_replicas, self._rank = resolve_world(num_replicas, rank)
        self._seed = check_int("seed", seed, minimum=0)
        self._pass = 0
        self._pinned = None
        self._start_at(0, 0)

    # -- what subclasses provide ------------------------------------------------------------

    def _batches(self, epoch: int) -> Any:
        """Every rank's batches of ``epoch``: ``len()`` steps, ``.batch(step, rank)`` each
        (:class:`~shapebucket.fit.batches.EpochBatches`, :class:`~shapebucket.fit.packing.PackedEpoch`)."""
        raise NotImplementedError

    def _count_for(self, seed: int, epoch: int) -> int:
        """Batches of ``epoch`` under ``seed`` (this rank's; every rank has as many)."""
        raise NotImplementedError

    def shapes(self) -> frozenset[Shape]:
        """Every :class:`~shapebucket.plan.Shape` a batch of this rank can have (rows: the
        samples of a batch, or the packed rows of a packed one)."""
        raise NotImplementedError

    def batch_buckets(self, epoch: int | None = None) -> np.ndarray:
        """The bucket of every batch of ``epoch`` (default: the current one), in order."""
        raise NotImplementedError

    # -- settings ---------------------------------------------------------------------------

    @property
    def rows(self) -> dict[K, int]:
        """Rows per batch for each key (bucket or cell): ``{key: rows}`` (a copy). Pass it
        to the collator (``rows=``) so short batches get the same shape as full ones."""
        return dict(self._rows)

    @property
    def epoch(self) -> int:
        """The epoch the sampler is in: the pass in progress's; after a completed epoch, the
        next one, where a state saved now resumes; else the next pass's."""
        return self._at()[0] if self._begun else self._upcoming()[0]

    @epoch.setter
    def epoch(self, value: Any) -> NoReturn:
        raise AttributeError(
            f"{type(self).__name__}.epoch is fixed by the passes and the state; call set_epoch()"
        )

    def _fingerprint(self) -> str:
        # cached: the settings never change, and StatefulDataLoader asks at every batch
        cached: str | None = self.__dict__.get("_fingerprint_value")
        if cached is None:
            extra = tuple(getattr(self, name) for name in self._FINGERPRINT)
            settings = (
                type(self).__name__,
                self._buckets.lengths,
                sorted(self._rows.items()),
                self._shuffle,
                self._num_replicas,
                *extra,
            )
            cached = self._fingerprint_value = fingerprint(self._lengths, settings)
        return cached

    def __repr__(self) -> str:
        shown = [f"{n}={getattr(self, n)!r}" for n in self._FINGERPRINT if n[0] != "_"]
        return (
            f"{type(self).__name__}({len(self._lengths):,} samples, "
            f"{getattr(self, self._TABLE)!r}, rows={self._rows}, shuffle={self._shuffle}, "
            f"{', '.join([*shown, ''])}rank {self._rank}/{self._num_replicas}, {len(self)} batches)"
        )

    # -- passes -----------------------------------------------------------------------------

    def _count(self, epoch: int) -> int:
        return self._count_for(self._seed, epoch)

    def _complete(self, epoch: int, position: int) -> bool:
        """Whether ``position`` is past the last batch of ``epoch`` (the epoch is done)."""
        return position > 0 and position >= self._count(epoch)

    def _start_at(self, epoch: int, position: int, *, loaded: bool = False) -> None:
        self._pass += 1
        self._epoch, self._position = epoch, position
        self._next = (epoch, position)
        self._begun = False
        self._loaded = loaded

    def _done(self) -> bool:
        """Whether a pass has begun and handed out the last batch of its epoch."""
        return self._begun and self._position >= self._count(self._epoch)

    def _at(self) -> tuple[int, int]:
        """Where the sampler stands: the pass in progress, else the next epoch's start."""
        return (self._epoch + 1, 0) if self._done() else (self._epoch, self._position)

    def _upcoming(self) -> tuple[int, int]:
        """Where the next pass starts: where the last one started if it was abandoned (a
        loaded end of epoch: the next epoch, unless ``set_epoch`` pinned the loaded one);
        after a completed epoch, the next one, or the pinned epoch again."""
        if not self._done():
            epoch, start = self._next
            if self._complete(epoch, start) and self._pinned != epoch:
                return epoch + 1, 0
            return self._next
        return (self._epoch + 1, 0) if self._pinned is None else (self._pinned, 0)

    def __iter__(self) -> Iterator[list[int]]:
        # A pass begins here, not at the first next(): a state saved between iter(loader)
        # and the first batch then already describes the new pass. An abandoned pass
        # restarts where it started; a completed one moves to the next epoch.
        if self._done():
            self._loaded = False
        self._next = self._upcoming()
        self._pass += 1
        epoch, start = self._next
        self._epoch, self._position, self._begun = epoch, start, True
        return self._run(self._pass, epoch, start)

    def _run(self, token: int, epoch: int, start: int) -> Iterator[list[int]]:
        batches = self._batches(epoch)
        for t in range(start, len(batches)):
            if token == self._pass:  # handing out the last batch completes the epoch
                self._position = t + 1
            yield batches.batch(t, self._rank)

    def __len__(self) -> int:
        # the pass in progress's epoch (where it started), else the next pass's
        return self._count(self._upcoming()[0])

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (as ``DistributedSampler.set_epoch``): the next pass
        starts it from its first batch, and every pass is of ``epoch`` until the next
        ``set_epoch``. Right after :meth:`load_state_dict`, the loaded epoch keeps the
        loaded position, so ``for epoch in range(state["epoch"], n):
        sampler.set_epoch(epoch)`` resumes where the state was saved
        (``docs/sampler.md``)."""
        epoch = check_int("epoch", epoch, minimum=0)
        if not (self._loaded and not self._done() and epoch == self._next[0]):
            self._start_at(epoch, 0)
        self._pinned = epoch

    # -- state ------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the sampler stands: epoch, batches of it consumed, seed, and a fingerprint
        of the settings (keys: the ``*_KEY`` constants of :mod:`shapebucket.sampling.state`).

        ``position`` counts this epoch's batches handed out: what the loop consumed with
        ``num_workers=0`` or torchdata's ``StatefulDataLoader``. A plain ``DataLoader``
        with workers fetches ahead: pass ``consumed=`` the batches your loop finished
        (``0 <= consumed <=`` what was handed out). ``position == num_batches`` is a
        complete epoch (``docs/sampler.md``).

        >>> from shapebucket.sampling import BucketBatchSampler
        >>> s = BucketBatchSampler([3, 5, 9, 12], [8, 16], rows=1, shuffle=False)
        >>> it = iter(s); _ = next(it); _ = next(it)
        >>> s.state_dict()["position"], s.state_dict(consumed=1)["position"]
        (2, 1)
        >>> _ = list(it); s.state_dict()["epoch"], s.state_dict()["position"], s.epoch
        (0, 4, 1)
        """
        epoch, position = self._epoch, self._position
        if self._done() and self._count(epoch) == 0:  # an empty epoch: nothing says complete
            epoch, position = epoch + 1, 0
        if consumed is not None:
            position = check_int("consumed", consumed, minimum=0, maximum=self._position)
        return saved_state(epoch, position, self._seed, self._count(epoch), self._fingerprint())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: the next pass yields exactly the batches not yet consumed.
        ``set_epoch`` with the loaded epoch keeps the resume point, another discards it;
        an epoch pinned by ``set_epoch`` stays pinned when the state is of it or ends the
        epoch before it (``StatefulDataLoader`` loads inside ``iter(loader)``)."""
        seed, epoch, position = self.check_state(state)
        self._seed = seed
        self._start_at(epoch, position, loaded=True)
        complete = self._complete(epoch, position)
        if self._pinned != epoch and not (complete and self._pinned == epoch + 1):
            self._pinned = None

    def check_state(self, state: Any) -> tuple[int, int, int]:
        """``(seed, epoch, position)`` of a saved ``state``, after checking that it fits this
        sampler (the same settings, a position inside its epoch); loads nothing. A
        ``ShapeBucketError`` names what does not fit.

        >>> from shapebucket.sampling import BucketBatchSampler
        >>> s = BucketBatchSampler([3, 5, 9, 12], [8, 16], rows=1, seed=7)
        >>> s.check_state(s.state_dict())
        (7, 0, 0)
        """
        return read_state(state, self._fingerprint(), self._count_for)
