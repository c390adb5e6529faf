"""Packed calls: one call's real tokens packed into a few rows of one row length, and
every per-token output scattered back into the caller's layout.

A call arrives right-padded, ``[rows, L, ...]`` per key. :func:`pack_call` drops the
pads and lays the samples end to end into ``row_length``-token rows, best-fit
decreasing (each sample, longest first, into the row with the least room that
still holds it; the call is small, so this is a short loop over samples, never over
tokens). The rows are padded up to the smallest row bucket that holds them, so a
call runs at one of ``len(row_buckets)`` shapes. Where each token goes (the
layout, :mod:`.placement`) is planned once per tuple of real lengths and kept, so a
call moves its tokens with one gather and one select per key, and :func:`unpack`
moves outputs back the same way.

The packed batch follows :class:`~shapebucket.PackedCollator`'s convention:
``position_ids`` (int64, restarting at 0 for each sample, 0 on padding) and, when
asked, ``document_ids`` (int32, each token's sample number in its row 0, 1, ...,
-1 on padding), which :func:`~shapebucket.document_causal_mask` and the bench
``GPT`` read. There is no ``attention_mask``: a Hugging Face decoder given
``position_ids``, no ``attention_mask`` and no cache (call it with
``use_cache=False``) finds the samples from the positions (checked in transformers
5.24 ``masking_utils.py``: ``_preprocess_mask_arguments`` calls
``find_packed_sequence_indices`` when ``attention_mask is None and cache is None``).
Which models read packed input: :func:`~shapebucket.bucketed.packable.packs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ShapeBucketError
from .placement import Layout, PackedCall, plan_layout

__all__ = [
    "IGNORE",
    "LABEL_KEY",
    "PackedCall",
    "host_lengths",
    "pack_call",
    "pack_into",
    "real_lengths",
    "unpack",
]

#: the labels key: padded with -100 by default, and shifted with ``shifted_labels=True``
LABEL_KEY = "labels"
#: the label no loss counts (Hugging Face and the bench GPT ignore it)
IGNORE = -100


def host_lengths(
    mask: torch.Tensor, labels: torch.Tensor | None = None
) -> tuple[tuple[int, ...], bool]:
    """Each row's real length from a right-padded 2-D mask (nonzero on real tokens), and
    whether ``labels`` (``[rows, length]``) hold a label other than -100 on a pad; a mask
    that is not ones then zeros in some row is refused.

    The lengths are read on the host because the packed shape depends on them: on a GPU
    this is a packed call's one copy to the host (one sync), labels' check included.

    >>> host_lengths(torch.tensor([[1, 1, 0], [1, 1, 1]]), torch.tensor([[5, 6, 7], [1, 2, 3]]))
    ((2, 3), True)
    """
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ShapeBucketError(
            f"a packed call reads its lengths from a 2-D attention mask [rows, length], got "
            f"{shape}; pass the call's 2-D padding mask"
        )
    real, bad = _viewed(mask, labels) if mask.device.type == "cpu" else _copied(mask, labels)
    if (real[:, 1:] > real[:, :-1]).any():  # a real token after a pad
        row = int(np.flatnonzero((real[:, 1:] > real[:, :-1]).any(1))[0])
        raise ShapeBucketError(
            f"row {row} of the attention mask is not right-padded ({mask[row].tolist()}): a "
            "packed call needs each row's real tokens first, then only padding; pad on the "
            "right (tokenizer.padding_side='right') or leave this call unpacked"
        )
    return tuple(real.sum(1).tolist()), bad is not None and bool(bad.any())


Flags = tuple[np.ndarray, "np.ndarray | None"]  # (real tokens, labels on pads) on the host


def _viewed(mask: torch.Tensor, labels: torch.Tensor | None) -> Flags:
    """A CPU call's flags, read in place by numpy (no copy)."""
    host = mask.numpy() if not mask.requires_grad else mask.detach().numpy()
    real = host if host.dtype == np.bool_ else host != 0
    return real, None if labels is None else (labels.numpy() != IGNORE) & ~real


def _copied(mask: torch.Tensor, labels: torch.Tensor | None) -> Flags:
    """A device call's flags, worked out on its device and copied to the host at once:
    one sync, not one per check."""
    real = mask if mask.dtype == torch.bool else mask != 0
    if labels is None:
        return real.cpu().numpy(), None
    both = torch.stack((real, labels.ne(IGNORE).logical_and(~real).expand_as(real))).cpu()
    return both[0].numpy(), both[1].numpy()


def real_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Each row's real length (int64, on the CPU) from a right-padded 2-D mask
    (:func:`host_lengths`).

    >>> real_lengths(torch.tensor([[1, 1, 0], [1, 1, 1]])).tolist()
    [2, 3]
    """
    return torch.tensor(host_lengths(mask)[0], dtype=torch.int64)


def _check_keys(batch: Mapping[str, torch.Tensor], keys: Sequence[str], rows: int) -> int:
    """The call's length; refuse keys of other shapes and a lengths list of other rows."""
    if not keys:
        raise ShapeBucketError("pack_call needs at least one key to pack (keys=[...])")
    first = batch[keys[0]]
    shape = (int(first.shape[0]), int(first.shape[1]))
    for k in keys:
        v = batch[k]
        if v.ndim < 2 or tuple(v.shape[:2]) != shape:
            raise ShapeBucketError(
                f"key {k!r} has shape {tuple(v.shape)}, but {keys[0]!r} is [{shape[0]}, "
                f"{shape[1]}, ...]: every packed key is right-padded [rows, length, ...]; "
                "leave other keys out of keys"
            )
    if rows != shape[0]:
        raise ShapeBucketError(
            f"{rows} lengths for a call of {shape[0]} rows: pass one real length per row "
            "(real_lengths(attention_mask))"
        )
    return shape[1]


def pack_call(
    batch: Mapping[str, torch.Tensor],
    keys: Sequence[str],
    lengths: torch.Tensor | Sequence[int],
    row_length: int,
    row_buckets: Sequence[int] | None,
    pad_values: Mapping[str, Any],
    *,
    shifted_labels: bool,
    document_ids: bool = False,
) -> tuple[dict[str, torch.Tensor], PackedCall]:
    """One right-padded call's real tokens packed into ``[packed_rows, row_length, ...]``.

    Each key of ``keys`` comes back packed, padded with ``pad_values[key]`` (default 0,
    -100 for ``labels``), with ``position_ids`` and, when ``document_ids`` is True,
    ``document_ids`` (the module docstring's convention); every other key and the
    attention mask are left out. ``packed_rows`` is the smallest of ``row_buckets``
    that holds the rows (``None``: the rows used). ``shifted_labels=True`` (a causal LM
    that shifts labels itself, as Hugging Face ``*ForCausalLM`` do) sets each sample's
    first label to the labels' pad value, so that the previous sample's last token
    does not learn to predict it: the padded call never counted that label either.
    Pass False for a model whose labels already are the next tokens (the bench GPT:
    its loss does not shift). Labels on the caller's pads are dropped with the pads,
    so a padded call that left real labels there (not -100) counted tokens that the
    packed call does not. The layout is built here (:func:`plan_layout`); a wrapper
    keeps its layouts (:class:`Layouts`) and calls :func:`pack_into`.

    >>> ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    >>> packed, call = pack_call({"input_ids": ids}, ["input_ids"], [3, 1], 4, None, {},
    ...                          shifted_labels=True)
    >>> packed["input_ids"].tolist(), packed["position_ids"].tolist()
    ([[5, 6, 7, 8]], [[0, 1, 2, 0]])
    >>> unpack(packed["input_ids"], call, fill=-1).tolist()
    [[5, 6, 7], [8, -1, -1]]
    """
    lens = lengths.tolist() if isinstance(lengths, torch.Tensor) else list(lengths)
    L = _check_keys(batch, keys, len(lens))
    device = batch[keys[0]].device
    layout = plan_layout(lens, L, row_length, row_buckets, document_ids, device)
    return pack_into(batch, keys, layout, pad_values, shifted_labels=shifted_labels)


def pack_into(
    batch: Mapping[str, torch.Tensor],
    keys: Sequence[str],
    layout: Layout,
    pad_values: Mapping[str, Any],
    *,
    shifted_labels: bool,
) -> tuple[dict[str, torch.Tensor], PackedCall]:
    """:func:`pack_call` through a layout already planned: one gather and one select
    per key (a gather and a fill), the position and document grids copied from the layout (so a model that
    writes into its inputs changes no kept layout)."""
    pc = layout.call
    if _check_keys(batch, keys, pc.rows) != pc.length:
        raise ShapeBucketError(
            f"a layout planned for calls of length {pc.length} got {keys[0]!r} of shape "
            f"{tuple(batch[keys[0]].shape)}: plan the layout for this call's length"
        )
    grid = pc.packed_rows * pc.row_length
    out: dict[str, torch.Tensor] = {}
    for k in keys:
        v = batch[k]
        trail = tuple(v.shape[2:])
        pad = pad_values.get(k, IGNORE if k == LABEL_KEY else 0)
        empty = layout.unlabelled if shifted_labels and k == LABEL_KEY else layout.empty
        out[k] = _select(
            empty, v.reshape(pc.rows * pc.length, *trail), layout.take, pad, grid
        ).view(pc.packed_rows, pc.row_length, *trail)
    out["position_ids"] = layout.positions.clone()
    if layout.documents is not None:
        out["document_ids"] = layout.documents.clone()
    return out, pc


def _select(
    empty: torch.Tensor, values: torch.Tensor, index: torch.Tensor, fill: Any, size: int
) -> torch.Tensor:
    """``values[index]``, ``fill`` where ``empty``, in ``values``' dtype: a flat grid of
    ``size`` positions (one gather, one in-place fill; gradients flow to ``values``)."""
    trail = tuple(values.shape[1:])
    if values.shape[0] == 0:  # nothing to gather from: all fill
        return values.new_full((size, *trail), fill)
    if trail:
        empty = empty.view(size, *(1 for _ in trail))
    return values.index_select(0, index).masked_fill_(empty, fill)


def unpack(t: torch.Tensor, packed: PackedCall, fill: float = 0) -> torch.Tensor:
    """A per-token output ``[packed_rows, row_length, ...]`` back in the caller's layout
    ``[rows, length, ...]``: real positions hold the packed values (gradients flow
    through them), pad positions hold ``fill`` (0 by default; what a padded call's pads
    would hold is model-defined, so none is imitated).

    >>> _, call = pack_call({"x": torch.ones(2, 2)}, ["x"], [1, 2], 4, [2], {}, shifted_labels=False)
    >>> unpack(torch.arange(8.0).view(2, 4), call, fill=-1).tolist()
    [[2.0, -1.0], [0.0, 1.0]]
    """
    shape = (packed.packed_rows, packed.row_length)
    if tuple(t.shape[:2]) != shape:
        raise ShapeBucketError(
            f"unpack needs a per-token output [{shape[0]}, {shape[1]}, ...] of this packed call, "
            f"got {tuple(t.shape)}"
        )
    trail = tuple(t.shape[2:])
    flat = t.reshape(shape[0] * shape[1], *trail)
    out = _select(packed.pads, flat, packed.back, fill, packed.rows * packed.length)
    return out.view(packed.rows, packed.length, *trail)
