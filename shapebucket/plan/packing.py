"""Packing: several whole samples per row, every batch one of a few static shapes.

A *packed* batch is ``rows x row_length`` tokens, ``row_length`` one of a few
row lengths and ``rows`` fixed per row length, so an epoch has at most
``len(buckets)`` batch shapes however the samples vary. Each row holds one
or more whole samples laid end to end; what is left of a row is padding.

How an epoch is planned (:func:`plan_packing`), from ``(seed, epoch)`` alone:

1. indices are shuffled, then cut into windows of ``window`` samples;
2. inside a window, samples are placed longest first, each into the open row
   with the *least* room that still fits it (best-fit decreasing). When no open
   row fits, the sample opens a new row of the smallest row length that holds
   it, so every row's first sample (its *opener*) belongs to that row length:
   the longest sample of a batch tells the collator its row length;
3. at the end of each window, every row length's oldest open rows are cut into
   global steps of ``num_replicas x rows`` rows (rank ``r`` gets the ``r``-th
   batch of each step); the rows left open keep filling in the next window;
4. after the last window each row length's remaining rows form one short step,
   dealt round-robin to the ranks (a rank left without a row gets a copy of
   one, counted in ``duplicated``); the collator pads short batches with empty
   rows, so they keep their shape;
5. steps are shuffled across row lengths.

The sampler yields each batch's indices row by row, every row's opener first.
:class:`~shapebucket.PackedCollator` rebuilds the rows by filling them in that
order (a sample that does not fit starts the next row): since a row is only
opened when no open row fits its opener, that reproduces the plan exactly.
Nothing is dropped or cut: a sample longer than the largest row length is an
error (pass a longer row length).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .._validate import check_int, check_lengths
from ..errors import ShapeBucketError
from .buckets import Buckets, as_buckets


@dataclass(frozen=True)
class PackingReport:
    """What one epoch of packing computes.

    ``token_efficiency`` is real tokens over computed tokens (rows x row length
    of every batch, empty pad rows included); ``attention_efficiency`` is the
    sum of each sample's ``length**2`` over the sum of each row's
    ``row_length**2``: the share of a dense (masked) attention's work that is
    real. ``shapes`` counts the distinct ``(rows, row_length)`` of the epoch.
    ``duplicated`` counts samples repeated so every rank gets a batch in a
    short step.

    >>> plan_packing([5, 3, 8, 2, 6], [8], {8: 2}).report.token_efficiency
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
    shapes: int
    batches_per_bucket: dict[int, int]

    def __str__(self) -> str:
        per = ", ".join(f"{L}: {n}" for L, n in self.batches_per_bucket.items())
        return (
            f"{self.num_samples:,} samples in {self.rows:,} rows, {self.batches:,} batches "
            f"({self.shapes} shapes; batches per row length {{{per}}}): "
            f"{self.token_efficiency:.1%} real tokens, {self.attention_efficiency:.1%} of "
            f"dense attention real, {self.duplicated} duplicated"
        )


@dataclass(frozen=True)
class PackedEpoch:
    """One epoch's packed plan. Global step ``t`` holds the batches ``t * W .. t * W + W - 1``
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


def rows_for_tokens(buckets: Buckets | Sequence[int], tokens: int) -> dict[int, int]:
    """Rows per row length for a token budget: ``tokens // row_length`` rows (at least one).

    >>> rows_for_tokens([64, 128, 256], 1536)
    {64: 24, 128: 12, 256: 6}
    """
    table = as_buckets(buckets)
    tokens = check_int("tokens_per_batch", tokens, minimum=1)
    if tokens < table.max_len:
        raise ShapeBucketError(
            f"tokens_per_batch={tokens} is less than the longest row length {table.max_len}: "
            f"a batch must hold at least one row; use tokens_per_batch >= {table.max_len}"
        )
    return {L: tokens // L for L in table}


def _check_rows(table: Buckets, rows: int | Mapping[int, int]) -> dict[int, int]:
    if isinstance(rows, Mapping):
        missing = [L for L in table if L not in rows]
        if missing:
            raise ShapeBucketError(
                f"rows has no entry for row length(s) {missing}; it has {sorted(rows)}; "
                "pass one per row length (rows_for_tokens(buckets, tokens) makes them)"
            )
        return {L: check_int(f"rows[{L}]", rows[L], minimum=1) for L in table}
    n = check_int("rows", rows, minimum=1)
    return {L: n for L in table}


def _check_sample_lengths(arr: np.ndarray, table: Buckets) -> None:
    if int(arr.max()) > table.max_len:
        i = int(np.argmax(arr > table.max_len))
        raise ShapeBucketError(
            f"sample {i} has length {int(arr[i])} > longest row length {table.max_len} of "
            f"{table!r}; packing never cuts a sample: add a row length >= {int(arr[i])}"
        )


class _Rows:
    """The rows of one epoch while they are being filled (all numpy, grown as needed)."""

    def __init__(self, capacity: int, max_len: int) -> None:
        self.n = 0
        self.rem = np.zeros(capacity, dtype=np.int64)
        self.cls = np.zeros(capacity, dtype=np.int64)
        self.closed = np.zeros(capacity, dtype=bool)
        self.step = np.full(capacity, -1, dtype=np.int64)
        self.rank = np.zeros(capacity, dtype=np.int64)
        self.slot = np.zeros(capacity, dtype=np.int64)
        self.count = np.zeros(max_len + 1, dtype=np.int64)  # open rows per remaining room
        self.by_room: dict[int, list[np.ndarray]] = {}  # room -> row ids (closed ones skipped)

    def grow(self, extra: int) -> None:
        if self.n + extra <= len(self.rem):
            return
        size = max(2 * len(self.rem), self.n + extra)
        fills = {"rem": 0, "cls": 0, "closed": False, "step": -1, "rank": 0, "slot": 0}
        for name, fill in fills.items():
            old = getattr(self, name)
            new = np.full(size, fill, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def add(self, room: int, ids: np.ndarray) -> None:
        if len(ids):
            self.by_room.setdefault(room, []).append(ids)
            self.count[room] += len(ids)

    def take(self, room: int, k: int) -> np.ndarray:
        """``k`` open rows with ``room`` left (any of them fits equally well; the most
        recently added come first)."""
        got: list[np.ndarray] = []
        need = k
        stack = self.by_room[room]
        while need:
            ids = stack.pop()
            ids = ids[~self.closed[ids]]
            if len(ids) > need:
                stack.append(ids[need:])
                ids = ids[:need]
            got.append(ids)
            need -= len(ids)
        self.count[room] -= k
        return np.concatenate(got) if len(got) > 1 else got[0]


def plan_packing(
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
    """One epoch's packed batches (the module docstring's steps 1-5).

    >>> plan = plan_packing([5, 3, 8, 2, 6], [8], rows=2, shuffle=False)
    >>> [plan.batch(t) for t in range(len(plan))]
    [[2, 4, 3], [0, 1]]
    """
    table = as_buckets(buckets)
    arr = check_lengths(lengths)
    _check_sample_lengths(arr, table)
    per = _check_rows(table, rows)
    W = check_int("num_replicas", num_replicas, minimum=1)
    window = check_int("window", window, minimum=1)
    n = len(arr)
    order = (
        np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    ).astype(np.int64)
    Ls = np.asarray(table.lengths, dtype=np.int64)
    R = np.asarray([per[L] for L in table.lengths], dtype=np.int64)
    rows_ = _Rows(max(16, n // 2), table.max_len)
    pending: list[list[np.ndarray]] = [[] for _ in Ls]  # open rows per class, oldest first
    n_pending = np.zeros(len(Ls), dtype=np.int64)
    placed_sample: list[np.ndarray] = []
    placed_row: list[np.ndarray] = []
    step_cls: list[int] = []

    def emit(c: int, k: int, last: bool) -> None:
        """Close the ``k`` oldest open rows of class ``c`` into steps."""
        ids = np.concatenate(pending[c]) if pending[c] else np.zeros(0, dtype=np.int64)
        ids, rest = ids[:k], ids[k:]
        pending[c] = [rest] if len(rest) else []
        n_pending[c] -= k
        rows_.closed[ids] = True
        np.subtract.at(rows_.count, rows_.rem[ids], 1)
        g = W * int(R[c])
        first = len(step_cls)
        if not last:
            j = np.arange(k)
            rows_.step[ids] = first + j // g
            rows_.rank[ids] = (j % g) // R[c]
            rows_.slot[ids] = j % R[c]
            step_cls.extend([c] * (k // g))
            return
        j = np.arange(k)  # one short step, rows dealt round-robin to the ranks
        rows_.step[ids] = first
        rows_.rank[ids] = j % W
        rows_.slot[ids] = j // W
        step_cls.append(c)
        if k >= W:
            return
        all_rows, all_samples = np.concatenate(placed_row), np.concatenate(placed_sample)
        for r in range(k, W):  # ranks without a row get a copy of one
            rows_.grow(1)
            new = rows_.n
            rows_.n += 1
            rows_.cls[new], rows_.closed[new] = c, True
            rows_.step[new], rows_.rank[new], rows_.slot[new] = first, r, 0
            dup = all_samples[all_rows == ids[r % k]]
            placed_sample.append(dup)
            placed_row.append(np.full(len(dup), new, dtype=np.int64))

    for lo in range(0, n, window):
        idx = order[lo : lo + window]
        ln = arr[idx]
        srt = np.argsort(-ln, kind="stable")
        idx, ln = idx[srt], ln[srt]
        cuts = np.flatnonzero(np.diff(ln)) + 1
        for part, part_len in zip(
            np.split(idx, cuts), ln[np.concatenate([[0], cuts])].tolist(), strict=True
        ):
            L = int(part_len)
            pos = 0
            while pos < len(part):  # best fit: the open rows with the least room that fits
                room = np.flatnonzero(rows_.count[L:])
                if not len(room):
                    break
                r = L + int(room[0])
                k = min(len(part) - pos, int(rows_.count[r]))
                ids = rows_.take(r, k)
                placed_sample.append(part[pos : pos + k])
                placed_row.append(ids)
                rows_.rem[ids] = r - L
                rows_.add(r - L, ids)
                pos += k
            rest = part[pos:]
            if not len(rest):
                continue
            c = int(np.searchsorted(Ls, L))  # the smallest row length that holds it
            q = int(Ls[c]) // L  # samples of this length per new row
            m = -(-len(rest) // q)
            rows_.grow(m)
            new = np.arange(rows_.n, rows_.n + m, dtype=np.int64)
            rows_.n += m
            rows_.cls[new] = c
            member = new[np.arange(len(rest)) // q]
            placed_sample.append(rest)
            placed_row.append(member)
            fill = np.bincount(np.arange(len(rest)) // q, minlength=m) * L
            rows_.rem[new] = Ls[c] - fill
            for room_left in np.unique(rows_.rem[new]).tolist():
                rows_.add(room_left, new[rows_.rem[new] == room_left])
            pending[c].append(new)
            n_pending[c] += m
        for c in range(len(Ls)):
            g = W * int(R[c])
            full = int(n_pending[c]) // g * g
            if full:
                emit(c, full, last=False)
    for c in range(len(Ls)):
        if n_pending[c]:
            emit(c, int(n_pending[c]), last=True)

    samples = np.concatenate(placed_sample) if placed_sample else np.zeros(0, np.int64)
    row_of = np.concatenate(placed_row) if placed_row else np.zeros(0, np.int64)
    steps = len(step_cls)
    cls_of_step = np.asarray(step_cls, dtype=np.int64)
    step_pos = (
        np.random.default_rng([seed, epoch, 1]).permutation(steps) if shuffle else np.arange(steps)
    )
    # step s runs at position step_pos[s]; order every placement by (position, rank, slot)
    rmax = int(R.max())
    batch_of = step_pos[rows_.step[row_of]] * W + rows_.rank[row_of]
    key = batch_of * rmax + rows_.slot[row_of]
    o = np.argsort(key, kind="stable")  # stable: each row keeps its placement order
    flat = samples[o]
    counts = np.bincount(batch_of, minlength=steps * W)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    row_length = np.empty(steps, dtype=np.int64)
    row_length[step_pos] = Ls[cls_of_step]

    used = rows_.n
    real = int(arr[samples].sum())
    computed = int((row_length * R[np.searchsorted(Ls, row_length)]).sum()) * W
    attn_real = float((arr[samples].astype(np.float64) ** 2).sum())
    attn_all = float((Ls[rows_.cls[:used]].astype(np.float64) ** 2).sum())
    # pad rows (empty rows of short batches) compute L**2 too
    rows_per_step = R[cls_of_step] * W
    filled = np.bincount(rows_.step[:used], minlength=steps)
    attn_all += float(((rows_per_step - filled) * Ls[cls_of_step].astype(np.float64) ** 2).sum())
    per_len = np.bincount(cls_of_step, minlength=len(Ls)) * W
    report = PackingReport(
        num_samples=n,
        steps=steps,
        batches=steps * W,
        rows=used,
        real_tokens=real,
        computed_tokens=computed,
        token_efficiency=real / computed if computed else 1.0,
        attention_efficiency=attn_real / attn_all if attn_all else 1.0,
        duplicated=len(samples) - n,
        shapes=int((per_len > 0).sum()),
        batches_per_bucket={int(L): int(b) for L, b in zip(Ls, per_len, strict=True) if b},
    )
    return PackedEpoch(flat, offsets, row_length, W, report)


def pack_rows(
    lengths: Sequence[int] | np.ndarray, row_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(row, start)`` of each sample when ``lengths`` fill rows of ``row_length`` in order
    (a sample that does not fit the current row starts the next one): how
    :class:`~shapebucket.PackedCollator` lays out a batch.

    >>> pack_rows([3, 4, 2, 5], 8)
    (array([0, 0, 1, 1]), array([0, 3, 0, 2]))
    """
    ln = np.asarray(lengths, dtype=np.int64)
    row = np.zeros(len(ln), dtype=np.int64)
    start = np.zeros(len(ln), dtype=np.int64)
    r = used = 0
    for i, x in enumerate(ln.tolist()):
        if used + x > row_length:
            r, used = r + 1, 0
        row[i], start[i] = r, used
        used += x
    return row, start
