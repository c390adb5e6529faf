"""What a route does beyond padding: learning its output roles and whether its calls
pack (once per kind of call), and packing a call of a packed route."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .. import _torch as compat
from ..errors import ShapeBucketError
from .calls import Call, Route, Side
from .outputs import learn_roles, packs_outputs, probe, probe_shapes
from .packed import host_lengths, pack_into
from .pad import pad_call
from .placement import Layouts, rows_used
from .tracing import uncompiled

__all__ = ["Packer", "learn", "pack"]


def learn(
    wrapper: Any,
    kwargs: Mapping[str, Any],
    route: Route,
    sides: dict[str, Side],
) -> None:
    """Learn ``route``'s output roles from two probe calls of ``kwargs`` (run with the
    compiler off), and whether its calls pack: the wrapper packs, pads right, the call
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
    if (
        wrapper.packing is not None
        and not left  # padding_side="left" asks for padded calls
        and list(route.sides) == ["source"]
        and not route.row_keys
        and "position_ids" not in kwargs
        and packs_outputs(route.outputs)
    ):
        route.packer = Packer(wrapper, route)


class Packer:
    """What a packed route decides once: the keys it packs, the row lengths, the pad
    values, and its layouts, kept per call lengths (:class:`~.placement.Layouts`), so a
    call reads its lengths, looks its layout up and gathers. Pickles without the
    layouts (rebuilt at the next calls)."""

    def __init__(self, wrapper: Any, route: Route) -> None:
        packing = wrapper.packing
        self.source = list(route.sides["source"])
        self.keys = [k for k in self.source if k != "attention_mask"]
        self.table = list(wrapper.buckets)
        self.pad_values = route.pad_values
        self.shifted_labels = bool(packing.shifted_labels)
        self.layouts = Layouts(wrapper.row_buckets, bool(packing.document_ids))

    def row_length(self, longest: int) -> int:
        """The row length of a call whose longest sample has ``longest`` tokens: the
        smallest bucket that holds it."""
        return self.table[bisect.bisect_left(self.table, longest)]


def pack(
    wrapper: Any, kwargs: dict[str, Any], route: Route, call: Call
) -> tuple[dict[str, Any], Call] | str | None:
    """``call`` packed into rows of the bucket that holds its longest sample; ``None``
    (pad it instead, counted and warned once) when its mask is not right-padded or a pad
    carries a label its loss counts; a str (why) when its samples pack into more rows
    than the largest row bucket and ``overflow`` runs it at its own shape (refused with
    ``overflow="error"``). The call's real lengths are read on the host (its
    packed shape depends on them: on a GPU, the call's one sync); everything that
    depends only on them is its route's kept layout."""
    side, packer = call.sides["source"], route.packer
    if any(kwargs[k].shape[0] != call.rows for k in packer.source):
        # a key broadcast over the rows ([1, length], as the call checks): one per row
        wide = {k: kwargs[k].expand(call.rows, *kwargs[k].shape[1:]) for k in packer.source}
        kwargs = {**kwargs, **wide}
    mask, labels = kwargs.get("attention_mask"), kwargs.get("labels")
    try:
        lengths, labelled_pads = (
            host_lengths(mask, labels if isinstance(labels, torch.Tensor) else None)
            if mask is not None
            else ((side.length,) * call.rows, False)
        )
    except ShapeBucketError:
        wrapper.stats.unpacked("its attention_mask is not right-padded")
        return None
    # a label on a caller's pad counts in the unwrapped call's loss; a packed call
    # drops the pads with it, so such a call is padded (exact), not packed
    if labelled_pads:
        wrapper.stats.unpacked(
            "it has labels other than -100 on pads (attention_mask 0), which its loss "
            "counts and a packed call would drop; set them to -100 (as Hugging Face's "
            "collators do)"
        )
        return None
    row_length = packer.row_length(max(lengths, default=0))
    why = _past_row_buckets(wrapper, call.rows, lengths, row_length)
    if why is not None:
        return why
    device = kwargs[packer.keys[0]].device
    layout = packer.layouts.get(lengths, side.length, row_length, device)
    batch, packed = pack_into(
        kwargs, packer.keys, layout, packer.pad_values, shifted_labels=packer.shifted_labels
    )
    rest = {k: v for k, v in kwargs.items() if k not in packer.source}
    sides = {"source": Side("source", packer.keys, side.length, row_length)}
    done = Call(call.rows, packed.packed_rows, sides, outputs=call.outputs, packed=packed)
    return wrapper.with_cache_off({**rest, **batch}), done


def _past_row_buckets(
    wrapper: Any, caller_rows: int, lengths: Sequence[int], row_length: int
) -> str | None:
    """Why samples of ``lengths`` pack into more rows than the largest row bucket (``None``:
    they fit); refused with ``overflow="error"``."""
    rows = wrapper.row_buckets
    if rows and caller_rows > rows[-1]:  # fewer caller rows always pack into the buckets
        used = rows_used(lengths, row_length)
        if used > rows[-1]:
            why = f"its samples pack into {used} rows, past the largest row bucket {rows[-1]}"
            if wrapper.overflow == "error":
                raise ShapeBucketError(
                    f"BucketedModel: a call of {caller_rows} rows: {why} (row_buckets {rows}, "
                    f"rows of {row_length} tokens); add a row bucket >= {used}, split the "
                    "batch, or pass overflow='eager' or 'dynamic'"
                )
            return why
    return None
