"""``fit_calls``: a :class:`~shapebucket.bucketed.BucketedModel`'s shapes fitted from
its calls (``docs/bucketed.md``, "Shapes from the calls")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._lengths import MAX_BUCKET
from .._validate import check_int
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets
from ..fit.optimal import DEFAULT_ALIGN, weighted_fit
from .calls import LEADS
from .placement import rows_used

__all__ = ["CallShapes", "fit_calls"]


@dataclass(frozen=True)
class CallShapes:
    """The shapes fitted from recorded calls, and what they cost on those calls.

    ``buckets`` are the lengths calls are padded (or packed rows are cut) to,
    ``row_buckets`` the row counts; ``token_efficiency`` is the calls' real tokens
    over the tokens those shapes run on them; ``shapes`` counts the planned shapes
    (``len(buckets) * len(row_buckets)``); ``packed_row_length`` is ``R`` when fitted
    for packing, else ``None``. Pass ``buckets`` and ``row_buckets`` to the wrapper.

    >>> shapes = fit_calls([(1, 12), (4, 30), (16, 100), (3, 64)], k=2, row_k=2)
    >>> shapes.buckets, shapes.row_buckets, shapes.shapes
    (Buckets([32, 104]), (4, 16), 4)
    >>> print(shapes)
    CallShapes: buckets [32, 104] x row_buckets [4, 16] (4 shapes), token efficiency 82.4%
    """

    buckets: Buckets
    row_buckets: tuple[int, ...]
    token_efficiency: float
    shapes: int
    packed_row_length: int | None = None

    def __str__(self) -> str:
        how = (
            ""
            if self.packed_row_length is None
            else f", packed into rows of {self.packed_row_length}"
        )
        return (
            f"CallShapes: buckets {list(self.buckets)} x row_buckets {list(self.row_buckets)} "
            f"({self.shapes} shape{'' if self.shapes == 1 else 's'}{how}), token efficiency {self.token_efficiency:.1%}"
        )


@dataclass(frozen=True)
class _Call:
    """One recorded call: its rows, its (padded) length and each row's real length."""

    rows: int
    length: int
    real: tuple[int, ...]


def fit_calls(
    calls: Iterable[Any],
    *,
    k: int = 3,
    row_k: int = 3,
    align: int = DEFAULT_ALIGN,
    packed_row_length: int | None = None,
) -> CallShapes:
    """Buckets and row buckets for a :class:`~shapebucket.bucketed.BucketedModel`, fitted
    from recorded calls.

    Args:
        calls: the recorded calls, each a mapping of keyword tensors (the one the model
            is called with: ``input_ids`` or ``inputs_embeds`` (the wrapper's lead keys),
            else its first 2-D tensor, gives the rows (dim 0) and the length (dim 1); an
            ``attention_mask`` gives each row's real
            length) or a ``(rows, length)`` pair (every row real to its end).
        k: the most length buckets (padding); ignored when packing (one row length).
        row_k: the most row buckets; the largest holds the largest call.
        align: every length bucket is a multiple of this (and >= 2: ``torch.compile``
            specialises sizes 0 and 1); row buckets are not aligned and may be 1.
        packed_row_length: ``None`` fits padding; an int ``R`` fits packing: each
            call's samples packed into rows of ``R`` (``R`` >= the longest sample).

    >>> shapes = fit_calls([(2, 16), (8, 200)], k=2, row_k=1, packed_row_length=256)
    >>> shapes.buckets, shapes.row_buckets
    (Buckets([256]), (8,))
    """
    k = check_int("k", k, minimum=1)
    row_k = check_int("row_k", row_k, minimum=1)
    align = check_int("align", align, minimum=1, maximum=MAX_BUCKET)
    recorded = _read_calls(calls)
    rows = np.array([c.rows for c in recorded], dtype=np.int64)
    lengths = np.array([c.length for c in recorded], dtype=np.int64)
    real = sum(sum(c.real) for c in recorded)
    if packed_row_length is not None:
        return _fit_packed(recorded, packed_row_length, row_k, real)
    row_buckets = weighted_fit(rows, lengths.astype(np.float64), row_k, align=1, least=1)
    padded_rows = np.array(row_buckets)[np.searchsorted(row_buckets, rows)]
    buckets = Buckets(weighted_fit(lengths, padded_rows.astype(np.float64), k, align))
    run = int((padded_rows * buckets.bucket_for_many(lengths)).sum())
    return CallShapes(buckets, tuple(row_buckets), real / run, len(buckets) * len(row_buckets))


def _fit_packed(recorded: list[_Call], row_length: Any, row_k: int, real: int) -> CallShapes:
    R = check_int("packed_row_length", row_length, minimum=2, maximum=MAX_BUCKET)
    longest = max(max(c.real) for c in recorded)
    if longest > R:
        i = next(i for i, c in enumerate(recorded) if max(c.real) == longest)
        raise ShapeBucketError(
            f"call {i} has a sample of {longest} real tokens > packed_row_length {R}; a sample "
            f"is never split across rows: pass packed_row_length >= {longest}"
        )
    packed = np.array([rows_used(c.real, R) for c in recorded], dtype=np.int64)
    row_buckets = weighted_fit(packed, np.ones(len(packed)), row_k, align=1, least=1)
    run = int(np.array(row_buckets)[np.searchsorted(row_buckets, packed)].sum()) * R
    return CallShapes(Buckets([R]), tuple(row_buckets), real / run, len(row_buckets), R)


def _read_calls(calls: Any) -> list[_Call]:
    if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Iterable):
        raise ShapeBucketError(
            f"fit_calls takes an iterable of recorded calls (keyword dicts of tensors or "
            f"(rows, length) pairs), got {type(calls).__name__}; for one call pass [call]"
        )
    recorded = [_read_call(i, call) for i, call in enumerate(calls)]
    if not recorded:
        raise ShapeBucketError(
            "fit_calls got no calls; record a few of the model's calls (their keyword "
            "tensors, or (rows, length) pairs) and pass them as a list"
        )
    return recorded


def _read_call(i: int, call: Any) -> _Call:
    if isinstance(call, Mapping):
        return _read_mapping(i, call)
    if isinstance(call, (tuple, list)) and len(call) == 2:
        rows = check_int(f"call {i} rows", call[0], minimum=1)
        length = check_int(f"call {i} length", call[1], minimum=1)
        return _Call(rows, length, (length,) * rows)
    raise ShapeBucketError(
        f"call {i} is {type(call).__name__} {call!r:.80}; a recorded call is a dict of "
        "keyword tensors (model(**call)) or a (rows, length) pair"
    )


def _read_mapping(i: int, call: Mapping[Any, Any]) -> _Call:
    # the wrapper's lead keys first (inputs_embeds is [rows, length, width]), then any 2-D
    key = next((k for k in LEADS if k in call), None)
    if key is None:
        key = next(
            (k for k, v in call.items() if isinstance(v, torch.Tensor) and v.dim() == 2), None
        )
    value = call.get(key) if key is not None else None
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        raise ShapeBucketError(
            f"call {i} has no [rows, length, ...] tensor (keys {list(call)!r}, "
            f"{key or 'input_ids'!r} {_describe(call.get(key or 'input_ids'))}); pass the tensors the model is called "
            "with, or a (rows, length) pair"
        )
    rows, length = int(value.shape[0]), int(value.shape[1])
    if rows == 0 or length == 0:
        raise ShapeBucketError(
            f"call {i}: {key!r} has shape {tuple(value.shape)}; a call needs >= 1 row and "
            "a length >= 1: drop empty calls before fitting"
        )
    mask = call.get("attention_mask")
    if mask is None:
        return _Call(rows, length, (length,) * rows)
    if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (rows, length):
        raise ShapeBucketError(
            f"call {i}: 'attention_mask' is {_describe(mask)}, expected a [rows, length] "
            f"tensor of shape {(rows, length)} like {key!r}; pass the 2-D padding mask"
        )
    real = tuple(int(n) for n in (mask != 0).sum(dim=1).tolist())
    if sum(real) == 0:
        raise ShapeBucketError(
            f"call {i}: 'attention_mask' marks no real token in its {rows} rows; drop the "
            "call, or check that 1 (not 0) marks the real tokens"
        )
    return _Call(rows, length, real)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return "absent" if value is None else f"a {type(value).__name__}"
