"""Two-length cells against a dataset's pairs of lengths: ``fit_cells`` (exact over
hierarchical tables: source strips, each with its own target boundaries),
``cells_lower_bound`` (which no ``k`` cells go below; the reasoning: ``docs/two_length.md``)
and ``cells_report`` (how much a table pads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lengths import MAX_BUCKET, check_lengths, round_up
from .._validate import check_int
from ..errors import ShapeBucketError
from .cells import Cells, check_pair, check_weights
from .optimal import DEFAULT_ALIGN, optimal_boundaries, weighted_fit

__all__ = ["CellsReport", "cells_lower_bound", "cells_report", "fit_cells"]


def _aligned(
    sources: Sequence[int] | np.ndarray, targets: Sequence[int] | np.ndarray, align: object
) -> tuple[np.ndarray, np.ndarray, int, int]:
    s, t = check_lengths(sources, name="sources"), check_lengths(targets, name="targets")
    if s.shape != t.shape:
        raise ShapeBucketError(
            f"{len(s)} source lengths and {len(t)} target lengths; give both lengths of every sample"
        )
    pair = align if isinstance(align, (tuple, list)) else (align, align)
    a_s, a_t = check_pair(
        pair, "align", ("source align", "target align"), 1, MAX_BUCKET, or_int=True
    )
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

    Exact over hierarchical tables on the candidate grid (``docs/two_length.md``);
    every cell returned receives samples.

    >>> fit_cells([10, 12, 100, 90], [90, 80, 5, 6], k=2)
    Cells([(16, 96), (104, 8)])
    """
    k = check_int("k", k, minimum=1)
    grid = check_int("grid", grid, minimum=2)
    ws, wt = check_weights(weights)
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
    for lens, a, w in zip((sa, ta), (a_s, a_t), check_weights(weights), strict=True):
        table = np.array(weighted_fit(lens, np.ones(len(lens)), k, a))
        total += w * int(table[np.searchsorted(table, lens)].sum())
    return total


@dataclass(frozen=True)
class CellsReport:
    """How much a cell table pads a dataset (each sample in its cell, rows not padded).

    ``token_efficiency`` is the real share of all padded tokens, source and
    target together; ``source_efficiency`` and ``target_efficiency`` each side's.
    ``num_shapes`` counts the cells that receive samples.
    """

    num_samples: int
    num_shapes: int
    token_efficiency: float
    source_efficiency: float
    target_efficiency: float
    samples_per_cell: dict[tuple[int, int], int]


def cells_report(
    cells: Cells | Sequence[Any], sources: Sequence[int] | np.ndarray, targets: Any
) -> CellsReport:
    """Pad each sample to its cell and count.

    >>> r = cells_report(Cells([(8, 8), (16, 8)]), [4, 16], [8, 2])
    >>> r.num_shapes, r.token_efficiency
    (2, 0.75)
    """
    table = cells if isinstance(cells, Cells) else Cells(cells)
    s, t = check_lengths(sources), check_lengths(targets)
    index = table.index_for_many(s, t)
    src = np.asarray([c[0] for c in table.cells], dtype=np.int64)[index]
    tgt = np.asarray([c[1] for c in table.cells], dtype=np.int64)[index]
    counts = np.bincount(index, minlength=len(table))
    used = {table.cells[j]: int(n) for j, n in enumerate(counts.tolist()) if n}
    return CellsReport(
        num_samples=len(s),
        num_shapes=len(used),
        token_efficiency=float((s.sum() + t.sum()) / (src.sum() + tgt.sum())),
        source_efficiency=float(s.sum() / src.sum()),
        target_efficiency=float(t.sum() / tgt.sum()),
        samples_per_cell=used,
    )
