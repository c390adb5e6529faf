"""The settings and the reading that both collators share.

:class:`Collator` holds what :class:`~shapebucket.BucketCollator` and
:class:`~shapebucket.PackedCollator` have in common: the bucket table, rows,
pad values, which keys are sequences and how long a sample is, the token
mask's name, ``seq_dim``, the index key, and the shared counters. Its
:meth:`Collator._read` turns a list of samples into checked columns and
lengths; each collator then describes its :class:`~.engine.Layout` and hands
the values to the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, NamedTuple, cast

import numpy as np
import torch

from .._validate import check_batch_sizes, check_int
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets, as_buckets
from .counters import CollateReport, Counts, SharedCounters
from .engine import Key, Layout
from .samples import (
    SCALARS,
    Where,
    check_collisions,
    is_sequence,
    lengths_of,
    namer,
    to_columns,
)
from .values import check_pad_fits, concat

__all__ = ["Collator", "Columns"]


class Columns(NamedTuple):
    """A batch of samples read and checked: one list per key, and each sample's length."""

    kind: str  # "dict", "tuple" or "bare"
    keys: list[Key]
    seq_keys: list[Key]
    columns: dict[Key, list[Any]]
    lengths: np.ndarray  # int64 [n], the length key's
    length_key: Key
    where: Where


def _check_key_list(name: str, value: Any) -> list[Key] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ShapeBucketError(f"{name} must be a list of keys, got {value!r}")
    if not value:
        raise ShapeBucketError(f"{name} must name at least one key, got []")
    return list(value)


_PY_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float32}


def _untyped(column: list[Any]) -> bool:
    """Whether a column is Python lists/tuples only (no array or tensor gives a dtype)."""
    return all(isinstance(v, (list, tuple)) for v in column)


@dataclass(repr=False)
class Collator:
    """The shared settings of the collators (see :class:`~shapebucket.BucketCollator`)."""

    buckets: Buckets | Sequence[int]
    _: KW_ONLY
    rows: int | Mapping[int, int] | None = None
    pad_values: Mapping[Any, Any] | None = None
    length_key: Key | None = None
    sequence_keys: Sequence[Key] | None = None
    mask_key: str | None = "attention_mask"
    seq_dim: int = 0
    index_key: Key | None = None

    def __post_init__(self) -> None:
        self.buckets = as_buckets(self.buckets)
        self.seq_dim = check_int("seq_dim", self.seq_dim, minimum=0)
        if self.mask_key is not None and not isinstance(self.mask_key, str):
            raise ShapeBucketError(f"mask_key must be a str or None, got {self.mask_key!r}")
        if self.pad_values is not None:
            if not isinstance(self.pad_values, Mapping):
                raise ShapeBucketError(
                    f"pad_values must be a mapping key -> number, got {self.pad_values!r}"
                )
            for k, v in self.pad_values.items():
                if isinstance(v, (torch.Tensor, np.ndarray)) or not isinstance(v, SCALARS):
                    raise ShapeBucketError(f"pad_values[{k!r}] must be a number, got {v!r}")
            self.pad_values = dict(self.pad_values)
        self.sequence_keys = _check_key_list("sequence_keys", self.sequence_keys)
        self.rows = check_batch_sizes(self.rows, self._table)
        self._counters = SharedCounters(tuple(self._table))

    @property
    def _table(self) -> Buckets:
        # __post_init__ turns any sequence of ints into Buckets
        return cast(Buckets, self.buckets)

    @property
    def stats(self) -> CollateReport:
        """What this collator (and its DataLoader workers' copies) did so far, as a snapshot."""
        return self._counters.snapshot()

    def reset_stats(self) -> None:
        """Set every counter back to zero (also for the workers of a running DataLoader)."""
        self._counters.reset()

    def rows_for(self, bucket: int) -> int | None:
        """The rows a batch at ``bucket`` is padded to (``None``: as many as it has samples).

        >>> from shapebucket import BucketCollator
        >>> BucketCollator([8, 16], rows={8: 4, 16: 2}).rows_for(16)
        2
        """
        target = self.rows
        if target is None or isinstance(target, int):
            return target
        if bucket not in target:
            raise ShapeBucketError(
                f"rows has no entry for bucket {bucket}; it has {sorted(target)}"
            )
        return target[bucket]

    def pad_value(self, key: Key) -> Any:
        """The pad value used for ``key``: ``pad_values[key]``, else -100 for ``labels``, else 0."""
        if self.pad_values is not None and key in self.pad_values:
            return self.pad_values[key]
        return -100 if key == "labels" else 0

    def _row_mask_key(self) -> str | None:
        """The key of the row mask this collator adds (None: none)."""
        return None

    # -- reading -----------------------------------------------------------------------------

    def _read(self, samples: Sequence[Any]) -> Columns:
        """The samples as checked columns and lengths."""
        if (
            not isinstance(samples, Sequence)
            or isinstance(samples, (str, bytes))
            or len(samples) == 0
        ):
            raise ShapeBucketError(
                f"{type(self).__name__} needs a non-empty list of samples, got {samples!r}"
            )
        kind, keys, columns = to_columns(samples)
        where = namer(kind, columns, self.index_key)
        seq_keys = self._sequence_keys(kind, keys, columns)
        check_collisions(
            kind,
            keys,
            seq_keys,
            columns,
            mask_key=self.mask_key,
            sample_mask_key=self._row_mask_key(),
        )
        length_key = self.length_key if self.length_key is not None else seq_keys[0]
        if length_key not in seq_keys:
            raise ShapeBucketError(
                f"length_key {length_key!r} is not a sequence key; sequence keys are {seq_keys}"
            )
        lens = lengths_of(length_key, columns[length_key], self.seq_dim, where)
        for k in seq_keys:
            if k != length_key:
                other = lengths_of(k, columns[k], self.seq_dim, where)
                if other.tobytes() != lens.tobytes():  # both int64 [n]
                    self._disagree(seq_keys, columns, length_key, lens, k, other, where)
        return Columns(kind, keys, seq_keys, columns, lens, length_key, where)

    def _disagree(
        self,
        seq_keys: list[Key],
        columns: dict[Key, list[Any]],
        length_key: Key,
        lens: np.ndarray,
        key: Key,
        other: np.ndarray,
        where: Where,
    ) -> None:
        i = int(np.argmax(other != lens))
        n = len(lens)
        fixed = [k for k in seq_keys if n > 1 and len({np.shape(v) for v in columns[k]}) == 1]
        hint = "pass sequence_keys=[...] to pad only some keys"
        if fixed and len(fixed) < len(seq_keys):
            rest = [k for k in seq_keys if k not in fixed]
            hint = (
                f"{fixed} have one shape in every sample: if they are not sequences "
                f"(an image, fixed features), pass sequence_keys={rest} and they are "
                "stacked instead"
            )
        raise ShapeBucketError(
            f"{where(i)}: sequence keys disagree in length: {length_key!r} has {int(lens[i])}, "
            f"{key!r} has {int(other[i])}; {hint}"
        )

    def _sequence_keys(
        self, kind: str, keys: list[Key], columns: dict[Key, list[Any]]
    ) -> list[Key]:
        if self.sequence_keys is not None:
            for k in self.sequence_keys:
                if k not in columns:
                    raise ShapeBucketError(
                        f"sequence key {k!r} is not in the samples; sample 0 has keys {keys}"
                    )
            return list(self.sequence_keys)
        seq = [k for k in keys if is_sequence(columns[k][0])]
        if not seq:
            raise ShapeBucketError(
                f"sample 0 has no sequence value (keys {keys}); sequences are lists, tuples, arrays "
                "or tensors with ndim >= 1"
            )
        if kind == "dict" and self.mask_key in seq and len(seq) > 1:
            seq.remove(self.mask_key)  # an existing mask is padded, but never defines the length
            seq.append(self.mask_key)
        return seq

    def _values(self, cols: Columns) -> tuple[dict[Key, torch.Tensor], dict[Key, Any]]:
        """Each sequence key's values concatenated, and its pad value (checked to fit)."""
        values: dict[Key, torch.Tensor] = {}
        pads: dict[Key, Any] = {}
        for k in cols.seq_keys:
            values[k] = concat(k, cols.columns[k], self.seq_dim, cols.where)
            pads[k] = self.pad_value(k)
            if values[k].numel() == 0 and _untyped(cols.columns[k]):
                # empty Python lists carry no dtype: the pad value's (int64, float32, bool)
                values[k] = values[k].to(_PY_DTYPES.get(type(pads[k]), values[k].dtype))
            check_pad_fits(k, pads[k], values[k].dtype)
        return values, pads

    def _count(self, layout: Layout, bucket: int, *, cut: tuple[int, int] = (0, 0)) -> None:
        real = int(layout.lengths.sum())
        self._counters.add(
            bucket,
            Counts(
                num_samples=layout.n,
                real_tokens=real,
                padded_tokens=layout.rows * layout.length - real,
                pad_rows=layout.rows - layout.used_rows(),
                truncated_samples=cut[0],
                truncated_tokens=cut[1],
            ),
        )
