"""Padding a call up to its planned shape (or a plan's example to a smaller one): one
``F.pad`` per key (``docs/bucketed.md``, "What a call does", step 3)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .calls import ID_KEYS, PAD_TRUE, Call, Route

__all__ = ["config_pad_values", "pad_call"]


def config_pad_values(model: Any) -> dict[str, Any]:
    """The model config's ``pad_token_id`` as the pad value of its token-id keys."""
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if isinstance(pad, int) and not isinstance(pad, bool):
        return {k: pad for k in ID_KEYS}
    return {}


def _fit(
    v: torch.Tensor, have: int, call: Call, bucket: int, value: Any, opened: Any = None
) -> torch.Tensor:
    """``v`` ``[have or 1, length, ...]`` padded or cut to ``[padded rows or 1, bucket,
    ...]``: a plan's example longer than the shape keeps its first rows and tokens."""
    if v.shape[1] > bucket:  # strides as a tensor made at this size has (dynamo guards them)
        v = v.narrow(1, v.shape[1] - bucket if call.left else 0, bucket)
        v = v.clone(memory_format=torch.contiguous_format)
    more = 0
    if v.shape[0] == have:  # [1, length] stays broadcast
        if have > call.rows:
            v = v[: call.rows]
        more = call.padded_rows - call.rows
    grow = bucket - v.shape[1]
    # a new tensor even when nothing grows: every input of a planned shape is made the same
    # way (under inference_mode, an inference tensor), so one graph's guards hold for all
    if opened is not None and more and v.ndim == 2:  # a mask: its pad rows open one token
        v = F.pad(v, [grow, 0] if call.left else [0, grow], value=value)
        return torch.cat([v, _opened_rows(more, bucket, v.dtype, v.device, call.left, opened)])
    spec = [0, 0] * (v.ndim - 2) + ([grow, 0] if call.left else [0, grow]) + [0, more]
    return F.pad(v, spec, value=value)


@functools.lru_cache(maxsize=256)
def _opened_rows(
    rows: int, bucket: int, dtype: torch.dtype, device: torch.device, left: bool, opened: Any
) -> torch.Tensor:
    """``rows`` all-pad mask rows with one open token (the first; padding left, the last).
    A row whose mask is all pad leaves every attention query of it with no key: an
    attention that fills masked scores with -inf gives NaN (torch's SDPA gives 0), and its
    backward NaN gradients, although the row's labels are all -100. The row's outputs are
    cut off and carry no loss, so no real row sees the change."""
    with torch.inference_mode(False):  # cached: usable in and out of inference mode
        block = torch.full((rows, bucket), not opened, dtype=dtype, device=device)
        block[:, -1 if left else 0] = opened
    return block


def pad_call(kwargs: Mapping[str, Any], route: Route, call: Call) -> dict[str, Any]:
    """``kwargs`` padded to ``call``'s shape along ``route``.

    >>> from shapebucket.bucketed.calls import Side
    >>> route = Route({"source": ["input_ids"]}, [], {"source": "attention_mask"}, {"input_ids": 0, "attention_mask": 0})
    >>> call = Call(1, 2, {"source": Side(["input_ids"], 3, 4)})
    >>> batch = pad_call({"input_ids": torch.tensor([[5, 6, 7]])}, route, call)
    >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
    ([[5, 6, 7, 0], [0, 0, 0, 0]], [[1, 1, 1, 0], [1, 0, 0, 0]])
    """
    batch = dict(kwargs)
    rows, padded_rows = call.rows, call.padded_rows
    have = int(batch[next(iter(call.sides.values())).keys[0]].shape[0])
    for name, side in call.sides.items():
        lead = batch[side.keys[0]]
        mask = route.masks.get(name)
        if mask is not None:
            batch[mask] = torch.ones(have, side.length, dtype=torch.long, device=lead.device)
        if name == "source" and route.positions:
            positions = torch.arange(side.length, device=lead.device)
            batch["position_ids"] = positions.expand(have, -1)
        added = [mask] if mask else []
        if name == "source" and route.positions:
            added.append("position_ids")
        for k in side.keys + added:
            opened = (k not in PAD_TRUE) if k in PAD_TRUE or k.endswith("attention_mask") else None
            batch[k] = _fit(batch[k], have, call, side.bucket, route.pad_values.get(k, 0), opened)
    if padded_rows != rows or have != rows:
        for k in route.row_keys:
            v = batch[k]
            if v.shape[0] == have:
                v = v[:rows]
                spec = [0, 0] * (v.ndim - 1) + [0, padded_rows - rows]
                batch[k] = F.pad(v, spec, value=route.pad_values.get(k, 0))
    return batch
