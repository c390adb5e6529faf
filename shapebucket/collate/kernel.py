"""The engine's triton kernel: one-sample-per-row padding on CUDA (anywhere under
``TRITON_INTERPRET=1``), int64 offsets, launches within CUDA's grid (:func:`launches`);
:func:`offsets` runs its offset arithmetic alone, so a test checks it at any size."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import ShapeBucketError

__all__ = [
    "BLOCK",
    "MAX_PROGRAMS",
    "interpreting",
    "launches",
    "offsets",
    "pad_rows",
    "triton_available",
    "usable",
]


def triton_available() -> bool:
    """Whether triton imports here."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def usable(t: torch.Tensor) -> bool:
    """Whether the kernel runs for ``t`` by default: on CUDA, or interpreted."""
    return (t.is_cuda or interpreting()) and triton_available()


@functools.lru_cache(maxsize=2)
def _kernels(interpret: bool) -> tuple[Any, Any]:
    """The padding kernel and the offset probe (``_triton_kernels.py``), loaded on first use.
    ``TRITON_INTERPRET`` is read when a kernel is defined, so the module is loaded once per
    setting, under its own name."""
    path = Path(__file__).with_name("_triton_kernels.py")
    spec = importlib.util.spec_from_file_location(f"{__package__}._triton_{int(interpret)}", path)
    assert spec is not None and spec.loader is not None  # the file ships with the package
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pad_kernel, module.probe


#: Values one program pads.
BLOCK = 1024
#: Programs in one launch: CUDA's limit on grid axis 0 (2**31 - 1).
MAX_PROGRAMS = 2**31 - 1


def launches(rows: int, elements: int) -> list[tuple[int, int]]:
    """The kernel launches that pad ``rows`` rows of ``elements`` values each: ``(first
    program, programs)`` per launch, each a one-axis grid of at most :data:`MAX_PROGRAMS`
    programs; program ``p`` pads block ``p % blocks`` of row ``p // blocks``.

    >>> launches(64, 16384 * 4096)  # [64, 16384, 4096] hidden states: 65,536 blocks a row
    [(0, 4194304)]
    """
    blocks = -(-elements // BLOCK)
    total = rows * blocks
    return [(first, min(MAX_PROGRAMS, total - first)) for first in range(0, total, MAX_PROGRAMS)]


def pad_rows(flat: torch.Tensor, out: torch.Tensor, lengths: torch.Tensor, *, left: bool) -> None:
    """Write ``out`` (``[rows, length, *trailing]``, already full of the pad value): sample
    ``i`` of ``flat`` in row ``i`` (at its end with ``left``), the pad elsewhere. Integer,
    float and bool dtypes (the engine passes wide unsigned ones as their signed view, and
    pads complex ones with torch: triton has no such types)."""
    if not triton_available():
        raise ShapeBucketError("use_triton=True needs triton (pip install 'shapebucket[gpu]')")
    if not (out.is_cuda or interpreting()):
        raise ShapeBucketError(
            f"use_triton=True needs the values on a CUDA device (they are on {out.device}), or "
            "TRITON_INTERPRET=1 for triton's CPU interpreter; move the batch with "
            "flat.to('cuda') first, or pass use_triton=None (torch pads on the CPU)"
        )
    if out.numel() == 0:
        return
    work, target = flat, out
    if flat.dtype == torch.bool:  # triton's i1 pointers: move bytes instead
        work, target = flat.view(torch.uint8), out.view(torch.uint8)
    rows, length = out.shape[:2]
    F = math.prod(out.shape[2:])
    fill = target.reshape(-1)[:1].clone()  # the pad value, exactly, in the stored dtype
    starts = torch.cumsum(lengths, 0) - lengths
    blocks = -(-(length * F) // BLOCK)
    pad_kernel, _ = _kernels(interpreting())
    values = work.contiguous()
    for first, programs in launches(rows, length * F):
        pad_kernel[(programs,)](
            values, starts, lengths, fill, target, len(lengths), length, F, first, blocks,
            LEFT=int(left), BLOCK=BLOCK,
        )  # fmt: skip


def offsets(
    lengths: torch.Tensor, *, row: int, block: int, length: int, features: int, left: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's offsets for the ``BLOCK`` elements of block ``block`` of row ``row``
    (int64): where each is written in the output, and where it is read in the flat values
    (-1: a pad), found from the program number as the kernel finds them. Computed by the kernel's own code, for any batch size, allocating
    nothing but ``lengths`` (needs triton; on CPU, ``TRITON_INTERPRET=1``)."""
    _, probe = _kernels(interpreting())
    dst = torch.empty(BLOCK, dtype=torch.int64, device=lengths.device)
    src = torch.empty(BLOCK, dtype=torch.int64, device=lengths.device)
    starts = torch.cumsum(lengths, 0) - lengths
    blocks = -(-(length * features) // BLOCK)
    probe[(1,)](
        dst, src, row * blocks + block, blocks, starts, lengths, len(lengths), length, features,
        LEFT=int(left), BLOCK=BLOCK,
    )  # fmt: skip
    return dst, src
