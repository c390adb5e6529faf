"""``BucketCollator``: pad each batch's sequence dimension to its bucket length.

The collator is a picklable dataclass meant for ``DataLoader(collate_fn=...)``.
Each key is filled in one pre-allocated tensor: the real tokens of all samples
are concatenated once and scattered through a mask built from the lengths, so
there is no per-sample ``F.pad`` and ``stack``.

Conventions (all documented in ``docs/collate.md``):

* Samples are dicts (output: dict), tuples/lists of fields (output: tuple), or
  bare sequences (output: a tuple ``(padded, mask)``, or the padded tensor alone
  when ``mask_key=None`` and ``rows`` is unset).
* Python ints become int64, Python floats float32, bools bool; numpy arrays and
  tensors keep their dtype.
* ``overflow="truncate"`` keeps the *first* ``max_len`` tokens with right
  padding and the *last* ``max_len`` with left padding (left padding is for
  generation, where the most recent context matters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, cast

import numpy as np
import torch

from .._validate import check_batch_sizes, check_fits_in_memory, check_int
from ..errors import ShapeBucketError
from ..plan.buckets import Buckets, as_buckets
from .counters import CollateReport, SharedCounters
from .device import FlatBatch
from .samples import (
    SCALARS,
    Key,
    Where,
    check_collisions,
    check_pad_fits,
    concat,
    is_sequence,
    namer,
    short,
    signed_view,
    stack_column,
    to_columns,
)

__all__ = ["BucketCollator", "CollateReport"]


def _check_pad_value(key: Key, value: Any) -> None:
    if isinstance(value, (torch.Tensor, np.ndarray)) or not isinstance(value, SCALARS):
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
            (lists, tuples, arrays and tensors with ``ndim >= 1``). Values of
            other keys are stacked: numbers into a ``[B]`` tensor, tensors and
            arrays of one shape into ``[B, *shape]``; anything else (strings,
            objects) stays a list.
        padding_side: ``"right"`` or ``"left"``.
        mask_key: name of the bool mask added (True on real tokens) when the
            samples do not carry it; ``None`` adds none.
        rows: rows per batch: pad a short batch with all-pad rows to
            this many rows (an int, or a mapping ``bucket length -> rows`` such
            as ``BucketBatchSampler.rows``) and add a bool row mask under
            ``sample_mask_key``.
        row_buckets: for inference: pad a batch's rows to the smallest of these
            sizes that holds its samples (serving systems' capture sizes, such as
            ``[1, 2, 4, 8, 16, 32]``), with the row mask; instead of ``rows``.
        sample_mask_key: ``None`` (default) or the key of a bool row mask
            (True on real rows) added to batches that get pad rows. The default
            adds none, so a batch feeds ``model(**batch)`` of a model that takes
            only its own inputs: pad rows are harmless without it (their token
            mask is all False and their ``labels`` are all -100).
        overflow: ``"error"`` or ``"truncate"`` for samples longer than the
            largest bucket.
        seq_dim: the sequence dimension of each sample's value (0 for ``[T, F]``).
        index_key: a key whose value is each sample's dataset index, so errors
            name the dataset index of a bad sample, not only its place in the
            batch; by default ``"idx"`` or ``"index"`` when the samples have one.

    Dtypes are kept exactly: a pad value that does not fit a key's dtype
    (``-100`` in ``uint8``), samples whose dtypes do not promote without loss
    (ids above 2**24 next to floats), and Python ints outside int64 raise a
    :class:`ShapeBucketError`. ``collator.stats`` counts batches, tokens and
    truncation, exactly also with DataLoader workers (see :class:`CollateReport`).

    >>> collate = BucketCollator(buckets=Buckets([8, 16]))
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4] * 9}])
    >>> batch["input_ids"].shape, batch["attention_mask"].sum(1).tolist()
    (torch.Size([2, 16]), [3, 9])
    """

    buckets: Buckets | Sequence[int]
    _: KW_ONLY
    pad_values: Mapping[Any, Any] | None = None
    length_key: Key | None = None
    sequence_keys: Sequence[Key] | None = None
    padding_side: Literal["right", "left"] = "right"
    mask_key: str | None = "attention_mask"
    rows: int | Mapping[int, int] | None = None
    row_buckets: Sequence[int] | None = None
    overflow: Literal["error", "truncate"] = "error"
    seq_dim: int = 0
    sample_mask_key: str | None = None
    index_key: Key | None = None

    def __post_init__(self) -> None:
        self.buckets = as_buckets(self.buckets)
        if self.padding_side not in ("right", "left"):
            raise ShapeBucketError(
                f"padding_side must be 'right' or 'left', got {self.padding_side!r}"
            )
        if self.overflow not in ("error", "truncate"):
            raise ShapeBucketError(f"overflow must be 'error' or 'truncate', got {self.overflow!r}")
        self.seq_dim = check_int("seq_dim", self.seq_dim, minimum=0)
        for name in ("mask_key", "sample_mask_key"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ShapeBucketError(f"{name} must be a str or None, got {value!r}")
        if self.mask_key is not None and self.mask_key == self.sample_mask_key:
            raise ShapeBucketError(
                f"mask_key and sample_mask_key are both {self.mask_key!r}: the row mask would "
                "replace the token mask; give them different names (or sample_mask_key=None)"
            )
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
        self.rows = check_batch_sizes(self.rows, self._table)
        if self.row_buckets is not None:
            if self.rows is not None:
                raise ShapeBucketError(
                    "pass rows (rows per bucket, training) or batch_buckets (row counts to "
                    "pad to, inference), not both"
                )
            if isinstance(self.row_buckets, (str, bytes)) or not isinstance(
                self.row_buckets, Sequence
            ):
                raise ShapeBucketError(
                    f"row_buckets must be a list of ints >= 1, got {self.row_buckets!r}"
                )
            sizes = [
                check_int(f"row_buckets[{i}]", v, minimum=1) for i, v in enumerate(self.row_buckets)
            ]
            if not sizes:
                raise ShapeBucketError("row_buckets must hold at least one size, got []")
            self.row_buckets = sorted(set(sizes))
        self._counters = SharedCounters(tuple(self._table))

    @property
    def stats(self) -> CollateReport:
        """What this collator (and its DataLoader workers' copies) did so far, as a snapshot."""
        return self._counters.snapshot()

    def reset_stats(self) -> None:
        """Set every counter back to zero (also for the workers of a running DataLoader)."""
        self._counters.reset()

    @property
    def _table(self) -> Buckets:
        # __post_init__ turns any sequence of ints into Buckets
        return cast(Buckets, self.buckets)

    def rows_for(self, bucket: int) -> int | None:
        """The rows a batch at ``bucket`` is padded to (``None``: as many as it has samples).

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

    def __repr__(self) -> str:
        settings = [
            f"buckets={self.buckets!r}",
            f"padding_side={self.padding_side!r}",
            f"mask_key={self.mask_key!r}",
            f"overflow={self.overflow!r}",
        ]
        if self.sample_mask_key is not None:
            settings.append(f"sample_mask_key={self.sample_mask_key!r}")
        for name in ("pad_values", "length_key", "sequence_keys", "rows", "row_buckets"):
            value = getattr(self, name)
            if value is not None:
                settings.append(f"{name}={value!r}")
        if self.seq_dim:
            settings.append(f"seq_dim={self.seq_dim}")
        if self.index_key is not None:
            settings.append(f"index_key={self.index_key!r}")
        return f"BucketCollator({', '.join(settings)})"

    # -- collation -------------------------------------------------------------

    def pad_value(self, key: Key) -> Any:
        """The pad value used for ``key``."""
        if self.pad_values is not None and key in self.pad_values:
            return self.pad_values[key]
        return -100 if key == "labels" else 0

    def __call__(self, samples: Sequence[Any]) -> Any:
        kind, keys, seq_keys, columns, lens, where, bucket, rows, cut = self._layout(samples)
        n_real = len(samples)
        cut_samples, cut_tokens = cut

        check_fits_in_memory(rows, bucket, len(seq_keys), self.buckets)
        try:
            out = self._fill(kind, keys, seq_keys, columns, lens, bucket, rows, where)
        except RuntimeError as e:
            if "alloc" not in str(e).lower() and "memory" not in str(e).lower():
                raise
            raise ShapeBucketError(
                f"a batch of {rows} rows at bucket {bucket} could not be allocated ({e}); "
                f"check the bucket table {self.buckets!r} and the batch size"
            ) from None

        real = int(lens.sum())
        # the order of _COUNTERS
        counts = (1, n_real, real, rows * bucket - real, rows - n_real, cut_samples, cut_tokens)
        self._counters.add(counts, bucket)

        if kind == "dict":
            return out
        result = tuple(out.values())
        if kind == "bare" and len(result) == 1:
            return result[0]
        return result

    def _layout(self, samples: Sequence[Any]) -> tuple[Any, ...]:
        """Read and check the samples, truncate (``overflow="truncate"``), and choose the
        bucket and the rows: everything but the padding."""
        kind, keys, seq_keys, columns, lens, length_key, where = self._read(samples)
        n_real = len(samples)
        longest = int(lens.max())
        cut_samples = cut_tokens = 0
        if longest > self._table.max_len:
            lens, cut_samples, cut_tokens = self._overflow(
                lens, length_key, seq_keys, columns, where
            )
            longest = self._table.max_len
        bucket = self._table.bucket_for(longest)
        rows = self._rows(bucket, n_real)
        return kind, keys, seq_keys, columns, lens, where, bucket, rows, (cut_samples, cut_tokens)

    def flat(self, samples: Sequence[Any]) -> FlatBatch:
        """The batch before padding, for device-side padding: each sequence key's values
        concatenated, the lengths, the bucket and the rows (:class:`~shapebucket.FlatBatch`;
        its ``finish()`` returns what this collator returns for ``samples``). Dict samples
        only. Counted in ``stats`` as a collated batch.

        >>> collate = BucketCollator([4, 8], rows=3)
        >>> flat = collate.flat([{"input_ids": [1, 2]}, {"input_ids": [3, 4, 5, 6, 7]}])
        >>> flat.bucket, flat.rows, flat.finish()["input_ids"].shape
        (8, 3, torch.Size([3, 8]))
        """
        kind, keys, seq_keys, columns, lens, where, bucket, rows, cut = self._layout(samples)
        if kind != "dict":
            raise ShapeBucketError(
                f"BucketCollator.flat needs dict samples, got {type(samples[0]).__name__}; "
                "call the collator itself for tuples and bare sequences"
            )
        values: dict[Key, torch.Tensor] = {}
        pads: dict[Key, Any] = {}
        stacked: dict[Key, Any] = {}
        for k in keys:
            if k in seq_keys:
                values[k] = concat(k, columns[k], self.seq_dim, where)
                pads[k] = self.pad_value(k)
                check_pad_fits(k, pads[k], values[k].dtype)
            else:
                stacked[k] = stack_column(k, columns[k], rows, self.pad_value(k), where)
        n_real = len(samples)
        real = int(lens.sum())
        counts = (1, n_real, real, rows * bucket - real, rows - n_real, *cut)
        self._counters.add(counts, bucket)
        return FlatBatch(
            values=values,
            lengths=torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int64)),
            bucket=bucket,
            rows=rows,
            pads=pads,
            padding_side=self.padding_side,
            seq_dim=self.seq_dim,
            stacked=stacked,
            keys=list(keys),
            mask_key=self.mask_key,
            sample_mask_key=self.sample_mask_key if self._pads_rows else None,
        )

    def _read(
        self, samples: Sequence[Any]
    ) -> tuple[str, list[Key], list[Key], dict[Key, list[Any]], np.ndarray, Key, Where]:
        """The samples as columns, checked: ``(kind, keys, sequence keys, columns, lengths,
        length key, how errors name a sample)``."""
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
            sample_mask_key=self.sample_mask_key if self._pads_rows else None,
        )
        length_key = self.length_key if self.length_key is not None else seq_keys[0]
        if length_key not in seq_keys:
            raise ShapeBucketError(
                f"length_key {length_key!r} is not a sequence key; sequence keys are {seq_keys}"
            )

        lengths = {k: self._lengths(k, columns[k], where) for k in seq_keys}
        lens = lengths[length_key]
        for k in seq_keys:
            if k != length_key and not np.array_equal(lengths[k], lens):
                i = int(np.argmax(lengths[k] != lens))
                fixed = [
                    key
                    for key in seq_keys
                    if len({tuple(np.shape(v)) for v in columns[key]}) == 1 and len(samples) > 1
                ]
                hint = "pass sequence_keys=[...] to pad only some keys"
                if fixed and len(fixed) < len(seq_keys):
                    rest = [key for key in seq_keys if key not in fixed]
                    hint = (
                        f"{fixed} have one shape in every sample: if they are not sequences "
                        f"(an image, fixed features), pass sequence_keys={rest} and they are "
                        "stacked instead"
                    )
                raise ShapeBucketError(
                    f"{where(i)}: sequence keys disagree in length: {length_key!r} has {int(lens[i])}, "
                    f"{k!r} has {int(lengths[k][i])}; {hint}"
                )
        return kind, keys, seq_keys, columns, lens, length_key, where

    def repad(self, batch: Any, bucket: int, rows: int | None = None) -> Any:
        """Re-pad a batch this collator made to ``bucket``, with ``rows`` rows: the batch
        the collator would have made had its samples been collated at that bucket.

        Sequence values are cut or padded along the sequence dim (``seq_dim + 1``
        of the batch) on the padding side, with each key's pad value; masks get
        ``False``. ``rows`` defaults to :meth:`rows_for` (``rows``), else
        the batch's own row count; added rows are all-pad rows (masks ``False``,
        stacked values the key's pad value, lists ``None``). Which keys are
        sequences follows the collator's own rule, so values it did not pad
        (``[B]`` scalars, stacked ``[B, F]`` features of keys outside
        ``sequence_keys``) keep their shape. Every tensor comes back
        contiguous, as a collated batch is (the compiler guards on strides).
        :func:`shapebucket.prewarm` builds its batches with this method.

        >>> collate = BucketCollator([8, 16])
        >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4] * 5}])
        >>> big = collate.repad(batch, 16, rows=3)
        >>> big["input_ids"].shape, big["attention_mask"].sum(1).tolist()
        (torch.Size([3, 16]), [3, 5, 0])
        """
        bucket = check_int("bucket", bucket, minimum=1)
        masks: set[Key]
        sample_mask: Key | None
        if isinstance(batch, Mapping):
            items = list(batch.items())
            masks = {self.mask_key}
            sample_mask = self.sample_mask_key
        elif isinstance(batch, (tuple, list)):
            items = list(enumerate(batch))
            # a tuple batch is the fields, then the token mask, then the row mask (when made)
            has_rows = self._pads_rows and self.sample_mask_key is not None
            has_mask = self.mask_key is not None
            masks = {len(items) - 1 - int(has_rows)} if has_mask else set()
            sample_mask = len(items) - 1 if has_rows else None
        elif isinstance(batch, torch.Tensor):
            items, masks, sample_mask = [(0, batch)], set(), None
        else:
            raise ShapeBucketError(
                f"repad needs a batch this collator made (a dict, a tuple or a tensor), got {type(batch).__name__}"
            )

        def seq_dim_of(key: Key, value: torch.Tensor) -> int:
            # the token mask the collator adds is [rows, bucket] whatever seq_dim is
            return 1 if key in masks and value.ndim == 2 else self.seq_dim + 1

        def is_seq(key: Key, value: Any) -> bool:
            if not isinstance(value, torch.Tensor) or key == sample_mask:
                return False
            if value.ndim <= seq_dim_of(key, value):
                return False
            return self.sequence_keys is None or key in self.sequence_keys or key in masks

        seq = [(k, v, seq_dim_of(k, v)) for k, v in items if is_seq(k, v)]
        if not seq:
            raise ShapeBucketError(
                f"repad found no sequence tensor (ndim > {self.seq_dim + 1}) in the batch "
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
        if rows is None:
            rows = self.rows_for(bucket) if self.rows is not None else n
            if self.row_buckets is not None:
                rows = self._batch_bucket(n)
        rows = check_int("rows", rows, minimum=1)
        check_fits_in_memory(rows, bucket, len(seq), self.buckets)
        keep_rows, keep = min(n, rows), min(length, bucket)
        src = slice(0, keep) if self.padding_side == "right" else slice(length - keep, length)
        dst = slice(0, keep) if self.padding_side == "right" else slice(bucket - keep, bucket)
        seq_dims = {k: d for k, _, d in seq}
        out: list[tuple[Key, Any]] = []
        for k, v in items:
            if k in seq_dims:
                d = seq_dims[k]
                pad = 0 if k in masks else self.pad_value(k)
                shape = (rows, *v.shape[1:d], bucket, *v.shape[d + 1 :])
                new = torch.full(shape, pad, dtype=v.dtype, device=v.device)
                lead = (slice(0, keep_rows),) + (slice(None),) * (d - 1)
                to, frm = (*lead, dst), (*lead, src)
                new[to] = v[frm]
                out.append((k, new))
            elif isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == n:
                pad = False if k == sample_mask else self.pad_value(k)
                new = torch.full((rows, *v.shape[1:]), pad, dtype=v.dtype, device=v.device)
                new[:keep_rows] = v[:keep_rows]
                out.append((k, new))
            elif isinstance(v, list) and len(v) == n:
                out.append((k, v[:keep_rows] + [None] * (rows - keep_rows)))
            else:
                out.append((k, v))
        if isinstance(batch, Mapping):
            return dict(out)
        if isinstance(batch, torch.Tensor):
            return out[0][1]
        return type(batch)(v for _, v in out)

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

    def _lengths(self, key: Key, column: list[Any], where: Where) -> np.ndarray:
        dim = self.seq_dim
        try:
            if dim == 0 and all(type(v) is list for v in column):
                return np.fromiter(map(len, column), dtype=np.int64, count=len(column))
            out = np.empty(len(column), dtype=np.int64)
            for i, v in enumerate(column):
                if not is_sequence(v):
                    raise ShapeBucketError(
                        f"{where(i)}: {key!r} is a sequence key but holds {type(v).__name__} {short(v)}; "
                        "pass sequence_keys=[...] to name the keys to pad"
                    )
                out[i] = len(v) if dim == 0 else np.shape(v)[dim]
            return out
        except IndexError:
            i = next(i for i, v in enumerate(column) if np.ndim(v) <= dim)
            raise ShapeBucketError(
                f"{where(i)}: {key!r} has shape {tuple(np.shape(column[i]))} with no seq_dim={dim}"
            ) from None

    def _overflow(
        self,
        lens: np.ndarray,
        length_key: Key,
        seq_keys: list[Key],
        columns: dict[Key, list[Any]],
        where: Where,
    ) -> tuple[np.ndarray, int, int]:
        """Lengths after truncation, and how many samples and tokens were cut."""
        limit = self._table.max_len
        over = np.flatnonzero(lens > limit)
        if self.overflow == "error":
            i = int(over[0])
            raise ShapeBucketError(
                f"{where(i)}: {length_key!r} has length {int(lens[i])} > largest bucket {limit} "
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
        return np.minimum(lens, limit), len(over), int((lens[over] - limit).sum())

    @property
    def _pads_rows(self) -> bool:
        """Whether batches get pad rows (and the row mask)."""
        return self.rows is not None or self.row_buckets is not None

    def _batch_bucket(self, n: int) -> int:
        sizes = cast(list, self.row_buckets)
        for size in sizes:
            if size >= n:
                return int(size)
        raise ShapeBucketError(
            f"batch of {n} samples is larger than the largest batch bucket {sizes[-1]} "
            f"(row_buckets={sizes}); add a larger size or split the request batch"
        )

    def _rows(self, bucket: int, n_real: int) -> int:
        if self.row_buckets is not None:
            return self._batch_bucket(n_real)
        rows = self.rows_for(bucket)
        if rows is None:
            return n_real
        if n_real > rows:
            raise ShapeBucketError(
                f"batch of {n_real} samples is larger than rows={rows} for bucket {bucket}; "
                "raise rows or make the sampler's batches smaller"
            )
        return rows

    def _fill(
        self,
        kind: str,
        keys: list[Key],
        seq_keys: list[Key],
        columns: dict[Key, list[Any]],
        lens: np.ndarray,
        bucket: int,
        rows: int,
        where: Where,
    ) -> dict[Key, Any]:
        """The batch's values: every key padded or stacked, plus the masks."""
        n_real = len(lens)
        positions = torch.arange(bucket)
        lens_t = torch.from_numpy(lens)
        if self.padding_side == "right":
            mask = positions[None, :] < lens_t[:, None]
        else:
            mask = positions[None, :] >= (bucket - lens_t)[:, None]

        out: dict[Key, Any] = {}
        for k in keys:
            if k in seq_keys:
                out[k] = self._pad_key(k, columns[k], mask, rows, where)
            else:
                out[k] = stack_column(k, columns[k], rows, self.pad_value(k), where)
        if self.mask_key is not None and self.mask_key not in keys:
            full = torch.zeros(rows, bucket, dtype=torch.bool)
            full[:n_real] = mask
            out[self.mask_key] = full
        if self._pads_rows and self.sample_mask_key is not None:
            sample_mask = torch.zeros(rows, dtype=torch.bool)
            sample_mask[:n_real] = True
            out[self.sample_mask_key] = sample_mask
        return out

    def _pad_key(
        self, key: Key, column: list[Any], mask: torch.Tensor, rows: int, where: Where
    ) -> torch.Tensor:
        flat = concat(key, column, self.seq_dim, where)
        n_real, bucket = mask.shape
        trailing = tuple(flat.shape[1:])
        pad = self.pad_value(key)
        check_pad_fits(key, pad, flat.dtype)
        out = torch.full((rows, bucket, *trailing), pad, dtype=flat.dtype)
        view = out[:n_real] if rows != n_real else out
        signed_view(view).masked_scatter_(
            mask.view(n_real, bucket, *([1] * len(trailing))), signed_view(flat)
        )
        if self.seq_dim:
            out = out.movedim(1, self.seq_dim + 1).contiguous()
        return out
