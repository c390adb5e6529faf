"""``CellCollator``: pad each key of an encoder-decoder batch to its own length.

Each side (source, target) is read and padded by a :class:`~shapebucket.BucketCollator`
of its own, through its public steps; this module splits the samples into their sides,
chooses the cell (``Shape(rows, source, target)``) and joins the halves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np
import torch

from ..errors import ShapeBucketError
from ..fit.cells import Cells
from ..plan.shapes import Shape, as_shape
from .base import TableCollator
from .bucket import BucketCollator
from .engine import Key, Layout, assemble
from .reading import Columns
from .repad import repad_batch
from .samples import KeyRoles, index_key_of

__all__ = ["DEFAULT_TARGET_KEYS", "CellCollator"]

#: The keys padded to the target length unless ``target_keys=`` says otherwise.
DEFAULT_TARGET_KEYS = ("labels", "decoder_input_ids", "decoder_attention_mask")

Cell = tuple[int, int]


@dataclass(repr=False)
class CellCollator(TableCollator):
    """Collate dict samples into a batch padded to their ``(source, target)`` cell.

    Args:
        cells: the cells (:class:`~shapebucket.fit.cells.Cells` or ``(S, T)`` pairs).
        rows: pad a short batch with all-pad rows: an int, or ``{(S, T): rows}``
            such as :attr:`CellBatchSampler.rows <shapebucket.sampling.CellBatchSampler.rows>`.
        target_keys: the keys padded to the target length (those the samples have);
            every other sequence key is padded to the source length.
        pad_values: pad value per key (default: ``labels`` -100, else 0).
        mask_key: the source token mask added (``None``: none).
        target_mask_key: a target token mask to add (default ``None``: a decoder is
            causal, so right padding never reaches a real token, and ``labels`` pad
            with -100). It may be one of ``target_keys``
            (``"decoder_attention_mask"``, Hugging Face's name): a mask the samples
            carry under it is padded with False, else the collator makes it.
        roles: the source's length key, the samples' index key (for error
            messages) and the label keys (:class:`~shapebucket.collate.KeyRoles`).
        sequence_keys: the source keys to pad (default: every source value with a
            length); other source values are stacked, as in ``BucketCollator``.
        seq_dim: the sequence dim of each source value (1 for audio features
            ``[n_mels, frames]``); target values are ``[T]``.

    The batch's cell is the cell of its longest source and longest target (the
    edge rule of :class:`~shapebucket.fit.cells.Cells`, with its ``weights``;
    batches of a :class:`~shapebucket.sampling.CellBatchSampler` with the same
    cells, weights included, land in their own cell: :meth:`shapes` refuses a
    sampler whose cells differ).

    ``collator.stats`` counts source plus target tokens, batches per cell
    (:class:`~shapebucket.collate.counters.CollateReport`); nothing is truncated.

    >>> collate = CellCollator([(8, 4), (16, 8)])
    >>> batch = collate([{"input_ids": [1] * 10, "labels": [2, 3]}, {"input_ids": [4], "labels": [5]}])
    >>> batch["input_ids"].shape, batch["labels"].shape, batch["labels"][1].tolist()
    (torch.Size([2, 16]), torch.Size([2, 8]), [5, -100, -100, -100, -100, -100, -100, -100])
    >>> collate.stats.real_tokens, collate.stats.padded_tokens, collate.stats.batches_per_bucket
    (14, 34, {(16, 8): 1})
    """

    cells: Cells | Sequence[Cell]
    rows: int | Mapping[Cell, int] | None = None
    target_keys: Sequence[Key] = DEFAULT_TARGET_KEYS
    pad_values: Mapping[Any, Any] | None = None
    mask_key: str | None = "attention_mask"
    target_mask_key: str | None = None
    roles: KeyRoles = field(default_factory=KeyRoles)
    sequence_keys: Sequence[Key] | None = None
    seq_dim: int = 0
    packs = False  # the collator protocol: one sample per row
    _word = "cell"  # a table of (source, target) cells
    _axes = 2
    _ADDS = ("mask_key", "target_mask_key")
    _source: BucketCollator = field(init=False, repr=False)
    _target: BucketCollator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.cells = self.cells if isinstance(self.cells, Cells) else Cells(self.cells)
        if isinstance(self.target_keys, (str, bytes)) or not isinstance(self.target_keys, Sequence):
            raise ShapeBucketError(f"target_keys must be a list of keys, got {self.target_keys!r}")
        self.target_keys = tuple(self.target_keys)
        self._check_added_keys()
        for name in ("mask_key", "target_mask_key"):
            key = getattr(self, name)
            # a target key may be the target mask (Hugging Face's decoder_attention_mask:
            # the samples' own is padded, else one is made), never a value such as labels
            allowed = name == "target_mask_key" and key not in self.roles.labels
            if key is not None and key in self.target_keys and not allowed:
                raise ShapeBucketError(
                    f"{name}={key!r} is one of the target keys {list(self.target_keys)}: the "
                    "batch would hold the mask or the values under it, not both; name the mask "
                    "differently"
                )
        self._start_table()
        pads = self.pad_values
        self._source = BucketCollator(
            sorted({s for s, _ in self.cells}),
            mask_key=self.mask_key,
            pad_values=pads,
            roles=self.roles,
            sequence_keys=self.sequence_keys,
            seq_dim=self.seq_dim,
        )
        self.seq_dim = self._source.seq_dim  # checked
        self._target = BucketCollator(
            sorted({t for _, t in self.cells}),
            mask_key=self.target_mask_key,
            pad_values=pads,
            roles=KeyRoles(index=self.roles.index, labels=self.roles.labels),
        )

    @property
    def _table(self) -> Cells:
        return self.cells  # type: ignore[return-value]

    # -- collation ---------------------------------------------------------------------------

    def __call__(self, samples: Sequence[Any]) -> dict[Key, Any]:
        src_samples, tgt_samples = _split_sides(samples, self.target_keys, self.roles.index)
        src = self._source.read(src_samples)
        tgt = self._target.read(tgt_samples)
        cell = _batch_cell(self._table, src, tgt)
        rows = self._batch_rows(cell, len(src.lengths))
        out, src_layout = self._side(self._source, src, rows, cell[0])
        target, tgt_layout = self._side(self._target, tgt, rows, cell[1])
        if self.target_mask_key is not None and self.target_mask_key in out:
            raise ShapeBucketError(
                f"target_mask_key={self.target_mask_key!r} is also a source key of the samples "
                f"(batch keys {list(out)}): the target mask would be dropped; name it differently"
            )
        out.update((k, v) for k, v in target.items() if k not in out)
        self._count(src_layout, tgt_layout)
        return out

    @staticmethod
    def _side(c: BucketCollator, cols: Columns, rows: int, length: int) -> tuple[dict, Layout]:
        lengths = torch.from_numpy(np.ascontiguousarray(cols.lengths))
        layout = Layout(lengths, rows=rows, length=length, seq_dim=c.seq_dim)
        values, pads = c.sequences(cols)
        out = assemble(cols.keys, values, pads, c.stacked(cols, rows), layout, mask_key=c.mask_key)
        return out, layout

    # -- the collator protocol (shapebucket.plan.ShapedCollator) ---------------------------

    def shapes(self, sampler: Any = None) -> frozenset[Shape]:
        """Every ``Shape(rows, source, target)`` this collator makes for the batches of a
        :class:`~shapebucket.sampling.CellBatchSampler`: the sampler's cells at its rows,
        or at ``rows_for(cell)`` when the collator pads rows. Without a sampler (only with
        ``rows``): every cell. A sampler whose cells or weights differ is refused: the
        collator's edge rule would put its batches in other cells.

        >>> sorted(CellCollator([(8, 4), (16, 8)], rows=2).shapes())
        [Shape(rows=2, lengths=(8, 4)), Shape(rows=2, lengths=(16, 8))]
        """
        table = self._table
        theirs = getattr(sampler, "cells", None)
        if isinstance(theirs, Cells) and theirs != table:
            what = (
                f"weighs rows as weights={theirs.weights}, the collator's as "
                f"weights={table.weights}"
                if theirs.cells == table.cells
                else f"are {theirs!r}, the collator's {table!r}"
            )
            raise ShapeBucketError(
                f"the sampler's cells {what}: the collator's edge rule would put a batch in "
                "another cell than the sampler planned (a shape the plan lacks); build both "
                "from one table: CellCollator(sampler.cells, rows=sampler.rows)"
            )
        return super().shapes(sampler)

    def repad(self, batch: Any, shape: Shape) -> dict[Key, Any]:
        """Re-pad a batch this collator made to ``shape`` (``Shape(rows, source, target)``
        of a cell): source keys to the source length, target keys (and the target mask)
        to the target length, rows to ``shape.rows``, in one
        :func:`~.repad.repad_batch` (each side's keys by its collator's
        :meth:`~.base.Collator.repad_rules`). :func:`shapebucket.prewarm` builds its
        batches with it.

        >>> collate = CellCollator([(8, 4), (16, 8)])
        >>> batch = collate([{"input_ids": [1, 2], "labels": [3]}])
        >>> big = collate.repad(batch, Shape(2, 16, 8))
        >>> big["input_ids"].shape, big["labels"].shape
        (torch.Size([2, 16]), torch.Size([2, 8]))
        """
        shape = as_shape(shape, 2, what="CellCollator.repad shape")
        if not isinstance(batch, Mapping):
            raise ShapeBucketError(
                f"repad needs a dict batch this collator made, got {type(batch).__name__}"
            )
        if shape.lengths not in self._table:
            raise ShapeBucketError(f"cell {shape.lengths} is not one of {self._table!r}")
        tnames = {*self.target_keys, self.target_mask_key} - {None}
        rules = self._source.repad_rules({k: v for k, v in batch.items() if k not in tnames})
        target = self._target.repad_rules({k: v for k, v in batch.items() if k in tnames})
        rules.update((k, replace(r, axis=1)) for k, r in target.items())
        return cast(dict, repad_batch(batch, shape, rules))


def _split_sides(
    samples: Sequence[Any], target_keys: Sequence[Key], index_key: Key | None
) -> tuple[list[dict], list[dict]]:
    """Each dict sample split into its source (every key but the target keys it has) and
    its target (those keys, and the key that names its dataset index, for errors)."""
    if (
        not isinstance(samples, Sequence)
        or not samples
        or not all(isinstance(s, Mapping) for s in samples)
    ):
        raise ShapeBucketError(
            f"CellCollator needs a non-empty list of dict samples, got {samples!r:.80}"
        )
    tkeys = [k for k in target_keys if k in samples[0]]
    if not tkeys:
        raise ShapeBucketError(
            f"sample 0 has none of the target keys {list(target_keys)} (its keys: "
            f"{list(samples[0])}); pass target_keys=[...] naming the decoder's keys"
        )
    extra = [k for k in [index_key_of("dict", samples[0], index_key)] if k in samples[0]]
    src = [{k: v for k, v in s.items() if k not in tkeys} for s in samples]
    if not any(k not in (*tkeys, *extra) for k in samples[0]):
        raise ShapeBucketError(
            f"sample 0 has only target keys ({list(samples[0])}), no source key such as "
            "'input_ids' or 'input_features'; a CellCollator pads a source and a target per "
            "sample (one length only: BucketCollator)"
        )
    tgt = [{k: s[k] for k in [*tkeys, *extra] if k in s} for s in samples]
    return src, tgt


def _batch_cell(table: Cells, src: Columns, tgt: Columns) -> tuple[int, int]:
    """The cell of a batch (its read source and target): the cell of its longest source
    and longest target, or a refusal naming the sample that fits no cell, or the mix of
    cells that fits none."""
    s, t = src.lengths, tgt.lengths
    for i in range(len(s)):  # each sample first, so the error names the sample and key
        if not any(s[i] <= S and t[i] <= T for S, T in table):
            raise ShapeBucketError(
                f"{src.where(i)}: {src.length_key!r} has length {int(s[i])} and "
                f"{tgt.length_key!r} has length {int(t[i])}: " + table.no_cell(int(s[i]), int(t[i]))
            )
    top = (int(s.max()), int(t.max()))
    if not any(top[0] <= S and top[1] <= T for S, T in table):
        raise ShapeBucketError(
            f"the batch's longest source {top[0]} and longest target {top[1]} fit no cell of "
            f"{table!r}, though each sample fits one: the batch mixes cells; batch with "
            "CellBatchSampler (one cell per batch) or add a cell >= "
            f"({top[0]}, {top[1]})"
        )
    return table.cell_for(*top)
