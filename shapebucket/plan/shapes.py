"""``Shape`` and ``ShapePlan``: every batch shape a loader makes (the collator's
``shapes(sampler)``), and how to make a batch of each (``repad`` or ``make_batch``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from typing import Any

from .._validate import check_int
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets
from .contract import check_batch_shape, check_pairing, check_protocol, check_repad, collator_shapes

__all__ = ["Shape", "ShapePlan", "as_shape"]


class Shape(tuple):  # type: ignore[type-arg]
    """One batch shape: ``rows`` rows, each padded to one length per padded axis.

    Buckets and packing pad one axis (``Shape(rows, length)``); two-length cells pad
    the source and the target each to their own (``Shape(rows, source, target)``).
    A shape is the tuple ``(rows, *lengths)``, so it compares equal to that tuple.

    >>> Shape(4, 128)
    Shape(rows=4, length=128)
    >>> s = Shape(4, 128, 32)
    >>> s
    Shape(rows=4, lengths=(128, 32))
    >>> s.rows, s.length, s.lengths, s == (4, 128, 32)
    (4, 128, (128, 32), True)
    """

    __slots__ = ()

    def __new__(cls, rows: int, *lengths: int) -> Shape:
        if not lengths:
            raise ShapeBucketError(
                f"Shape({rows!r}) has no length: write Shape(rows, length), or "
                "Shape(rows, source, target) for two-length cells"
            )
        return super().__new__(
            cls,
            (
                check_int("Shape rows", rows, minimum=1),
                *(check_int(f"Shape lengths[{i}]", n, minimum=1) for i, n in enumerate(lengths)),
            ),
        )

    def __getnewargs__(self) -> tuple[int, ...]:  # pickle: Shape(*self)
        return tuple(self)

    @property
    def rows(self) -> int:
        """Rows (samples, or packed rows) per batch."""
        return int(self[0])

    @property
    def lengths(self) -> tuple[int, ...]:
        """The length of each padded axis: one for buckets and packing, two for cells."""
        return tuple(self[1:])

    @property
    def length(self) -> int:
        """The first padded axis' length (a bucket, a packed row, a cell's source)."""
        return int(self[1])

    def __repr__(self) -> str:
        if len(self) == 2:
            return f"Shape(rows={self[0]}, length={self[1]})"
        return f"Shape(rows={self[0]}, lengths={self.lengths})"


def as_shape(shape: Any, axes: int | None = None, *, what: str = "shape") -> Shape:
    """``shape`` as a :class:`Shape`: a ``Shape`` or a ``(rows, *lengths)`` tuple of ints
    >= 1, with ``axes`` lengths when given (1: buckets and packing, 2: cells).

    >>> as_shape((4, 128)), as_shape((2, 16, 8), 2)
    (Shape(rows=4, length=128), Shape(rows=2, lengths=(16, 8)))
    """
    want = "(rows, source, target) triple" if axes == 2 else "(rows, length) pair"
    if (
        isinstance(shape, (str, bytes, Mapping, Set))
        or not isinstance(shape, Iterable)
        or len(shape) < 2  # type: ignore[arg-type]
        or (axes is not None and len(shape) != axes + 1)  # type: ignore[arg-type]
    ):
        raise ShapeBucketError(
            f"{what} must be a {want}, got {shape!r}; write Shape(4, 128) for 4 rows of 128 "
            "(Shape(4, 128, 32): 4 rows of a two-length cell)"
        )
    rows, *lengths = shape
    return Shape(
        check_int(f"{what} rows", rows, minimum=1),
        *(check_int(f"{what} length", n, minimum=1) for n in lengths),
    )


def _check_shapes(shapes: Iterable[Any]) -> tuple[Shape, ...]:
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Iterable):
        raise ShapeBucketError(
            f"shapes must be a list of (rows, length) pairs, got {shapes!r}; "
            "for one shape write [(rows, length)]"
        )
    out = {as_shape(s, what=f"shapes[{i}]") for i, s in enumerate(shapes)}
    for i, s in enumerate(sorted(out)):
        if min(s.lengths) < 2:  # dynamo specialises sizes 0 and 1: no bucket is that short
            raise ShapeBucketError(f"shapes[{i}] length must be >= 2, got {min(s.lengths)}")
    if not out:
        raise ShapeBucketError("a ShapePlan needs at least one (rows, length) shape, got none")
    if len({len(s) for s in out}) > 1:
        raise ShapeBucketError(
            "shapes mix (rows, length) pairs and (rows, source, target) triples; a plan is "
            "one-length or two-length"
        )
    return tuple(sorted(out, key=lambda s: (s.lengths, s.rows)))


class _Listed:
    """A sampler whose batches have exactly the given shapes: how a plan built from a list
    checks it through the collator protocol (``collator.shapes(_Listed(shapes))``)."""

    def __init__(self, shapes: Iterable[Shape], packs: bool) -> None:
        self._shapes, self.packs = frozenset(shapes), packs

    def shapes(self) -> frozenset[Shape]:
        return self._shapes


class ShapePlan:
    """The set of batch shapes a loader produces, and how to make a batch of each.

    Build it with :meth:`of` (``collator.shapes(sampler)``: any collator that
    implements :class:`~shapebucket.plan.ShapedCollator`), with
    :meth:`from_function` (a ``make_batch(shape)`` of your own), or directly as
    ``ShapePlan([(rows, length), ...], collator)``; a two-length plan (a
    :class:`~shapebucket.collate.CellCollator`) holds ``Shape(rows, source,
    target)`` triples. ``plan.shapes`` is sorted by lengths, then rows;
    ``len(plan)`` counts them. A plan pickles when its collator (or
    ``make_batch``) does.

    A plan given its shapes checks them through the protocol: ``collator.shapes``
    of a sampler whose batches have exactly those shapes must contain every one
    (a collator that pads rows makes its own row count; one with ``row_buckets``
    makes every row bucket, and a warning names those the plan lacks).

    >>> from shapebucket.collate.bucket import BucketCollator
    >>> collate = BucketCollator([8, 16], rows=4)
    >>> plan = ShapePlan.of(collate)
    >>> plan.shapes
    (Shape(rows=4, length=8), Shape(rows=4, length=16))
    >>> example = collate([{"input_ids": [1, 2, 3]}])
    >>> plan.batch(example, plan.shapes[1])["input_ids"].shape
    torch.Size([4, 16])
    """

    __slots__ = ("_collator", "_make_batch", "_shapes")

    def __init__(
        self,
        shapes: Iterable[tuple[int, ...]],
        collator: Any = None,
        *,
        make_batch: Callable[[Shape], Any] | None = None,
    ) -> None:
        if (collator is None) == (make_batch is None):
            raise ShapeBucketError(
                "a ShapePlan needs exactly one of collator (re-pads an example to each shape) "
                "and make_batch(shape); use ShapePlan.of(collator, sampler) or "
                "ShapePlan.from_function(shapes, make_batch)"
            )
        if collator is not None:
            check_protocol(collator, "ShapePlan")
        if make_batch is not None and not callable(make_batch):
            raise ShapeBucketError(
                f"make_batch must be a function shape -> batch, got {make_batch!r}"
            )
        self._shapes = _check_shapes(shapes)
        self._collator = collator
        self._make_batch = make_batch
        if collator is not None:
            self._check_collator(collator)

    def _check_collator(self, collator: Any) -> None:
        """Every shape must be one the collator makes for batches of that shape; shapes it
        makes beside them (``row_buckets``) are named in a warning."""
        listed = _Listed(self._shapes, bool(collator.packs))
        made = {as_shape(s) for s in collator_shapes(collator, listed)}
        for s in self._shapes:
            if s not in made:
                raise ShapeBucketError(
                    f"shape {tuple(s)} never occurs: {collator!r} makes "
                    f"{sorted(tuple(m) for m in made)} from batches of the plan's shapes, so a "
                    f"batch of {s.rows} rows at {s.lengths} is not one it makes; use "
                    "ShapePlan.of(collator, sampler)"
                )
        missing = sorted(tuple(m) for m in made - set(self._shapes))
        if missing:
            warnings.warn(
                f"the collator makes shapes {missing} from batches of the plan's shapes too "
                "(row_buckets pad a request batch of any size), but the plan has no shapes "
                f"{missing}: such batches compile when they first come (no_recompiles() raises); "
                "use ShapePlan.of(collator) for all of them",
                stacklevel=3,
            )

    @classmethod
    def of(cls, collator: Any, sampler: Any = None) -> ShapePlan:
        """The plan of a loader made of ``collator`` and ``sampler``:
        ``ShapePlan(collator.shapes(sampler), collator)``.

        >>> from shapebucket.collate.bucket import BucketCollator
        >>> ShapePlan.of(BucketCollator.with_row_buckets([8, 16], [1, 4])).shapes
        (Shape(rows=1, length=8), Shape(rows=4, length=8), Shape(rows=1, length=16), Shape(rows=4, length=16))
        """
        check_protocol(collator, "ShapePlan.of")
        if sampler is not None:
            check_pairing(sampler, collator)
        return cls(collator_shapes(collator, sampler), collator)

    @classmethod
    def from_function(
        cls, shapes: Iterable[tuple[int, ...]], make_batch: Callable[[Shape], Any]
    ) -> ShapePlan:
        """A plan whose batches come from ``make_batch(shape)``, for code without a collator.

        >>> import torch
        >>> plan = ShapePlan.from_function([(2, 8), (2, 16)], lambda s: torch.ones(s.rows, s.length))
        >>> plan.batch(None, plan.shapes[0]).shape
        torch.Size([2, 8])
        """
        return cls(shapes, make_batch=make_batch)

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """Every shape, sorted by lengths, then rows."""
        return self._shapes

    @property
    def lengths(self) -> Buckets:
        """The distinct lengths of the shapes' first axis."""
        return Buckets(sorted({s.length for s in self._shapes}))

    @property
    def collator(self) -> Any:
        """The collator that re-pads examples (``None`` for :meth:`from_function` plans)."""
        return self._collator

    @property
    def seq_dim(self) -> int:
        """The sequence dim of each sample (the collator's ``seq_dim``; 0 for a
        :meth:`from_function` plan): batches have their length at dim ``seq_dim + 1``."""
        return 0 if self._collator is None else int(self._collator.seq_dim)

    def batch(self, example: Any, shape: tuple[int, ...]) -> Any:
        """A batch of ``shape`` (one of the plan's): ``collator.repad(example, shape)``,
        or ``make_batch(shape)``, which must return tensors of ``shape``."""
        shape = as_shape(shape)
        if shape not in self._shapes:
            raise ShapeBucketError(
                f"shape {tuple(shape)!r} is not in the plan {[tuple(s) for s in self._shapes]}; "
                "a batch of it would compile a graph no loader batch uses: pass one of plan.shapes"
            )
        if self._make_batch is not None:
            return check_batch_shape(self._make_batch(shape), shape)
        if example is None:
            raise ShapeBucketError(
                "this plan re-pads an example batch to each shape: pass example=next(iter(loader))"
            )
        return check_repad(self._collator, self._collator.repad(example, shape), shape)

    def __len__(self) -> int:
        return len(self._shapes)

    def __iter__(self) -> Iterator[Shape]:
        return iter(self._shapes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ShapePlan):
            return NotImplemented
        return (self._shapes, self._collator, self._make_batch) == (
            other._shapes,
            other._collator,
            other._make_batch,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        pairs = ", ".join(str(tuple(s)) for s in self._shapes)  # (rows, *lengths)
        source = (
            type(self._collator).__name__
            if self._collator is not None
            else getattr(self._make_batch, "__name__", "make_batch")
        )
        return f"ShapePlan([{pairs}], {source})"
