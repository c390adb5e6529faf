"""Where a packed call's real tokens go: best-fit rows, the index grids that move the
tokens there and back, planned once per layout and kept (:class:`Layouts`).

A layout is a pure function of the samples' real lengths, the call's length, the row
length, the row buckets and whether document ids are made; a call only gathers
through it (:func:`~shapebucket.bucketed.packed.pack_into`). The index grids are built
on the host with numpy and copied to the call's device when the layout is planned
(two copies), never per call.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Layout", "Layouts", "PackedCall", "plan_layout", "rows_used"]


@dataclass(frozen=True)
class PackedCall:
    """What :func:`~shapebucket.bucketed.packed.unpack` needs to put a packed call's
    tokens back: ``rows x length`` is the caller's shape, ``packed_rows x row_length``
    the packed one; ``back[j]`` is the packed index of the caller's flat position ``j``
    (0 on its pads) and ``pads[j]`` whether that position is a pad (on the call's
    device): one gather and one fill put an output back."""

    rows: int
    length: int
    packed_rows: int
    row_length: int
    back: torch.Tensor
    pads: torch.Tensor


@dataclass(frozen=True)
class Layout:
    """A packed call's :class:`PackedCall` and what packing a key needs: ``take[p]``
    the caller's flat index of packed position ``p`` (0 on padding), ``empty[p]``
    whether ``p`` is padding, ``unlabelled`` the same plus each sample's first token
    (where shifted labels hold their pad value), and the packed ``positions`` and
    ``documents`` grids (``None`` when not made), all on the call's device."""

    call: PackedCall
    take: torch.Tensor
    empty: torch.Tensor
    unlabelled: torch.Tensor
    positions: torch.Tensor
    documents: torch.Tensor | None


class Layouts:
    """Layouts kept by ``(lengths, length, row_length, device)``, the least recently
    used dropped once the kept ones index more than ``max_tokens`` positions (packed
    and caller's; each costs at most 40 bytes on the call's device, so the default
    keeps under 11 MB). The key is everything a layout depends on besides the settings
    given here, so a kept layout is the one :func:`plan_layout` would build. Pickles and copies empty
    (a cache, rebuilt where it is used).

    >>> layouts = Layouts([1, 2], document_ids=False)
    >>> layouts.get((3,), 4, 4, torch.device("cpu")) is layouts.get((3,), 4, 4, torch.device("cpu"))
    True
    """

    def __init__(
        self, row_buckets: Sequence[int] | None, document_ids: bool, max_tokens: int = 1 << 18
    ) -> None:
        self.row_buckets = None if row_buckets is None else tuple(row_buckets)
        self.document_ids = document_ids
        self.max_tokens = max_tokens
        self._kept: OrderedDict[tuple[Any, ...], Layout] = OrderedDict()
        self._tokens = 0

    def get(
        self, lengths: tuple[int, ...], length: int, row_length: int, device: torch.device
    ) -> Layout:
        """The layout of a call of ``length`` tokens per row whose samples have
        ``lengths`` real tokens, packed into rows of ``row_length``."""
        key = (lengths, length, row_length, device)
        layout = self._kept.get(key)
        if layout is not None:
            self._kept.move_to_end(key)
            return layout
        layout = plan_layout(
            lengths, length, row_length, self.row_buckets, self.document_ids, device
        )
        size = layout.call.packed_rows * row_length + len(lengths) * length
        if size <= self.max_tokens:
            self._kept[key] = layout
            self._tokens += size
            while self._tokens > self.max_tokens:
                (old_lengths, old_length, *_), old = self._kept.popitem(last=False)
                self._tokens -= old.call.packed_rows * old.call.row_length
                self._tokens -= len(old_lengths) * old_length
        return layout

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def tokens(self) -> int:
        """The packed and caller positions the kept layouts index (at most ``max_tokens``)."""
        return self._tokens

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_kept": OrderedDict(), "_tokens": 0}


def _best_fit(
    lengths: Sequence[int], row_length: int
) -> tuple[list[int], list[int], list[int], int]:
    """``(row, start, number in row)`` of each sample packed best-fit decreasing, and the
    rows used (at least one). An empty sample takes no room (row 0, start 0)."""
    n = len(lengths)
    if n == 1:  # one sample, one row: nothing to search
        return [0], [0], [0], 1
    row, start, number = [0] * n, [0] * n, [0] * n
    used: list[int] = []  # tokens used per row
    count: list[int] = []  # samples per row
    # each row's room left and number as one int, room * M + row, kept sorted: the
    # best fit (least room that holds x, lowest row on a tie) is one bisection
    M = n + 1
    rooms: list[int] = []
    for i in sorted(range(n), key=lengths.__getitem__, reverse=True):  # stable
        x = lengths[i]
        if x == 0:
            continue
        at = bisect.bisect_left(rooms, x * M)
        if at < len(rooms):
            best = rooms.pop(at) % M
        else:
            best = len(used)
            used.append(0)
            count.append(0)
        row[i], start[i], number[i] = best, used[best], count[best]
        used[best] += x
        count[best] += 1
        bisect.insort(rooms, (row_length - used[best]) * M + best)
    return row, start, number, max(len(used), 1)


def rows_used(lengths: Sequence[int], row_length: int) -> int:
    """How many ``row_length``-token rows best-fit decreasing packs samples of ``lengths``
    into (before a row bucket pads them).

    >>> rows_used([2, 3, 2, 1], 4)
    2
    """
    return _best_fit(tuple(int(x) for x in lengths), row_length)[3]


def plan_layout(
    lengths: Sequence[int],
    length: int,
    row_length: int,
    row_buckets: Sequence[int] | None,
    document_ids: bool,
    device: torch.device,
) -> Layout:
    """The packed layout of a call of ``len(lengths)`` rows of ``length`` tokens whose
    samples have ``lengths`` real tokens: best-fit decreasing into ``row_length``-token
    rows (a 1-row call: its one sample in row 0, no search), padded to the smallest row
    bucket. Built outside inference mode, so a layout first planned under
    ``torch.inference_mode`` still serves a call that records gradients.

    >>> plan_layout([3, 1], 3, 4, None, False, torch.device("cpu")).positions.tolist()
    [[0, 1, 2, 0]]
    """
    lens = lengths if isinstance(lengths, tuple) else tuple(int(x) for x in lengths)
    row, start, number, used = _best_fit(lens, row_length)
    # the smallest row bucket that holds them (a call packed past them never gets here)
    P = used if row_buckets is None else min(b for b in row_buckets if b >= used)
    ln = np.array(lens, dtype=np.int64)
    rows, grid = len(lens), P * row_length
    caller = rows * length
    # sample i's token j: source i * length + j, target base[i] + j, position j
    within = np.arange(int(ln.sum())) - (np.cumsum(ln) - ln).repeat(ln)
    base = np.array(row, dtype=np.int64) * row_length + np.array(start, dtype=np.int64)
    source = (np.arange(rows, dtype=np.int64) * length).repeat(ln) + within
    target = base.repeat(ln) + within
    # every index grid in one int64 buffer and every flag in one bool buffer: two
    # copies to the device per layout planned, none per call
    sizes = [caller, grid, grid] + ([grid] if document_ids else [])
    ints = np.zeros(sum(sizes), np.int64)
    back, take, positions, *documents = np.split(ints, np.cumsum(sizes)[:-1])
    take[target], back[source], positions[target] = source, target, within
    if document_ids:
        documents[0].fill(-1)
        documents[0][target] = np.array(number, dtype=np.int64).repeat(ln)
    flags = np.ones(caller + 2 * grid, np.bool_)
    pads, empty, unlabelled = np.split(flags, [caller, caller + grid])
    pads[source], empty[target], unlabelled[target] = False, False, False
    unlabelled[base[ln > 0]] = True  # each sample's first token: a shifted label's pad
    with torch.inference_mode(False):  # a layout planned under inference mode serves any call
        bk, tk, pos, *docs = torch.from_numpy(ints).to(device).split_with_sizes(sizes)
        pd, em, un = torch.from_numpy(flags).to(device).split_with_sizes([caller, grid, grid])
        doc = docs[0].to(torch.int32).view(P, row_length) if docs else None
    call = PackedCall(rows, length, P, row_length, bk, pd)
    return Layout(call, tk, em, un, pos.view(P, row_length), doc)
