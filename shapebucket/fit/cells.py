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

The cells are fitted by :func:`~.cell_fit.fit_cells`; the reasoning: ``docs/two_length.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from .._lengths import MAX_BUCKET, check_lengths
from .._validate import check_int
from ..errors import ShapeBucketError

__all__ = ["MAX_WEIGHT", "Cells", "check_pair", "check_weights"]

_CHUNK = 1 << 16  # samples per vectorised containment test (x cells bools)
#: The largest weight of a side: the cost ``ws * S + wt * T`` stays far inside int64.
MAX_WEIGHT = 2**30


def check_pair(
    value: Any, what: str, sides: tuple[str, str], low: int, high: int, *, or_int: bool = False
) -> tuple[int, int]:
    """``value`` as a ``(source, target)`` pair of ints in ``[low, high]``; ``sides`` name them,
    ``or_int`` says the caller also takes one int for both."""
    pair = (
        tuple(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes)) else ()
    )
    if len(pair) != 2:
        raise ShapeBucketError(
            f"{what} must be {'an int or ' if or_int else ''}a (source, target) pair of ints "
            f">= {low}, got {value!r}"
        )
    return (
        check_int(sides[0], pair[0], minimum=low, maximum=high),
        check_int(sides[1], pair[1], minimum=low, maximum=high),
    )


def check_weights(weights: Any) -> tuple[int, int]:
    """``weights`` as a ``(source, target)`` pair of ints in ``[1, MAX_WEIGHT]``."""
    return check_pair(weights, "weights", ("source weight", "target weight"), 1, MAX_WEIGHT)


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
        ws, wt = check_weights(weights)
        object.__setattr__(self, "_weights", (ws, wt))
        if isinstance(cells, Cells):
            pairs = list(cells.cells)
        else:
            if isinstance(cells, (str, bytes)) or not isinstance(cells, Iterable):
                raise ShapeBucketError(
                    f"Cells takes (source, target) pairs, got {cells!r}; e.g. Cells([(64, 16)])"
                )
            pairs = [
                check_pair(c, f"cell {i}", (f"cell {i} source", f"cell {i} target"), 2, MAX_BUCKET)
                for i, c in enumerate(cells)
            ]
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
