"""Packed calls (``docs/bucketed.md``, "Packed calls"): which models take them (one
rule, :func:`packs`), a right-padded call's real tokens moved into a few rows through a
planned layout (:mod:`.placement`, kept per packed route by its :class:`Packer`), and
per-token outputs moved back. The batch follows :class:`~shapebucket.PackedCollator`'s
convention: ``position_ids`` restart at 0 per sample, ``document_ids`` number the
samples of a row (-1 on padding), and there is no ``attention_mask``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .. import _hf as hf
from ..errors import ShapeBucketError
from .calls import Call, Route, Side, parameters, takes, wrapped
from .placement import Layout, Layouts, PackedCall, rows_used

__all__ = ["Packer", "host_lengths", "pack", "pack_into", "packs", "unpack"]

#: the labels key: padded with -100 by default, and shifted with ``shifted_labels=True``
LABEL_KEY = "labels"
#: the label no loss counts (Hugging Face and the bench GPT ignore it)
IGNORE = -100
def packs(model: Any) -> bool:
    """Whether ``model`` can take a packed call (:func:`pack_into`) and give the
    same outputs as the padded call, by this rule (a ``torch.compile`` d or DDP model
    is judged by the module it wraps):

    (a) a Hugging Face decoder-only model (``config.is_encoder_decoder`` not True) whose
        ``forward`` takes ``position_ids``, whose modeling code hands ``position_ids`` to
        ``create_causal_mask`` and whose attention implementation is one of
        :data:`shapebucket._hf.PACKED_ATTENTION` (sdpa, eager, flex_attention; not flash
        attention).
        Call it with ``use_cache=False``: with a cache, transformers skips the packed
        mask (checked in transformers 5.24);
    (b) any model whose ``forward`` takes ``document_ids`` (the bench ``GPT``: it masks
        attention by document, :func:`~shapebucket.document_causal_mask`).

    Everything else (encoders such as BERT, encoder-decoders such as T5, a plain module
    with a padding mask) is False: such a model keeps padded calls.

    >>> import torch
    >>> packs(torch.nn.Linear(2, 2)), packs(torch.compile(torch.nn.Linear(2, 2)))
    (False, False)
    """
    inner = wrapped(model)
    params = parameters(inner)
    if takes(params, "document_ids"):
        return True
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False) is True:
        return False
    if not takes(params, "position_ids"):
        return False
    return hf.masks_packed_positions(type(inner), config)


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


def pack_into(
    batch: Mapping[str, torch.Tensor],
    keys: Sequence[str],
    layout: Layout,
    pad_values: Mapping[str, Any],
    *,
    shifted_labels: bool,
) -> tuple[dict[str, torch.Tensor], PackedCall]:
    """One right-padded call's real tokens packed through ``layout`` into
    ``[packed_rows, row_length, ...]``: one gather and one fill per key of ``keys``
    (padded with ``pad_values[key]``, default 0, -100 for ``labels``), with
    ``position_ids`` and, when the layout has them, ``document_ids`` (copies: a model
    that writes into its inputs changes no kept layout); other keys are left out.
    ``shifted_labels=True`` (a causal LM that shifts labels itself) sets each sample's
    first label to the pad value, so that the previous sample's last token does not
    learn to predict it; labels on the caller's pads are dropped with the pads.

    >>> from shapebucket.bucketed.placement import plan_layout
    >>> ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    >>> layout = plan_layout([3, 1], 3, 4, None, False, ids.device)
    >>> packed, call = pack_into({"input_ids": ids}, ["input_ids"], layout, {}, shifted_labels=True)
    >>> packed["input_ids"].tolist(), packed["position_ids"].tolist()
    ([[5, 6, 7, 8]], [[0, 1, 2, 0]])
    >>> unpack(packed["input_ids"], call, fill=-1).tolist()
    [[5, 6, 7], [8, -1, -1]]
    """
    pc = layout.call
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

    >>> from shapebucket.bucketed.placement import plan_layout
    >>> layout = plan_layout([1, 2], 2, 4, [2], False, torch.device("cpu"))
    >>> _, call = pack_into({"x": torch.ones(2, 2)}, ["x"], layout, {}, shifted_labels=False)
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


class Packer:
    """What a packed route decides once: the keys it packs, the pad values, and its
    layouts, kept per call lengths (:class:`~.placement.Layouts`), so a call reads its
    lengths, looks its layout up and gathers. Pickles without the layouts (rebuilt at
    the next calls)."""

    def __init__(self, wrapper: Any, route: Route) -> None:
        document_ids = wrapper.packing.document_ids
        self.source = list(route.sides["source"])
        self.keys = [k for k in self.source if k != "attention_mask"]
        self.pad_values = route.pad_values
        self.shifted_labels = not document_ids  # a Hugging Face decoder shifts its labels
        self.layouts = Layouts(wrapper.row_buckets, document_ids)


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
    row_length = wrapper.buckets.bucket_for(max(lengths, default=0))  # the longest's
    why = _past_row_buckets(wrapper, call.rows, lengths, row_length)
    if why is not None:
        return why
    device = kwargs[packer.keys[0]].device
    layout = packer.layouts.get(lengths, side.length, row_length, device)
    batch, packed = pack_into(
        kwargs, packer.keys, layout, packer.pad_values, shifted_labels=packer.shifted_labels
    )
    rest = {k: v for k, v in kwargs.items() if k not in packer.source}
    sides = {"source": Side(packer.keys, side.length, row_length)}
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
