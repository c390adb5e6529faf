"""Packed calls: one call's real tokens packed into a few rows of one row length, and
every per-token output scattered back into the caller's layout.

A call arrives right-padded, ``[rows, L, ...]`` per key. :func:`pack_call` drops the
pads and lays the samples end to end into ``row_length``-token rows, best-fit
decreasing (each sample, longest first, into the row with the least room that
still holds it; the call is small, so this is a short loop over samples, never over
tokens). The rows are padded up to the smallest row bucket that holds them, so a
call runs at one of ``len(row_buckets)`` shapes. The tokens move with one gather per
key through two index tensors built once per call (:class:`PackedCall`), and
:func:`unpack` moves outputs back with the same two.

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

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ShapeBucketError

__all__ = ["IGNORE", "LABEL_KEY", "PackedCall", "pack_call", "real_lengths", "unpack"]

#: the labels key: padded with -100 by default, and shifted with ``shifted_labels=True``
LABEL_KEY = "labels"
#: the label no loss counts (Hugging Face and the bench GPT ignore it)
IGNORE = -100


@dataclass(frozen=True)
class PackedCall:
    """What :func:`unpack` needs to put a packed call's tokens back.

    ``rows x length`` is the caller's shape, ``packed_rows x row_length`` the packed
    one; real token ``i`` sits at flat index ``source[i]`` of the caller's
    ``rows * length`` grid and ``target[i]`` of the packed grid (int64, on the
    call's device). ``lengths`` are the samples' real lengths (a Python tuple).
    """

    rows: int
    length: int
    packed_rows: int
    row_length: int
    lengths: tuple[int, ...]
    source: torch.Tensor
    target: torch.Tensor


def real_lengths(mask: torch.Tensor) -> torch.Tensor:
    """Each row's real length (int64, on the CPU) from a right-padded 2-D mask (nonzero on
    real tokens); a mask that is not ones then zeros in some row is refused.

    >>> real_lengths(torch.tensor([[1, 1, 0], [1, 1, 1]])).tolist()
    [2, 3]
    """
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ShapeBucketError(
            f"a packed call reads its lengths from a 2-D attention mask [rows, length], got "
            f"{shape}; pass the call's 2-D padding mask"
        )
    real = mask if mask.dtype == torch.bool else mask != 0
    host = real.cpu().numpy()  # the one copy to the host (a packed call's plan needs it)
    bad = np.flatnonzero((host[:, 1:] > host[:, :-1]).any(1))  # a real token after a pad
    if len(bad):
        row = int(bad[0])
        raise ShapeBucketError(
            f"row {row} of the attention mask is not right-padded ({mask[row].tolist()}): a "
            "packed call needs each row's real tokens first, then only padding; pad on the "
            "right (tokenizer.padding_side='right') or leave this call unpacked"
        )
    return torch.from_numpy(host.sum(1, dtype=np.int64))


def _best_fit(lengths: list[int], row_length: int) -> tuple[list[int], list[int], list[int], int]:
    """``(row, start, number in row)`` of each sample packed best-fit decreasing, and the
    rows used (at least one). An empty sample takes no room (row 0, start 0)."""
    n = len(lengths)
    row, start, number = [0] * n, [0] * n, [0] * n
    used: list[int] = []  # tokens used per row
    count: list[int] = []  # samples per row
    rooms: list[tuple[int, int]] = []  # (room left, row), sorted: the best fit is a bisection
    for i in sorted(range(n), key=lambda j: -lengths[j]):
        x = lengths[i]
        if x == 0:
            continue
        at = bisect.bisect_left(rooms, (x, -1))
        if at < len(rooms):
            best = rooms.pop(at)[1]
        else:
            best = len(used)
            used.append(0)
            count.append(0)
        row[i], start[i], number[i] = best, used[best], count[best]
        used[best] += x
        count[best] += 1
        bisect.insort(rooms, (row_length - used[best], best))
    return row, start, number, max(len(used), 1)


def _packed_rows(used: int, row_buckets: Sequence[int] | None, row_length: int) -> int:
    """The smallest row bucket that holds ``used`` rows (``used`` itself without buckets)."""
    if row_buckets is None:
        return used
    if not row_buckets or min(row_buckets) < 1:
        raise ShapeBucketError(f"row_buckets must be ints >= 1 (or None), got {row_buckets!r}")
    fits = [b for b in row_buckets if b >= used]
    if not fits:
        raise ShapeBucketError(
            f"this call packs into {used} rows of {row_length} tokens, more than the largest "
            f"row bucket {max(row_buckets)} of {sorted(row_buckets)}: add a row bucket >= "
            f"{used}, or a longer row length, or leave calls this large unpacked"
        )
    return min(fits)


def _check_call(
    batch: Mapping[str, torch.Tensor], keys: Sequence[str], lengths: list[int], row_length: int
) -> tuple[int, int]:
    """The call's ``(rows, length)``; refuse keys of other shapes and samples that do not fit."""
    if not keys:
        raise ShapeBucketError("pack_call needs at least one key to pack (keys=[...])")
    if isinstance(row_length, bool) or not isinstance(row_length, int) or row_length < 1:
        raise ShapeBucketError(f"row_length must be an int >= 1, got {row_length!r}")
    first = batch[keys[0]]
    rows, L = int(first.shape[0]), int(first.shape[1])
    for k in keys:
        v = batch[k]
        if v.ndim < 2 or tuple(v.shape[:2]) != (rows, L):
            raise ShapeBucketError(
                f"key {k!r} has shape {tuple(v.shape)}, but {keys[0]!r} is [{rows}, {L}, ...]: "
                "every packed key is right-padded [rows, length, ...]; leave other keys out of keys"
            )
    if len(lengths) != rows:
        raise ShapeBucketError(
            f"{len(lengths)} lengths for a call of {rows} rows: pass one real length per row "
            "(real_lengths(attention_mask))"
        )
    for i, x in enumerate(lengths):
        if not 0 <= x <= L:
            raise ShapeBucketError(
                f"row {i} has real length {x}, outside 0..{L} (the call's length)"
            )
        if x > row_length:
            raise ShapeBucketError(
                f"row {i} has {x} real tokens > row_length {row_length}: packing never cuts a "
                f"sample; use a row length >= {x} or leave this call unpacked"
            )
    return rows, L


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
    packed call does not.

    >>> ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    >>> packed, call = pack_call({"input_ids": ids}, ["input_ids"], [3, 1], 4, None, {},
    ...                          shifted_labels=True)
    >>> packed["input_ids"].tolist(), packed["position_ids"].tolist()
    ([[5, 6, 7, 8]], [[0, 1, 2, 0]])
    >>> unpack(packed["input_ids"], call, fill=-1).tolist()
    [[5, 6, 7], [8, -1, -1]]
    """
    lens = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    rows, L = _check_call(batch, keys, lens, row_length)
    row, start, number, used = _best_fit(lens, row_length)
    P = _packed_rows(used, row_buckets, row_length)
    ln = np.asarray(lens, dtype=np.int64)
    total = int(ln.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(ln) - ln, ln)
    base = np.asarray(row, dtype=np.int64) * row_length + np.asarray(start, dtype=np.int64)
    target = np.repeat(base, ln) + within
    source = np.repeat(np.arange(rows, dtype=np.int64) * L, ln) + within
    firsts = base[ln > 0]
    parts = [source, target, firsts, within]
    if document_ids:
        parts.append(np.repeat(np.asarray(number, dtype=np.int64), ln))
    # one copy to the call's device, of what the real tokens need (not of the whole grid)
    device = batch[keys[0]].device
    src, dst, first, *per_token = (
        torch.from_numpy(np.concatenate(parts)).to(device).split([len(x) for x in parts])
    )
    out: dict[str, torch.Tensor] = {}
    for k in keys:
        v = batch[k]
        trail = tuple(v.shape[2:])
        pad = pad_values.get(k, IGNORE if k == LABEL_KEY else 0)
        values = v.reshape(rows * L, *trail).index_select(0, src)
        packed = v.new_full((P * row_length, *trail), pad).index_copy_(0, dst, values)
        if shifted_labels and k == LABEL_KEY:
            packed.index_fill_(0, first, pad)
        out[k] = packed.view(P, row_length, *trail)
    grid = P * row_length
    positions = torch.zeros(grid, dtype=torch.int64, device=device)
    out["position_ids"] = positions.index_copy_(0, dst, per_token[0]).view(P, row_length)
    if document_ids:
        documents = torch.full((grid,), -1, dtype=torch.int32, device=device)
        numbers = per_token[1].to(torch.int32)
        out["document_ids"] = documents.index_copy_(0, dst, numbers).view(P, row_length)
    return out, PackedCall(rows, L, P, row_length, tuple(lens), src, dst)


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
    values = t.reshape(shape[0] * shape[1], *trail).index_select(0, packed.target)
    out = t.new_full((packed.rows * packed.length, *trail), fill)
    return out.index_copy(0, packed.source, values).view(packed.rows, packed.length, *trail)
