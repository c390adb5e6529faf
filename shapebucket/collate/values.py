"""Sample values as tensors, exactly: the collators' dtype rules (``docs/collate.md``),
checked once per batch, not per sample."""

from __future__ import annotations

import array
import functools
import math
import numbers
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np
import torch

from ..errors import ShapeBucketError
from .engine import Key, pad_rows
from .samples import Where, at, is_scalar, short

__all__ = ["check_pad_fits", "concat", "from_python", "same_dtype", "stack_column"]


_INT64 = (-(2**63), 2**63 - 1)


def check_pad_fits(key: Key, pad: Any, dtype: torch.dtype) -> None:
    """Refuse a pad value the key's dtype cannot hold exactly (-100 in uint8, 0.5 in int64,
    5 in bool, 1e5 in float16), naming the key, the dtype, the value, the limit and the fix."""
    value = pad.item() if isinstance(pad, np.generic) else pad
    if isinstance(value, bool) and dtype != torch.bool:
        raise ShapeBucketError(
            f"pad value {value!r} for {key!r} is a bool but {key!r} holds "
            f"{str(dtype).replace('torch.', '')}: it would pad with {int(value)}; pass the "
            f"number you mean (pad_values={{{key!r}: {int(value)}}})"
        )
    if dtype == torch.bool:
        ok = value in (0, 1) and not (isinstance(value, float) and not float(value).is_integer())
        limit = "False/True (0 or 1)"
    elif dtype.is_floating_point or dtype.is_complex:
        finfo = torch.finfo(dtype) if dtype.is_floating_point else None
        ok = not (
            finfo is not None
            and isinstance(value, numbers.Real)
            and math.isfinite(value)
            and abs(float(value)) > finfo.max
        )
        limit = f"|value| <= {finfo.max:g}" if finfo is not None else "any number"
    else:
        info = torch.iinfo(dtype)
        integral = isinstance(value, numbers.Integral) or (
            isinstance(value, float) and value.is_integer()
        )
        ok = integral and info.min <= int(value) <= info.max
        limit = f"an integer in [{info.min}, {info.max}]"
    if not ok:
        fix = (
            f"pass pad_values={{{key!r}: ...}} with a value in that range, or store {key!r} "
            "in a wider dtype (torch.int64)"
        )
        if key == "labels" and not dtype.is_floating_point:
            fix += "; labels pad to -100 by default, which needs a signed dtype"
        raise ShapeBucketError(
            f"pad value {pad!r} for {key!r} does not fit its dtype {str(dtype).replace('torch.', '')} "
            f"(needs {limit}); {fix}"
        )


def concat(key: Key, column: list[Any], seq_dim: int, where: Where = at) -> torch.Tensor:
    """All samples' values of one key, concatenated along the sequence dim (moved to 0), by
    the dtype rules of this module."""
    kinds = {type(v) for v in column}
    if kinds <= {list, tuple} and seq_dim == 0:
        return from_python(key, list(chain.from_iterable(column)), column, where)
    try:
        if kinds == {np.ndarray} and len({v.dtype for v in column}) == 1:
            _numeric(key, column[0], 0, where)  # one dtype: the first names it
            arr = np.concatenate(
                [np.moveaxis(v, seq_dim, 0) for v in column] if seq_dim else column
            )
            return torch.from_numpy(arr)
        if kinds == {torch.Tensor}:
            parts = column
        else:
            parts = [_to_tensor(key, v, i, where) for i, v in enumerate(column)]
        if seq_dim:
            parts = [p.movedim(seq_dim, 0) for p in parts]
        return torch.cat(same_dtype(key, parts, where))
    except ShapeBucketError:  # a sample's own refusal names it already
        raise
    except (ValueError, RuntimeError, TypeError) as e:
        shapes = [
            tuple(np.shape(v)) if not isinstance(v, (list, tuple)) else (len(v),) for v in column
        ]
        raise ShapeBucketError(
            f"cannot batch {key!r}: the values' non-sequence dims disagree (shapes {shapes[:8]}"
            f"{'...' if len(shapes) > 8 else ''}): {e}"
        ) from None


def same_dtype(key: Key, parts: list[torch.Tensor], where: Where) -> list[torch.Tensor]:
    """``parts`` in one dtype: their promotion when it changes no value, else an error."""
    dtypes = {p.dtype for p in parts}
    if len(dtypes) == 1:
        return parts
    # an empty value loses nothing in any dtype (and an empty Python list has none of its
    # own): the others decide
    filled = {p.dtype for p in parts if p.numel()}
    if len(filled) <= 1:
        target = next(iter(filled), parts[0].dtype)
        return [p.to(target) for p in parts]
    if len(filled) < len(dtypes):
        some = next(p.dtype for p in parts if p.numel())
        parts = [p if p.numel() else p.to(some) for p in parts]
        dtypes = filled
    first = parts[0].dtype
    try:
        target = functools.reduce(torch.promote_types, dtypes)
    except RuntimeError:  # torch does not promote uint16/32/64 with other types
        i = next(i for i, p in enumerate(parts) if p.dtype != first)
        raise ShapeBucketError(
            f"{where(i)}: {key!r} has dtype {parts[i].dtype} but {where(0)} has {first}, and torch "
            f"does not promote {sorted(map(str, dtypes))} together; give every sample of {key!r} "
            "one dtype"
        ) from None
    out = []
    for i, p in enumerate(parts):
        q = p.to(target)
        if not p.dtype.is_floating_point and not torch.equal(q.to(p.dtype), p):
            bad = (q.to(p.dtype) != p).flatten()
            v = p.flatten()[int(bad.nonzero()[0])].item()
            raise ShapeBucketError(
                f"{where(i)}: {key!r} holds {v} as {p.dtype}, which {target} (the common dtype of "
                f"{sorted(map(str, dtypes))}) cannot hold exactly; give every sample of {key!r} one "
                "dtype, for example ids as int64"
            )
        out.append(q)
    return out


def from_python(key: Key, flat: list[Any], column: list[Any], where: Where) -> torch.Tensor:
    if not flat:
        return torch.empty(0, dtype=torch.int64)

    def culprit(test: Callable[[Any], bool]) -> tuple[int, Any]:
        """The first sample and value that ``test`` flags (for error messages)."""
        return next(((i, v) for i, s in enumerate(column) for v in s if test(v)), (0, flat[0]))

    if type(flat[0]) is int:
        # the common case, token ids: array("q") takes ints only (TypeError on a float, a
        # string, a list; OverflowError beyond int64), about 2x faster than numpy's dtype
        # discovery; anything else takes the checked path below
        try:
            return torch.from_numpy(np.frombuffer(array.array("q", flat), dtype=np.int64))
        except (TypeError, OverflowError):
            pass
    try:
        arr = np.asarray(flat)
    except (ValueError, TypeError, OverflowError):
        arr = np.asarray(flat, dtype=object)
    values = flat if arr.ndim <= 1 else np.asarray(flat, dtype=object).ravel().tolist()
    suspects: Any = values
    if arr.dtype.kind == "f":
        # An int that float32 cannot hold exactly, or that int64 cannot hold, is above 2**24
        # in magnitude and integral: look only at those entries (vectorised), not at all.
        x = arr.ravel()
        suspects = [values[i] for i in np.flatnonzero((np.abs(x) > 2**24) & (x == np.floor(x)))]
    # numpy reads ints beyond int64 as uint64, float64 or object, depending on the neighbours
    if arr.dtype.kind in "uOf" and any(map(_out_of_int64, suspects)):
        i, v = culprit(_out_of_int64)
        raise ShapeBucketError(
            f"{where(i)}: {key!r} holds {v}, outside int64 [{_INT64[0]}, {_INT64[1]}]; Python "
            "ints become int64, so pass this sample as a numpy array or tensor of the dtype you "
            "mean (np.uint64), or check how the value was computed"
        )
    if arr.dtype.kind == "f":
        return _to_float32(key, arr, suspects, culprit, where)
    if arr.dtype.kind not in "iub":  # objects, strings
        i, v = culprit(_not_a_number)
        raise ShapeBucketError(
            f"{where(i)}: {key!r} holds {short(v)} ({type(v).__name__}); sequence values must be "
            "ints, floats or bools"
        )
    return torch.from_numpy(arr.astype(np.int64, copy=False) if arr.dtype.kind in "iu" else arr)


def _not_a_number(v: Any) -> bool:
    return not isinstance(v, (int, float, bool, np.integer, np.floating, np.bool_))


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))


def _out_of_int64(v: Any) -> bool:
    return _is_int(v) and not _INT64[0] <= int(v) <= _INT64[1]


def _to_float32(
    key: Key,
    arr: np.ndarray,
    suspects: list[Any],
    culprit: Callable[[Callable[[Any], bool]], tuple[int, Any]],
    where: Where,
) -> torch.Tensor:
    """Python floats (maybe mixed with ints) as float32, refusing any value that changes."""
    if any(_is_int(v) and float(np.float32(v)) != v for v in suspects):
        i, v = culprit(lambda x: _is_int(x) and float(np.float32(x)) != x)
        raise ShapeBucketError(
            f"{where(i)}: {key!r} mixes ints and floats, and the int {v} does not fit float32 "
            "(the dtype of Python floats) exactly; pass ids and floats under different keys, "
            "or every value as a float if that is what you mean"
        )
    with np.errstate(over="ignore"):
        f32 = arr.astype(np.float32)
    if not np.isfinite(f32).all():  # checked once per batch; a loss only when some inf
        lost = np.flatnonzero(np.isinf(f32.ravel()) & np.isfinite(arr.ravel()))
        if len(lost):
            bad = float(arr.ravel()[lost[0]])
            i, v = culprit(lambda x: isinstance(x, float) and x == bad)
            raise ShapeBucketError(
                f"{where(i)}: {key!r} holds {v!r}, beyond float32's largest value "
                f"{float(np.finfo(np.float32).max):g} (Python floats become float32), so it "
                "would become inf; pass this key as a float64 numpy array or tensor, or "
                "check how the value was computed"
            )
    return torch.from_numpy(f32)


def _to_tensor(key: Key, value: Any, i: int, where: Where) -> torch.Tensor:
    """Sample ``i``'s value (a tensor, array, list or number) as a tensor, arrays checked."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(_numeric(key, value, i, where))
    if isinstance(value, (list, tuple)):
        return from_python(key, list(value), [value], lambda _: where(i))
    if is_scalar(value):
        return torch.as_tensor(value)
    raise ShapeBucketError(f"{where(i)}: {key!r} holds {short(value)}, not a sequence")


def _numeric(key: Key, value: np.ndarray, i: int, where: Where) -> np.ndarray:
    """``value``, a numpy array of numbers or bools, or the refusal naming the sample (an
    array of objects or strings has no tensor)."""
    if value.dtype.kind not in "biufc":
        raise ShapeBucketError(
            f"{where(i)}: {key!r} is a numpy array of dtype {value.dtype} ({short(value)}), "
            "which no tensor holds; give numbers (np.asarray(value, dtype=np.int64) for "
            "ids), or leave the key out of the samples"
        )
    return value


def stack_column(key: Key, column: list[Any], rows: int, pad: Any, where: Where = at) -> Any:
    """The values of a key that is not padded, as one batch value of ``rows`` rows (the
    engine's :func:`~.engine.pad_rows` adds them): numbers into a ``[rows]`` tensor,
    tensors and arrays of one shape into ``[rows, *shape]``, anything else a list."""
    extra = rows - len(column)
    values: torch.Tensor
    if all(is_scalar(v) for v in column):
        if all(type(v) in (int, float, bool) for v in column):
            values = from_python(key, column, [[v] for v in column], where)
        else:
            parts = [_to_tensor(key, v, i, where).reshape(1) for i, v in enumerate(column)]
            values = torch.cat(same_dtype(key, parts, where))
    elif all(isinstance(v, (torch.Tensor, np.ndarray)) for v in column):
        tensors = [_to_tensor(key, v, i, where) for i, v in enumerate(column)]
        shapes = {tuple(t.shape) for t in tensors}
        if len(shapes) > 1:
            i = next(i for i, t in enumerate(tensors) if tuple(t.shape) != tuple(tensors[0].shape))
            raise ShapeBucketError(
                f"{where(i)}: {key!r} is not a sequence key, so it is stacked, but it has shape "
                f"{tuple(tensors[i].shape)} where {where(0)} has {tuple(tensors[0].shape)}; add "
                f"{key!r} to sequence_keys to pad it, or give every sample the same shape"
            )
        values = torch.stack(same_dtype(key, tensors, where))
    else:
        return pad_rows(list(column), rows, None)
    if extra:
        check_pad_fits(key, pad, values.dtype)
        values = pad_rows(values, rows, pad)
    return values
