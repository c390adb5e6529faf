"""Cutting a call's outputs back to the caller's shape, by the roles of their dims learned
from two probe calls of the model (``docs/bucketed.md``, "What a call does", step 5)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..errors import ShapeBucketError
from .calls import Call
from .packed import unpack
from .placement import PackedCall

__all__ = ["OutputRoles", "cloned", "cut_outputs", "learn_roles", "numbers", "probe_shapes"]

#: the offsets a length dim may have from its length (shifted logits: -1)
_OFFSETS = (0, -1, 1, -2, 2)

Role = tuple[Any, ...]  # ("rows",) | ("length", side, offset) | ("flat", side, offset)
#: per output tensor (in :func:`leaves` order), the role of each dim (``None``: fixed)
OutputRoles = tuple[tuple[Role | None, ...], ...]


# -- walking an output ------------------------------------------------------------------------


def leaves(out: Any, path: str = "output") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``out`` (a tensor, a dict or ``ModelOutput``, a dataclass, a tuple
    or list, nested), with its path, in a fixed order."""
    for p, v in _values(out, path):
        if isinstance(v, torch.Tensor):
            yield p, v


def _values(out: Any, path: str = "output") -> Iterator[tuple[str, Any]]:
    """Every leaf of ``out`` (tensors and other values), with its path, in a fixed order."""
    if isinstance(out, Mapping):
        for k, v in out.items():
            yield from _values(v, f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(out) and not isinstance(out, type):
        for f in dataclasses.fields(out):
            yield from _values(getattr(out, f.name), f"{path}.{f.name}")
    elif isinstance(out, (tuple, list)):
        for i, v in enumerate(out):
            yield from _values(v, f"{path}[{i}]")
    else:
        yield path, out


def numbers(out: Any) -> Iterator[tuple[str, Any]]:
    """Every Python number of ``out`` (a bool, int, float or complex leaf, not a
    tensor), with its path, in :func:`leaves` order.

    >>> list(numbers({"x": torch.zeros(1), "n": 3, "name": "a", "mask": None}))
    [("output['n']", 3)]
    """
    for p, v in _values(out):
        if isinstance(v, (bool, int, float, complex)):
            yield p, v


def _refuse_shape_numbers(outs: list[Any], shapes: list[tuple[int, dict[str, int]]]) -> None:
    """Refuse an int output that follows the probe shapes' rows or a length, as a dim would
    (other numbers, a loss's ``.item()``, pass)."""
    patterns = {pair for _, pair in _patterns(shapes)}
    (r0, l0), (r1, l1) = shapes
    second = dict(_values(outs[1]))
    for path, x in _values(outs[0]):
        y = second.get(path)
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (x, y))
        if ints and (x, y) in patterns:
            raise ShapeBucketError(
                f"BucketedModel: {path} is {x!r} for a call of {r0} rows and lengths {l0}, "
                f"and {y!r} for {r1} rows and {l1}: an int that follows the call's shape "
                "would come back as the padded call's, not the caller's; return it as a "
                "tensor of the shape's dims, or call the model unwrapped"
            )


def _rebuild(out: Any, new: Iterator[torch.Tensor]) -> Any:
    """``out`` with its tensors replaced by ``new``'s, in :func:`leaves` order."""
    if isinstance(out, torch.Tensor):
        return next(new)
    if isinstance(out, Mapping):
        fixed = {k: _rebuild(v, new) for k, v in out.items()}
        kind: Any = type(out)
        try:
            return kind(**fixed)  # a ModelOutput or a dict subclass of its fields
        except TypeError:
            return kind(fixed.items())
    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        changes = {f.name: _rebuild(getattr(out, f.name), new) for f in dataclasses.fields(out)}
        return dataclasses.replace(out, **changes)
    if isinstance(out, tuple) and hasattr(type(out), "_fields"):  # a NamedTuple
        return type(out)(*(_rebuild(v, new) for v in out))
    if isinstance(out, (tuple, list)):
        return type(out)(_rebuild(v, new) for v in out)
    return out


# -- learning -------------------------------------------------------------------------------


def probe_shapes(table: list[int], sides: list[str]) -> list[tuple[int, dict[str, int]]]:
    """Two shapes ``(rows, {side: length})`` whose every pattern (rows, each length with
    each offset, rows times each length) changes differently, so that one dim's change
    names one role.

    >>> probe_shapes([8, 16, 32], ["source"])
    [(2, {'source': 8}), (3, {'source': 16})]
    """
    a = table[0]
    b = table[1] if len(table) > 1 else (a - 1 if a >= 3 else a + 1)
    lengths = [{"source": a, "target": b}, {"source": b, "target": a}]
    if sides == ["target"]:
        lengths = [{"target": a}, {"target": b}]
    lengths = [{s: ls[s] for s in sides} for ls in lengths]
    for r0, r1 in itertools.combinations(range(2, 40), 2):
        shapes = [(r0, lengths[0]), (r1, lengths[1])]
        pairs = [p for _, p in _patterns(shapes)]
        if len(set(pairs)) == len(pairs) and all(x != y for x, y in pairs):
            return shapes
    raise ShapeBucketError(f"no probe shapes for buckets {table}")  # pragma: no cover


def _patterns(shapes: list[tuple[int, dict[str, int]]]) -> list[tuple[Role, tuple[int, int]]]:
    (r0, l0), (r1, l1) = shapes
    found: list[tuple[Role, tuple[int, int]]] = [(("rows",), (r0, r1))]
    for side in l0:
        for off in _OFFSETS:
            found.append((("length", side, off), (l0[side] + off, l1[side] + off)))
            found.append((("flat", side, off), (r0 * (l0[side] + off), r1 * (l1[side] + off))))
    return found


def learn_roles(outs: list[Any], shapes: list[tuple[int, dict[str, int]]]) -> OutputRoles:
    """The roles of the outputs ``outs`` of two calls at ``shapes``
    (:func:`probe_shapes`).

    >>> shapes = probe_shapes([8, 16], ["source"])
    >>> outs = [{"logits": torch.zeros(r, ls["source"], 8), "loss": torch.zeros(())} for r, ls in shapes]
    >>> learn_roles(outs, shapes)
    ((('rows',), ('length', 'source', 0), None), ())
    """
    patterns = dict((pair, role) for role, pair in _patterns(shapes))
    first, second = (list(leaves(o)) for o in outs)
    if [(p, t.ndim) for p, t in first] != [(p, t.ndim) for p, t in second]:
        raise ShapeBucketError(
            "the model's outputs have another structure at another shape "
            f"({[p for p, _ in first]} against {[p for p, _ in second]}): BucketedModel "
            "cannot cut them back; call the model unwrapped"
        )
    _refuse_shape_numbers(outs, shapes)
    roles = []
    for (path, a), (_, b) in zip(first, second, strict=True):
        dims: list[Role | None] = []
        for d, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)):
            if x == y:
                dims.append(None)
            elif (x, y) in patterns:
                dims.append(patterns[(x, y)])
            else:
                (r0, l0), (r1, l1) = shapes
                raise ShapeBucketError(
                    f"BucketedModel: {path} has size {x} at dim {d} for a call of {r0} rows "
                    f"and lengths {l0}, and {y} for {r1} rows and {l1}: it follows neither the "
                    "rows nor a length, so it cannot be cut back to the caller's call; call "
                    "the model unwrapped, or return [rows, length, ...] outputs"
                )
        roles.append(tuple(dims))
    return tuple(roles)


# -- cutting --------------------------------------------------------------------------------


def _cut_dim(t: torch.Tensor, d: int, role: Role, call: Call) -> torch.Tensor:
    if role[0] == "rows":
        return t.narrow(d, 0, call.rows) if call.rows != call.padded_rows else t
    side = call.sides[role[1]]
    keep, start = side.length + role[2], (side.bucket - side.length if call.left else 0)
    if role[0] == "length":
        return t.narrow(d, start, keep) if keep != t.shape[d] else t
    grid = t.unflatten(d, (call.padded_rows, side.bucket + role[2]))
    return grid.narrow(d, 0, call.rows).narrow(d + 1, start, keep).flatten(d, d + 1)


def packs_outputs(roles: OutputRoles) -> bool:
    """Whether every output can come back from a packed call: per-token (rows at dim 0,
    a length at dim 1, nothing else changing) or fixed (a scalar loss)."""
    return all(
        all(r is None for r in dims)
        or (
            len(dims) >= 2
            and dims[0] == ("rows",)
            and dims[1] == ("length", "source", 0)
            and all(r is None for r in dims[2:])
        )
        for dims in roles
    )


def _with_roles(out: Any, roles: OutputRoles) -> list[tuple[torch.Tensor, tuple[Role | None, ...]]]:
    """Each tensor of ``out`` with its learned roles (refused when their numbers differ)."""
    tensors = [t for _, t in leaves(out)]
    if len(tensors) != len(roles):
        raise ShapeBucketError(
            f"the model returned {len(tensors)} tensors for a call of a kind that returned "
            f"{len(roles)} before: BucketedModel cannot cut them back; call the model "
            "unwrapped"
        )
    return list(zip(tensors, roles, strict=True))


def cut_outputs(out: Any, roles: OutputRoles, call: Call) -> Any:
    """Every tensor of ``out`` cut back to the call's shape along its learned roles.

    >>> from shapebucket.bucketed.calls import Side
    >>> call = Call(rows=2, padded_rows=4, sides={"source": Side(["input_ids"], 5, 8)})
    >>> roles = ((("rows",), ("length", "source", 0), None), ())
    >>> out = cut_outputs({"logits": torch.zeros(4, 8, 8), "loss": torch.tensor(1.0)}, roles, call)
    >>> out["logits"].shape, out["loss"].shape
    (torch.Size([2, 5, 8]), torch.Size([]))
    """
    if call.packed is not None:
        return _unpacked(out, roles, call.packed)
    if not call.pads:
        return out
    cut = []
    for t, dims in _with_roles(out, roles):
        for d, role in enumerate(dims):
            if role is not None:
                t = _cut_dim(t, d, role, call)
        cut.append(t)
    return _rebuild(out, iter(cut))


def cloned(out: Any) -> Any:
    """``out`` with every tensor cloned (its structure rebuilt as :func:`cut_outputs` does).

    >>> out = {"logits": torch.zeros(2)}
    >>> cloned(out)["logits"] is out["logits"]
    False
    """
    return _rebuild(out, (t.clone() for _, t in leaves(out)))


def _unpacked(out: Any, roles: OutputRoles, packed: PackedCall) -> Any:
    """``out`` of a packed call with every per-token output put back in the caller's
    layout (pads 0); fixed outputs (a mean loss) as they are."""
    back = [
        t if all(r is None for r in dims) else unpack(t, packed)
        for t, dims in _with_roles(out, roles)
    ]
    return _rebuild(out, iter(back))


def probe(run: Callable[[dict[str, Any]], Any], batches: list[dict[str, Any]]) -> list[Any]:
    """``run`` on each batch under ``no_grad``, with the random state put back after (a
    dropout draws no number the caller's call would have drawn). Batch-norm statistics
    are not touched: a call that pads a training batch-norm model is refused before."""
    device = next(
        (v.device for b in batches for v in b.values() if isinstance(v, torch.Tensor)), None
    )
    devices = [device] if device is not None and device.type == "cuda" else []
    with torch.no_grad(), torch.random.fork_rng(devices=devices):
        return [_probe_one(run, b) for b in batches]


def _probe_one(run: Callable[[dict[str, Any]], Any], batch: dict[str, Any]) -> Any:
    try:
        return run(batch)
    except ShapeBucketError:
        raise
    except Exception as e:
        shapes = {k: tuple(v.shape) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        raise ShapeBucketError(
            f"BucketedModel learns which output dims to cut back from two eager probe calls "
            f"of each kind of call, and the model failed on the probe call {shapes}: "
            f"{type(e).__name__}: {e}. A model that runs only some row counts or lengths "
            "cannot be padded to others: call it unwrapped (or fix what its error names, "
            "such as a config.pad_token_id for more than one row)"
        ) from e
