"""What the collators share: a table of shapes with its rows and counters
(:class:`TableCollator`, also the base of ``CellCollator``), the one-length settings, the
public steps of collation (:meth:`Collator.read`, :meth:`Collator.sequences`,
:meth:`Collator.stacked`) and the collator protocol (:meth:`TableCollator.shapes`,
:meth:`Collator.repad`), implemented once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, cast

import numpy as np
import torch

from .._validate import check_batch_sizes, check_int, is_int_key
from ..errors import ShapeBucketError
from ..fit.buckets import Buckets, as_buckets
from ..plan.contract import batch_items
from ..plan.protocol import sampler_shapes
from ..plan.shapes import Shape, as_shape
from .counters import CollateReport, SharedCounters
from .engine import Key, Layout
from .reading import Columns, read_columns
from .repad import Rule, repad_batch
from .samples import SCALARS, KeyRoles
from .values import check_pad_fits, concat, stack_column

__all__ = ["Collator", "TableCollator", "check_key_list"]


def check_key_list(name: str, value: Any) -> list[Key] | None:
    """A list of keys (``None`` stays ``None``), refusing a string or an empty list."""
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


class TableCollator:
    """A collator that pads to the entries of a table (bucket lengths, or CellCollator's
    ``(source, target)`` cells): it owns the rows per entry, the counters and the shapes."""

    #: what an entry of the table is called in messages, and how many lengths it has
    _word: ClassVar[str] = "bucket"
    _axes: ClassVar[int] = 1
    #: the settings that name a key the collator adds to a batch
    _ADDS: ClassVar[tuple[str, ...]] = ("mask_key",)
    rows: Any
    _counters: SharedCounters

    @property
    def _table(self) -> Any:
        raise NotImplementedError

    def _start_table(self) -> None:
        """Check ``rows`` against the table and start the counters (from ``__post_init__``)."""
        self.rows = check_batch_sizes(self.rows, self._table)
        self._counters = SharedCounters(tuple(self._table))

    def _check_added_keys(self) -> None:
        """Each key the collator adds (:attr:`_ADDS`) is a str or None, no two alike."""
        named: dict[str, str] = {}
        for name in self._ADDS:
            key = getattr(self, name)
            if key is not None and not isinstance(key, str):
                raise ShapeBucketError(f"{name} must be a str or None, got {key!r}")
            if key in named:
                raise ShapeBucketError(
                    f"{named[key]} and {name} are both {key!r}: the collator adds a value under "
                    "each, so one would replace the other; give them different names (or "
                    f"{name}=None)"
                )
            if key is not None:
                named[key] = name

    def __repr__(self) -> str:
        """The table (the first field, no default) and every setting off its default."""
        shown = []
        for f in fields(cast(Any, self)):  # the collators are dataclasses
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            if f.repr and value != default:
                shown.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def stats(self) -> CollateReport:
        """What this collator (and its DataLoader workers' copies) did so far, as a snapshot."""
        return self._counters.snapshot()

    def reset_stats(self) -> None:
        """Set every counter back to zero (also for the workers of a running DataLoader)."""
        self._counters.reset()

    def rows_for(self, bucket: Any) -> int | None:
        """The rows a batch at ``bucket`` (a cell for ``CellCollator``) is padded to
        (``None``: as many as it has samples).

        >>> from shapebucket import BucketCollator
        >>> BucketCollator([8, 16], rows={8: 4, 16: 2}).rows_for(16)
        2
        """
        target = self.rows
        if target is None or isinstance(target, int):
            return target
        entry = tuple(bucket) if self._axes > 1 and isinstance(bucket, Sequence) else bucket
        if not is_int_key(entry) or entry not in target:  # 8.0 == 8, a list is unhashable
            raise ShapeBucketError(
                f"rows has no entry for {self._word} {bucket!r}; it has {sorted(target)}"
            )
        return cast(int, target[entry])

    def _batch_rows(self, entry: Any, n: int) -> int:
        """The rows of a batch of ``n`` samples at ``entry``, refusing more than ``rows``."""
        rows = self.rows_for(entry)
        if rows is None:
            return n
        if n > rows:
            raise ShapeBucketError(
                f"batch of {n} samples is larger than rows={rows} for {self._word} "
                f"{entry}; raise rows (pass rows=sampler.rows of the sampler that made the "
                "batches) or make the sampler's batches smaller"
            )
        return rows

    def _count(self, *layouts: Layout, cut: tuple[int, int] = (0, 0)) -> None:
        """Count one batch: its layout (a CellCollator's: the source's and the target's)."""
        real = sum(int(x.lengths.sum()) for x in layouts)
        first = layouts[0]
        self._counters.add(
            first.length if len(layouts) == 1 else tuple(x.length for x in layouts),
            num_samples=first.n,
            real_tokens=real,
            padded_tokens=sum(x.rows * x.length for x in layouts) - real,
            pad_rows=first.rows - first.used_rows(),
            truncated_samples=cut[0],
            truncated_tokens=cut[1],
        )

    def shapes(self, sampler: Any = None) -> frozenset[Shape]:
        """Every shape this collator makes for the batches of ``sampler``: with ``rows``,
        ``Shape(rows_for(b), b)`` at each bucket ``b`` the sampler's batches use; without,
        the sampler's own shapes. Without a sampler: every bucket at ``rows_for``.

        >>> from shapebucket import BucketCollator
        >>> sorted(BucketCollator([8, 16], rows=4).shapes())
        [Shape(rows=4, length=8), Shape(rows=4, length=16)]
        """
        table, word, axes = self._table, self._word, self._axes

        def entry(lengths: tuple[int, ...]) -> Any:
            return lengths[0] if axes == 1 else lengths

        if sampler is None:
            if self.rows is None:
                raise ShapeBucketError(
                    f"{type(self).__name__} pads no rows (no rows=), so a batch's row count "
                    "comes from the sampler: pass ShapePlan.of(collator, sampler), give the "
                    "collator rows=, or list the shapes: ShapePlan([(rows, *lengths), ...], "
                    "collator)"
                )
            cells = [(e,) if axes == 1 else tuple(e) for e in table]
            return frozenset(Shape(cast(int, self.rows_for(entry(c))), *c) for c in cells)
        used = sampler_shapes(sampler, self, axes)
        unknown = sorted({entry(s.lengths) for s in used} - set(table))
        if unknown:
            raise ShapeBucketError(
                f"the sampler makes batches at {word}s {unknown}, which the collator ({table!r}) "
                f"does not have (lengths {unknown} are not {word}s of it, so it never pads a "
                f"batch to them); give the sampler and the collator the same {word}s"
            )
        if self.rows is None:
            return used
        out = set()
        for s in used:
            rows = cast(int, self.rows_for(entry(s.lengths)))
            if s.rows > rows:
                raise ShapeBucketError(
                    f"the sampler makes batches of {s.rows} rows at {word} {entry(s.lengths)}, "
                    f"more than the collator's rows={rows} there; pass "
                    f"{type(self).__name__}(rows=sampler.rows)"
                )
            out.add(Shape(rows, *s.lengths))
        return frozenset(out)


@dataclass(repr=False, kw_only=True)
class Collator(TableCollator):
    """The shared settings of the collators (see :class:`~shapebucket.BucketCollator`)."""

    #: whether a row holds several samples (pairs the collator with a sampler that packs)
    packs: ClassVar[bool] = False

    buckets: Buckets | Sequence[int] = field(kw_only=False)
    rows: int | Mapping[int, int] | None = None
    pad_values: Mapping[Any, Any] | None = None
    roles: KeyRoles = field(default_factory=KeyRoles)
    mask_key: str | None = "attention_mask"
    seq_dim: int = 0

    def __post_init__(self) -> None:
        self.buckets = as_buckets(self.buckets)
        if not isinstance(self.roles, KeyRoles):
            raise ShapeBucketError(
                f"roles must be a KeyRoles(length=..., index=..., labels=...), got {self.roles!r}"
            )
        self.seq_dim = check_int("seq_dim", self.seq_dim, minimum=0)
        self._check_added_keys()
        if self.pad_values is not None:
            if not isinstance(self.pad_values, Mapping):
                raise ShapeBucketError(
                    f"pad_values must be a mapping key -> number, got {self.pad_values!r}"
                )
            for k, v in self.pad_values.items():
                if isinstance(v, (torch.Tensor, np.ndarray)) or not isinstance(v, SCALARS):
                    raise ShapeBucketError(f"pad_values[{k!r}] must be a number, got {v!r}")
            self.pad_values = dict(self.pad_values)
        self._start_table()

    @property
    def _table(self) -> Buckets:
        # __post_init__ turns any sequence of ints into Buckets
        return cast(Buckets, self.buckets)

    def pad_value(self, key: Key) -> Any:
        """The pad value used for ``key``: ``pad_values[key]``, else -100 for the label keys
        (``roles.labels``), else 0."""
        if self.pad_values is not None and key in self.pad_values:
            return self.pad_values[key]
        return -100 if key in self.roles.labels else 0

    def _row_mask_key(self) -> str | None:
        """The key of the row mask this collator adds (None: none)."""
        return None

    # -- the collator protocol (shapebucket.plan.ShapedCollator) ---------------------------

    def repad(self, batch: Any, shape: Shape) -> Any:
        """``batch`` (one this collator made) cut or padded to ``shape``: each row keeps the
        places that fit on its padding side, sequences pad with their key's pad value and
        masks with False, rows are added as all-pad rows (per-row values: the key's pad
        value, lists ``None``). Which keys are sequences follows the collator's own rule
        (:meth:`repad_rules`). Every tensor comes back contiguous, as a collated batch is.
        :func:`shapebucket.prewarm` builds its batches with this method.

        >>> from shapebucket import BucketCollator
        >>> from shapebucket.plan import Shape
        >>> collate = BucketCollator([8, 16])
        >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4] * 5}])
        >>> big = collate.repad(batch, Shape(3, 16))
        >>> big["input_ids"].shape, big["attention_mask"].sum(1).tolist()
        (torch.Size([3, 16]), [3, 5, 0])
        """
        shape = as_shape(shape, 1, what="repad shape")
        return repad_batch(batch, shape, self.repad_rules(batch), left=self._left_padded())

    def repad_rules(self, batch: Any) -> dict[Key, Rule]:
        """How :meth:`repad` re-pads each value of ``batch``: the token mask (``[rows,
        length]`` whatever ``seq_dim`` is) and the sequence keys (tensors with a dim past
        ``seq_dim + 1``, limited to ``sequence_keys``) are sequences; other values with one
        entry per row are per-row values; the rest is kept."""
        items = batch_items(batch)
        row_mask: Key | None = self._row_mask_key()
        masks: set[Key]
        if isinstance(batch, Mapping):
            masks = {self.mask_key}
        elif isinstance(batch, torch.Tensor):
            masks, row_mask = set(), None
        else:  # a tuple batch: the fields, the token mask, then the row mask (when made)
            row_mask = len(items) - 1 if row_mask is not None else None
            masks = {len(items) - 1 - int(row_mask is not None)} if self.mask_key else set()
        rules: dict[Key, Rule] = {}
        chosen = self.chosen_sequence_keys()
        for k, v in items:
            if not isinstance(v, torch.Tensor) or k == row_mask:
                continue
            dim = 1 if k in masks and v.ndim == 2 else self.seq_dim + 1
            listed = chosen is None or k in chosen or k in masks
            if v.ndim > dim and listed:
                rules[k] = Rule("sequence", pad=0 if k in masks else self.pad_value(k), dim=dim)
        n = next((int(dict(items)[k].shape[0]) for k in rules), None)
        for k, v in items:
            if k in rules:
                continue
            per_row = isinstance(v, list) or (isinstance(v, torch.Tensor) and v.ndim >= 1)
            if per_row and len(v) == n:
                rules[k] = Rule("row", pad=False if k == row_mask else self.pad_value(k))
            else:
                rules[k] = Rule("keep")
        return rules

    def _left_padded(self) -> bool:
        return False

    def chosen_sequence_keys(self) -> Sequence[Key] | None:
        """The keys named as sequences (``BucketCollator(sequence_keys=...)``); ``None``:
        every value with a length is one (a packed batch packs every key)."""
        return None

    # -- reading -----------------------------------------------------------------------------

    def read(self, samples: Sequence[Any]) -> Columns:
        """The samples as checked columns and each sample's length (the first step of every
        collator: reading, key and length checks, the errors that name a sample).

        >>> from shapebucket import BucketCollator
        >>> BucketCollator([8]).read([{"input_ids": [1, 2]}, {"input_ids": [3]}]).lengths.tolist()
        [2, 1]
        """
        return read_columns(
            samples,
            who=type(self).__name__,
            roles=self.roles,
            seq_dim=self.seq_dim,
            mask_key=self.mask_key,
            row_mask_key=self._row_mask_key(),
            chosen=self.chosen_sequence_keys(),
        )

    def sequences(self, cols: Columns) -> tuple[dict[Key, torch.Tensor], dict[Key, Any]]:
        """Each sequence key's values concatenated along the sequence dim (the engine's
        input), and its pad value (checked to fit the dtype).

        >>> from shapebucket import BucketCollator
        >>> collate = BucketCollator([8])
        >>> values, pads = collate.sequences(collate.read([{"labels": [1, 2]}, {"labels": [3]}]))
        >>> values["labels"].tolist(), pads
        ([1, 2, 3], {'labels': -100})
        """
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

    def stacked(self, cols: Columns, rows: int) -> dict[Key, Any]:
        """The keys that are not padded, each stacked into one value of ``rows`` rows
        (:func:`~.values.stack_column`: extra rows hold the key's pad value)."""
        return {
            k: stack_column(k, cols.columns[k], rows, self.pad_value(k), cols.where)
            for k in cols.keys
            if k not in cols.seq_keys
        }
