"""``ResumableBatchSampler``: what every shapebucket batch sampler shares.

An epoch's batches are a pure function of the settings and ``(seed, epoch)``,
so a sampler's state is only where it stands: the epoch, the batches of it
already yielded, the seed, and a fingerprint of the settings the order depends
on. The base owns that state and everything else the samplers have in common:
the read-only settings, the lengths check, the world size and rank, the
``state_dict`` and its checks (written and read by :mod:`.state`) and the shape protocol
(:meth:`~ResumableBatchSampler.shapes`, ``packs``).

Passes and epochs. ``iter(sampler)`` begins a *pass*: it starts where the state
points (the start of the current epoch, or a loaded resume point) and yields
the rest of that epoch. An epoch is complete once its last batch is handed
out, whether or not the iterator is then exhausted: ``for batch in loader``,
``itertools.islice(loader, len(loader))`` and a loop calling ``next``
``len(loader)`` times all leave the sampler at the start of the next epoch
(its ``epoch`` and ``len()`` are the next epoch's; ``state_dict()`` says the epoch
is complete, and loaded resumes at the next one, or, under ``set_epoch`` of the
saved epoch, with its empty rest), with any number of workers (``set_epoch``
chooses another one instead). A pass
abandoned before its last batch completes nothing: the next pass starts where
it started, so an example batch taken with ``next(iter(loader))`` skips nothing
(unless it was the epoch's only batch).

Two limits follow from what a sampler can see:

- it sees what is *fetched*, not what a training loop uses. A ``DataLoader``
  with workers fetches ``prefetch_factor x num_workers`` batches ahead, so an
  iterator dropped after ``next(iter(loader))`` has completed an epoch short
  enough to be fetched whole, and the next pass is the epoch after it. Call
  ``set_epoch(epoch)`` at the start of every epoch (as with
  ``DistributedSampler``: every pass is that epoch until the next ``set_epoch``)
  and what was fetched before never matters. ``StatefulDataLoader`` with workers
  restores a state saved after its iterator ended by prefetching a pass and then
  discarding it: without ``set_epoch``, an epoch that fits in that prefetch is
  skipped;
- until the next pass begins, ``state_dict()`` counts the batches of the last
  pass, abandoned or not (after ``break``, that is what the loop consumed). A
  state saved right after taking an example batch counts it: pass
  ``consumed=0`` (or save once the next epoch's pass has begun).
"""

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
    :class:`~shapebucket.sampling.PackedBatchSampler` (see the module docstring for
    passes and epochs), generic over what a batch is keyed by (``K``: a bucket length,
    or a ``(source, target)`` cell): :attr:`rows` is ``{K: rows}``.

    Subclasses call ``super().__init__`` with the common arguments, set ``_rows``,
    and implement :meth:`_rank_batches`, :meth:`_count_for`, :meth:`shapes` and
    :meth:`batch_buckets`; ``_FINGERPRINT`` names the settings besides lengths,
    buckets, rows, shuffle and world size that a saved state must match.
    """

    #: Whether the batches are packed (several samples per row): a collator whose
    #: ``packs`` differs refuses this sampler.
    packs: ClassVar[bool] = False
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

    def _rank_batches(self, epoch: int) -> Sequence[list[int]]:
        """This rank's batches of ``epoch``, in order (indexable; built lazily is fine)."""
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
        next one, where a state saved now resumes (the next pass repeats the epoch
        :meth:`set_epoch` pinned, if any); else the next pass's."""
        return self._at()[0] if self._begun else self._upcoming()[0]

    @epoch.setter
    def epoch(self, value: Any) -> NoReturn:
        raise AttributeError(
            f"{type(self).__name__}.epoch is fixed by the passes and the state; call set_epoch()"
        )

    def _fingerprint(self) -> str:
        # the settings never change, and StatefulDataLoader asks for the state at every batch
        cached: str | None = self.__dict__.get("_fingerprint_value")
        if cached is None:
            cached = self._fingerprint_value = self._compute_fingerprint()
        return cached

    def _compute_fingerprint(self) -> str:
        extra = tuple(getattr(self, name) for name in self._FINGERPRINT)
        settings = (
            type(self).__name__,
            self._buckets.lengths,
            sorted(self._rows.items()),
            self._shuffle,
            self._num_replicas,
            *extra,
        )
        return fingerprint(self._lengths, settings)

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
        """Where the sampler stands: the pass in progress (or abandoned), else (after a
        completed epoch) the next epoch's first batch, where a resumed run starts."""
        return (self._epoch + 1, 0) if self._done() else (self._epoch, self._position)

    def _upcoming(self) -> tuple[int, int]:
        """Where the next pass starts: where the last one started if it was abandoned;
        after a completed epoch, the next one, or the epoch ``set_epoch`` pinned again. A
        loaded state at the end of its epoch is the next epoch's start, unless
        ``set_epoch`` pinned the loaded epoch (the docs' recipe, resuming at the loop's
        epoch): then the pass yields the nothing left of it."""
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
        batches = self._rank_batches(epoch)
        for t in range(start, len(batches)):
            if token == self._pass:  # handing out the last batch completes the epoch
                self._position = t + 1
            yield batches[t]

    def __len__(self) -> int:
        # the pass in progress's epoch (where it started), else the next pass's
        return self._count(self._upcoming()[0])

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` (as ``DistributedSampler.set_epoch``); the next pass
        starts it from its first batch, and every pass after it is of ``epoch`` too until
        the next ``set_epoch`` (a pass that a loader's prefetch ran to the end, or that a
        restoring ``StatefulDataLoader`` discarded, never moves the order on). ``epoch``
        and :meth:`state_dict` still count an epoch whose last batch was handed out as
        done: a state saved then resumes at the next epoch (or, loaded under
        ``set_epoch`` of the saved epoch, with the empty rest of it).

        Right after :meth:`load_state_dict`, ``set_epoch`` with the loaded epoch keeps
        the loaded position, so the usual loop (``for epoch in range(start, n):
        sampler.set_epoch(epoch)``, ``start`` the state's ``epoch``) resumes where the
        state was saved instead of replaying the epoch.
        """
        epoch = check_int("epoch", epoch, minimum=0)
        if not (self._loaded and not self._done() and epoch == self._next[0]):
            self._start_at(epoch, 0)
        self._pinned = epoch

    # -- state ------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the sampler stands: epoch, batches of it consumed, seed, and a fingerprint
        of the settings (keys: the ``*_KEY`` constants of :mod:`shapebucket.sampling.state`).

        ``position`` is the number of this epoch's batches the sampler has handed out.
        That is what the training loop consumed when nothing fetches ahead: with
        ``num_workers=0``, and with torchdata's ``StatefulDataLoader`` at any
        ``num_workers`` (it saves this state at the batch the loop is at). A plain
        ``DataLoader`` with workers pulls ``prefetch_factor x num_workers`` batches
        ahead of the loop; pass ``consumed=`` the number of this epoch's batches your
        loop has finished instead (``0 <= consumed <=`` what was handed out).

        An epoch whose last batch is handed out (or ``consumed=``) is complete, whether or
        not the iterator was exhausted: the state says so (``position == num_batches``).
        Loaded, it resumes at the next epoch's start (as a loop that counts its steps
        resumes: epoch = steps // batches per epoch), or, when ``set_epoch`` names the
        saved epoch (a loop that saved its own epoch beside the state), with the empty
        rest of that epoch, so that the loop's next ``set_epoch`` starts the next one.

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

        A pass abandoned before its end leaves the resume point in place;
        ``set_epoch`` with the loaded epoch keeps it, another epoch discards it. A state
        at the end of its epoch (``position == num_batches``) is the next epoch's start,
        or, with ``set_epoch`` of the saved epoch, that epoch's empty rest. An epoch
        pinned by ``set_epoch`` stays pinned when the state is of that epoch (or ends the
        epoch before it: ``StatefulDataLoader`` loads the state inside ``iter(loader)``,
        after the loop's ``set_epoch``).
        """
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
