"""``BucketedModel.plan(example)``: every shape a wrapper runs, each made from one call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import ShapeBucketError
from ..plan import Shape, ShapePlan
from .calls import Call, read_call
from .checks import refuse_empty
from .packed import real_lengths
from .pad import pad_call

__all__ = ["plan_of"]


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
    return ShapePlan.from_function(shapes, ExampleAt(wrapper, example))


class ExampleAt:
    """A plan's maker of a shape's batch: the example padded (or cut, keeping its first
    rows and tokens) to the shape. A class, so that the plan pickles."""

    def __init__(self, wrapper: Any, example: dict[str, Any]) -> None:
        self.wrapper, self.example = wrapper, example

    def __call__(self, shape: Shape) -> dict[str, Any]:
        route = self.wrapper.route(self.example)
        rows, sides = read_call(self.example, route)
        if route.outputs is None:  # a packed plan needs to know whether calls pack
            self.wrapper.learn(self.example, route, sides)
        if route.packed:
            return self._packed(route, shape)  # a call, packed by the wrapper when run
        lengths = {"source": shape[1], "target": shape[-1]}
        for name, side in sides.items():
            side.bucket = lengths[name]
            side.length = min(side.length, side.bucket)
        left = self.wrapper.padding_side == "left"
        call = Call(min(rows, shape.rows), shape.rows, sides, left=left)
        return self.wrapper.with_cache_off(pad_call(self.example, route, call))

    def _packed(self, route: Any, shape: Shape) -> dict[str, Any]:
        """A call that packs into exactly ``shape``: ``shape.rows`` samples, each the
        example's longest sample repeated to ``shape.length`` real tokens (so each fills
        one packed row), with the example's keys: passed through the wrapper, as
        prewarm does, it runs the packed shape with the inputs real calls give it."""
        example = self.example
        keys = route.sides["source"]
        if example[keys[0]].shape[1] == 0:
            raise ShapeBucketError(
                f"plan(example): {keys[0]!r} has shape {tuple(example[keys[0]].shape)}, no "
                "token to grow into a packed shape's samples; pass an example call with "
                "at least one token"
            )
        mask = example.get("attention_mask")
        try:
            lengths = real_lengths(mask) if mask is not None else None
        except ShapeBucketError as e:
            raise ShapeBucketError(
                f"plan(example): {e}. A left-padded loop's calls are padded, not packed: "
                "pass BucketedModel(..., packing=False) and a left-padded example, or pad "
                "the loop's calls on the right"
            ) from None
        row = int(lengths.argmax()) if lengths is not None else 0
        real = int(lengths[row]) if lengths is not None else int(example[keys[0]].shape[1])
        at = torch.arange(shape.length) % max(real, 1)
        call = {k: v for k, v in example.items() if k not in keys}
        for k in keys:
            v = example[k]
            grown = v[row, at] if k != "attention_mask" else torch.ones_like(v[row, at])
            call[k] = grown.expand(shape.rows, *grown.shape).contiguous()
        return call
