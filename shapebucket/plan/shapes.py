"""``ShapePlan``: every ``(rows, length)`` shape a loader will produce, and how to make each.

The sampler knows which rows and buckets its batches have, the collator knows
how it pads rows and lengths; together they know every shape the model will
see. :func:`shapebucket.prewarm` compiles each shape of a plan, and
:func:`shapebucket.no_recompiles` names the plan when a batch falls outside it.

Inference, in :meth:`ShapePlan.of`:

* a collator with ``row_buckets`` (inference): every bucket at every row bucket;
* a collator with ``rows`` (``BucketCollator(rows=...)``, every ``PackedCollator``):
  ``(collator.rows_for(b), b)`` for each bucket ``b``;
* otherwise the sampler's ``shapes()``: the ``(rows, bucket)`` of every batch it
  can yield on this rank, short last batches included.

With a sampler the lengths are the buckets its batches use on this rank (a
bucket no sample falls into is not compiled).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from typing import Any

import torch

from .._validate import check_int
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets
from .cell_shapes import cell_shapes, check_cell_shapes, two_length

__all__ = ["CellShape", "Shape", "ShapePlan"]


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
        return super().__new__(cls, (rows, *lengths))

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


CellShape = Shape  # removed by the shape-contract refactor: one Shape for every path


def _check_shapes(shapes: Iterable[Any]) -> tuple[Shape, ...]:
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Iterable):
        raise ShapeBucketError(
            f"shapes must be a list of (rows, length) pairs, got {shapes!r}; "
            "for one shape write [(rows, length)]"
        )
    out: set[Any] = set()  # Shape, or CellShape for two-length plans
    for i, pair in enumerate(shapes):
        if (
            isinstance(pair, (str, bytes, Mapping, Set))
            or not isinstance(pair, Iterable)
            or len(pair) not in (2, 3)  # type: ignore[arg-type]
        ):
            raise ShapeBucketError(
                f"shapes[{i}] must be a (rows, length) pair, got {pair!r}; write (4, 128) for "
                "4 rows of 128 tokens (or (rows, source, target) for two-length cells)"
            )
        rows, length, *target = pair
        rows = check_int(f"shapes[{i}] rows", rows, minimum=1)
        length = check_int(f"shapes[{i}] length", length, minimum=2)
        if target:
            out.add(Shape(rows, length, check_int(f"shapes[{i}] target", target[0], minimum=2)))
        else:
            out.add(Shape(rows, length))
    if not out:
        raise ShapeBucketError("a ShapePlan needs at least one (rows, length) shape, got none")
    if len({len(s) for s in out}) > 1:
        raise ShapeBucketError(
            "shapes mix (rows, length) pairs and (rows, source, target) triples; a plan is "
            "one-length or two-length"
        )
    return tuple(sorted(out, key=lambda s: (s.length, *s[2:], s.rows)))


def _tensor_shapes(batch: Any) -> list[tuple[int, ...]]:
    if isinstance(batch, torch.Tensor):
        return [tuple(batch.shape)]
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        return [s for v in batch for s in _tensor_shapes(v)]
    return []


def _checked(batch: Any, shape: Shape) -> Any:
    """``make_batch(shape)``'s batch, refused unless a tensor has ``rows`` at dim 0 and
    ``length`` at a later dim (else prewarm compiles shapes the loader never makes). A
    batch without tensors is the step's business and passes."""
    found = _tensor_shapes(batch)
    if found and not any(
        len(t) >= 2 and t[0] == shape.rows and shape.length in t[1:] for t in found
    ):
        raise ShapeBucketError(
            f"make_batch({tuple(shape)}) returned a batch with tensor shapes {found} "
            f"({type(batch).__name__}); none has {shape.rows} rows at dim 0 and length "
            f"{shape.length} after it, so prewarm would compile a shape the loader never makes: "
            "build each batch from shape.rows and shape.length"
        )
    return batch


def _packs(obj: Any) -> bool:
    """Whether ``obj`` is a packed sampler or collator (by class: plan imports neither)."""
    return any(c.__name__ in ("PackedBatchSampler", "PackedCollator") for c in type(obj).__mro__)


class ShapePlan:
    """The set of ``(rows, length)`` shapes a loader produces, and how to make a batch of each.

    Build it with :meth:`of` (from the collator, and the sampler when the
    collator does not pad rows), with :meth:`from_function` (a
    ``make_batch(shape)`` of your own), or directly as
    ``ShapePlan([(rows, length), ...], collator)``; a two-length plan (a
    :class:`~shapebucket.collate.CellCollator`) holds :class:`CellShape` triples
    ``(rows, source, target)`` instead. ``plan.shapes`` is sorted by length, then rows; ``len(plan)`` counts them. A plan pickles when its
    collator (or ``make_batch``) does.

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
        shapes: Iterable[tuple[int, int]] | Iterable[tuple[int, int, int]],
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
        if collator is not None and not callable(getattr(collator, "repad", None)):
            raise ShapeBucketError(
                f"collator must be a BucketCollator or PackedCollator (it re-pads the example "
                f"with repad), got {type(collator).__name__}"
            )
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
        """Every shape must be one the collator can make, and with ``row_buckets`` every
        row bucket should be there (a request batch of any size lands in one)."""
        if two_length(collator):
            check_cell_shapes(self._shapes, collator)
            return
        known = sorted(collator.buckets)
        unknown = sorted({s.length for s in self._shapes} - set(known))
        if unknown:
            raise ShapeBucketError(
                f"lengths {unknown} are not buckets of the collator ({known}): it never pads a "
                "batch to them; give the sampler and the collator the same buckets"
            )
        row_buckets = getattr(collator, "row_buckets", None)
        rows = getattr(collator, "rows", None)
        for s in self._shapes:
            if row_buckets is not None and s.rows not in row_buckets:
                raise ShapeBucketError(
                    f"shape {tuple(s)}: the collator pads rows to row_buckets={list(row_buckets)}, "
                    f"so a batch of {s.rows} rows never occurs; use ShapePlan.of(collator)"
                )
            if rows is not None and s.rows != collator.rows_for(s.length):
                raise ShapeBucketError(
                    f"shape {tuple(s)}: the collator pads every batch at length {s.length} to "
                    f"rows={collator.rows_for(s.length)}, so {s.rows} rows never occur; use "
                    "ShapePlan.of(collator)"
                )
        if row_buckets is not None:
            missing = sorted(
                {(r, b) for r in row_buckets for b in {s.length for s in self._shapes}}
                - set(self._shapes)
            )
            if missing:
                warnings.warn(
                    f"the collator pads request batches to row_buckets={list(row_buckets)}, but the "
                    f"plan has no shapes {missing}: such batches compile when they first come "
                    "(no_recompiles() raises); use ShapePlan.of(collator) for all of them",
                    stacklevel=3,
                )

    @classmethod
    def of(cls, collator: Any, sampler: Any = None) -> ShapePlan:
        """The plan of a loader made of ``collator`` and ``sampler``.

        >>> from shapebucket.collate.bucket import BucketCollator
        >>> ShapePlan.of(BucketCollator([8, 16], row_buckets=[1, 4])).shapes
        (Shape(rows=1, length=8), Shape(rows=4, length=8), Shape(rows=1, length=16), Shape(rows=4, length=16))
        """
        if two_length(collator) or two_length(sampler):
            return cls(cell_shapes(collator, sampler), collator)
        if not callable(getattr(collator, "repad", None)) or not hasattr(collator, "buckets"):
            raise ShapeBucketError(
                f"ShapePlan.of needs the BucketCollator or PackedCollator of the loader, got "
                f"{type(collator).__name__}; without one use ShapePlan.from_function(shapes, make_batch)"
            )
        used = None
        if sampler is not None:
            if not callable(getattr(sampler, "shapes", None)):
                raise ShapeBucketError(
                    f"sampler must be a BucketBatchSampler or PackedBatchSampler (it lists its "
                    f"shapes()), got {type(sampler).__name__}"
                )
            if _packs(sampler) != _packs(collator):
                raise ShapeBucketError(
                    f"a {type(sampler).__name__} and a {type(collator).__name__} do not make one "
                    "loader: pair BucketBatchSampler with BucketCollator and PackedBatchSampler "
                    "with PackedCollator (same buckets and rows)"
                )
            used = cls._sampler_shapes(sampler, collator)
        row_buckets = getattr(collator, "row_buckets", None)
        lengths = list(collator.buckets) if used is None else sorted({b for _, b in used})
        if row_buckets is not None:
            too_many = sorted({(r, b) for r, b in used or () if r > max(row_buckets)})
            if too_many:
                raise ShapeBucketError(
                    f"the sampler makes batches of {too_many[0][0]} rows (at bucket "
                    f"{too_many[0][1]}), more than the collator's largest row bucket "
                    f"{max(row_buckets)} (row_buckets={list(row_buckets)}); every such batch "
                    "would fail to collate: add a larger row bucket or make the batches smaller"
                )
            return cls([(r, b) for b in lengths for r in row_buckets], collator)
        if getattr(collator, "rows", None) is not None:
            shapes = [(int(collator.rows_for(b)), b) for b in lengths]
            for rows, b in used or ():
                if rows > collator.rows_for(b):
                    raise ShapeBucketError(
                        f"the sampler makes batches of {rows} rows at bucket {b}, more than the "
                        f"collator's rows={collator.rows_for(b)} there; pass "
                        "BucketCollator(rows=sampler.rows)"
                    )
            return cls(shapes, collator)
        if used is None:
            raise ShapeBucketError(
                f"{type(collator).__name__} pads no rows (no rows= or row_buckets=), so a "
                "batch's row count comes from the sampler: pass ShapePlan.of(collator, sampler), "
                "give the collator rows=, or list the shapes: ShapePlan([(rows, length), ...], collator)"
            )
        return cls(used, collator)

    @staticmethod
    def _sampler_shapes(sampler: Any, collator: Any) -> set[tuple[int, int]]:
        used = {(int(r), int(b)) for r, b in sampler.shapes()}
        known = set(collator.buckets)
        unknown = sorted({b for _, b in used} - known)
        if unknown:
            raise ShapeBucketError(
                f"the sampler makes batches at buckets {unknown}, which the collator "
                f"({list(known)}) does not have; give the sampler and the collator the same buckets"
            )
        return used

    @classmethod
    def from_function(
        cls, shapes: Iterable[tuple[int, int]], make_batch: Callable[[Shape], Any]
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
        """Every shape, sorted by length, then rows."""
        return self._shapes

    @property
    def lengths(self) -> Buckets:
        """The distinct lengths of the shapes."""
        return Buckets(sorted({s.length for s in self._shapes}))

    @property
    def collator(self) -> Any:
        """The collator that re-pads examples (``None`` for :meth:`from_function` plans)."""
        return self._collator

    @property
    def seq_dim(self) -> int:
        """The sequence dim of each sample (the collator's ``seq_dim``; 0 without one):
        batches have their length at dim ``seq_dim + 1``."""
        return int(getattr(self._collator, "seq_dim", 0))

    def batch(self, example: Any, shape: tuple[int, int]) -> Any:
        """A batch of ``shape`` (one of the plan's): ``collator.repad(example, length, rows)``,
        or ``make_batch(shape)``, which must return tensors of ``shape``."""
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Iterable):
            raise ShapeBucketError(f"shape must be a (rows, length) pair, got {shape!r}")
        pair = tuple(shape)
        if pair not in self._shapes:
            raise ShapeBucketError(
                f"shape {pair!r} is not in the plan {[tuple(s) for s in self._shapes]}; a "
                "batch of it would compile a graph no loader batch uses: pass one of plan.shapes"
            )
        shape = Shape(*pair) if len(pair) == 2 else CellShape(*pair)
        if self._make_batch is not None:
            return _checked(self._make_batch(shape), shape)
        if example is None:
            raise ShapeBucketError(
                "this plan re-pads an example batch to each shape: pass example=next(iter(loader))"
            )
        if len(shape) == 3:
            return self._collator.repad(example, shape.lengths, shape.rows)
        return self._collator.repad(example, shape.length, shape.rows)

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

    def __getstate__(self) -> dict[str, Any]:
        return {"shapes": self._shapes, "collator": self._collator, "make_batch": self._make_batch}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._shapes = state["shapes"]
        self._collator = state["collator"]
        self._make_batch = state["make_batch"]

    def __repr__(self) -> str:
        pairs = ", ".join(str(tuple(s)) for s in self._shapes)  # (rows, length[, target])
        source = (
            type(self._collator).__name__
            if self._collator is not None
            else getattr(self._make_batch, "__name__", "make_batch")
        )
        return f"ShapePlan([{pairs}], {source})"
