"""The collator protocol: what a :class:`~shapebucket.plan.ShapePlan` asks of a
collator (:class:`ShapedCollator`) and of a sampler (:class:`ShapedSampler`). A user's
collator that implements it is planned, prewarmed and guarded like the built-in ones;
pairing is by ``packs``, never by class name.

>>> from shapebucket import BucketCollator
>>> isinstance(BucketCollator([8, 16]), ShapedCollator)
True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import ShapeBucketError
from .contract import check_pairing
from .shapes import Shape, as_shape

__all__ = ["ShapedCollator", "ShapedSampler", "sampler_shapes", "table_shapes"]


@runtime_checkable
class ShapedCollator(Protocol):
    """A collate function that lists the shapes it makes and re-pads its batches.

    ``shapes(sampler)`` must contain the shape of every batch the collator makes
    from the batches of ``sampler``; ``repad(batch, shape)`` must return a batch
    of exactly ``shape`` (``shape.rows`` rows, ``shape.lengths`` on the padded
    axes) with the keys, dtypes and trailing dims of ``batch``, whose real values
    are ``batch``'s where they fit. ``packs`` says whether its rows hold several samples
    each; ``seq_dim`` is each sample's sequence dim (0 for token lists).
    """

    packs: bool
    seq_dim: int

    def __call__(self, samples: Sequence[Any]) -> Any:
        """Collate a list of samples into a batch."""
        ...

    def shapes(self, sampler: Any = None) -> frozenset[Shape]:
        """Every shape the collator makes for the batches of ``sampler``."""
        ...

    def repad(self, batch: Any, shape: Shape) -> Any:
        """``batch`` (one the collator made) cut or padded to ``shape``."""
        ...


@runtime_checkable
class ShapedSampler(Protocol):
    """A batch sampler that lists the shape of each batch it yields on this rank.

    ``packs`` (a class attribute) is True for a sampler whose batches are rows of
    several samples each (their shapes' rows are packed rows).
    """

    packs: bool

    def shapes(self) -> Iterable[Any]:
        """``(rows, *lengths)`` of every batch this sampler yields on this rank."""
        ...


def sampler_shapes(sampler: Any, collator: Any, axes: int = 1) -> frozenset[Shape]:
    """The shapes of ``sampler``'s batches (its ``shapes()``), checked to pair with
    ``collator`` by ``packs`` and to have ``axes`` lengths: where a collator's ``shapes()``
    starts."""
    name, kind = type(collator).__name__, type(sampler).__name__
    if not callable(getattr(sampler, "shapes", None)):
        raise ShapeBucketError(
            f"{name}.shapes(sampler) needs a batch sampler that lists its shapes() "
            f"(BucketBatchSampler, PackedBatchSampler, CellBatchSampler), got {kind}"
        )
    check_pairing(sampler, collator)
    listed = sampler.shapes()
    if isinstance(listed, (str, bytes)) or not isinstance(listed, Iterable):
        raise ShapeBucketError(
            f"{kind}.shapes() returned {listed!r}; it must list the (rows, *lengths) shape of "
            "every batch the sampler yields, such as [(4, 128), (2, 256)]"
        )
    shapes = [as_shape(s, what=f"{kind}.shapes()") for s in listed]
    wrong = [s for s in shapes if len(s.lengths) != axes]
    if wrong:
        raise ShapeBucketError(
            f"a {kind} and a {name} do not make one loader: the sampler's batches have "
            f"{len(wrong[0].lengths)} length(s) ({tuple(wrong[0])}), the collator pads {axes}; "
            "pair CellBatchSampler (source and target) with CellCollator, the one-length "
            "samplers with BucketCollator or PackedCollator"
        )
    return frozenset(shapes)


def table_shapes(collator: Any, sampler: Any, table: Any, axes: int = 1) -> frozenset[Shape]:
    """The shapes of a collator that pads to the entries of ``table`` (bucket lengths; with
    ``axes=2``, ``(source, target)`` cells), at ``collator.rows_for(entry)`` rows when it
    has ``rows``: without a sampler every entry (refused without ``rows``); with one, the
    sampler's shapes (:func:`sampler_shapes`), refusing an entry the table lacks and a
    batch of more rows than ``rows_for``."""
    name, word = type(collator).__name__, ("bucket", "cell")[axes - 1]

    def entry(lengths: tuple[int, ...]) -> Any:
        return lengths[0] if axes == 1 else lengths

    if sampler is None:
        if collator.rows is None:
            raise ShapeBucketError(
                f"{name} pads no rows (no rows=), so a batch's row count comes from the "
                "sampler: pass ShapePlan.of(collator, sampler), give the collator rows=, or "
                "list the shapes: ShapePlan([(rows, *lengths), ...], collator)"
            )
        cells = [(e,) if axes == 1 else tuple(e) for e in table]
        return frozenset(Shape(collator.rows_for(entry(c)), *c) for c in cells)
    used = sampler_shapes(sampler, collator, axes)
    unknown = sorted({entry(s.lengths) for s in used} - set(table))
    if unknown:
        raise ShapeBucketError(
            f"the sampler makes batches at {word}s {unknown}, which the collator ({table!r}) "
            f"does not have (lengths {unknown} are not {word}s of it, so it never pads a batch "
            f"to them); give the sampler and the collator the same {word}s"
        )
    if collator.rows is None:
        return used
    out = set()
    for s in used:
        rows = collator.rows_for(entry(s.lengths))
        if s.rows > rows:
            raise ShapeBucketError(
                f"the sampler makes batches of {s.rows} rows at {word} {entry(s.lengths)}, "
                f"more than the collator's rows={rows} there; pass {name}(rows=sampler.rows)"
            )
        out.add(Shape(rows, *s.lengths))
    return frozenset(out)
