"""Device-side padding: workers send flat values, the device writes the padded batch.

``BucketCollator.flat(samples)`` does everything a collator does on the host
except the padding: it checks the samples (dtypes, lengths, pad values,
collisions), picks the bucket and the rows, concatenates each sequence key's
values into one flat tensor, and returns a :class:`FlatBatch`. A DataLoader
moves that (one pinned copy per key, ``rows x bucket`` never crosses the bus
for padding) and :meth:`FlatBatch.finish` writes the padded ``[rows, bucket,
...]`` tensors and the masks where the values are: with a triton kernel on a
CUDA device (or anywhere under ``TRITON_INTERPRET=1``), with torch indexing
otherwise. The result equals what ``collator(samples)`` returns, value for
value and dtype for dtype (``tests/test_device_pad.py``)::

    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=collate.flat, pin_memory=True)
    for flat in loader:
        batch = flat.to("cuda", non_blocking=True).finish()
"""

from __future__ import annotations

import functools
import os
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .samples import signed_view

__all__ = ["FlatBatch", "pad_flat", "triton_available"]

Key = Hashable
_UNSIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


@dataclass
class FlatBatch:
    """One batch before padding: each sequence key's values concatenated along the
    sequence dim, the samples' lengths, and where they go (bucket, rows, side).

    ``stacked`` holds the keys the collator stacks (already ``rows`` long);
    ``keys`` is the order of the batch's keys. Picklable; ``pin_memory()`` and
    ``to(device)`` move every tensor.

    >>> from shapebucket import BucketCollator
    >>> collate = BucketCollator([4, 8])
    >>> flat = collate.flat([{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    >>> flat.values["input_ids"].tolist(), flat.lengths.tolist(), flat.bucket
    ([1, 2, 3, 4], [3, 1], 4)
    >>> flat.finish()["input_ids"].tolist()
    [[1, 2, 3, 0], [4, 0, 0, 0]]
    """

    values: dict[Key, torch.Tensor]
    lengths: torch.Tensor  # int64 [n]
    bucket: int
    rows: int
    pads: dict[Key, Any]
    padding_side: str = "right"
    seq_dim: int = 0
    stacked: dict[Key, Any] = field(default_factory=dict)
    keys: list[Key] = field(default_factory=list)
    mask_key: str | None = "attention_mask"
    sample_mask_key: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # torch 2.13 cannot unpickle uint16/32/64 tensors: ship their bits as the signed type
        state = dict(self.__dict__)
        state["values"] = {
            k: (v.view(_UNSIGNED[v.dtype]), str(v.dtype)) if v.dtype in _UNSIGNED else v
            for k, v in self.values.items()
        }
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        names = {str(u): u for u in _UNSIGNED}
        state["values"] = {
            k: v[0].view(names[v[1]]) if isinstance(v, tuple) else v
            for k, v in state["values"].items()
        }
        self.__dict__.update(state)

    def _map(self, fn: Any) -> FlatBatch:
        def move(v: Any) -> Any:
            return fn(v) if isinstance(v, torch.Tensor) else v

        return replace(
            self,
            values={k: move(v) for k, v in self.values.items()},
            lengths=move(self.lengths),
            stacked={k: move(v) for k, v in self.stacked.items()},
        )

    def to(self, device: Any, non_blocking: bool = False) -> FlatBatch:
        """This batch with every tensor on ``device``."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> FlatBatch:
        """This batch in pinned host memory (what ``DataLoader(pin_memory=True)`` calls)."""
        return self._map(lambda t: t.pin_memory())

    def finish(self, *, use_triton: bool | None = None) -> dict[Key, Any]:
        """The padded batch, on the device the values are on; equal to what the collator
        returns for the same samples. ``use_triton``: default on CUDA tensors when triton
        is installed, and under ``TRITON_INTERPRET=1``; ``False`` forces torch indexing."""
        n = len(self.lengths)
        device = self.lengths.device
        lengths = self.lengths
        offsets = torch.cumsum(lengths, 0) - lengths
        out: dict[Key, Any] = {}
        for k in self.keys:
            if k in self.values:
                v = pad_flat(
                    self.values[k],
                    lengths,
                    offsets,
                    rows=self.rows,
                    length=self.bucket,
                    pad=self.pads[k],
                    left=self.padding_side == "left",
                    use_triton=use_triton,
                )
                if self.seq_dim:
                    v = v.movedim(1, self.seq_dim + 1).contiguous()
                out[k] = v
            else:
                out[k] = self.stacked[k]
        positions = torch.arange(self.bucket, device=device)
        if self.padding_side == "right":
            mask = positions[None, :] < lengths[:, None]
        else:
            mask = positions[None, :] >= (self.bucket - lengths)[:, None]
        if self.mask_key is not None and self.mask_key not in self.keys:
            full = torch.zeros(self.rows, self.bucket, dtype=torch.bool, device=device)
            full[:n] = mask
            out[self.mask_key] = full
        if self.sample_mask_key is not None:
            rows = torch.zeros(self.rows, dtype=torch.bool, device=device)
            rows[:n] = True
            out[self.sample_mask_key] = rows
        return out


def triton_available() -> bool:
    """Whether triton imports here."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=2)
def _kernel(interpret: bool) -> Any:
    """The triton kernel, built on first use (``TRITON_INTERPRET`` is read when a kernel
    is defined, so one is kept per setting)."""
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[misc]
    def pad_rows(src, offsets, lengths, pad, out, n, L, F, LEFT: tl.constexpr, BLOCK: tl.constexpr):
        # program (r, b): row r of the output, elements b * BLOCK ... of its L * F values
        r = tl.program_id(0)
        e = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = e < L * F
        p = e // F  # position in the row
        f = e % F  # index in the trailing dims
        has = r < n
        ln = tl.load(lengths + r, mask=has, other=0)
        off = tl.load(offsets + r, mask=has, other=0)
        q = p - (L - ln) * LEFT  # the sample's own position (LEFT: 1 for left padding)
        real = inside & (q >= 0) & (q < ln)
        x = tl.load(src + (off + q) * F + f, mask=real, other=0)
        fill = tl.load(pad)
        tl.store(out + r * L * F + e, tl.where(real, x, fill), mask=inside)

    return pad_rows


def pad_flat(
    flat: torch.Tensor,
    lengths: torch.Tensor,
    offsets: torch.Tensor,
    *,
    rows: int,
    length: int,
    pad: Any,
    left: bool = False,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """``[rows, length, *trailing]`` from ``flat = [sum(lengths), *trailing]``: sample ``i``'s
    values ``flat[offsets[i]:][:lengths[i]]`` in row ``i`` (at the end with ``left``), the
    rest ``pad``; rows past ``len(lengths)`` are all ``pad``.

    >>> flat = torch.tensor([1, 2, 3, 4])
    >>> pad_flat(flat, torch.tensor([3, 1]), torch.tensor([0, 3]), rows=3, length=4, pad=-1).tolist()
    [[1, 2, 3, -1], [4, -1, -1, -1], [-1, -1, -1, -1]]
    """
    trailing = tuple(flat.shape[1:])
    out = torch.full((rows, length, *trailing), pad, dtype=flat.dtype, device=flat.device)
    if use_triton is None:
        use_triton = triton_available() and (flat.is_cuda or _interpreting())
    n = len(lengths)
    if not use_triton:
        total = int(lengths.sum())
        if total:
            tok_row = torch.repeat_interleave(torch.arange(n, device=flat.device), lengths)
            within = torch.arange(total, device=flat.device) - torch.repeat_interleave(
                offsets, lengths
            )
            pos = within + (length - lengths)[tok_row] if left else within
            signed_view(out)[tok_row, pos] = signed_view(flat)
        return out
    if out.numel() == 0:
        return out
    work, target = flat, out
    if flat.dtype == torch.bool:  # triton's i1 pointers: move bytes instead
        work, target = flat.view(torch.uint8), out.view(torch.uint8)
    elif flat.dtype in _UNSIGNED:  # same bits, signed type
        work, target = flat.view(_UNSIGNED[flat.dtype]), out.view(_UNSIGNED[flat.dtype])
    fill = target.reshape(-1)[:1].clone()  # the pad value, exactly, in the stored dtype
    F = 1
    for d in trailing:
        F *= d
    BLOCK = 1024
    grid = (rows, -(-(length * F) // BLOCK))
    _kernel(_interpreting())[grid](
        work.contiguous(), offsets, lengths, fill, target, n, length, F, LEFT=int(left), BLOCK=BLOCK
    )
    return out
