"""Reading a list of samples into columns and tensors, for the collators.

Samples are dicts (one column per key), tuples or lists of fields (one column
per position), or bare sequences (one column). Python ints become int64,
Python floats float32, bools bool; numpy arrays and tensors keep their dtype.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
import torch

from .errors import ShapeBucketError

__all__ = [
    "SCALARS",
    "Key",
    "concat",
    "is_scalar",
    "is_sequence",
    "short",
    "stack_column",
    "to_columns",
]

Key = Hashable
SCALARS = (numbers.Number, np.generic)


def is_scalar(value: Any) -> bool:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim == 0
    return isinstance(value, SCALARS)


def is_sequence(value: Any) -> bool:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim >= 1
    return isinstance(value, (list, tuple))


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def to_columns(samples: Sequence[Any]) -> tuple[str, list[Key], dict[Key, list[Any]]]:
    """The samples' kind ("dict", "tuple" or "bare"), keys, and one list per key."""
    first = samples[0]
    if isinstance(first, Mapping):
        keys = list(first.keys())
        columns: dict[Key, list[Any]] = {}
        for k in keys:
            try:
                columns[k] = [s[k] for s in samples]
            except (KeyError, TypeError, IndexError):
                i = next(
                    i for i, s in enumerate(samples) if not isinstance(s, Mapping) or k not in s
                )
                raise ShapeBucketError(
                    f"sample {i} has no key {k!r} (sample 0 has keys {keys}); every sample needs the same keys"
                ) from None
        for i, s in enumerate(samples):
            if len(s) != len(keys):
                extra = [k for k in s if k not in first]
                raise ShapeBucketError(
                    f"sample {i} has keys {extra} that sample 0 does not; every sample needs the same keys"
                )
        return "dict", keys, columns
    if _is_bare(first):
        for i, s in enumerate(samples):
            if not _is_bare(s):
                raise ShapeBucketError(
                    f"sample {i} is {type(s).__name__} but sample 0 is a bare sequence"
                )
        return "bare", [0], {0: list(samples)}
    if isinstance(first, (list, tuple)):
        width = len(first)
        for i, s in enumerate(samples):
            if not isinstance(s, (list, tuple)) or len(s) != width:
                raise ShapeBucketError(
                    f"sample {i} is {short(s)}, but sample 0 is a tuple of {width} fields; every sample "
                    "needs the same structure"
                )
        keys = list(range(width))
        return "tuple", keys, {k: [s[k] for s in samples] for k in keys}
    raise ShapeBucketError(
        f"sample 0 is {type(first).__name__} {short(first)}; samples must be dicts, tuples of fields, "
        "or sequences (lists, arrays, tensors)"
    )


def _is_bare(sample: Any) -> bool:
    if isinstance(sample, (torch.Tensor, np.ndarray)):
        return sample.ndim >= 1
    return isinstance(sample, (list, tuple)) and all(is_scalar(v) for v in sample[:8])


def concat(key: Key, column: list[Any], seq_dim: int) -> torch.Tensor:
    """All samples' values of one key, concatenated along the sequence dim (moved to 0)."""
    kinds = {type(v) for v in column}
    try:
        if kinds <= {list, tuple} and seq_dim == 0:
            return _from_python(list(chain.from_iterable(column)))
        if kinds == {torch.Tensor}:
            parts = column
        elif kinds == {np.ndarray}:
            arr = np.concatenate(
                [np.moveaxis(v, seq_dim, 0) for v in column] if seq_dim else column
            )
            return torch.from_numpy(arr)
        else:
            parts = [_to_tensor(v) for v in column]
        if seq_dim:
            parts = [p.movedim(seq_dim, 0) for p in parts]
        return torch.cat(parts)
    except (ValueError, RuntimeError, TypeError) as e:
        shapes = [
            tuple(np.shape(v)) if not isinstance(v, (list, tuple)) else (len(v),) for v in column
        ]
        raise ShapeBucketError(
            f"cannot batch {key!r}: the values' non-sequence dims or types disagree (shapes {shapes[:8]}"
            f"{'...' if len(shapes) > 8 else ''}): {e}"
        ) from None


def _from_python(flat: list[Any]) -> torch.Tensor:
    if not flat:
        return torch.empty(0, dtype=torch.int64)
    arr = np.asarray(flat)
    if arr.dtype == np.float64:
        return torch.from_numpy(arr.astype(np.float32))
    if arr.dtype.kind not in "iub":
        raise TypeError(f"values must be numbers, got dtype {arr.dtype}")
    return torch.from_numpy(arr.astype(np.int64) if arr.dtype.kind in "iu" else arr)


def _to_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return _from_python(list(value))


def stack_column(key: Key, column: list[Any], rows: int, pad: Any) -> Any:
    """The values of a key that is not padded, as one batch value of ``rows`` rows: numbers
    into a ``[rows]`` tensor, tensors and arrays of one shape and dtype into
    ``[rows, *shape]`` (extra rows hold ``pad``), anything else a list (extra rows ``None``)."""
    extra = rows - len(column)
    values: torch.Tensor
    if all(is_scalar(v) for v in column):
        if all(isinstance(v, torch.Tensor) for v in column):
            values = torch.stack(column)
        else:
            values = torch.as_tensor(
                np.asarray([v.item() if isinstance(v, torch.Tensor) else v for v in column])
            )
            if values.dtype == torch.float64 and not any(
                isinstance(v, (np.ndarray, np.generic, torch.Tensor)) for v in column
            ):
                values = values.float()
    elif all(isinstance(v, (torch.Tensor, np.ndarray)) for v in column):
        tensors = [torch.as_tensor(v) for v in column]
        shapes = {tuple(t.shape) for t in tensors}
        dtypes = {t.dtype for t in tensors}
        if len(shapes) > 1 or len(dtypes) > 1:
            i = next(
                i
                for i, t in enumerate(tensors)
                if (tuple(t.shape), t.dtype) != (tuple(tensors[0].shape), tensors[0].dtype)
            )
            raise ShapeBucketError(
                f"sample {i}: {key!r} is not a sequence key, so it is stacked, but it has shape "
                f"{tuple(tensors[i].shape)} and dtype {tensors[i].dtype} where sample 0 has "
                f"{tuple(tensors[0].shape)} and {tensors[0].dtype}; add {key!r} to sequence_keys "
                "to pad it, or give every sample the same shape and dtype"
            )
        values = torch.stack(tensors)
    else:
        return list(column) + [None] * extra
    if extra:
        filler = torch.full((extra, *values.shape[1:]), pad, dtype=values.dtype)
        values = torch.cat([values, filler])
    return values
