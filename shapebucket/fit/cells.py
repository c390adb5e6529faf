"""``Cells``: the ``(source, target)`` shapes of two-length (encoder-decoder) buckets.

A sample has two lengths, its source (encoder input, audio frames) and its
target (decoder tokens). A *cell* is one ``(source, target)`` pair a batch is
padded to; each cell is one compiled shape (times the row counts).

Edge rule: a sample ``(s, t)`` lands in the cheapest cell that holds it: of the
cells with ``source >= s`` and ``target >= t``, the one with the smallest
``source + target`` (the padded tokens of one row; ``ws * source + wt * target``
with ``weights=(ws, wt)``), ties to the smaller source.
The rule is a total order, so a batch whose samples all land in cell ``c`` has
its componentwise longest ``(max s, max t)`` in ``c`` as well: the sampler's
cell and the collator's cell of a batch always agree.

:func:`fit_cells` fits the cells, *hierarchically*: the source axis is cut
into strips, each strip with its own target boundaries. For a strip and a
budget of ``j`` cells the best target boundaries are the exact 1-D fit of the
strip's targets (the min-plus programme of :mod:`.optimal`, run for every strip
at once); a second programme splits the sources and the budget ``k`` across the
strips. The result is exact over hierarchical tables on the candidate grid
(every aligned length that occurs, or ``grid`` quantiles of them when there are
more); the objective is every sample's padded ``source + target``, which the
edge rule can only lower. :func:`cells_lower_bound` bounds what *any* ``k``
cells can reach; :func:`~.cell_report.cells_report` says how much a table pads.
The reasoning: ``docs/two_length.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .._lengths import MAX_BUCKET, check_lengths, round_up
from .._validate import check_int
from ..errors import ShapeBucketError
from .optimal import DEFAULT_ALIGN, optimal_boundaries, optimal_buckets

__all__ = ["Cells", "cells_lower_bound", "fit_cells"]

_CHUNK = 1 << 16  # samples per vectorised containment test (x cells bools)
#: The largest weight of a side: the cost ``ws * S + wt * T`` stays far inside int64.
MAX_WEIGHT = 2**30


def _check_weights(weights: Any) -> tuple[int, int]:
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Iterable):
        raise ShapeBucketError(
            f"weights must be a (source, target) pair of ints >= 1, got {weights!r}"
        )
    pair = tuple(weights)
    if len(pair) != 2:
        raise ShapeBucketError(
            f"weights must be a (source, target) pair of ints >= 1, got {weights!r}"
        )
    return (
        check_int("source weight", pair[0], minimum=1, maximum=MAX_WEIGHT),
        check_int("target weight", pair[1], minimum=1, maximum=MAX_WEIGHT),
    )


def _pair(i: int, cell: Any) -> tuple[int, int]:
    if isinstance(cell, (str, bytes)) or not isinstance(cell, Iterable):
        raise ShapeBucketError(f"cell {i} must be a (source, target) pair of ints, got {cell!r}")
    pair = tuple(cell)
    if len(pair) != 2:
        raise ShapeBucketError(f"cell {i} must be a (source, target) pair of ints, got {cell!r}")
    s = check_int(f"cell {i} source", pair[0], minimum=2, maximum=MAX_BUCKET)
    t = check_int(f"cell {i} target", pair[1], minimum=2, maximum=MAX_BUCKET)
    return s, t


class Cells:
    """An immutable set of ``(source, target)`` cells, sorted by source then target.

    Hashable, comparable by value, iterable, picklable. Lengths are ints >= 2
    (as :class:`~shapebucket.fit.Buckets`: the compiler specialises sizes 0 and 1).

    ``weights=(ws, wt)`` (positive ints, default ``(1, 1)``) prices a row of a cell
    at ``ws * source + wt * target`` in the edge rule (and in :func:`fit_cells`):
    ``(1, 4)`` when a decoder token costs four encoder positions.

    >>> cells = Cells([(16, 8), (32, 8), (32, 24)])
    >>> cells.cell_for(10, 5), cells.cell_for(20, 20), len(cells)
    ((16, 8), (32, 24), 3)
    >>> Cells([(64, 8), (16, 32)]).cell_for(8, 8), Cells([(64, 8), (16, 32)], weights=(1, 4)).cell_for(8, 8)
    ((16, 32), (64, 8))
    """

    __slots__ = ("_cells", "_order", "_src", "_tgt", "_weights")
    _cells: tuple[tuple[int, int], ...]
    _src: np.ndarray
    _tgt: np.ndarray
    _order: np.ndarray
    _weights: tuple[int, int]

    def __init__(self, cells: Iterable[Any], weights: tuple[int, int] | None = None) -> None:
        if weights is None:
            weights = cells.weights if isinstance(cells, Cells) else (1, 1)
        ws, wt = _check_weights(weights)
        object.__setattr__(self, "_weights", (ws, wt))
        if isinstance(cells, Cells):
            pairs = list(cells.cells)
        else:
            if isinstance(cells, (str, bytes)) or not isinstance(cells, Iterable):
                raise ShapeBucketError(
                    f"Cells takes (source, target) pairs, got {cells!r}; e.g. Cells([(64, 16)])"
                )
            pairs = [_pair(i, c) for i, c in enumerate(cells)]
        if not pairs:
            raise ShapeBucketError("Cells needs at least one (source, target) pair, got none")
        if len(set(pairs)) != len(pairs):
            twice = next(p for p in pairs if pairs.count(p) > 1)
            raise ShapeBucketError(f"cell {twice} appears twice; each cell must be unique")
        ordered = tuple(sorted(pairs))
        object.__setattr__(self, "_cells", ordered)
        src = np.array([s for s, _ in ordered], dtype=np.int64)
        tgt = np.array([t for _, t in ordered], dtype=np.int64)
        # the edge rule's order: cheapest first, ties to the smaller source
        order = np.lexsort((tgt, src, ws * src + wt * tgt))
        for a in (src, tgt, order):
            a.flags.writeable = False
        object.__setattr__(self, "_src", src)
        object.__setattr__(self, "_tgt", tgt)
        object.__setattr__(self, "_order", order)

    @property
    def weights(self) -> tuple[int, int]:
        """``(ws, wt)``: a row of cell ``(S, T)`` costs ``ws * S + wt * T``."""
        return self._weights

    @property
    def cells(self) -> tuple[tuple[int, int], ...]:
        """The cells, sorted by source, then target."""
        return self._cells

    @property
    def max_source(self) -> int:
        """The longest source any cell takes."""
        return int(self._src.max())

    @property
    def max_target(self) -> int:
        """The longest target any cell takes."""
        return int(self._tgt.max())

    def cell_for(self, source: int, target: int) -> tuple[int, int]:
        """The cell a sample of these lengths lands in (the module's edge rule).

        >>> Cells([(16, 32), (32, 8)]).cell_for(4, 4)
        (32, 8)
        """
        source = check_int("source", source, minimum=0)
        target = check_int("target", target, minimum=0)
        return self._cells[int(self.index_for_many([source], [target])[0])]

    def index_for_many(self, sources: Any, targets: Any) -> np.ndarray:
        """Each sample's cell *index* (position in :attr:`cells`), vectorised.

        >>> Cells([(16, 32), (32, 8)]).index_for_many([4, 4], [4, 20])
        array([1, 0])
        """
        s = check_lengths(sources, minimum=0, allow_empty=True)
        t = check_lengths(targets, minimum=0, allow_empty=True)
        if s.shape != t.shape:
            raise ShapeBucketError(
                f"source and target lengths differ in count: {len(s)} sources, {len(t)} targets; "
                "give both lengths of every sample"
            )
        out = np.empty(len(s), dtype=np.int64)
        src, tgt = self._src[self._order], self._tgt[self._order]
        for lo in range(0, len(s), _CHUNK):
            fits = (s[lo : lo + _CHUNK, None] <= src) & (t[lo : lo + _CHUNK, None] <= tgt)
            first = np.argmax(fits, axis=1)
            bad = ~fits[np.arange(len(first)), first]
            if bad.any():
                i = lo + int(np.argmax(bad))
                raise ShapeBucketError(f"sample {i}: " + self.no_cell(int(s[i]), int(t[i])))
            out[lo : lo + _CHUNK] = self._order[first]
        return out

    def no_cell(self, source: int, target: int) -> str:
        """The message for a sample no cell holds: the lengths, the limits, the fix."""
        wide = self._tgt[self._src >= source]
        limit = (
            f"the longest target of the cells with source >= {source} is {int(wide.max())}"
            if wide.size
            else f"the longest source of the cells is {self.max_source}"
        )
        return (
            f"source length {source} and target length {target} fit no cell of {self!r} "
            f"({limit}); fit the cells on lengths that include this sample (fit_cells), add a "
            f"cell >= ({source}, {target}), or drop or truncate the sample before batching"
        )

    def __len__(self) -> int:
        return len(self._cells)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._cells)

    def __contains__(self, item: object) -> bool:
        return item in self._cells

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cells):
            return NotImplemented
        return (self._cells, self._weights) == (other._cells, other._weights)

    def __hash__(self) -> int:
        return hash(("Cells", self._cells, self._weights))

    def __repr__(self) -> str:
        weights = "" if self._weights == (1, 1) else f", weights={self._weights}"
        return f"Cells({list(self._cells)}{weights})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Cells is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Cells, (self._cells, self._weights))


# -- fitting the cells ------------------------------------------------------------


def _aligned(
    sources: Sequence[int] | np.ndarray, targets: Sequence[int] | np.ndarray, align: object
) -> tuple[np.ndarray, np.ndarray, int, int]:
    s, t = check_lengths(sources, name="sources"), check_lengths(targets, name="targets")
    if s.shape != t.shape:
        raise ShapeBucketError(
            f"{len(s)} source lengths and {len(t)} target lengths; give both lengths of every sample"
        )
    pair = align if isinstance(align, tuple) else (align, align)
    if len(pair) != 2:
        raise ShapeBucketError(f"align must be an int or a (source, target) pair, got {align!r}")
    a_s = check_int("source align", pair[0], minimum=1, maximum=MAX_BUCKET)
    a_t = check_int("target align", pair[1], minimum=1, maximum=MAX_BUCKET)
    sa = np.maximum(round_up(s, a_s), round_up(2, a_s))
    ta = np.maximum(round_up(t, a_t), round_up(2, a_t))
    return sa, ta, a_s, a_t


def _grid(values: np.ndarray, grid: int) -> np.ndarray:
    """The candidate boundaries: every distinct value, or ``grid`` equal-count quantiles
    of them (always values that occur, always the largest)."""
    distinct = np.unique(values)
    if len(distinct) <= grid:
        return distinct
    ordered = np.sort(values)
    at = np.ceil(np.linspace(1 / grid, 1, grid) * len(ordered)).astype(np.int64) - 1
    return np.unique(ordered[at])


def _target_costs(hist: np.ndarray, cands: np.ndarray, k: int) -> np.ndarray:
    """``out[m, j-1]``: the least padded target tokens of strip ``m`` (its target histogram
    over ``cands``) with at most ``j`` target buckets, for j = 1..k (the 1-D min-plus
    programme, vectorised across strips; O(k n^2) per strip)."""
    m, n = hist.shape
    W = np.concatenate([np.zeros((m, 1)), np.cumsum(hist, axis=1)], axis=1)
    c = np.concatenate([[0.0], cands.astype(np.float64)])
    last = n - np.argmax(hist[:, ::-1] > 0, axis=1)  # 1-based index of each strip's longest
    rows = np.arange(m)
    prev = np.full((m, n + 1), np.inf)
    prev[:, 0] = 0.0
    out = np.full((m, k), np.inf)
    for layer in range(min(k, n)):
        cur = np.full((m, n + 1), np.inf)
        for j in range(1, n + 1):
            cur[:, j] = (prev[:, :j] - c[j] * W[:, :j]).min(axis=1) + c[j] * W[:, j]
        out[:, layer] = cur[rows, last]
        prev = cur
    return np.minimum.accumulate(out, axis=1)


def _split_sources(
    src_cost: np.ndarray, f: np.ndarray, A: np.ndarray, B: np.ndarray, ns: int, k: int
) -> list[tuple[int, int, int]]:
    """The strips ``(a, b, cells)`` of the best hierarchical table: ``D[b, c]`` is the least
    cost of the sources up to candidate ``b`` in ``c`` cells."""
    D = np.full((ns + 1, k + 1), np.inf)
    D[0, 0] = 0.0
    choice = np.zeros((ns + 1, k + 1, 2), dtype=np.int64)
    for b in range(1, ns + 1):
        idx = np.flatnonzero(b == B)  # strips ending at b, one per a (a = A[idx])
        a = A[idx]
        for c in range(1, k + 1):
            j = np.arange(1, c + 1)  # cells given to this strip
            val = D[a][:, c - j] + src_cost[idx][:, None] + f[idx][:, j - 1]
            flat = int(np.argmin(val))
            if np.isfinite(val.flat[flat]):
                D[b, c] = val.flat[flat]
                choice[b, c] = (a[flat // c], j[flat % c])
    c = int(np.argmin(D[ns, 1:])) + 1
    strips: list[tuple[int, int, int]] = []
    b = ns
    while b > 0:
        start, given = int(choice[b, c, 0]), int(choice[b, c, 1])
        strips.append((start, b, given))
        b, c = start, c - given
    return strips[::-1]


def fit_cells(
    sources: Sequence[int] | np.ndarray,
    targets: Sequence[int] | np.ndarray,
    k: int = 8,
    *,
    align: int | tuple[int, int] = DEFAULT_ALIGN,
    grid: int = 64,
    weights: tuple[int, int] = (1, 1),
) -> Cells:
    """At most ``k`` aligned ``(source, target)`` cells with the fewest padded tokens.

    Args:
        sources, targets: each sample's source and target length (ints >= 1).
        k: the most cells (each is one compiled shape, times its row counts).
        align: every cell length is a multiple of this (an int, or one per side).
        grid: the most candidate boundaries per axis (quantiles past it).
        weights: ``(ws, wt)``: minimise ``ws * padded source + wt * padded target``
            (the cells returned carry them, for the edge rule).

    Exact over hierarchical tables on the candidate grid (module docstring);
    every cell returned receives samples.

    >>> fit_cells([10, 12, 100, 90], [90, 80, 5, 6], k=2)
    Cells([(16, 96), (104, 8)])
    """
    k = check_int("k", k, minimum=1)
    grid = check_int("grid", grid, minimum=2)
    ws, wt = _check_weights(weights)
    sa, ta, _, _ = _aligned(sources, targets, align)
    cs, ct = _grid(sa, grid), _grid(ta, grid)
    si = np.searchsorted(cs, sa, side="left")
    ti = np.searchsorted(ct, ta, side="left")
    ns, nt = len(cs), len(ct)
    hist = np.bincount(si * nt + ti, minlength=ns * nt).reshape(ns, nt).astype(np.float64)
    k = min(k, int(np.count_nonzero(hist)))  # one cell per occupied grid pair is the most
    C = np.concatenate([np.zeros((1, nt)), np.cumsum(hist, axis=0)])
    A, B = np.triu_indices(ns + 1, k=1)  # every strip (a, b] of source candidates
    strip_hist = C[B] - C[A]
    f = wt * _target_costs(strip_hist, ct, k)
    src_cost = ws * cs[B - 1] * strip_hist.sum(axis=1)
    out = []
    for a, b, j in _split_sources(src_cost, f, A, B, ns, k):
        h = strip_hist[(a == A) & (b == B)][0]
        top = int(np.flatnonzero(h)[-1]) + 1
        for T in optimal_boundaries(ct[:top], h[:top], ct[:top].astype(np.float64), j):
            out.append((int(cs[b - 1]), T))
    table = Cells(out, weights=(ws, wt))
    used = np.unique(table.index_for_many(sources, targets))
    return Cells([table.cells[i] for i in used.tolist()], weights=(ws, wt))


def cells_lower_bound(
    sources: Sequence[int] | np.ndarray,
    targets: Sequence[int] | np.ndarray,
    k: int = 8,
    *,
    align: int | tuple[int, int] = DEFAULT_ALIGN,
    weights: tuple[int, int] = (1, 1),
) -> int:
    """Padded tokens that no table of at most ``k`` aligned cells can go below: the exact
    1-D optimum of the sources with ``k`` buckets plus that of the targets (any ``k``
    cells have at most ``k`` distinct sources and ``k`` distinct targets, so each side
    is a ``k``-bucket table); with ``weights``, ``ws`` and ``wt`` times each.

    >>> cells_lower_bound([10, 12, 100, 90], [90, 80, 5, 6], k=2)
    448
    """
    k = check_int("k", k, minimum=1)
    sa, ta, a_s, a_t = _aligned(sources, targets, align)
    total = 0
    for lens, a, w in zip((sa, ta), (a_s, a_t), _check_weights(weights), strict=True):
        table = optimal_buckets(lens, k, align=a)
        total += w * int(table.bucket_for_many(lens).sum())
    return total
