"""What a plan checks of what it is given: a collator implements the protocol (its members,
``shapes(sampler)`` callable with a sampler), pairs with the sampler by ``packs``, and
``repad`` (or ``make_batch``) returns a batch of the shape it was asked for.

These checks know a shape only as ``rows`` and ``lengths``, so :mod:`.shapes` and
:mod:`.protocol` both use them. They read a batch through :func:`walk_batch` (every leaf
of a nested batch), the one walk that marking and the background compile use too.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = [
    "check_batch_shape",
    "check_pairing",
    "check_protocol",
    "check_repad",
    "collator_shapes",
    "walk_batch",
]


def walk_batch(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every leaf of a nested batch of dicts, lists and tuples.

    >>> list(walk_batch({"a": 1, "b": (2, 3)}))
    [('a', 1), ('b[0]', 2), ('b[1]', 3)]
    """
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from walk_batch(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk_batch(v, f"{path}[{i}]")
    else:
        yield path, obj


def _tensor_shapes(batch: Any) -> list[tuple[int, ...]]:
    return [tuple(v.shape) for _, v in walk_batch(batch) if isinstance(v, torch.Tensor)]


def check_batch_shape(batch: Any, shape: Any) -> Any:
    """``make_batch(shape)``'s batch, refused unless a tensor has ``rows`` at dim 0 and
    ``length`` at a later dim (else prewarm compiles, or calibration measures, a shape
    the loader never makes). A batch without tensors is the step's business and passes.

    >>> from shapebucket.plan import Shape
    >>> check_batch_shape(torch.ones(2, 8), Shape(2, 8)).shape
    torch.Size([2, 8])
    """
    found = _tensor_shapes(batch)
    if found and not any(
        len(t) >= 2 and t[0] == shape.rows and shape.length in t[1:] for t in found
    ):
        raise ShapeBucketError(
            f"make_batch({tuple(shape)}) returned a batch with tensor shapes {found} "
            f"({type(batch).__name__}); none has {shape.rows} rows at dim 0 and length "
            f"{shape.length} after it, so it would stand for a shape the loader never makes: "
            "build each batch from shape.rows and shape.length"
        )
    return batch


def check_protocol(collator: Any, where: str) -> None:
    """Refuse an object that does not implement :class:`~shapebucket.plan.ShapedCollator`
    (``shapes(sampler)``, ``repad(batch, shape)``, ``packs`` and ``seq_dim``), naming what
    it lacks."""
    lacks = [m for m in ("shapes", "repad") if not callable(getattr(collator, m, None))]
    lacks += [m for m in ("packs", "seq_dim") if not hasattr(collator, m)]
    if lacks:
        raise ShapeBucketError(
            f"{where} needs a collator that implements the ShapedCollator protocol "
            f"(shapes(sampler), repad(batch, shape), packs and seq_dim); "
            f"{type(collator).__name__} has no {' or '.join(lacks)}: use BucketCollator, "
            "PackedCollator or CellCollator, add them to your collator (packs = False and "
            "seq_dim = 0 for rows of one token sequence each), or build the plan with "
            "ShapePlan.from_function(shapes, make_batch)"
        )


def check_pairing(sampler: Any, collator: Any) -> None:
    """Refuse a sampler and a collator of which one packs samples into rows and the other
    does not (their ``packs`` attributes; a sampler without one does not pack)."""
    packs, packed = bool(getattr(sampler, "packs", False)), bool(collator.packs)
    if packs != packed:
        name, kind = type(collator).__name__, type(sampler).__name__
        what = ("packs samples into rows", "does not pack")
        raise ShapeBucketError(
            f"a {kind} and a {name} do not make one loader: the sampler "
            f"{what[0] if packs else what[1]} (packs={packs}) and the collator "
            f"{what[0] if packed else what[1]} (packs={packed}); pair BucketBatchSampler with "
            "BucketCollator, PackedBatchSampler with PackedCollator and CellBatchSampler with "
            "CellCollator (same buckets and rows)"
        )


def collator_shapes(collator: Any, sampler: Any) -> Any:
    """``collator.shapes(sampler)``, refused with the fix when ``shapes`` takes no sampler
    (the protocol's ``shapes(sampler=None)``)."""
    try:
        inspect.signature(collator.shapes).bind(sampler)
    except TypeError:
        raise ShapeBucketError(
            f"{type(collator).__name__}.shapes{inspect.signature(collator.shapes)} cannot be "
            "called with a sampler; the ShapedCollator protocol's method is "
            "shapes(self, sampler=None): add the parameter"
        ) from None
    except ValueError:  # a builtin without a signature: call it as it is
        pass
    made = collator.shapes(sampler)
    listed = getattr(sampler, "shapes", None)
    if not callable(listed) or isinstance(made, (str, bytes)) or not isinstance(made, Iterable):
        return made  # no sampler, or not a list: the plan's own checks name it
    made = list(made)
    want = sorted({n for n in map(_lengths_of, listed()) if n is not None})
    for shape in made:
        n = _lengths_of(shape)
        if n is not None and want and n not in want:
            kind = "(rows, length) pairs" if want == [1] else "(rows, source, target) triples"
            raise ShapeBucketError(
                f"{type(collator).__name__}.shapes(sampler) returned {tuple(shape)!r}, a shape "
                f"of {n} length(s), for a {type(sampler).__name__} whose batches have "
                f"{' or '.join(map(str, want))} length(s): the plan would prewarm shapes the loader never "
                f"makes; the ShapedCollator protocol's shapes() gives {kind} for these "
                "batches (Shape(rows, *lengths) of each batch it makes)"
            )
    return made


def _lengths_of(shape: Any) -> int | None:
    """How many lengths a ``(rows, *lengths)`` shape has (``None``: not a shape; the plan's
    own checks name it)."""
    lengths = getattr(shape, "lengths", None)  # a Shape
    if isinstance(lengths, tuple):
        return len(lengths)
    if isinstance(shape, (str, bytes, Mapping)) or not isinstance(shape, Sequence):
        return None
    return len(shape) - 1 if len(shape) >= 2 else None


def check_repad(collator: Any, batch: Any, shape: Any) -> Any:
    """``collator.repad(..., shape)``'s ``batch``, refused unless it is a batch and, when it
    holds tensors, one has ``shape.rows`` rows at dim 0 and each of ``shape.lengths`` after
    it (else prewarm would compile a shape the loader never makes)."""
    name = f"{type(collator).__name__}.repad(batch, {tuple(shape)})"
    if batch is None:
        raise ShapeBucketError(
            f"{name} returned None; repad must return the re-padded batch (the ShapedCollator "
            "protocol), not change the batch in place"
        )
    found = _tensor_shapes(batch)
    rowed = [t for t in found if len(t) >= 2 and t[0] == shape.rows]
    missing = [n for n in shape.lengths if not any(n in t[1:] for t in rowed)]
    if found and (not rowed or missing):
        raise ShapeBucketError(
            f"{name} returned a batch with tensor shapes {found}; none has {shape.rows} rows "
            f"at dim 0 and length {(missing or list(shape.lengths))[0]} after it, so prewarm "
            "would compile a shape the loader never makes: repad must return a batch of "
            "exactly the shape it is given"
        )
    return batch
