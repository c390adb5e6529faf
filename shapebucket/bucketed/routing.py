"""What a route does beyond padding: learning its output roles and whether its calls
pack (once per kind of call), and packing a call of a packed route."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import _torch as compat
from ..errors import ShapeBucketError
from .calls import Call, Route, Side
from .outputs import learn_roles, packs_outputs, probe, probe_shapes
from .packed import IGNORE, pack_call, real_lengths
from .pad import pad_call

__all__ = ["learn", "pack"]


def learn(
    wrapper: Any,
    kwargs: Mapping[str, Any],
    route: Route,
    sides: dict[str, Side],
    uncompiled: Callable[[Any, dict[str, Any]], Any],
) -> None:
    """Learn ``route``'s output roles from two probe calls of ``kwargs`` (run by
    ``uncompiled``), and whether its calls pack: the wrapper packs, pads right, the call
    has one side and no per-row or position keys, and every output is per-token or
    fixed."""
    left = wrapper.padding_side == "left"
    shapes = probe_shapes(list(wrapper.buckets), list(sides))
    have = int(kwargs[next(iter(sides.values())).keys[0]].shape[0])
    batches = []
    for rows, lengths in shapes:
        at = {n: Side(n, s.keys, min(s.length, lengths[n]), lengths[n]) for n, s in sides.items()}
        call = Call(min(rows, have), rows, at, left=left)
        batches.append(wrapper.with_cache_off(pad_call(kwargs, route, call)))
    inner = compat.unwrap_compiled(wrapper.model)
    route.outputs = learn_roles(probe(lambda b: uncompiled(inner, b), batches), shapes)
    route.packed = (
        wrapper.packing is not None
        and not left  # padding_side="left" asks for padded calls
        and list(route.sides) == ["source"]
        and not route.row_keys
        and "position_ids" not in kwargs
        and packs_outputs(route.outputs)
    )


def pack(
    wrapper: Any, kwargs: dict[str, Any], route: Route, call: Call
) -> tuple[dict[str, Any], Call] | None:
    """``call`` packed into rows of the bucket that holds its longest sample; ``None``
    (pad it instead, counted and warned once) when its mask is not right-padded or a pad
    carries a label its loss counts."""
    side, packing = call.sides["source"], wrapper.packing
    mask = kwargs.get("attention_mask")
    try:
        lengths = real_lengths(mask).tolist() if mask is not None else [side.length] * call.rows
    except ShapeBucketError:
        wrapper.stats.unpacked("its attention_mask is not right-padded")
        return None
    labels = kwargs.get("labels")
    # a label on a caller's pad counts in the unwrapped call's loss; a packed call
    # drops the pads with it, so such a call is padded (exact), not packed
    if (
        isinstance(mask, torch.Tensor)
        and isinstance(labels, torch.Tensor)
        and bool(labels.ne(IGNORE).logical_and(mask.eq(0)).any())
    ):
        wrapper.stats.unpacked(
            "it has labels other than -100 on pads (attention_mask 0), which its loss "
            "counts and a packed call would drop; set them to -100 (as Hugging Face's "
            "collators do)"
        )
        return None
    table = list(wrapper.buckets)
    row_length = table[bisect.bisect_left(table, max(lengths, default=0))]
    keys = [k for k in route.sides["source"] if k != "attention_mask"]
    batch, packed = pack_call(
        kwargs,
        keys,
        lengths,
        row_length,
        wrapper.row_buckets,
        route.pad_values,
        shifted_labels=packing.shifted_labels,
        document_ids=packing.document_ids,
    )
    rest = {k: v for k, v in kwargs.items() if k not in route.sides["source"]}
    sides = {"source": Side("source", keys, side.length, row_length)}
    done = Call(call.rows, packed.packed_rows, sides, outputs=call.outputs, packed=packed)
    return wrapper.with_cache_off({**rest, **batch}), done
