"""``CellCollator``: pad each key of an encoder-decoder batch to its own length.

Source keys (``input_ids``, ``attention_mask``, audio features...) are padded to
the cell's source length, target keys (``labels``, ``decoder_input_ids``,
``decoder_attention_mask``) to its target length. Each side is read, checked
and padded by a :class:`~shapebucket.BucketCollator` of its own (the same
dtype rules, pad values, errors and engine); this module only splits the
samples, chooses the cell and the rows, and joins the two halves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._validate import check_int
from ..errors import ShapeBucketError
from ..fit.cells import Cells
from .base import Columns
from .bucket import BucketCollator
from .engine import Key, Layout, assemble
from .repad import repad_batch

__all__ = ["DEFAULT_TARGET_KEYS", "CellCollator"]

#: The keys padded to the target length unless ``target_keys=`` says otherwise.
DEFAULT_TARGET_KEYS = ("labels", "decoder_input_ids", "decoder_attention_mask")

Cell = tuple[int, int]


@dataclass(repr=False)
class CellCollator:
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
            with -100).
        index_key: a key holding each sample's dataset index, for error messages.
        sequence_keys: the source keys to pad (default: every source value with a
            length); other source values are stacked, as in ``BucketCollator``.
        seq_dim: the sequence dim of each source value (1 for audio features
            ``[n_mels, frames]``); target values are ``[T]``.

    The batch's cell is the cell of its longest source and longest target (the
    edge rule of :class:`~shapebucket.fit.cells.Cells`; batches of a
    :class:`~shapebucket.sampling.CellBatchSampler` land in their own cell).

    >>> collate = CellCollator([(8, 4), (16, 8)])
    >>> batch = collate([{"input_ids": [1] * 10, "labels": [2, 3]}, {"input_ids": [4], "labels": [5]}])
    >>> batch["input_ids"].shape, batch["labels"].shape, batch["labels"][1].tolist()
    (torch.Size([2, 16]), torch.Size([2, 8]), [5, -100, -100, -100, -100, -100, -100, -100])
    """

    cells: Cells | Sequence[Cell]
    rows: int | Mapping[Cell, int] | None = None
    target_keys: Sequence[Key] = DEFAULT_TARGET_KEYS
    pad_values: Mapping[Any, Any] | None = None
    mask_key: str | None = "attention_mask"
    target_mask_key: str | None = None
    index_key: Key | None = None
    sequence_keys: Sequence[Key] | None = None
    seq_dim: int = 0
    _source: BucketCollator = field(init=False, repr=False)
    _target: BucketCollator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.cells = self.cells if isinstance(self.cells, Cells) else Cells(self.cells)
        if isinstance(self.target_keys, (str, bytes)) or not isinstance(self.target_keys, Sequence):
            raise ShapeBucketError(f"target_keys must be a list of keys, got {self.target_keys!r}")
        self.target_keys = tuple(self.target_keys)
        self._check_mask_keys()
        self.rows = self._check_rows(self.rows)
        pads, index = self.pad_values, self.index_key
        self._source = BucketCollator(
            sorted({s for s, _ in self.cells}),
            mask_key=self.mask_key,
            pad_values=pads,
            index_key=index,
            sequence_keys=self.sequence_keys,
            seq_dim=self.seq_dim,
        )
        self.seq_dim = self._source.seq_dim  # checked
        self._target = BucketCollator(
            sorted({t for _, t in self.cells}),
            mask_key=self.target_mask_key,
            pad_values=pads,
            index_key=index,
        )

    def _check_mask_keys(self) -> None:
        """A mask named like a target key or like the other mask would replace it."""
        for name, key in (("mask_key", self.mask_key), ("target_mask_key", self.target_mask_key)):
            if key is not None and key in self.target_keys:
                raise ShapeBucketError(
                    f"{name}={key!r} is one of the target keys {list(self.target_keys)}: the "
                    "batch would hold the mask or the values under it, not both; name the mask "
                    "differently"
                )
        if self.mask_key is not None and self.mask_key == self.target_mask_key:
            raise ShapeBucketError(
                f"mask_key and target_mask_key are both {self.mask_key!r}: one mask would "
                "replace the other; give them different names"
            )

    def _check_rows(self, rows: Any) -> int | dict[Cell, int] | None:
        if rows is None:
            return None
        if not isinstance(rows, Mapping):
            return check_int("rows", rows, minimum=1)
        table: Cells = self.cells  # type: ignore[assignment]
        out = {}
        for cell, n in rows.items():
            if tuple(cell) not in table:
                raise ShapeBucketError(
                    f"rows has an entry for {cell}, which is not a cell of {table!r}"
                )
            out[tuple(cell)] = check_int(f"rows[{cell}]", n, minimum=1)
        missing = [c for c in table if c not in out]
        if missing:
            raise ShapeBucketError(
                f"rows has no batch size for cells {missing}; give one for every cell "
                "(pass rows=sampler.rows)"
            )
        return out

    @property
    def _table(self) -> Cells:
        return self.cells  # type: ignore[return-value]

    def rows_for(self, cell: Cell) -> int | None:
        """The rows a batch in ``cell`` is padded to (``None``: as many as it has samples)."""
        if self.rows is None or isinstance(self.rows, int):
            return self.rows
        if tuple(cell) not in self.rows:
            raise ShapeBucketError(f"rows has no entry for cell {cell}; it has {sorted(self.rows)}")
        return self.rows[tuple(cell)]  # type: ignore[index]

    def __repr__(self) -> str:
        return (
            f"CellCollator({self.cells!r}, rows={self.rows!r}, target_keys={list(self.target_keys)}, "
            f"mask_key={self.mask_key!r}, target_mask_key={self.target_mask_key!r}"
            + (f", seq_dim={self.seq_dim})" if self.seq_dim else ")")
        )

    # -- collation ---------------------------------------------------------------------------

    def _split(self, samples: Sequence[Any]) -> tuple[list[dict], list[dict]]:
        if (
            not isinstance(samples, Sequence)
            or not samples
            or not all(isinstance(s, Mapping) for s in samples)
        ):
            raise ShapeBucketError(
                f"CellCollator needs a non-empty list of dict samples, got {samples!r:.80}"
            )
        tkeys = [k for k in self.target_keys if k in samples[0]]
        if not tkeys:
            raise ShapeBucketError(
                f"sample 0 has none of the target keys {list(self.target_keys)} (its keys: "
                f"{list(samples[0])}); pass target_keys=[...] naming the decoder's keys"
            )
        names = (self.index_key, "idx", "index")  # what names a sample's dataset index
        extra = [k for k in names if k is not None and k in samples[0]][:1]
        src = [{k: v for k, v in s.items() if k not in tkeys} for s in samples]
        if not any(k not in (*tkeys, *extra) for k in samples[0]):
            raise ShapeBucketError(
                f"sample 0 has only target keys ({list(samples[0])}), no source key such as "
                "'input_ids' or 'input_features'; a CellCollator pads a source and a target per "
                "sample (one length only: BucketCollator)"
            )
        tgt = [{k: s[k] for k in [*tkeys, *extra] if k in s} for s in samples]
        return src, tgt

    def _cell(self, src: Columns, tgt: Columns) -> Cell:
        s, t = src.lengths, tgt.lengths
        table = self._table
        for i in range(len(s)):  # each sample first, so the error names the sample and key
            if not any(s[i] <= S and t[i] <= T for S, T in table):
                raise ShapeBucketError(
                    f"{src.where(i)}: {src.length_key!r} has length {int(s[i])} and "
                    f"{tgt.length_key!r} has length {int(t[i])}: "
                    + table.no_cell(int(s[i]), int(t[i]))
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

    def __call__(self, samples: Sequence[Any]) -> dict[Key, Any]:
        src_samples, tgt_samples = self._split(samples)
        src = self._source._read(src_samples)
        tgt = self._target._read(tgt_samples)
        cell = self._cell(src, tgt)
        n = len(src.lengths)
        rows = self.rows_for(cell)
        if rows is None:
            rows = n
        elif n > rows:
            raise ShapeBucketError(
                f"batch of {n} samples is larger than rows={rows} for cell {cell}; "
                "pass rows=sampler.rows of the sampler that made the batches"
            )
        out = self._side(self._source, src, rows, cell[0], self.mask_key)
        target = self._side(self._target, tgt, rows, cell[1], self.target_mask_key)
        if self.target_mask_key is not None and self.target_mask_key in out:
            raise ShapeBucketError(
                f"target_mask_key={self.target_mask_key!r} is also a source key of the samples "
                f"(batch keys {list(out)}): the target mask would be dropped; name it differently"
            )
        out.update((k, v) for k, v in target.items() if k not in out)
        return out

    @staticmethod
    def _side(
        collator: BucketCollator, cols: Columns, rows: int, length: int, mask_key: str | None
    ) -> dict[Key, Any]:
        lengths = torch.from_numpy(np.ascontiguousarray(cols.lengths))
        layout = Layout(lengths, rows=rows, length=length, seq_dim=collator.seq_dim)
        values, pads = collator._values(cols)
        stacked = collator._stacked(cols, rows)
        return assemble(cols.keys, values, pads, stacked, layout, mask_key=mask_key)

    def repad(self, batch: Any, cell: Cell, rows: int | None = None) -> dict[Key, Any]:
        """Re-pad a batch this collator made to ``cell`` with ``rows`` rows (default: the
        collator's rows for it, else the batch's): source keys to ``cell[0]``, target keys
        (and the target mask) to ``cell[1]``. :func:`shapebucket.prewarm` builds its
        batches with it.

        >>> collate = CellCollator([(8, 4), (16, 8)])
        >>> batch = collate([{"input_ids": [1, 2], "labels": [3]}])
        >>> big = collate.repad(batch, (16, 8), rows=2)
        >>> big["input_ids"].shape, big["labels"].shape
        (torch.Size([2, 16]), torch.Size([2, 8]))
        """
        if not isinstance(batch, Mapping):
            raise ShapeBucketError(
                f"repad needs a dict batch this collator made, got {type(batch).__name__}"
            )
        if tuple(cell) not in self._table:
            raise ShapeBucketError(f"cell {cell} is not one of {self._table!r}")
        S, T = (int(x) for x in cell)
        rows = self.rows_for((S, T)) if rows is None else rows
        tnames = {*self.target_keys, self.target_mask_key} - {None}
        src = {k: v for k, v in batch.items() if k not in tnames}
        tgt = {k: v for k, v in batch.items() if k in tnames}
        out = repad_batch(self._source, src, S, rows)
        out.update(repad_batch(self._target, tgt, T, rows))
        return {k: out[k] for k in batch}
