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
