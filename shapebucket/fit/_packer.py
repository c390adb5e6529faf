"""The packer behind :func:`~shapebucket.fit.packing.pack_epoch`: best-fit decreasing into
open rows, window by window (the steps: ``docs/packing.md``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


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

    def new(self, m: int, cls: int) -> np.ndarray:
        """Ids of ``m`` new rows of class ``cls``."""
        if self.n + m > len(self.rem):
            self._grow(max(2 * len(self.rem), self.n + m))
        ids = np.arange(self.n, self.n + m, dtype=np.int64)
        self.n += m
        self.cls[ids] = cls
        return ids

    def _grow(self, size: int) -> None:
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


class Packer:
    """Best-fit decreasing into open rows, window by window; closed rows become steps.

    Row lengths are *classes* ``c`` (``Ls[c]`` tokens, ``R[c]`` rows per batch, from
    ``rows``); a global step of class ``c`` is ``W * R[c]`` rows, ``W`` the world size.
    """

    def __init__(self, lengths: np.ndarray, rows: Mapping[int, int], W: int) -> None:
        self.lengths, self.W = lengths, W
        self.Ls = Ls = np.asarray(sorted(rows), dtype=np.int64)
        self.R = np.asarray([rows[L] for L in sorted(rows)], dtype=np.int64)
        self.rows = _Rows(max(16, len(lengths) // 2), int(Ls[-1]))
        self.pending: list[list[np.ndarray]] = [[] for _ in Ls]  # open rows per class, oldest first
        self.n_pending = np.zeros(len(Ls), dtype=np.int64)
        self.placed_sample: list[np.ndarray] = []
        self.placed_row: list[np.ndarray] = []
        self.step_cls: list[int] = []

    def place(self, samples: np.ndarray, rows: np.ndarray) -> None:
        self.placed_sample.append(samples)
        self.placed_row.append(rows)

    def window(self, idx: np.ndarray) -> None:
        """Place one window's samples, longest first, then close every class's full steps."""
        ln = self.lengths[idx]
        srt = np.argsort(-ln, kind="stable")
        idx, ln = idx[srt], ln[srt]
        cuts = np.flatnonzero(np.diff(ln)) + 1
        heads = ln[np.concatenate([[0], cuts])].tolist()
        for part, L in zip(np.split(idx, cuts), heads, strict=True):
            rest = self._best_fit(part, int(L))
            if len(rest):
                self._open(rest, int(L))
        for c in range(len(self.Ls)):
            g = self.W * int(self.R[c])
            full = int(self.n_pending[c]) // g * g
            if full:
                self._close(c, full)

    def _best_fit(self, part: np.ndarray, L: int) -> np.ndarray:
        """Put samples of length ``L`` into the open rows with the least room that fits;
        return those no open row holds."""
        rows = self.rows
        pos = 0
        while pos < len(part):
            room = np.flatnonzero(rows.count[L:])
            if not len(room):
                break
            r = L + int(room[0])
            k = min(len(part) - pos, int(rows.count[r]))
            ids = rows.take(r, k)
            self.place(part[pos : pos + k], ids)
            rows.rem[ids] = r - L
            rows.add(r - L, ids)
            pos += k
        return part[pos:]

    def _open(self, rest: np.ndarray, L: int) -> None:
        """Open rows of the smallest class that holds length ``L``, ``Ls[c] // L`` samples each."""
        c = int(np.searchsorted(self.Ls, L))
        q = int(self.Ls[c]) // L
        m = -(-len(rest) // q)
        new = self.rows.new(m, c)
        self.place(rest, new[np.arange(len(rest)) // q])
        fill = np.bincount(np.arange(len(rest)) // q, minlength=m) * L
        self.rows.rem[new] = self.Ls[c] - fill
        for room_left in np.unique(self.rows.rem[new]).tolist():
            self.rows.add(room_left, new[self.rows.rem[new] == room_left])
        self.pending[c].append(new)
        self.n_pending[c] += m

    def _take_pending(self, c: int, k: int) -> np.ndarray:
        """Close the ``k`` oldest open rows of class ``c``."""
        pending = self.pending[c]
        ids = np.concatenate(pending) if pending else np.zeros(0, dtype=np.int64)
        ids, rest = ids[:k], ids[k:]
        self.pending[c] = [rest] if len(rest) else []
        self.n_pending[c] -= k
        self.rows.closed[ids] = True
        np.subtract.at(self.rows.count, self.rows.rem[ids], 1)
        return ids

    def _close(self, c: int, k: int) -> None:
        """Cut ``k`` (a multiple of ``W * R[c]``) oldest open rows of class ``c`` into steps."""
        ids = self._take_pending(c, k)
        rows, Rc, g = self.rows, int(self.R[c]), self.W * int(self.R[c])
        j = np.arange(k)
        rows.step[ids] = len(self.step_cls) + j // g
        rows.rank[ids] = (j % g) // Rc
        rows.slot[ids] = j % Rc
        self.step_cls.extend([c] * (k // g))

    def pack(self, order: np.ndarray, window: int) -> Packer:
        """The samples of ``order``, ``window`` at a time; after the last window each class's
        open rows form one short step."""
        for lo in range(0, len(order), window):
            self.window(order[lo : lo + window])
        for c in range(len(self.Ls)):
            if self.n_pending[c]:
                self._close_short(c, int(self.n_pending[c]))
        return self

    def _close_short(self, c: int, k: int) -> None:
        """One short step of ``k`` rows, dealt round-robin to the ranks; a rank left
        without a row gets a copy of one (counted as duplicated)."""
        ids = self._take_pending(c, k)
        rows, first = self.rows, len(self.step_cls)
        j = np.arange(k)
        rows.step[ids] = first
        rows.rank[ids] = j % self.W
        rows.slot[ids] = j // self.W
        self.step_cls.append(c)
        if k >= self.W:
            return
        all_rows, all_samples = np.concatenate(self.placed_row), np.concatenate(self.placed_sample)
        for r in range(k, self.W):
            new = self.rows.new(1, c)
            rows.closed[new] = True
            rows.step[new], rows.rank[new], rows.slot[new] = first, r, 0
            dup = all_samples[all_rows == ids[r % k]]
            self.place(dup, np.full(len(dup), int(new[0]), dtype=np.int64))

    def placements(self) -> tuple[np.ndarray, np.ndarray]:
        """``(sample, row)`` of every placement, duplicates included."""
        if not self.placed_sample:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(self.placed_sample), np.concatenate(self.placed_row)
