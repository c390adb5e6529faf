"""Samples (dicts, tuples of fields, bare sequences) read into columns: their structure
checked (keys, sequence values, lengths along ``seq_dim``), and how errors name a sample."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ShapeBucketError
from .engine import Key

__all__ = [
    "SCALARS",
    "KeyRoles",
    "Where",
    "at",
    "check_collisions",
    "index_key_of",
    "is_scalar",
    "is_sequence",
    "lengths_of",
    "namer",
    "short",
    "to_columns",
]

SCALARS = (numbers.Number, np.generic)


@dataclass(frozen=True)
class KeyRoles:
    """Which key of the samples plays which part (``None``: found as documented).

    Args:
        length: the key whose length is the sample's length (default: the first
            sequence key). All sequence keys must have this length.
        index: a key whose value is each sample's dataset index, so errors name the
            dataset index of a bad sample (default: ``"idx"`` or ``"index"`` when the
            samples have one).
        labels: the keys holding labels: padded with -100 unless ``pad_values``
            says otherwise, and shifted by ``PackedCollator(label_shift="model")``.

    >>> KeyRoles(index="id").labels
    ('labels',)
    """

    length: Key | None = None
    index: Key | None = None
    labels: tuple[Key, ...] = ("labels",)

    def __post_init__(self) -> None:
        labels = self.labels
        if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
            raise ShapeBucketError(f"KeyRoles(labels=...) must be a list of keys, got {labels!r}")
        object.__setattr__(self, "labels", tuple(labels))


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


def index_key_of(kind: str, keys: Iterable[Key], index_key: Key | None) -> Key | None:
    """The key of each sample's dataset index: ``index_key`` (``KeyRoles.index``), else a
    dict key named ``idx`` or ``index``, else None."""
    if index_key is not None or kind != "dict":
        return index_key
    return next((k for k in ("idx", "index") if k in keys), None)


def namer(kind: str, columns: dict[Key, list[Any]], index_key: Key | None) -> Where:
    """How errors name sample ``i``: its place in the batch, and its dataset index when the
    samples carry it (:func:`index_key_of`)."""
    key = index_key_of(kind, columns, index_key)
    if key is None:
        return at
    if key not in columns:
        raise ShapeBucketError(
            f"KeyRoles(index={key!r}) is not in the samples; they have keys {list(columns)}"
        )
    column = columns[key]

    def where(i: int) -> str:
        v = column[i]
        if isinstance(v, (torch.Tensor, np.ndarray, np.generic)) and np.size(v) == 1:
            v = v.item()
        return f"sample {i} of the batch (dataset index {short(v)})"

    return where


def check_collisions(
    seq_keys: list[Key], columns: dict[Key, list[Any]], mask_key: Key | None, row_mask: Key | None
) -> None:
    """Refuse sample keys that would collide with the keys a collator adds: its token
    mask (``mask_key``) and its row mask (``row_mask``, None when it adds none)."""
    if row_mask is not None and row_mask in columns:
        raise ShapeBucketError(
            f"the samples have a key {row_mask!r}, which is where the collator puts "
            "its row mask (rows is set), so yours would be overwritten; rename your key, "
            "or pass sample_mask_key='...' (or None) to put the row mask elsewhere"
        )
    if mask_key is not None and mask_key in columns and mask_key not in seq_keys:
        v = columns[mask_key][0]
        raise ShapeBucketError(
            f"the samples have a key {mask_key!r} holding {type(v).__name__} {short(v)}, "
            "which is not padded as a sequence; the collator adds its token mask under that name "
            "and would leave the batch without one. Rename your key, pass mask_key='...' for the "
            f"token mask, or add {mask_key!r} to sequence_keys if it is a per-token mask"
        )


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


Where = Callable[[int], str]


def at(i: int) -> str:
    """How an error names sample ``i`` of a batch when nothing better is known."""
    return f"sample {i}"


def lengths_of(key: Key, column: list[Any], seq_dim: int, where: Where = at) -> np.ndarray:
    """Each sample's length along ``seq_dim`` (int64), checked in one pass over the column:
    the set of types and of ``ndim`` first, a per-sample look only to name a bad sample."""
    n = len(column)
    types = set(map(type, column))
    if types == {list} and seq_dim == 0:
        return np.fromiter(map(len, column), dtype=np.int64, count=n)
    if (
        len(types) == 1
        and types <= {torch.Tensor, np.ndarray}
        and min(v.ndim for v in column) > seq_dim
    ):
        return np.fromiter((v.shape[seq_dim] for v in column), dtype=np.int64, count=n)
    out = np.empty(n, dtype=np.int64)
    for i, v in enumerate(column):
        if not is_sequence(v):
            raise ShapeBucketError(
                f"{where(i)}: {key!r} is a sequence key but holds {type(v).__name__} {short(v)}; "
                "pass sequence_keys=[...] to name the keys to pad"
            )
        out[i] = _length(key, v, seq_dim, where, i)
    return out


def _length(key: Key, value: Any, seq_dim: int, where: Where, i: int) -> int:
    """One sample's length along ``seq_dim``; nested lists must be rectangular."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        shape = tuple(value.shape)
    else:
        shape = _nested_shape(key, value, where, i)
    if len(shape) <= seq_dim:
        fix = "pass the seq_dim the values have (0 for [T], [T, F])"
        if shape:  # a per-step value [T] beside [F, T] features: one seq_dim pads every key
            fix = (
                f"every sequence key of a collator is padded along seq_dim={seq_dim}, and a "
                f"{len(shape)}-D value has no dim {seq_dim}; if {key!r} is a per-frame mask, "
                "leave it out of the samples: the collator makes the mask itself (mask_key, "
                f"[rows, frames]); else give it the features' layout ({[1, *shape]} for "
                f"{list(shape)})"
            )
        raise ShapeBucketError(
            f"{where(i)}: {key!r} has shape {shape} with no seq_dim={seq_dim}; {fix}"
        )
    return shape[seq_dim]


def _nested_shape(key: Key, value: Any, where: Where, i: int) -> tuple[int, ...]:
    """The shape of nested lists/tuples (and arrays or tensors inside them), or a
    ShapeBucketError when they are ragged."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return tuple(value.shape)
    if not isinstance(value, (list, tuple)):
        return ()
    if not value:
        return (0,)
    inner = {_nested_shape(key, v, where, i) for v in value}
    if len(inner) > 1:
        raise ShapeBucketError(
            f"{where(i)}: {key!r} is a ragged nested list (its items have shapes "
            f"{sorted(inner)[:4]}); every item along a dim must have the same length"
        )
    return (len(value), *inner.pop())
