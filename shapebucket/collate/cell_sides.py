"""A two-length collator's own reading: each sample split into its source and its
target side (:func:`split_sides`), and the cell a batch lands in (:func:`batch_cell`);
each side is then read by a collator of its own (:mod:`.reading`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ShapeBucketError
from ..fit.cells import Cells
from .engine import Key
from .reading import Columns

__all__ = ["batch_cell", "split_sides"]


def split_sides(
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
    names = (index_key, "idx", "index")  # what names a sample's dataset index
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


def batch_cell(table: Cells, src: Columns, tgt: Columns) -> tuple[int, int]:
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
