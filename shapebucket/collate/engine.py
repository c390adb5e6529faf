"""The padding engine: flat values plus a :class:`Layout` become padded tensors and masks,
for every path (``docs/collate.md``, "One padding engine")."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from . import kernel

__all__ = [
    "SIGNED",
    "Key",
    "Layout",
    "assemble",
    "pad",
    "pad_rows",
    "regrid",
    "regrid_boundaries",
    "signed_view",
]

Key = Hashable

#: torch has no ``masked_scatter_``/indexing kernels (and no unpickling, in 2.13) for the
#: wide unsigned types: their bits are moved as the signed type of the same width.
SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


#: dtypes whose CPU tensors have a numpy view (the engine scatters 1-D keys through it)
_NUMPY = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
}  # fmt: skip


def signed_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` reinterpreted bit for bit as a signed type when torch lacks kernels for its own."""
    return t.view(SIGNED[t.dtype]) if t.dtype in SIGNED else t


@dataclass(frozen=True)
class Layout:
    """Where each sample of a batch goes in its ``[rows, length]`` grid of tokens.

    ``lengths`` (int64 ``[n]``) are the samples' lengths after any truncation.
    With ``row``/``start`` left ``None``, sample ``i`` fills row ``i`` from
    position 0 (or ends at ``length`` with ``left``); packed layouts give each
    sample's row and start, samples in row order and, inside a row, in
    position order (as :func:`~shapebucket.fit.packing.pack_rows` lays them).
    ``seq_dim`` is the sequence dim of a sample's values: the batch puts the
    ``length`` at ``seq_dim + 1``.

    >>> lay = Layout(torch.tensor([3, 1]), rows=3, length=4)
    >>> lay.token_mask().int().tolist()
    [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    >>> pad(torch.tensor([1, 2, 3, 4]), lay, -1).tolist()
    [[1, 2, 3, -1], [4, -1, -1, -1], [-1, -1, -1, -1]]
    """

    lengths: torch.Tensor
    rows: int
    length: int
    row: torch.Tensor | None = None
    start: torch.Tensor | None = None
    left: bool = False
    seq_dim: int = 0

    @property
    def packed(self) -> bool:
        """Whether a row may hold several samples."""
        return self.row is not None

    @property
    def n(self) -> int:
        return int(self.lengths.shape[0])

    def used_rows(self) -> int:
        """Rows that hold at least one sample (the rest are all padding)."""
        if self.row is None:
            return self.n
        return int(self.row[-1]) + 1 if self.n else 0

    def _starts(self) -> torch.Tensor:
        if self.start is not None:
            return self.start
        if self.left:
            return self.length - self.lengths
        return torch.zeros_like(self.lengths)

    def _rows(self) -> torch.Tensor:
        if self.row is not None:
            return self.row
        return torch.arange(self.n, device=self.lengths.device)

    def within(self) -> torch.Tensor:
        """Each real token's position in its own sample, in sample order (int64 ``[total]``)."""
        total = int(self.lengths.sum())
        offsets = torch.cumsum(self.lengths, 0) - self.lengths
        return torch.arange(total, device=self.lengths.device) - torch.repeat_interleave(
            offsets, self.lengths, output_size=total
        )

    def token_index(self, within: torch.Tensor | None = None) -> torch.Tensor:
        """Each real token's place in the flattened ``rows * length`` grid (int64)."""
        within = self.within() if within is None else within
        base = self._rows() * self.length + self._starts()
        total = len(within)
        return torch.repeat_interleave(base, self.lengths, output_size=total) + within

    def token_mask(self) -> torch.Tensor:
        """Bool ``[rows, length]``: True exactly on real tokens."""
        device = self.lengths.device
        if self.packed:
            mask = torch.zeros(self.rows * self.length, dtype=torch.bool, device=device)
            mask[self.token_index()] = True
            return mask.view(self.rows, self.length)
        real = self.sample_rows
        if self.rows == self.n:
            return real
        mask = torch.zeros(self.rows, self.length, dtype=torch.bool, device=device)
        mask[: self.n] = real
        return mask

    @cached_property
    def sample_rows(self) -> torch.Tensor:
        """Bool ``[n, length]`` of a one-sample-per-row layout: sample ``i``'s tokens in row ``i``."""
        if self.lengths.device.type == "cpu":  # numpy: the same compare, less overhead
            lengths = self.lengths.numpy()[:, None]
            places = np.arange(self.length)[None, :]
            real = places >= self.length - lengths if self.left else places < lengths
            return torch.from_numpy(real)
        positions = torch.arange(self.length, device=self.lengths.device)
        if self.left:
            return positions[None, :] >= (self.length - self.lengths)[:, None]
        return positions[None, :] < self.lengths[:, None]

    def row_mask(self) -> torch.Tensor:
        """Bool ``[rows]``: True on rows that hold a sample."""
        mask = torch.zeros(self.rows, dtype=torch.bool, device=self.lengths.device)
        mask[: self.used_rows()] = True
        return mask

    def positions(self) -> torch.Tensor:
        """Int64 ``[rows, length]``: each token's position in its sample, 0 on padding."""
        within = self.within()
        out = torch.zeros(self.rows * self.length, dtype=torch.int64, device=within.device)
        out[self.token_index(within)] = within
        return out.view(self.rows, self.length)

    def documents(self) -> torch.Tensor:
        """Int32 ``[rows, length]``: each token's sample number inside its row (0, 1, ...),
        -1 on padding."""
        rows = self._rows()
        # rows are sorted: a sample's number in its row is its index minus its row's first
        first = torch.searchsorted(rows, rows)
        number = (torch.arange(self.n, device=rows.device) - first).to(torch.int32)
        out = torch.full((self.rows * self.length,), -1, dtype=torch.int32, device=rows.device)
        total = int(self.lengths.sum())
        out[self.token_index()] = torch.repeat_interleave(number, self.lengths, output_size=total)
        return out.view(self.rows, self.length)

    def cu_seqlens(self) -> torch.Tensor:
        """Int32 ``[rows * length + 1]``: segment boundaries over the flattened grid (each
        sample, each row's padding tail), padded with the total so the shape is static."""
        R, L, device = self.rows, self.length, self.lengths.device
        ends = self._rows() * L + self._starts() + self.lengths
        row_used = torch.zeros(R, dtype=torch.int64, device=device)
        row_used.scatter_reduce_(0, self._rows(), self._starts() + self.lengths, reduce="amax")
        tails = (torch.arange(R, device=device) * L + L)[row_used < L]
        zero = torch.zeros(1, dtype=torch.int64, device=device)
        bounds = torch.unique(torch.cat([zero, ends, tails]))
        out = torch.full((R * L + 1,), R * L, dtype=torch.int32, device=device)
        out[: len(bounds)] = bounds.to(torch.int32)
        return out


def pad(
    flat: torch.Tensor, layout: Layout, value: Any, *, use_triton: bool | None = None
) -> torch.Tensor:
    """The batch tensor of one key: ``flat`` (``[sum(lengths), *trailing]``, samples in
    order) laid out by ``layout``, every other place ``value``, with the sequence at dim
    ``layout.seq_dim + 1``. ``value`` must fit ``flat.dtype`` (the collators check it).

    ``use_triton``: default on CUDA tensors when triton is installed, and under
    ``TRITON_INTERPRET=1``; used for one-sample-per-row layouts of real dtypes (packed
    layouts and complex values are written by torch, with the same result).
    """
    trailing = tuple(flat.shape[1:])
    R, L = layout.rows, layout.length
    if use_triton is None:
        use_triton = kernel.usable(flat)
    out = torch.full((R, L, *trailing), value, dtype=flat.dtype, device=flat.device)
    if flat.shape[0]:
        target = signed_view(out)
        if use_triton and not layout.packed and not flat.dtype.is_complex:
            kernel.pad_rows(signed_view(flat), target, layout.lengths, left=layout.left)
        elif layout.packed:
            target.view(R * L, *trailing)[layout.token_index()] = signed_view(flat)
        else:
            n = layout.n
            view = target[:n] if n != R else target
            source = signed_view(flat)
            if not trailing and view.device.type == "cpu" and view.dtype in _NUMPY:
                # numpy's boolean assignment: the same scatter, about 3x faster on CPU
                view.numpy()[layout.sample_rows.numpy()] = source.numpy()
            else:
                view.masked_scatter_(layout.sample_rows.view(n, L, *([1] * len(trailing))), source)
    if layout.seq_dim:
        out = out.movedim(1, layout.seq_dim + 1).contiguous()
    return out


def assemble(
    keys: list[Key],
    values: Mapping[Key, torch.Tensor],
    pads: Mapping[Key, Any],
    stacked: Mapping[Key, Any],
    layout: Layout,
    *,
    mask_key: Key | None,
    row_mask_key: Key | None = None,
    use_triton: bool | None = None,
) -> dict[Key, Any]:
    """The padded batch: each key of ``keys`` in order (padded from ``values``, or taken
    from ``stacked``), then the token mask under ``mask_key`` (unless a key of the samples
    already has that name) and the row mask under ``row_mask_key`` (``None``: none)."""
    out: dict[Key, Any] = {}
    for k in keys:
        if k in values:
            out[k] = pad(values[k], layout, pads[k], use_triton=use_triton)
        else:
            out[k] = stacked[k]
    if mask_key is not None and mask_key not in out:
        out[mask_key] = layout.token_mask()
    if row_mask_key is not None:
        out[row_mask_key] = layout.row_mask()
    return out


# -- re-padding a padded batch value (the batches prewarm compiles for) ---------------------


def regrid(
    value: torch.Tensor, dim: int, rows: int, length: int, fill: Any, *, left: bool = False
) -> torch.Tensor:
    """A padded batch value (``[n, ..., L, ...]``, ``L`` at ``dim`` >= 1) laid out again in
    ``rows`` rows of ``length``: each of the first ``min(n, rows)`` rows keeps its first
    (``left``: last) ``min(L, length)`` places, written by :func:`pad` as one sample per
    row; every other place is ``fill``.

    >>> regrid(torch.tensor([[1, 2, 0], [3, 0, 0]]), 1, 3, 4, 0).tolist()
    [[1, 2, 0, 0], [3, 0, 0, 0], [0, 0, 0, 0]]
    """
    n, old = int(value.shape[0]), int(value.shape[dim])
    keep_rows, keep = min(n, rows), min(old, length)
    kept = value[:keep_rows].narrow(dim, old - keep if left else 0, keep).movedim(dim, 1)
    flat = kept.reshape(keep_rows * keep, *kept.shape[2:])
    lengths = torch.full((keep_rows,), keep, dtype=torch.int64, device=value.device)
    layout = Layout(lengths, rows=rows, length=length, left=left, seq_dim=dim - 1)
    return pad(flat, layout, fill, use_triton=False)


def pad_rows(value: torch.Tensor | list[Any], rows: int, fill: Any) -> Any:
    """A per-row value cut or padded to ``rows`` rows: a tensor (``[n, ...]``) with
    ``fill``, a list (one entry per row, anything in it) with ``None``.

    >>> pad_rows(torch.tensor([True, True]), 3, False).tolist(), pad_rows(["a"], 2, 0)
    ([True, True, False], ['a', None])
    """
    if isinstance(value, list):
        return value[:rows] + [None] * (rows - len(value))
    out = torch.full((rows, *value.shape[1:]), fill, dtype=value.dtype, device=value.device)
    keep = min(rows, int(value.shape[0]))
    signed_view(out)[:keep] = signed_view(value[:keep])
    return out


def regrid_boundaries(
    cu: torch.Tensor, grid: tuple[int, int], rows: int, length: int
) -> torch.Tensor:
    """Varlen boundaries over a ``grid = (rows, length)`` batch (:meth:`Layout.cu_seqlens`)
    moved to ``rows`` rows of ``length``: a segment cut by a shorter row ends at the row's
    end, a longer row's new places are one more padding segment, new rows one segment
    each; padded with the total to ``rows * length + 1`` entries.

    >>> cu = Layout(torch.tensor([2, 1]), rows=1, length=4, row=torch.tensor([0, 0]),
    ...             start=torch.tensor([0, 2])).cu_seqlens()
    >>> cu.tolist(), regrid_boundaries(cu, (1, 4), 2, 6).tolist()[:6]
    ([0, 2, 3, 4, 4], [0, 2, 3, 4, 6, 12])
    """
    old_rows, old = grid
    bounds = torch.unique(cu.to(torch.int64))
    r = bounds.div(old, rounding_mode="floor")
    c = bounds - r * old
    inside = r < rows
    moved = r[inside] * length + c[inside].clamp(max=length)
    starts = torch.arange(rows + 1, dtype=torch.int64) * length
    parts = [moved.cpu(), starts]
    if length > old:  # the old row end: the new places are a padding segment of their own
        parts.append(torch.arange(min(rows, old_rows), dtype=torch.int64) * length + old)
    bounds = torch.unique(torch.cat(parts))
    out = torch.full((rows * length + 1,), rows * length, dtype=torch.int32)
    out[: len(bounds)] = bounds.to(torch.int32)
    return out.to(cu.device)
