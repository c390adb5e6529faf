"""Re-padding a batch a :class:`~shapebucket.BucketCollator` made to another bucket and
row count: the batches :func:`shapebucket.prewarm` compiles for (see
:meth:`BucketCollator.repad <shapebucket.BucketCollator.repad>`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._validate import check_fits_in_memory, check_int
from ..errors import ShapeBucketError
from .engine import Key

__all__ = ["repad_batch"]

Items = list[tuple[Key, Any]]
# the BucketCollator whose batch is re-padded (its settings are read; typed loosely so
# that this module does not import bucket.py, which imports it)
BucketCollator = Any


def repad_batch(collator: BucketCollator, batch: Any, bucket: int, rows: int | None) -> Any:
    """``batch`` cut or padded to ``bucket`` with ``rows`` rows (``BucketCollator.repad``)."""
    bucket = check_int("bucket", bucket, minimum=1)
    items, masks, sample_mask = _items(collator, batch)
    seq = _sequences(collator, items, masks, sample_mask)
    _, v0, d0 = seq[0]
    length, n = v0.shape[d0], v0.shape[0]
    if rows is None:
        rows = collator.rows_for(bucket) if collator.rows is not None else n
        if collator.row_buckets is not None:
            rows = collator._batch_bucket(n)
    rows = check_int("rows", rows, minimum=1)
    check_fits_in_memory(rows, bucket, len(seq), collator.buckets)
    out = _rebuild(
        collator, items, {k: d for k, _, d in seq}, masks, sample_mask, n, length, bucket, rows
    )
    if isinstance(batch, Mapping):
        return dict(out)
    if isinstance(batch, torch.Tensor):
        return out[0][1]
    return type(batch)(v for _, v in out)


def _items(collator: BucketCollator, batch: Any) -> tuple[Items, set[Key], Key | None]:
    """The batch's (key, value) pairs, which keys are token masks, and the row mask's key."""
    masks: set[Key]
    sample_mask: Key | None
    if isinstance(batch, Mapping):
        items = list(batch.items())
        masks = {collator.mask_key}
        sample_mask = collator.sample_mask_key
    elif isinstance(batch, (tuple, list)):
        items = list(enumerate(batch))
        # a tuple batch is the fields, then the token mask, then the row mask (when made)
        has_rows = collator._pads_rows and collator.sample_mask_key is not None
        has_mask = collator.mask_key is not None
        masks = {len(items) - 1 - int(has_rows)} if has_mask else set()
        sample_mask = len(items) - 1 if has_rows else None
    elif isinstance(batch, torch.Tensor):
        items, masks, sample_mask = [(0, batch)], set(), None
    else:
        raise ShapeBucketError(
            f"repad needs a batch this collator made (a dict, a tuple or a tensor), got {type(batch).__name__}"
        )
    return items, masks, sample_mask


def _sequences(
    collator: BucketCollator, items: Items, masks: set[Key], sample_mask: Key | None
) -> list[tuple[Key, torch.Tensor, int]]:
    """The sequence tensors of the batch and their sequence dims, checked to agree."""

    def seq_dim_of(key: Key, value: torch.Tensor) -> int:
        # the token mask the collator adds is [rows, bucket] whatever seq_dim is
        return 1 if key in masks and value.ndim == 2 else collator.seq_dim + 1

    def is_seq(key: Key, value: Any) -> bool:
        if not isinstance(value, torch.Tensor) or key == sample_mask:
            return False
        if value.ndim <= seq_dim_of(key, value):
            return False
        return collator.sequence_keys is None or key in collator.sequence_keys or key in masks

    seq = [(k, v, seq_dim_of(k, v)) for k, v in items if is_seq(k, v)]
    if not seq:
        raise ShapeBucketError(
            f"repad found no sequence tensor (ndim > {collator.seq_dim + 1}) in the batch "
            f"(keys {[k for k, _ in items]}); pass a batch this collator made"
        )
    k0, v0, d0 = seq[0]
    length, n = v0.shape[d0], v0.shape[0]
    for k, v, d in seq:
        if v.shape[d] != length or v.shape[0] != n:
            raise ShapeBucketError(
                f"repad: {k!r} has shape {tuple(v.shape)}, but {k0!r} has {tuple(v0.shape)}: "
                f"sequence values must agree in rows and in length (dim {d}); "
                "name the keys to pad with sequence_keys"
            )
    return seq


def _rebuild(
    collator: BucketCollator,
    items: Items,
    seq_dims: dict[Key, int],
    masks: set[Key],
    sample_mask: Key | None,
    n: int,
    length: int,
    bucket: int,
    rows: int,
) -> Items:
    """Every value cut or padded: sequences along their dim, per-row values along rows."""
    keep_rows, keep = min(n, rows), min(length, bucket)
    right = collator.padding_side == "right"
    src = slice(0, keep) if right else slice(length - keep, length)
    dst = slice(0, keep) if right else slice(bucket - keep, bucket)
    out: list[tuple[Key, Any]] = []
    for k, v in items:
        if k in seq_dims:
            d = seq_dims[k]
            pad = 0 if k in masks else collator.pad_value(k)
            shape = (rows, *v.shape[1:d], bucket, *v.shape[d + 1 :])
            new = torch.full(shape, pad, dtype=v.dtype, device=v.device)
            lead = (slice(0, keep_rows),) + (slice(None),) * (d - 1)
            to, frm = (*lead, dst), (*lead, src)
            new[to] = v[frm]
            out.append((k, new))
        elif isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == n:
            pad = False if k == sample_mask else collator.pad_value(k)
            new = torch.full((rows, *v.shape[1:]), pad, dtype=v.dtype, device=v.device)
            new[:keep_rows] = v[:keep_rows]
            out.append((k, new))
        elif isinstance(v, list) and len(v) == n:
            out.append((k, v[:keep_rows] + [None] * (rows - keep_rows)))
        else:
            out.append((k, v))
    return out
