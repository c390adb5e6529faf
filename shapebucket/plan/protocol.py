"""The collator protocol: what a :class:`~shapebucket.plan.ShapePlan` asks of a collator.

A collator that implements :class:`ShapedCollator` is planned, prewarmed and guarded
like the built-in ones (:class:`~shapebucket.BucketCollator`,
:class:`~shapebucket.PackedCollator`, :class:`~shapebucket.collate.CellCollator`):

* ``shapes(sampler=None)``: every :class:`~shapebucket.plan.Shape` the collator makes
  for the batches of ``sampler`` (a :class:`ShapedSampler`; ``None``: the shapes it
  makes on its own, or a :class:`~shapebucket.ShapeBucketError` when its row count
  comes from the sampler);
* ``repad(batch, shape)``: a batch of ``shape`` made from ``batch``, a batch the
  collator made (:func:`shapebucket.prewarm` compiles each shape from one);
* ``packs``: True when its rows hold several samples each (it pairs with a packing
  sampler);
* ``seq_dim``: the sequence dim of each sample (batches have their length at dim
  ``seq_dim + 1``).

A sampler (:class:`ShapedSampler`) lists ``shapes()``, the shape of each batch it
yields on this rank, and says whether it ``packs`` samples into rows. Pairing is by
that attribute, never by class name: :func:`sampler_shapes` refuses a packing sampler
with a collator that does not pack, and the other way round.

>>> from shapebucket import BucketCollator
>>> isinstance(BucketCollator([8, 16]), ShapedCollator)
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import ShapeBucketError
from .contract import check_pairing
from .shapes import Shape, as_shape

__all__ = ["ShapedCollator", "ShapedSampler", "sampler_shapes"]


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
    """The shapes of ``sampler``'s batches, checked to suit ``collator``: the sampler
    lists ``shapes()``, packs exactly when the collator does (their ``packs`` attributes;
    a sampler without one does not pack), and its shapes have ``axes`` lengths. A collator's ``shapes()`` starts
    from them.

    >>> from shapebucket import BucketCollator
    >>> class Listed:
    ...     packs = False
    ...     def shapes(self):
    ...         return [(4, 8), (2, 16)]
    >>> sorted(sampler_shapes(Listed(), BucketCollator([8, 16])))
    [Shape(rows=2, length=16), Shape(rows=4, length=8)]
    """
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


def shapes_at_rows(
    collator: Any,
    used: frozenset[Shape],
    key: Callable[[Shape], Any],
    too_many: Callable[[Shape, int], str],
) -> frozenset[Shape]:
    """The shapes ``collator`` pads a sampler's batches (``used``: their shapes) to: with
    ``collator.rows``, each at ``collator.rows_for(key(shape))`` rows, refusing a batch with
    more rows than that (``too_many(shape, rows)`` says so, naming the fix); without,
    ``used`` as it is.

    >>> class C:
    ...     rows = 4
    ...     def rows_for(self, length): return 4
    >>> shapes_at_rows(C(), frozenset({Shape(2, 8)}), lambda s: s.length, lambda s, r: "")
    frozenset({Shape(rows=4, length=8)})
    """
    if collator.rows is None:
        return used
    for s in used:
        rows = collator.rows_for(key(s))
        if s.rows > rows:
            raise ShapeBucketError(too_many(s, rows))
    return frozenset(Shape(collator.rows_for(key(s)), *s.lengths) for s in used)
