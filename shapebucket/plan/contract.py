"""What a plan checks of what it is given: the protocol's members, ``shapes(sampler)``,
the pairing by ``packs``, and that ``repad`` (or ``make_batch``) returns a batch of the
shape asked for; :func:`walk_batch` is the one walk over a nested batch."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = [
    "batch_items",
    "check_batch_shape",
    "check_pairing",
    "check_protocol",
    "check_repad",
    "collator_shapes",
    "walk_batch",
]


def walk_batch(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every leaf of a nested batch (or a model's output) of dicts,
    lists, tuples and dataclasses.

    >>> list(walk_batch({"a": 1, "b": (2, 3)}))
    [('a', 1), ('b[0]', 2), ('b[1]', 3)]
    """
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from walk_batch(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk_batch(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from walk_batch(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)
    else:
        yield path, obj


def batch_items(batch: Any, need: str = "repad needs a batch this collator made") -> list:
    """A batch's ``(key, value)`` pairs: a dict's items, a tuple's ``(position, value)``,
    a bare tensor as ``[(0, tensor)]``; anything else refused, saying what is ``need``-ed."""
    if isinstance(batch, Mapping):
        return list(batch.items())
    if isinstance(batch, (tuple, list)):
        return list(enumerate(batch))
    if isinstance(batch, torch.Tensor):
        return [(0, batch)]
    raise ShapeBucketError(f"{need} (a dict, a tuple or a tensor), got {type(batch).__name__}")


def check_batch_shape(
    batch: Any,
    shape: Any,
    name: str = "",
    fix: str = "build each batch from shape.rows and shape.lengths",
) -> Any:
    """``batch`` (``make_batch(shape)``'s, or ``name``'s), refused unless a tensor has
    ``shape.rows`` at dim 0 and each of ``shape.lengths`` after it (else prewarm compiles,
    or calibration measures, a shape the loader never makes). A batch without tensors is
    the step's business and passes.

    >>> from shapebucket.plan import Shape
    >>> check_batch_shape(torch.ones(2, 8), Shape(2, 8)).shape
    torch.Size([2, 8])
    """
    found = [tuple(v.shape) for _, v in walk_batch(batch) if isinstance(v, torch.Tensor)]
    rowed = [t for t in found if len(t) >= 2 and t[0] == shape.rows]
    missing = [n for n in shape.lengths if not any(n in t[1:] for t in rowed)]
    if found and (not rowed or missing):
        raise ShapeBucketError(
            f"{name or f'make_batch({tuple(shape)})'} returned a batch with tensor shapes "
            f"{found}; none has {shape.rows} rows at dim 0 and length "
            f"{(missing or list(shape.lengths))[0]} after it, so it would stand for a shape "
            f"the loader never makes: {fix}"
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
    """``collator.repad(..., shape)``'s ``batch``, refused when it is None or not of
    ``shape`` (:func:`check_batch_shape`)."""
    name = f"{type(collator).__name__}.repad(batch, {tuple(shape)})"
    if batch is None:
        raise ShapeBucketError(
            f"{name} returned None; repad must return the re-padded batch (the ShapedCollator "
            "protocol), not change the batch in place"
        )
    fix = "repad must return a batch of exactly the shape it is given"
    return check_batch_shape(batch, shape, name, fix)
