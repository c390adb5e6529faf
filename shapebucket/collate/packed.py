"""``PackedCollator``: lay a packed batch's samples into rows of one row length.

The samples come row by row, as :class:`~shapebucket.PackedBatchSampler` yields them;
:func:`~shapebucket.fit.packing.pack_rows` rebuilds the sampler's rows, and the engine
pads the packed :class:`~.engine.Layout` and makes positions and documents from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch

from .._memory import check_fits_in_memory
from ..errors import ShapeBucketError
from ..fit.packing import pack_rows
from ..plan.contract import batch_items
from ..plan.shapes import Shape, as_shape
from .base import Collator
from .engine import Key, Layout, assemble, signed_view
from .reading import Columns
from .repad import Rule
from .samples import index_key_of

__all__ = ["PackedCollator"]

#: The key Hugging Face models read as a padding mask: never in a packed batch.
HF_MASK = "attention_mask"


@dataclass(repr=False, kw_only=True)
class PackedCollator(Collator):
    """Collate a packed batch: whole samples laid end to end in ``rows x row_length`` tokens.

    Args:
        buckets: the row lengths (as given to :class:`PackedBatchSampler`).
        rows: rows per batch, an int or ``{row length: rows}`` (``sampler.rows``).
        pad_values, roles, seq_dim: as for :class:`BucketCollator`. Every key
            of the samples is a sequence (per-token) key and is packed, except
            ``roles.index``, whose values come back as a list in packing order.
        mask_key: ``None`` (default) or the key of a bool mask that is True on
            real tokens. Never ``"attention_mask"``, and the samples may not
            carry one: a Hugging Face model reads ``attention_mask`` as a
            padding mask and lets every token of a row attend to the samples
            before it (refused with a :class:`ShapeBucketError` naming the fix).
        position_key: where each token's position inside its own sample goes
            (``int64``, restarting at 0 for each sample, 0 on padding); the key
            Hugging Face decoders read to find packed sequences. ``None``: none.
        document_key: where each token's document number inside its row goes
            (``int32``: 0, 1, ... per row, ``-1`` on padding), the input of
            :func:`~shapebucket.document_causal_mask` and
            :func:`~shapebucket.document_block_mask`. ``None``: none.
        cu_seqlens_key: ``None`` (default) or a key for the cumulative sequence
            boundaries over the flattened ``rows * row_length`` tokens, as
            varlen attention kernels take them (``int32``): every sample is a
            segment, each row's padding another, and the tensor is padded to
            ``rows * row_length + 1`` entries by repeating the total, so its
            shape is static too. Use the row length as ``max_seqlen``.
        label_shift: required when the samples have labels (a key of
            ``roles.labels``, or ``labels``), since no default is right for both
            conventions: ``"model"`` (the model shifts labels by one, as Hugging
            Face causal LMs do: the first label of every sample is set to its pad
            value, so no token learns to predict the next sample) or ``"none"``
            (labels are already aligned with the next token: kept as they are).
            With ``"model"`` every key of ``roles.labels`` must be in the samples
            (a typo would leave labels unshifted).

    Per-token losses equal those of the samples run one at a time, provided
    the model masks attention by document (:func:`~shapebucket.document_causal_mask`
    of ``document_ids``, or a Hugging Face decoder called with ``use_cache=False``:
    given ``position_ids`` and no ``attention_mask`` it finds the samples by itself)
    and reads positions from ``position_ids``. ``collator.stats`` counts
    batches, samples, real and pad tokens and empty rows, as for
    :class:`BucketCollator`.

    >>> collate = PackedCollator([8], rows=2)
    >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}, {"input_ids": [6] * 8}])
    >>> sorted(batch)
    ['document_ids', 'input_ids', 'position_ids']
    >>> batch["input_ids"].tolist()
    [[1, 2, 3, 4, 5, 0, 0, 0], [6, 6, 6, 6, 6, 6, 6, 6]]
    >>> batch["position_ids"][0].tolist(), batch["document_ids"][0].tolist()
    ([0, 1, 2, 0, 1, 0, 0, 0], [0, 0, 0, 1, 1, -1, -1, -1])
    """

    packs = True  # a row holds several samples: paired with PackedBatchSampler
    _ADDS = ("mask_key", "position_key", "document_key", "cu_seqlens_key")

    rows: int | Mapping[int, int]  # type: ignore[assignment]
    mask_key: str | None = None
    position_key: str | None = "position_ids"
    document_key: str | None = "document_ids"
    cu_seqlens_key: str | None = None
    label_shift: Literal["model", "none"] | None = None

    def __post_init__(self) -> None:
        if self.rows is None:
            raise ShapeBucketError("PackedCollator needs rows= (an int or {row length: rows})")
        super().__post_init__()
        if self.label_shift not in ("model", "none", None):
            raise ShapeBucketError(
                f"label_shift must be 'model' or 'none', got {self.label_shift!r}"
            )
        if self.mask_key == HF_MASK:
            raise ShapeBucketError(
                f"PackedCollator(mask_key={HF_MASK!r}) would make a mask that is True on every "
                "real token of a row; a Hugging Face model reads that key as a padding mask and "
                "lets each sample attend to the samples before it in its row. Leave mask_key=None "
                "(a Hugging Face decoder called with use_cache=False finds the samples from "
                "position_ids; other models mask with document_causal_mask(batch['document_ids'])), "
                "or name the real-token mask otherwise (mask_key='token_mask')"
            )

    def __call__(self, samples: Sequence[Any]) -> dict[Key, Any]:
        cols = self.read(samples)
        index_key = self._check(cols)
        lens = cols.lengths
        longest = int(lens.max())
        if longest > self._table.max_len:
            i = int(np.argmax(lens > self._table.max_len))
            raise ShapeBucketError(
                f"{cols.where(i)}: {cols.length_key!r} has length {int(lens[i])} > longest row "
                f"length {self._table.max_len} of {self._table!r}; packing never cuts a sample: "
                f"add a row length >= {int(lens[i])}"
            )
        L = self._table.bucket_for(longest)
        R = cast(int, self.rows_for(L))  # rows= is required
        row, start = pack_rows(lens, L)
        used = int(row[-1]) + 1
        if used > R:
            raise ShapeBucketError(
                f"these {len(lens)} samples (longest {longest}, so row length {L}) fill {used} rows "
                f"of {L} when laid in order, more than rows[{L}]={R}: a packed batch comes from "
                "PackedBatchSampler with the same row lengths and rows (its order is the layout)"
            )
        check_fits_in_memory(R, L, len(cols.seq_keys) + 3, self._table)
        row_t, start_t = torch.from_numpy(row), torch.from_numpy(start)
        layout = Layout(
            torch.from_numpy(lens), rows=R, length=L, row=row_t, start=start_t, seq_dim=self.seq_dim
        )
        values, pads = self.sequences(cols)
        stacked = {k: list(cols.columns[k]) for k in cols.keys if k == index_key}
        out = assemble(cols.keys, values, pads, stacked, layout, mask_key=self.mask_key)
        if self.label_shift == "model":
            for k in self.roles.labels:
                view = signed_view(out[k].movedim(self.seq_dim + 1, 1))
                view[row_t, start_t] = signed_view(torch.tensor(pads[k], dtype=out[k].dtype))
        if self.position_key is not None:
            out[self.position_key] = layout.positions()
        if self.document_key is not None:
            out[self.document_key] = layout.documents()
        if self.cu_seqlens_key is not None:
            out[self.cu_seqlens_key] = layout.cu_seqlens()
        self._count(layout)
        return out

    def _check(self, cols: Columns) -> Key | None:
        """Refuse what has no place in a packed batch; the index key (or None)."""
        if cols.kind != "dict":
            raise ShapeBucketError(
                "PackedCollator needs dict samples (it adds position and document keys), got "
                f"{cols.kind} samples; use BucketCollator for tuples and bare sequences"
            )
        self._check_labels(cols.keys)
        if HF_MASK in cols.columns:
            raise ShapeBucketError(
                f"the samples have {HF_MASK!r}: packed into a row it is True on every real "
                "token, and a Hugging Face model reads it as a padding mask and lets each sample "
                f"attend to the samples before it. Drop {HF_MASK!r} from the samples (for a "
                f"datasets.Dataset: ds.remove_columns({HF_MASK!r})); the batch's position_ids "
                "and document_ids say where each sample starts"
            )
        index_key = index_key_of(cols.kind, cols.keys, self.roles.index)
        others = [k for k in cols.keys if k not in cols.seq_keys and k != index_key]
        if others:
            raise ShapeBucketError(
                f"sample 0 has per-sample values under {others}: packing puts several samples "
                "in one row, so only per-token sequences have a place in the batch. Make them "
                "per-token, drop them in the dataset, name a sample id as roles=KeyRoles(index=...), or use "
                "BucketCollator (one sample per row)"
            )
        for name in (self.position_key, self.document_key, self.cu_seqlens_key):
            if name is not None and name in cols.columns:
                raise ShapeBucketError(
                    f"the samples have a key {name!r}, where the collator puts what it adds; "
                    "rename your key or pass another name for the collator's (or None)"
                )
        return index_key

    def _check_labels(self, keys: list[Key]) -> None:
        """Refuse labels without a stated convention, and label keys the samples lack."""
        label_keys = self.roles.labels
        labels = [k for k in keys if k in label_keys or k == "labels"]
        if self.label_shift is None and labels:
            raise ShapeBucketError(
                f"the samples have labels ({labels[0]!r}) but PackedCollator has no label_shift: "
                "pass label_shift='model' if the model shifts labels itself (Hugging Face causal "
                "LMs; the first label of each sample becomes -100 so no token predicts the next "
                "sample), or label_shift='none' if each token's label already is the next token"
            )
        if self.label_shift == "model":
            missing = [k for k in label_keys if k not in keys]
            if missing:
                raise ShapeBucketError(
                    f"label_shift='model' shifts the label keys {list(label_keys)} "
                    f"(roles.labels), but the samples have no key {missing[0]!r} (they have "
                    f"{keys}); name the labels' key: roles=KeyRoles(labels=[...])"
                )
            stray = [k for k in labels if k not in label_keys]
            if stray:
                raise ShapeBucketError(
                    f"the samples have {stray[0]!r}, which the label keys {list(label_keys)} "
                    "(roles.labels) do not name, so it would not be shifted; add it: "
                    "roles=KeyRoles(labels=[...])"
                )

    def repad(self, batch: Any, shape: Shape) -> dict[Key, Any]:
        """``batch`` (a packed batch this collator made) with ``shape.rows`` rows of row
        length ``shape.length`` (a row length of the table): each row keeps its samples
        where they fit (a sample past the new row end is cut there), added rows are empty;
        positions, documents and the token mask are re-padded with the rest, varlen
        boundaries moved to the new grid (a longer row's new places are a padding segment
        of their own). The same :meth:`~shapebucket.collate.base.Collator.repad` as every
        collator's, by :meth:`repad_rules`. Not counted in ``stats``.

        >>> from shapebucket.plan import Shape
        >>> collate = PackedCollator([8, 16], rows={8: 2, 16: 1})
        >>> batch = collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
        >>> big = collate.repad(batch, Shape(1, 16))
        >>> big["input_ids"].tolist()[0][:6], big["document_ids"][0, :6].tolist()
        ([1, 2, 3, 4, 5, 0], [0, 0, 0, 1, 1, -1])
        """
        shape = as_shape(shape, 1, what="repad shape")
        if not isinstance(batch, Mapping):
            raise ShapeBucketError(
                f"repad needs a batch this collator made (a dict), got {type(batch).__name__}"
            )
        if shape.length not in self._table:
            raise ShapeBucketError(
                f"{shape.length} is not one of the row lengths {list(self._table)}"
            )
        return cast(dict, super().repad(batch, shape))

    def repad_rules(self, batch: Any) -> dict[Key, Rule]:
        """How :meth:`repad` re-pads each value of a packed batch: the token mask, positions
        and documents are ``[rows, row_length]`` sequences (padded with False, 0 and -1),
        the varlen boundaries are moved, the index list is kept, and every other value is
        a sequence with its length at ``seq_dim + 1``."""
        fills = {self.mask_key: 0, self.position_key: 0, self.document_key: -1}
        rules: dict[Key, Rule] = {}
        for k, v in batch_items(batch):
            if k == self.cu_seqlens_key:
                rules[k] = Rule("boundaries")
            elif isinstance(v, list):  # the index key: one entry per sample, packing order
                rules[k] = Rule("keep")
            elif k in fills and isinstance(v, torch.Tensor) and v.ndim == 2:
                rules[k] = Rule("sequence", pad=fills[k], dim=1)
            elif isinstance(v, torch.Tensor) and v.ndim > self.seq_dim + 1:
                rules[k] = Rule("sequence", pad=self.pad_value(k), dim=self.seq_dim + 1)
            else:
                raise ShapeBucketError(
                    f"repad: {k!r} is not a value this collator made (a [rows, row_length, ...] "
                    "tensor)"
                )
        return rules
