"""Device-side padding: workers send a :class:`FlatBatch`, the device pads it
(``docs/collate.md``, "Device-side padding")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..errors import ShapeBucketError
from .engine import SIGNED, Key, Layout, assemble

__all__ = ["FlatBatch", "to_device"]


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
            k: (v.view(SIGNED[v.dtype]), str(v.dtype)) if v.dtype in SIGNED else v
            for k, v in self.values.items()
        }
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        names = {str(u): u for u in SIGNED}
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

    def layout(self) -> Layout:
        """Where the samples go: the engine's :class:`~.engine.Layout` of this batch."""
        return Layout(
            self.lengths,
            rows=self.rows,
            length=self.bucket,
            left=self.padding_side == "left",
            seq_dim=self.seq_dim,
        )

    def finish(self, *, use_triton: bool | None = None) -> dict[Key, Any]:
        """The padded batch, on the device the values are on; equal to what the collator
        returns for the same samples (the same engine makes both). ``use_triton``: default
        on CUDA tensors when triton is installed, and under ``TRITON_INTERPRET=1``;
        ``False`` forces torch."""
        if use_triton not in (None, True, False):
            raise ShapeBucketError(f"use_triton must be True, False or None, got {use_triton!r}")
        return assemble(
            self.keys,
            self.values,
            self.pads,
            self.stacked,
            self.layout(),
            mask_key=self.mask_key,
            row_mask_key=self.sample_mask_key,
            use_triton=use_triton,
        )


def to_device(batch: Any, device: Any, non_blocking: bool = False) -> Any:
    """``batch`` with every tensor on ``device``, those in nested mappings, lists and
    tuples too (document blocks, a model's positional inputs)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device, non_blocking) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch
