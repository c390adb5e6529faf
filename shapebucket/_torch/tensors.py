"""Copying many tensors at once: ``torch._foreach_copy_``."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def copy_all(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``d.copy_(s)`` for every pair, as one multi-tensor copy (``torch._foreach_copy_``:
    on CUDA, few kernel launches for many tensors). Shapes and dtypes must match pairwise.

    >>> a, b = torch.zeros(2), torch.zeros(3)
    >>> copy_all([a, b], [torch.ones(2), torch.full((3,), 2.0)])
    >>> a.tolist(), b.tolist()
    ([1.0, 1.0], [2.0, 2.0, 2.0])
    """
    torch._foreach_copy_(list(dst), list(src))
