"""Planning a wrapper's shapes: what each kind of call learns before its first planned
call (its output roles, whether it packs), the padded shape of each call (or its
refusal), and ``BucketedModel.plan(example)``, every shape a wrapper runs."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .. import _torch as compat
from ..errors import ShapeBucketError
from ..fit.step_cost import StepCost
from ..plan import Shape, ShapePlan
from .calls import Call, Route, Side, read_call
from .checks import refuse_empty
from .outputs import learn_roles, packs_outputs, probe, probe_shapes
from .packed import Packer, host_lengths
from .pad import pad_call
from .tracing import uncompiled

__all__ = ["learn", "plan_call", "plan_of"]


def learn(
    wrapper: Any,
    kwargs: Mapping[str, Any],
    route: Route,
    sides: dict[str, Side],
) -> None:
    """Learn ``route``'s output roles from two probe calls of ``kwargs`` (compiler off),
    and whether its calls pack."""
    left = wrapper.padding_side == "left"
    shapes = probe_shapes(list(wrapper.buckets), list(sides))
    have = int(kwargs[next(iter(sides.values())).keys[0]].shape[0])
    batches = []
    for rows, lengths in shapes:
        at = {n: Side(s.keys, min(s.length, lengths[n]), lengths[n]) for n, s in sides.items()}
        call = Call(min(rows, have), rows, at, left=left)
        batches.append(wrapper.with_cache_off(pad_call(kwargs, route, call)))
    inner = compat.unwrap_compiled(wrapper.model)
    route.outputs = learn_roles(probe(lambda b: uncompiled(inner, b), batches), shapes)
    if (
        wrapper.packing is not None
        and not left  # padding_side="left" asks for padded calls
        and list(route.sides) == ["source"]
        and not route.row_keys
        and "position_ids" not in kwargs
        and packs_outputs(route.outputs)
    ):
        route.packer = Packer(wrapper, route)


def plan_call(
    rows: int,
    sides: dict[str, Side],
    *,
    lengths: Sequence[int],
    row_buckets: Sequence[int] | None,
    overflow: str,
    costs: tuple[StepCost, StepCost] | None,
    left: bool,
    packed: bool = False,
) -> Call | str:
    """The padded shape of a call of ``rows`` rows and ``sides`` (each side's ``bucket``
    set to the smallest of ``lengths`` that holds it, the rows to the smallest of
    ``row_buckets``), or why it runs at its own shape (past the plan with
    ``overflow="eager"`` or ``"dynamic"``, or, with ``costs``, cheaper on the dynamic
    graph than padded). Past the plan with ``overflow="error"``: refused with the fix.
    A ``packed`` call's rows are checked once packed (its samples may fit fewer rows)."""
    if rows == 0 and not row_buckets:
        refuse_empty(sides)
    too_long = [s for s in sides.values() if s.length > lengths[-1]]
    too_many = row_buckets is not None and rows > row_buckets[-1] and not packed
    if too_long or too_many:
        if overflow != "error":
            if too_long:
                return f"past the largest bucket {lengths[-1]}"
            return f"past the largest row bucket {row_buckets[-1]}"  # type: ignore[index]
        if too_long:
            s = too_long[0]
            raise ShapeBucketError(
                f"BucketedModel: {s.keys[0]!r} has length {s.length} > largest bucket "
                f"{lengths[-1]} (buckets {list(lengths)}); add a bucket >= {s.length}, cut "
                "the input, or pass overflow='eager' or 'dynamic' to run such calls at "
                "their own shape"
            )
        raise ShapeBucketError(
            f"BucketedModel: the call has {rows} rows > largest row bucket "
            f"{row_buckets[-1]} (row_buckets {row_buckets}); add a row bucket >= {rows}, "  # type: ignore[index]
            "split the batch, or pass overflow='eager' or 'dynamic'"
        )
    padded_rows = (  # a packed call past the row buckets: its packed rows decide
        rows
        if row_buckets is None or rows > row_buckets[-1]
        else row_buckets[bisect.bisect_left(row_buckets, rows)]
    )
    for s in sides.values():
        s.bucket = lengths[bisect.bisect_left(lengths, s.length)]
    if costs is not None and _dynamic_cheaper(costs, rows, padded_rows, sides):
        return "cheaper on the dynamic graph than padded, by costs="
    return Call(rows, padded_rows, sides, left=left)


def _dynamic_cheaper(
    costs: tuple[StepCost, StepCost], rows: int, padded_rows: int, sides: dict[str, Side]
) -> bool:
    """Whether the call costs less at its own shape on the dynamic graph than padded."""
    static, dynamic = costs
    padded = sum(padded_rows * s.bucket * static.per_token(s.bucket) for s in sides.values())
    own = sum(rows * s.length * dynamic.per_token(s.length) for s in sides.values())
    return own < padded


def plan_of(wrapper: Any, example: Mapping[str, Any]) -> ShapePlan:
    """The plan of ``wrapper``'s (a ``BucketedModel``'s) shapes, each batch ``example`` re-padded (or cut) to it."""
    if not isinstance(example, Mapping):
        raise ShapeBucketError(
            f"plan(example) takes the keyword batch of one call (a dict), got "
            f"{type(example).__name__}"
        )
    example = dict(example)
    rows, sides = read_call(example, wrapper.route(example))
    if rows == 0:
        refuse_empty(sides, "plan(example)")
    row_counts = wrapper.row_buckets or [rows]
    table = list(wrapper.buckets)
    if "target" in sides and "source" in sides:
        shapes: Any = [(r, s, t) for r in row_counts for s in table for t in table]
    else:
        shapes = [(r, b) for r in row_counts for b in table]
    return ShapePlan.from_function(shapes, functools.partial(_example_at, wrapper, example))


def _example_at(wrapper: Any, example: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """A plan's batch: ``example`` padded (or cut) to ``shape`` (a partial of it pickles)."""
    route = wrapper.route(example)
    rows, sides = read_call(example, route)
    if route.outputs is None:  # a packed plan needs to know whether calls pack
        learn(wrapper, example, route, sides)
    if route.packer is not None:
        return _packed_example(example, route, shape)  # packed by the wrapper when run
    lengths = {"source": shape[1], "target": shape[-1]}
    for name, side in sides.items():
        side.bucket = lengths[name]
        side.length = min(side.length, side.bucket)
    left = wrapper.padding_side == "left"
    call = Call(min(rows, shape.rows), shape.rows, sides, left=left)
    return wrapper.with_cache_off(pad_call(example, route, call))


def _packed_example(example: dict[str, Any], route: Any, shape: Shape) -> dict[str, Any]:
    """A call that packs into exactly ``shape``: ``shape.rows`` samples, each the
    example's longest sample repeated to ``shape.length`` real tokens (so each fills
    one packed row), with the example's keys: passed through the wrapper, as
    prewarm does, it runs the packed shape with the inputs real calls give it."""
    keys = route.sides["source"]
    if example[keys[0]].shape[1] == 0:
        raise ShapeBucketError(
            f"plan(example): {keys[0]!r} has shape {tuple(example[keys[0]].shape)}, no "
            "token to grow into a packed shape's samples; pass an example call with "
            "at least one token"
        )
    mask = example.get("attention_mask")
    try:
        lengths = host_lengths(mask)[0] if mask is not None else None
    except ShapeBucketError as e:
        raise ShapeBucketError(
            f"plan(example): {e}. A left-padded loop's calls are padded, not packed: "
            "pass BucketedModel(..., packing=False) and a left-padded example, or pad "
            "the loop's calls on the right"
        ) from None
    row = lengths.index(max(lengths)) if lengths is not None else 0
    real = lengths[row] if lengths is not None else int(example[keys[0]].shape[1])
    at = torch.arange(shape.length) % max(real, 1)
    call = {k: v for k, v in example.items() if k not in keys}
    for k in keys:
        v = example[k]
        grown = v[row, at] if k != "attention_mask" else torch.ones_like(v[row, at])
        call[k] = grown.expand(shape.rows, *grown.shape).contiguous()
    return call
