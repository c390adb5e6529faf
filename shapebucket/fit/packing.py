"""Packing: several whole samples per row, every batch one of a few static shapes.

A packed batch is ``rows x row_length`` tokens, ``row_length`` one of a few row lengths
and ``rows`` fixed per row length. :func:`pack_epoch` plans an epoch from ``(seed,
epoch)`` alone, best-fit decreasing in windows (its five steps: ``docs/packing.md``, "How
an epoch is planned"); :func:`pack_rows` is the rule by which
:class:`~shapebucket.PackedCollator` rebuilds the rows from a batch's indices. Nothing is
dropped or cut: a sample longer than the largest row length is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lengths import check_lengths
from .._validate import check_int, rows_per_key
from ..errors import ShapeBucketError
from ._packer import Packer
from .batches import check_longest
from .buckets import Buckets, as_buckets
from .padding import efficiency

__all__ = [
    "PackedEpoch",
    "PackingReport",
    "pack_epoch",
    "pack_rows",
    "rows_for_tokens",
]

_TOO_LONG = "packing never cuts a sample: add a row length >= {length}"


@dataclass(frozen=True)
class PackingReport:
    """What one epoch of packing computes.

    ``real_tokens`` counts each sample once; ``token_efficiency`` is real tokens
    over computed tokens (rows x row length of every batch, empty pad rows and
    the copies that even out a short step included); ``attention_efficiency`` is
    the sum of each sample's ``length**2`` over the sum of each row's
    ``row_length**2``: the share of a dense (masked) attention's work that is
    real. With nothing computed, both are 1.0 (nothing computed, nothing
    wasted). ``num_shapes`` counts the distinct ``(rows, row_length)`` of the
    epoch. ``duplicated`` counts samples repeated so every rank gets a batch in
    a short step; ``short_steps`` counts the steps in which some rank's batch has
    fewer rows of samples than its shape (the collator adds empty rows).

    >>> pack_epoch([5, 3, 8, 2, 6], [8], {8: 2}).report.token_efficiency
    0.75
    """

    num_samples: int
    steps: int
    batches: int  # all ranks
    rows: int  # rows holding samples, all ranks
    real_tokens: int
    computed_tokens: int
    token_efficiency: float
    attention_efficiency: float
    duplicated: int
    num_shapes: int
    batches_per_bucket: dict[int, int]
    short_steps: int

    def __str__(self) -> str:
        per = ", ".join(f"{L}: {n}" for L, n in self.batches_per_bucket.items())
        return (
            f"{self.num_samples:,} samples in {self.rows:,} rows, {self.batches:,} batches "
            f"({self.num_shapes} shapes; batches per row length {{{per}}}): "
            f"{self.token_efficiency:.1%} real tokens, {self.attention_efficiency:.1%} of "
            f"dense attention real, {self.duplicated} duplicated"
        )


@dataclass(frozen=True)
class PackedEpoch:
    """One epoch's packed batches. Global step ``t`` holds the batches ``t * W .. t * W + W - 1``
    (``W = num_replicas``; batch ``t * W + r`` is rank ``r``'s); batch ``i`` is
    ``flat[offsets[i]:offsets[i + 1]]``, its samples row by row; ``row_length[t]`` is
    step ``t``'s row length and ``report`` its accounting."""

    flat: np.ndarray
    offsets: np.ndarray
    row_length: np.ndarray
    num_replicas: int
    report: PackingReport

    def batch(self, step: int, rank: int = 0) -> list[int]:
        i = step * self.num_replicas + rank
        return self.flat[self.offsets[i] : self.offsets[i + 1]].tolist()

    def __len__(self) -> int:
        return len(self.row_length)


def rows_for_tokens(
    keys: Buckets | Sequence[Any],
    tokens: int,
    *,
    widths: Sequence[int] | None = None,
    multiple: int = 1,
    what: str = "longest row length",
) -> dict[Any, int]:
    """Rows per key for a token budget: a key of row width ``w`` gets ``tokens // w`` rows,
    rounded down to a multiple of ``multiple`` (``batch_multiple``); the widest key (named
    ``what`` in the error) must get at least that many. Without ``widths`` the keys are row
    lengths (buckets), each its own width.

    >>> rows_for_tokens([64, 128, 256], 1536)
    {64: 24, 128: 12, 256: 6}
    >>> rows_for_tokens([(8, 8), (8, 24)], 64, widths=[16, 32], multiple=2, what="widest cell")
    {(8, 8): 4, (8, 24): 2}
    """
    if widths is None:
        keys = widths = as_buckets(keys).lengths
    budget = check_int("tokens_per_batch", tokens, minimum=1)
    multiple = check_int("batch_multiple", multiple, minimum=1)
    w = int(np.argmax(widths))
    if budget // widths[w] < multiple:
        need, rows = widths[w] * multiple, "one row" if multiple == 1 else f"{multiple} rows"
        raise ShapeBucketError(
            f"tokens_per_batch={budget} is less than {need}, the tokens of {rows} of the "
            f"{what} {keys[w]!r} ({widths[w]} tokens a row); use tokens_per_batch >= {need}"
        )
    return {
        k: budget // width // multiple * multiple for k, width in zip(keys, widths, strict=True)
    }


def pack_epoch(
    lengths: Sequence[int] | np.ndarray,
    buckets: Buckets | Sequence[int],
    rows: int | Mapping[int, int],
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    num_replicas: int = 1,
    window: int = 16384,
) -> PackedEpoch:
    """One epoch's packed batches (the five steps of ``docs/packing.md``).

    >>> packed = pack_epoch([5, 3, 8, 2, 6], [8], rows=2, shuffle=False)
    >>> [packed.batch(t) for t in range(len(packed))]
    [[2, 4, 3], [0, 1]]
    """
    table = as_buckets(buckets)
    arr = check_lengths(lengths)
    check_longest(arr, table, limit="longest row length", fix=_TOO_LONG)
    per = rows_per_key(rows, table.lengths)
    W = check_int("num_replicas", num_replicas, minimum=1)
    window = check_int("window", window, minimum=1)
    n = len(arr)
    order = (
        np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    ).astype(np.int64)
    packer = Packer(arr, per, W).pack(order, window)
    steps = len(packer.step_cls)
    step_pos = (
        np.random.default_rng([seed, epoch, 1]).permutation(steps) if shuffle else np.arange(steps)
    )
    flat, offsets, row_length = _layout(packer, step_pos)
    return PackedEpoch(flat, offsets, row_length, W, _report(packer, row_length))


def _layout(packer: Packer, step_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(flat, offsets, row_length)`` of :class:`PackedEpoch` when step ``s`` runs at
    position ``step_pos[s]``: every placement ordered by (position, rank, slot)."""
    rows, W = packer.rows, packer.W
    samples, row_of = packer.placements()
    steps = len(step_pos)
    batch_of = step_pos[rows.step[row_of]] * W + rows.rank[row_of]
    key = batch_of * int(packer.R.max()) + rows.slot[row_of]
    o = np.argsort(key, kind="stable")  # stable: each row keeps its placement order
    counts = np.bincount(batch_of, minlength=steps * W)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    row_length = np.empty(steps, dtype=np.int64)
    row_length[step_pos] = packer.Ls[np.asarray(packer.step_cls, dtype=np.int64)]
    return samples[o], offsets, row_length


def _report(packer: Packer, row_length: np.ndarray) -> PackingReport:
    """The accounting of a packed epoch; real tokens count each sample once."""
    rows, W, Ls, R, arr = packer.rows, packer.W, packer.Ls, packer.R, packer.lengths
    samples, _ = packer.placements()
    cls_of_step = np.asarray(packer.step_cls, dtype=np.int64)
    steps, used = len(cls_of_step), rows.n
    real = int(arr.sum())
    computed = int((row_length * R[np.searchsorted(Ls, row_length)]).sum()) * W
    attn_real = float((arr.astype(np.float64) ** 2).sum())
    attn_all = float((Ls[rows.cls[:used]].astype(np.float64) ** 2).sum())
    # pad rows (empty rows of short batches) compute L**2 too
    filled = np.bincount(rows.step[:used], minlength=steps)
    pad_rows = R[cls_of_step] * W - filled
    attn_all += float((pad_rows * Ls[cls_of_step].astype(np.float64) ** 2).sum())
    per_len = np.bincount(cls_of_step, minlength=len(Ls)) * W
    return PackingReport(
        num_samples=len(arr),
        steps=steps,
        batches=steps * W,
        rows=used,
        real_tokens=real,
        computed_tokens=computed,
        token_efficiency=efficiency(real, computed),
        attention_efficiency=efficiency(attn_real, attn_all),
        duplicated=len(samples) - len(arr),
        num_shapes=int((per_len > 0).sum()),
        batches_per_bucket={int(L): int(b) for L, b in zip(Ls, per_len, strict=True) if b},
        short_steps=int((pad_rows > 0).sum()),
    )


def pack_rows(
    lengths: Sequence[int] | np.ndarray, row_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(row, start)`` of each sample when ``lengths`` fill rows of ``row_length`` in order
    (a sample that does not fit the current row starts the next one): how
    :class:`~shapebucket.PackedCollator` lays out a batch.

    An empty sample takes no room: it stays in the current row at start 0, so every
    ``start`` is an index inside a row (``start < row_length``), also right after a
    full row, and the first token of that row (a sample's first, or padding) is the
    only one it can be said to touch.

    >>> pack_rows([3, 4, 2, 5], 8)
    (array([0, 0, 1, 1]), array([0, 3, 0, 2]))
    >>> pack_rows([8, 0, 3], 8)
    (array([0, 0, 1]), array([0, 0, 0]))
    """
    ln = np.asarray(lengths, dtype=np.int64)
    row = np.zeros(len(ln), dtype=np.int64)
    start = np.zeros(len(ln), dtype=np.int64)
    r = used = 0
    for i, x in enumerate(ln.tolist()):
        if x == 0:
            row[i] = r
            continue
        if used + x > row_length:
            r, used = r + 1, 0
        row[i], start[i] = r, used
        used += x
    return row, start
