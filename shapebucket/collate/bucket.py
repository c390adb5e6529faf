"""``BucketCollator``: pad each batch's sequence dimension to its bucket length (the
conventions are in ``docs/collate.md``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from .._memory import check_fits_in_memory
from .._validate import check_row_buckets
from ..errors import ShapeBucketError
from ..plan.shapes import Shape
from .base import Collator, check_key_list
from .device import FlatBatch
from .engine import Key, Layout
from .reading import Columns

__all__ = ["BucketCollator"]


@dataclass(repr=False, kw_only=True)
class BucketCollator(Collator):
    """Collate variable-length samples into a batch padded to its bucket length.

    Args:
        buckets: the bucket lengths (:class:`Buckets` or a sorted list of ints).
        pad_values: pad value per key (tuple samples: per position). Defaults:
            the label keys (``roles.labels``, ``labels``) -> -100, everything else 0.
        roles: which key is the sample's length, its dataset index and its labels
            (:class:`~shapebucket.collate.KeyRoles`; by default the first
            sequence key, ``idx``/``index``, and ``labels``). Errors name the
            dataset index of a bad sample, not only its place in the batch.
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
            ``sample_mask_key``. For inference, :meth:`with_row_buckets` pads a
            batch's rows to the smallest of a few sizes instead.
        sample_mask_key: ``None`` (default) or the key of a bool row mask
            (True on real rows) added to batches that get pad rows. The default
            adds none, so a batch feeds ``model(**batch)`` of a model that takes
            only its own inputs: pad rows are harmless without it (their token
            mask is all False and their ``labels`` are all -100).
        overflow: ``"error"`` or ``"truncate"`` for samples longer than the
            largest bucket.
        seq_dim: the sequence dimension of each sample's value (0 for ``[T, F]``).

    Dtypes are kept exactly: a pad value that does not fit a key's dtype
    (``-100`` in ``uint8``), samples whose dtypes do not promote without loss
    (ids above 2**24 next to floats), and Python ints outside int64 raise a
    :class:`ShapeBucketError`. ``collator.stats`` counts batches, tokens and
    truncation, exactly also with DataLoader workers (see :class:`~shapebucket.collate.counters.CollateReport`).

    >>> collate = BucketCollator(buckets=[8, 16])
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4] * 9}])
    >>> batch["input_ids"].shape, batch["attention_mask"].sum(1).tolist()
    (torch.Size([2, 16]), [3, 9])
    """

    sequence_keys: Sequence[Key] | None = None
    padding_side: Literal["right", "left"] = "right"
    overflow: Literal["error", "truncate"] = "error"
    sample_mask_key: str | None = None
    row_buckets: list[int] | None = field(default=None, init=False)
    _ADDS = ("mask_key", "sample_mask_key")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.sequence_keys = check_key_list("sequence_keys", self.sequence_keys)
        if self.padding_side not in ("right", "left"):
            raise ShapeBucketError(
                f"padding_side must be 'right' or 'left', got {self.padding_side!r}"
            )
        if self.overflow not in ("error", "truncate"):
            raise ShapeBucketError(f"overflow must be 'error' or 'truncate', got {self.overflow!r}")

    @classmethod
    def with_row_buckets(
        cls, buckets: Any, row_buckets: Sequence[int], **options: Any
    ) -> BucketCollator:
        """A collator for inference: each batch's rows are padded to the smallest of
        ``row_buckets`` that holds its samples (serving systems' capture sizes, such as
        ``[1, 2, 4, 8, 16, 32]``), so a request batch of any size has one of
        ``len(buckets) * len(row_buckets)`` shapes. ``options`` are the other settings
        (not ``rows``).

        >>> collate = BucketCollator.with_row_buckets([8, 16], [1, 4])
        >>> collate([{"input_ids": [1, 2]}] * 3)["input_ids"].shape
        torch.Size([4, 8])
        """
        if options.get("rows") is not None:
            raise ShapeBucketError(
                "pass rows (rows per bucket, training: BucketCollator(buckets, rows=...)) or "
                "row_buckets (row counts to pad to, inference: with_row_buckets), not both"
            )
        sizes = check_row_buckets(row_buckets)
        collator = cls(buckets, **options)
        collator.row_buckets = sizes
        return collator

    def _row_mask_key(self) -> str | None:
        pads_rows = self.rows is not None or self.row_buckets is not None
        return self.sample_mask_key if pads_rows else None

    # -- collation -------------------------------------------------------------

    def __call__(self, samples: Sequence[Any]) -> Any:
        cols, layout, cut = self._layout(samples)
        try:  # the host path is the device path's own finish(), on the CPU
            out = self._flat(cols, layout).finish()
        except RuntimeError as e:
            if "alloc" not in str(e).lower() and "memory" not in str(e).lower():
                raise
            raise ShapeBucketError(
                f"a batch of {layout.rows} rows at bucket {layout.length} could not be allocated "
                f"({e}); check the bucket table {self.buckets!r} and the batch size"
            ) from None
        self._count(layout, cut=cut)
        if cols.kind == "dict":
            return out
        result = tuple(out.values())
        if cols.kind == "bare" and len(result) == 1:
            return result[0]
        return result

    def flat(self, samples: Sequence[Any]) -> FlatBatch:
        """The batch before padding, for device-side padding: each sequence key's values
        concatenated, the lengths, the bucket and the rows (:class:`~shapebucket.collate.device.FlatBatch`;
        its ``finish()`` returns what this collator returns for ``samples``). Dict samples
        only. Counted in ``stats`` as a collated batch.

        >>> collate = BucketCollator([4, 8], rows=3)
        >>> flat = collate.flat([{"input_ids": [1, 2]}, {"input_ids": [3, 4, 5, 6, 7]}])
        >>> flat.bucket, flat.rows, flat.finish()["input_ids"].shape
        (8, 3, torch.Size([3, 8]))
        """
        cols, layout, cut = self._layout(samples)
        if cols.kind != "dict":
            raise ShapeBucketError(
                f"BucketCollator.flat needs dict samples, got {type(samples[0]).__name__}; "
                "call the collator itself for tuples and bare sequences"
            )
        self._count(layout, cut=cut)
        return self._flat(cols, layout)

    def _flat(self, cols: Columns, layout: Layout) -> FlatBatch:
        values, pads = self.sequences(cols)
        stacked = self.stacked(cols, layout.rows)
        return FlatBatch(
            values=values,
            lengths=layout.lengths,
            bucket=layout.length,
            rows=layout.rows,
            pads=pads,
            padding_side=self.padding_side,
            seq_dim=self.seq_dim,
            stacked=stacked,
            keys=list(cols.keys),
            mask_key=self.mask_key,
            sample_mask_key=self._row_mask_key(),
        )

    def _layout(self, samples: Sequence[Any]) -> tuple[Columns, Layout, tuple[int, int]]:
        """Read and check the samples, truncate (``overflow="truncate"``), choose the bucket
        and the rows: the layout, and how many samples and tokens were cut."""
        cols = self.read(samples)
        lens, cut = cols.lengths, (0, 0)
        if int(lens.max()) > self._table.max_len:
            lens, cut = self._overflow(cols)
        bucket = self._table.bucket_for(int(lens.max()))
        rows = self._rows(bucket, len(lens))
        check_fits_in_memory(rows, bucket, len(cols.seq_keys), self.buckets)
        layout = Layout(
            torch.from_numpy(lens),
            rows=rows,
            length=bucket,
            left=self.padding_side == "left",
            seq_dim=self.seq_dim,
        )
        return cols, layout, cut

    def shapes(self, sampler: Any = None) -> frozenset[Shape]:
        """Every shape this collator makes for the batches of ``sampler``: the sampler's
        shapes; with ``rows``, each bucket used at ``rows_for(bucket)``; with
        ``row_buckets``, each bucket used at every row bucket. Without a sampler every
        bucket (at ``rows_for`` or every row bucket).

        >>> sorted(BucketCollator.with_row_buckets([8, 16], [1, 4]).shapes())[:2]
        [Shape(rows=1, length=8), Shape(rows=1, length=16)]
        """
        if self.row_buckets is None:
            return super().shapes(sampler)
        sizes = self.row_buckets
        if sampler is None:
            return frozenset(Shape(r, b) for b in self._table for r in sizes)
        used = super().shapes(sampler)  # no rows=: the sampler's shapes, checked
        for s in used:
            if s.rows > sizes[-1]:
                raise ShapeBucketError(
                    f"the sampler makes batches of {s.rows} rows (at bucket {s.length}), more "
                    f"than the collator's largest row bucket {sizes[-1]} (row_buckets={sizes}); "
                    "every such batch would fail to collate: add a larger row bucket or make "
                    "the batches smaller"
                )
        return frozenset(Shape(r, s.length) for s in used for r in sizes)

    def _left_padded(self) -> bool:
        return self.padding_side == "left"

    def chosen_sequence_keys(self) -> Sequence[Key] | None:
        """``sequence_keys``: the keys to pad (``None``: every value with a length)."""
        return self.sequence_keys

    def _overflow(self, cols: Columns) -> tuple[np.ndarray, tuple[int, int]]:
        """Lengths after truncation (the columns are cut in place), and how many samples
        and tokens were cut."""
        limit, lens = self._table.max_len, cols.lengths
        over = np.flatnonzero(lens > limit)
        if self.overflow == "error":
            i = int(over[0])
            raise ShapeBucketError(
                f"{cols.where(i)}: {cols.length_key!r} has length {int(lens[i])} > largest bucket "
                f"{limit} of {self.buckets!r}; add a bucket >= {int(lens[i])}, or pass "
                "overflow='truncate' to cut such samples (counted in collator.stats)"
            )
        keep = slice(None, limit) if self.padding_side == "right" else slice(-limit, None)
        for k in cols.seq_keys:
            column = cols.columns[k] = list(cols.columns[k])
            for i in over.tolist():
                column[i] = _cut(column[i], keep, self.seq_dim)
        return np.minimum(lens, limit), (len(over), int((lens[over] - limit).sum()))

    def _rows(self, bucket: int, n_real: int) -> int:
        if self.row_buckets is not None:
            sizes = self.row_buckets
            if n_real > sizes[-1]:
                raise ShapeBucketError(
                    f"batch of {n_real} samples is larger than the largest batch bucket "
                    f"{sizes[-1]} (row_buckets={sizes}); add a larger size or split the request "
                    "batch"
                )
            return next(size for size in sizes if size >= n_real)
        return self._batch_rows(bucket, n_real)


def _cut(value: Any, keep: slice, seq_dim: int) -> Any:
    """``value`` cut to ``keep`` along ``seq_dim``, whether it is an array, a tensor, or
    lists/tuples nested any way (arrays inside lists included): lists and arrays agree."""
    if isinstance(value, (list, tuple)):
        if seq_dim == 0:
            return value[keep]
        return [_cut(v, keep, seq_dim - 1) for v in value]
    return value[(slice(None),) * seq_dim + (keep,)]
