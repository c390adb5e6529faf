"""``BucketCollator``: pad each batch's sequence dimension to its bucket length.

The collator is a picklable dataclass meant for ``DataLoader(collate_fn=...)``.
Each key is filled in one pre-allocated tensor: the real tokens of all samples
are concatenated once and scattered through a mask built from the lengths, so
there is no per-sample ``F.pad`` and ``stack``.

Conventions (all documented in ``docs/collate.md``):

* Samples are dicts (output: dict), tuples/lists of fields (output: tuple), or
  bare sequences (output: a tuple ``(padded, mask)``, or the padded tensor alone
  when ``mask_key=None`` and ``pad_batch_to`` is unset).
* Python ints become int64, Python floats float32, bools bool; numpy arrays and
  tensors keep their dtype.
* ``overflow="truncate"`` keeps the *first* ``max_len`` tokens with right
  padding and the *last* ``max_len`` with left padding (left padding is for
  generation, where the most recent context matters).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal, cast

import numpy as np
import torch

from .buckets import Buckets, as_buckets
from .errors import ShapeBucketError

__all__ = ["BucketCollator", "CollateStats"]

Key = Hashable
_SCALARS = (numbers.Number, np.generic)


@dataclass
class CollateStats:
    """Counters kept by one collator object.

    With ``num_workers > 0`` each DataLoader worker collates with its own copy of
    the collator, so these counters live in the workers and the main process's
    copy stays at zero; count in the main process from the batches instead (for
    example ``batch["attention_mask"].sum()``) when workers are used.

    >>> collate = BucketCollator([8])
    >>> _ = collate([[1, 2, 3], [4]])
    >>> collate.stats.real_tokens, collate.stats.padded_tokens, collate.stats.batches_per_bucket
    (4, 12, {8: 1})
    """

    batches: int = 0
    samples: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    pad_rows: int = 0
    truncated_samples: int = 0
    truncated_tokens: int = 0
    batches_per_bucket: dict[int, int] = field(default_factory=dict)

    @property
    def token_efficiency(self) -> float:
        """Real tokens / computed tokens (real + padding), 0.0 before any batch."""
        total = self.real_tokens + self.padded_tokens
        return self.real_tokens / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["token_efficiency"] = self.token_efficiency
        return out


def _is_scalar(value: Any) -> bool:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim == 0
    return isinstance(value, _SCALARS)


def _is_sequence(value: Any) -> bool:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim >= 1
    return isinstance(value, (list, tuple))


def _check_pad_value(key: Key, value: Any) -> None:
    if isinstance(value, (torch.Tensor, np.ndarray)) or not isinstance(value, _SCALARS):
        raise ShapeBucketError(f"pad_values[{key!r}] must be a number, got {value!r}")


@dataclass(repr=False)
class BucketCollator:
    """Collate variable-length samples into a batch padded to its bucket length.

    Args:
        buckets: the bucket lengths (:class:`Buckets` or a sorted list of ints).
        pad_values: pad value per key (tuple samples: per position). Defaults:
            ``labels`` -> -100, everything else 0.
        length_key: the key whose length is the sample's length (default: the
            first sequence key). All sequence keys must have this length.
        sequence_keys: the keys to pad; default: every value with a length
            (lists, tuples, arrays and tensors with ``ndim >= 1``).
        padding_side: ``"right"`` or ``"left"``.
        mask_key: name of the bool mask added (True on real tokens) when the
            samples do not carry it; ``None`` adds none.
        pad_batch_to: pad a short batch with all-pad rows to this many rows
            (an int, or a mapping ``bucket length -> rows`` such as
            ``BucketBatchSampler.batch_sizes``) and add a bool row mask under
            ``sample_mask_key``.
        sample_mask_key: where the row mask goes (default ``"sample_mask"``);
            ``None`` adds none, for models that reject unknown keys (pad rows
            still have an all-False mask and labels -100).
        overflow: ``"error"`` or ``"truncate"`` for samples longer than the
            largest bucket.
        seq_dim: the sequence dimension of each sample's value (0 for ``[T, F]``).

    >>> collate = BucketCollator(buckets=Buckets([8, 16]))
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4] * 9}])
    >>> batch["input_ids"].shape, batch["attention_mask"].sum(1).tolist()
    (torch.Size([2, 16]), [3, 9])
    """

    buckets: Buckets | Sequence[int]
    pad_values: Mapping[Any, Any] | None = field(default=None, kw_only=True)
    length_key: Key | None = field(default=None, kw_only=True)
    sequence_keys: Sequence[Key] | None = field(default=None, kw_only=True)
    padding_side: Literal["right", "left"] = field(default="right", kw_only=True)
    mask_key: str | None = field(default="attention_mask", kw_only=True)
    pad_batch_to: int | Mapping[int, int] | None = field(default=None, kw_only=True)
    overflow: Literal["error", "truncate"] = field(default="error", kw_only=True)
    seq_dim: int = field(default=0, kw_only=True)
    sample_mask_key: str | None = field(default="sample_mask", kw_only=True)
    stats: CollateStats = field(default_factory=CollateStats, init=False, compare=False)

    def __post_init__(self) -> None:
        self.buckets = as_buckets(self.buckets)
        if self.padding_side not in ("right", "left"):
            raise ShapeBucketError(
                f"padding_side must be 'right' or 'left', got {self.padding_side!r}"
            )
        if self.overflow not in ("error", "truncate"):
            raise ShapeBucketError(f"overflow must be 'error' or 'truncate', got {self.overflow!r}")
        if isinstance(self.seq_dim, bool) or not isinstance(self.seq_dim, int) or self.seq_dim < 0:
            raise ShapeBucketError(f"seq_dim must be an int >= 0, got {self.seq_dim!r}")
        for name in ("mask_key", "sample_mask_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ShapeBucketError(f"{name} must be a str or None, got {value!r}")
        if self.pad_values is not None:
            if not isinstance(self.pad_values, Mapping):
                raise ShapeBucketError(
                    f"pad_values must be a mapping key -> number, got {self.pad_values!r}"
                )
            for k, v in self.pad_values.items():
                _check_pad_value(k, v)
            self.pad_values = dict(self.pad_values)
        if self.sequence_keys is not None:
            if isinstance(self.sequence_keys, (str, bytes)) or not isinstance(
                self.sequence_keys, Sequence
            ):
                raise ShapeBucketError(
                    f"sequence_keys must be a list of keys, got {self.sequence_keys!r}"
                )
            self.sequence_keys = list(self.sequence_keys)
            if not self.sequence_keys:
                raise ShapeBucketError("sequence_keys must name at least one key, got []")
        self.pad_batch_to = self._check_pad_batch_to(self.pad_batch_to)

    @property
    def _table(self) -> Buckets:
        # __post_init__ turns any sequence of ints into Buckets
        return cast(Buckets, self.buckets)

    def _check_pad_batch_to(self, value: Any) -> int | dict[int, int] | None:
        if value is None:
            return None
        if isinstance(value, Mapping):
            rows = {}
            for b, n in value.items():
                if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                    raise ShapeBucketError(f"pad_batch_to[{b}] must be an int >= 1, got {n!r}")
                rows[int(b)] = int(n)
            missing = [b for b in self.buckets if b not in rows]
            if missing:
                raise ShapeBucketError(
                    f"pad_batch_to has no batch size for buckets {missing}; give one for every bucket "
                    f"of {self.buckets!r} (BucketBatchSampler.batch_sizes has them all)"
                )
            return rows
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ShapeBucketError(f"pad_batch_to must be an int >= 1 or a mapping, got {value!r}")
        return int(value)

    # -- pickling: settings only ----------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["stats"] = CollateStats()  # a worker's counters start from zero
        return state

    def __repr__(self) -> str:
        settings = [
            f"buckets={self.buckets!r}",
            f"padding_side={self.padding_side!r}",
            f"mask_key={self.mask_key!r}",
            f"overflow={self.overflow!r}",
        ]
        if self.sample_mask_key != "sample_mask":
            settings.append(f"sample_mask_key={self.sample_mask_key!r}")
        for name in ("pad_values", "length_key", "sequence_keys", "pad_batch_to"):
            value = getattr(self, name)
            if value is not None:
                settings.append(f"{name}={value!r}")
        if self.seq_dim:
            settings.append(f"seq_dim={self.seq_dim}")
        return f"BucketCollator({', '.join(settings)})"

    # -- collation -------------------------------------------------------------

    def pad_value(self, key: Key) -> Any:
        """The pad value used for ``key``."""
        if self.pad_values is not None and key in self.pad_values:
            return self.pad_values[key]
        return -100 if key == "labels" else 0

    def __call__(self, samples: Sequence[Any]) -> Any:
        if (
            not isinstance(samples, Sequence)
            or isinstance(samples, (str, bytes))
            or len(samples) == 0
        ):
            raise ShapeBucketError(
                f"BucketCollator needs a non-empty list of samples, got {samples!r}"
            )
        kind, keys, columns = _columns(samples)
        seq_keys = self._sequence_keys(kind, keys, columns)
        length_key = self.length_key if self.length_key is not None else seq_keys[0]
        if length_key not in seq_keys:
            raise ShapeBucketError(
                f"length_key {length_key!r} is not a sequence key; sequence keys are {seq_keys}"
            )

        lengths = {k: self._lengths(k, columns[k]) for k in seq_keys}
        lens = lengths[length_key]
        for k in seq_keys:
            if k != length_key and not np.array_equal(lengths[k], lens):
                i = int(np.argmax(lengths[k] != lens))
                raise ShapeBucketError(
                    f"sample {i}: sequence keys disagree in length: {length_key!r} has {int(lens[i])}, "
                    f"{k!r} has {int(lengths[k][i])}; pass sequence_keys=[...] to pad only some keys"
                )

        n_real = len(samples)
        longest = int(lens.max())
        if longest > self._table.max_len:
            lens = self._overflow(lens, length_key, seq_keys, columns)
            longest = self._table.max_len
        bucket = self._table.bucket_for(longest)
        rows = self._rows(bucket, n_real)

        positions = torch.arange(bucket)
        lens_t = torch.from_numpy(lens)
        if self.padding_side == "right":
            mask = positions[None, :] < lens_t[:, None]
        else:
            mask = positions[None, :] >= (bucket - lens_t)[:, None]

        out: dict[Key, Any] = {}
        for k in keys:
            if k in seq_keys:
                out[k] = self._pad_key(k, columns[k], mask, rows)
            else:
                out[k] = self._stack_key(k, columns[k], rows)
        if self.mask_key is not None and self.mask_key not in keys:
            full = torch.zeros(rows, bucket, dtype=torch.bool)
            full[:n_real] = mask
            out[self.mask_key] = full
        if self.pad_batch_to is not None and self.sample_mask_key is not None:
            sample_mask = torch.zeros(rows, dtype=torch.bool)
            sample_mask[:n_real] = True
            out[self.sample_mask_key] = sample_mask

        real = int(lens.sum())
        st = self.stats
        st.batches += 1
        st.samples += n_real
        st.real_tokens += real
        st.padded_tokens += rows * bucket - real
        st.pad_rows += rows - n_real
        st.batches_per_bucket[bucket] = st.batches_per_bucket.get(bucket, 0) + 1

        if kind == "dict":
            return out
        result = tuple(out.values())
        if kind == "bare" and len(result) == 1:
            return result[0]
        return result

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
        seq = [k for k in keys if _is_sequence(columns[k][0])]
        if not seq:
            raise ShapeBucketError(
                f"sample 0 has no sequence value (keys {keys}); sequences are lists, tuples, arrays "
                "or tensors with ndim >= 1"
            )
        if kind == "dict" and self.mask_key in seq and len(seq) > 1:
            seq.remove(self.mask_key)  # an existing mask is padded, but never defines the length
            seq.append(self.mask_key)
        return seq

    def _lengths(self, key: Key, column: list[Any]) -> np.ndarray:
        dim = self.seq_dim
        try:
            if dim == 0 and all(type(v) is list for v in column):
                return np.fromiter(map(len, column), dtype=np.int64, count=len(column))
            out = np.empty(len(column), dtype=np.int64)
            for i, v in enumerate(column):
                if not _is_sequence(v):
                    raise ShapeBucketError(
                        f"sample {i}: {key!r} is a sequence key but holds {type(v).__name__} {_short(v)}; "
                        "pass sequence_keys=[...] to name the keys to pad"
                    )
                out[i] = len(v) if dim == 0 else np.shape(v)[dim]
            return out
        except IndexError:
            i = next(i for i, v in enumerate(column) if np.ndim(v) <= dim)
            raise ShapeBucketError(
                f"sample {i}: {key!r} has shape {tuple(np.shape(column[i]))} with no seq_dim={dim}"
            ) from None

    def _overflow(
        self, lens: np.ndarray, length_key: Key, seq_keys: list[Key], columns: dict[Key, list[Any]]
    ) -> np.ndarray:
        limit = self._table.max_len
        over = np.flatnonzero(lens > limit)
        if self.overflow == "error":
            i = int(over[0])
            raise ShapeBucketError(
                f"sample {i}: {length_key!r} has length {int(lens[i])} > largest bucket {limit} "
                f"of {self.buckets!r}; add a bucket >= {int(lens[i])}, or pass overflow='truncate' "
                "to cut such samples (counted in collator.stats)"
            )
        keep = slice(None, limit) if self.padding_side == "right" else slice(-limit, None)
        index = (slice(None),) * self.seq_dim + (keep,)
        for k in seq_keys:
            column = columns[k] = list(columns[k])
            for i in over.tolist():
                v = column[i]
                column[i] = v[keep] if isinstance(v, (list, tuple)) else v[index]
        self.stats.truncated_samples += len(over)
        self.stats.truncated_tokens += int((lens[over] - limit).sum())
        return np.minimum(lens, limit)

    def _rows(self, bucket: int, n_real: int) -> int:
        target = self.pad_batch_to
        if target is None:
            return n_real
        rows = int(target if isinstance(target, int) else target[bucket])
        if n_real > rows:
            raise ShapeBucketError(
                f"batch of {n_real} samples is larger than pad_batch_to={rows} for bucket {bucket}; "
                "raise pad_batch_to or make the sampler's batches smaller"
            )
        return rows

    def _pad_key(self, key: Key, column: list[Any], mask: torch.Tensor, rows: int) -> torch.Tensor:
        flat = _concat(key, column, self.seq_dim)
        n_real, bucket = mask.shape
        trailing = tuple(flat.shape[1:])
        pad = self.pad_value(key)
        try:
            out = torch.full((rows, bucket, *trailing), pad, dtype=flat.dtype)
        except (RuntimeError, TypeError) as e:
            raise ShapeBucketError(
                f"pad value {pad!r} for {key!r} does not fit dtype {flat.dtype}: {e}"
            ) from None
        view = out[:n_real] if rows != n_real else out
        view.masked_scatter_(mask.view(n_real, bucket, *([1] * len(trailing))), flat)
        if self.seq_dim:
            out = out.movedim(1, self.seq_dim + 1).contiguous()
        return out

    def _stack_key(self, key: Key, column: list[Any], rows: int) -> Any:
        extra = rows - len(column)
        if all(_is_scalar(v) for v in column):
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
            if extra:
                values = torch.cat(
                    [values, torch.full((extra,), self.pad_value(key), dtype=values.dtype)]
                )
            return values
        return list(column) + [None] * extra


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _columns(samples: Sequence[Any]) -> tuple[str, list[Key], dict[Key, list[Any]]]:
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
                    f"sample {i} is {_short(s)}, but sample 0 is a tuple of {width} fields; every sample "
                    "needs the same structure"
                )
        keys = list(range(width))
        return "tuple", keys, {k: [s[k] for s in samples] for k in keys}
    raise ShapeBucketError(
        f"sample 0 is {type(first).__name__} {_short(first)}; samples must be dicts, tuples of fields, "
        "or sequences (lists, arrays, tensors)"
    )


def _is_bare(sample: Any) -> bool:
    if isinstance(sample, (torch.Tensor, np.ndarray)):
        return sample.ndim >= 1
    return isinstance(sample, (list, tuple)) and all(_is_scalar(v) for v in sample[:8])


def _concat(key: Key, column: list[Any], seq_dim: int) -> torch.Tensor:
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
